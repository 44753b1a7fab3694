"""Run a lab experiment end to end: train one model per (task, scheme, seed), evaluate it (and the models of the
``extended_schemes`` under each extension method), aggregate over seeds, write results.json, report.md and plots.

Every scheme gets the same model size, data order, steps and seeds. Only the main process writes files. Tasks,
schemes and extension methods are looked up in their registries (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from posenc._internal.atomic import atomic_write_json
from posenc._internal.fingerprint import state_fingerprint
from posenc.attention import is_attention_method
from posenc.extensions import FitContext, get_method
from posenc.lab.context import DIVERGED, Evaluation, Run
from posenc.lab.curriculum import LengthWarmupSampler
from posenc.lab.data import load_corpus
from posenc.lab.distributed import current, is_main_process, resolve_device
from posenc.lab.evaluate import apply_extension, band_counts, extension_config, lab_spec
from posenc.lab.jobs import Unit, plan, run_units, units_of
from posenc.lab.lock import out_lock
from posenc.lab.precision import autocast, native_bf16, resolve_precision
from posenc.lab.presets import LabConfig
from posenc.lab.report import main_table, write_report
from posenc.lab.tables import model_label
from posenc.lab.tasks import get_task, needs_corpus
from posenc.lab.train import TrainJob, TrainSettings, checkpoint_step, train
from posenc._internal.machine import busy_cores, busy_jiffies, cpu_cores, cpu_model  # noqa: F401 (their owner)
from posenc.nn.model import TinyLM
from posenc.randomized import randomized_positions

RESULT_KEY = ("task", "scheme", "positions", "scaling", "finetuned", "train_len", "eval_len", "metric", "protocol",
              "depth")


def auto_threads() -> int:
    """CPU threads to use: torch's default, but no more than the cores other work leaves idle: both cores of an
    idle 2-core machine, one while another job keeps one busy.

    Busy cores are sampled now (``busy_cores``); the 1-minute load average, used where that cannot be read, lags by
    minutes: right after one lab run it still shows a busy core, and a second run started then trained one model
    at a time, 156 s instead of 85 s. Oversubscribed OpenMP threads wait on each other: on a shared 2-core machine
    2 threads ran 2-3x slower than 1. The choice changes speed only: training and evaluation give identical numbers
    at any thread count (posenc.nn.model.LayerNorm; tests/nn/test_model.py).
    """
    default = torch.get_num_threads()
    busy = busy_cores()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):
            return default
    return max(1, min(default, cpu_cores() - int(round(busy))))


def out_dir(cfg: LabConfig) -> Path:
    return Path(cfg.out) if cfg.out else Path("runs") / cfg.preset


def training(cfg: LabConfig, steps: int | None = None, lr: float | None = None) -> TrainSettings:
    """The lab's training settings for a run of ``steps`` (default cfg.train.steps): warmup at most a tenth."""
    steps = steps or cfg.train.steps
    return replace(cfg.train, steps=steps, lr=lr or cfg.train.lr, warmup=min(cfg.train.warmup, max(1, steps // 10)))


def run_lab(cfg: LabConfig, *, resume: bool = False, progress: bool = True, log=print,
            device: torch.device | None = None) -> dict:
    """Run ``cfg``; returns the results document {"meta", "results", "curves"} (also written to the out dir).

    ``device``: the device already resolved by the caller's distributed session (else resolved here).
    """
    cfg.validate()
    t_start, c_start = time.perf_counter(), cpu_time()
    device = device if device is not None else resolve_device(cfg.device)
    units = units_of(cfg)
    jobs, threads = plan(cfg, device, len(units), auto_threads, distributed=current().world_size > 1)
    if cfg.threads or device.type == "cpu":
        torch.set_num_threads(threads)
    precision = resolve_precision(cfg.precision, device)
    corpus = load_corpus(cfg.data) if needs_corpus(cfg.tasks) else None
    run = Run(cfg, corpus, device, out_dir(cfg), resume=resume, progress=progress, log=log, precision=precision)
    meta = {
        "preset": cfg.preset, "settings": cfg.to_dict(), "device": str(device), "threads": torch.get_num_threads(),
        "jobs": jobs, "processes": current().world_size, "precision": precision, "native_bf16": native_bf16(device),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
        "data": corpus.meta if corpus else None, "extension_factor": cfg.factor, "timings_s": {},
        "cpu": cpu_model(),
    }
    # the out folder is this job's until it ends (rank 0 holds the lock: only it writes)
    lock = out_lock(run.out, "posenc " + " ".join(sys.argv[1:])) if is_main_process() else contextlib.nullcontext()
    with lock:
        if not run.resume and is_main_process():
            _set_aside_earlier_results(run)
        done: dict[int, dict] = {}
        partial: dict = {}  # the unit in progress (one process): its rows so far
        try:
            bar = run.bar(len(units), "models") if jobs > 1 else None  # one process: the training bars show it
            for i, result in run_units(run, units, jobs, threads, run_unit, partial):
                done[i] = result
                if bar is not None:
                    bar.update(1)
                if progress and is_main_process():
                    log(result["log"])
            if bar is not None:
                bar.close()
        except BaseException as exc:  # keep what is finished: the rows so far, marked incomplete
            raw, curves = _collect(done, meta)
            raw += partial.get("rows", [])
            curves.update(partial.get("curves", {}))
            if raw and is_main_process():
                _write_partial(run, meta, raw, curves, t_start, c_start, exc)
            raise
        raw, curves = _collect(done, meta)
        doc = _finish(meta, raw, curves, t_start, c_start)
        if is_main_process():
            atomic_write_json(run.out / "results.json", doc)
            write_report(doc, run.out)
            log(main_table(doc))
            if meta.get("diverged"):
                log("diverged (non-finite weights or loss; reported as such, no number): "
                    + "; ".join(meta["diverged"]))
            log(f"wrote {run.out}/results.json, report.md and plots (wall {meta['wall_s']:.0f} s)")
    return doc


def run_unit(run: Run, unit: Unit, rows: list, curves: dict) -> dict:
    """Train and evaluate one unit (posenc.lab.jobs), appending its result rows to ``rows`` and its per-position
    curves to ``curves`` as they are made: -> {"rows", "curves", "timing": (key, seconds and throughput),
    "extensions": (key, info) or None, "log": its line}."""
    cfg = run.cfg
    task, scheme, randomized, seed = unit.task, unit.scheme, unit.randomized, unit.seed
    positions = positions_label(randomized)
    name = scheme + (f" ({positions})" if positions else "")
    t0 = time.perf_counter()
    model, trained = train_model(run, unit)
    t_train = time.perf_counter() - t0
    rows += evaluate(run, Evaluation(run, model, task, scheme, seed=seed, curves=curves, positions=positions))
    extensions = None
    if scheme in cfg.extended_schemes and not randomized:
        ext: dict = {}
        evaluate_extensions(run, model, unit, curves, ext, rows=rows)   # (rows grow as each ends)
        extensions = (f"{task}/{scheme}/seed{seed}", ext)
    t_eval = time.perf_counter() - t0 - t_train
    timing = {"train": round(t_train, 1), "eval": round(t_eval, 1), **throughput(model.cfg, cfg, trained)}
    reached = ""
    if cfg.train_until:  # the steps it took (or the cap, not reached)
        timing.update(steps=trained["step"], criterion_met=trained["criterion_met"])
        verdict = "criterion met at" if trained["criterion_met"] else "criterion NOT met by"
        reached = f", {verdict} step {trained['step']}"
    return {"rows": rows, "curves": curves, "extensions": extensions, "timing": (f"{task}/{name}/seed{seed}", timing),
            "log": f"  {task:7s} {name:11s} seed {seed}: train {t_train:5.1f} s, eval {t_eval:5.1f} s{reached}"}


def _collect(done: dict[int, dict], meta: dict) -> tuple[list[dict], dict]:
    """The finished units' rows and curves in unit order; their timings and extension info into ``meta``."""
    raw: list[dict] = []
    curves: dict[str, list[float | None]] = {}
    for i in sorted(done):
        result = done[i]
        raw += result["rows"]
        curves.update(result["curves"])
        key, timing = result["timing"]
        meta["timings_s"][key] = timing
        if result["extensions"] is not None:
            key, ext = result["extensions"]
            meta.setdefault("extensions", {})[key] = ext
    return raw, curves


def cpu_time() -> float:
    """CPU seconds of this process plus its finished child processes (the --jobs workers)."""
    try:
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime
    except (ImportError, OSError):
        return time.process_time()


def _finish(meta: dict, raw: list[dict], curves: dict, t_start: float, c_start: float) -> dict:
    """The results document: timings, the diverged models, every number finite (JSON has no NaN)."""
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    meta["cpu_s"] = round(cpu_time() - c_start, 1)  # CPU time of this process and its --jobs workers
    diverged = sorted({model_label(r) for r in raw if str(r.get("note", "")).startswith(DIVERGED)})
    if diverged:
        meta["diverged"] = diverged
    doc, replaced = finite_json({"meta": meta, "results": aggregate(raw), "curves": curves})
    if replaced:  # a plug-in task's row or curve with NaN: recorded, not fatal
        doc["meta"]["non_finite_replaced"] = replaced
    return doc


def _set_aside_earlier_results(run: Run) -> None:
    """A new run (not --resume) in a folder holding an earlier run's results: they are kept as results.previous.json
    and report.previous.md, so that until this run writes its own, the folder does not present the earlier numbers
    beside this run's checkpoints."""
    moved = []
    for name, previous in (("results.json", "results.previous.json"), ("report.md", "report.previous.md")):
        if (run.out / name).is_file():
            os.replace(run.out / name, run.out / previous)
            moved.append(previous)
    if moved:
        run.log(f"kept the earlier run's results as {' and '.join(moved)} (this run does not --resume it)")


def _write_partial(run: Run, meta: dict, raw: list[dict], curves: dict, t_start: float, c_start: float,
                   exc: BaseException):
    """results.json and report.md with the rows finished before ``exc`` ended the run (meta.incomplete says why)."""
    meta["incomplete"] = f"ended early by {type(exc).__name__}: {exc}"[:500]
    try:
        doc = _finish(meta, raw, curves, t_start, c_start)
        atomic_write_json(run.out / "results.json", doc)
        write_report(doc, run.out)
        run.log(f"wrote the {len(doc['results'])} finished result rows to {run.out}/results.json and report.md "
                "(incomplete run)")
    except Exception as err:  # never hide the original error behind this one
        run.log(f"could not write the partial results: {type(err).__name__}: {err}")


def finite_json(obj) -> tuple[object, int]:
    """``obj`` with every non-finite float replaced by None (JSON cannot hold NaN/inf); -> (copy, count replaced)."""
    count = 0

    def walk(x):
        nonlocal count
        if isinstance(x, float) and not math.isfinite(x):
            count += 1
            return None
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    return walk(obj), count


def checkpoint_path(out: Path, task: str, scheme: str, seed: int, tag: str = "") -> Path:
    """out/checkpoints/TASK-SCHEME[TAG]-seedN.safetensors; ConfigError if the names would make it leave ``out``
    (the registries refuse such names; a plug-in may still write its table directly)."""
    from posenc._internal.registry import path_under

    return path_under(out, "checkpoints", f"{task}-{scheme}{tag}-seed{seed}.safetensors", what="checkpoint")


def throughput(model_cfg, cfg: LabConfig, trained: dict) -> dict:
    """Training tokens/s and achieved GFLOP/s (``ModelConfig.flops_per_token``) of the steps this process ran."""
    steps = trained["step"] - trained["resumed_from"]
    if steps <= 0 or trained["wall_s"] <= 0:
        return {}
    tokens = steps * cfg.batch_size * cfg.train_len  # length_warmup phases hold the same tokens per step
    flops = tokens * model_cfg.flops_per_token(cfg.train_len, training=True)
    return {"tokens_per_s": round(tokens / trained["wall_s"]), "gflops": round(flops / trained["wall_s"] / 1e9, 1)}


def positions_label(randomized: int) -> str | None:
    """The result rows' ``positions`` field: None for plain positions, "randomized N=1024" otherwise."""
    return f"randomized N={randomized}" if randomized else None


class RandomizedTrainPositions:
    """``TinyLM.train_positions`` for randomized positions (Ruoss et al. 2023): each training forward gets a sorted
    random subset of 0..N-1 per row, drawn from a generator seeded by (seed, step, rank), so a resumed run draws
    the same positions as an uninterrupted one. Call k of this object is step start + k."""

    def __init__(self, max_position: int, seed: int, start_step: int = 0):
        self.max_position, self.seed, self.step = max_position, seed, start_step

    def __call__(self, batch: int, seq_len: int, device) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.step) * 1009 + current().rank)
        self.step += 1
        return randomized_positions(seq_len, self.max_position, generator=g, batch_size=batch, device=device)


def train_model(run: Run, unit: Unit) -> tuple[TinyLM, dict]:
    """Train (or resume) the model of ``unit`` (task, scheme, randomized, seed); same initial shared weights and data
    for every scheme. -> (the model, ``train``'s result).

    ``unit.randomized`` > 0: train on randomized positions below it (evaluation uses plain positions).
    """
    cfg = run.cfg
    task, scheme, randomized, seed = unit.task, unit.scheme, unit.randomized, unit.seed
    torch.manual_seed(seed)
    model = TinyLM(cfg.model_config(scheme))
    sampler = task_sampler(run, task, cfg.train_len, cfg.batch_size, seed)
    run_settings = {"task": task, "seed": seed, "model": model.cfg.to_dict(), "batch_size": cfg.batch_size,
                    "data": run.corpus.meta.get("files_sha256") if run.corpus else None}
    if cfg.length_warmup:  # absent when off, so checkpoints written before the setting existed still resume
        sampler = LengthWarmupSampler(
            [(n, task_sampler(run, task, length, cfg.batch_size * cfg.train_len // length, seed))
             for length, n in cfg.length_warmup], sampler)
        run_settings["length_warmup"] = cfg.length_warmup
    tag = ""
    if randomized:
        run_settings["randomized_positions"] = randomized
        tag = f"-rand{randomized}"
    ckpt = checkpoint_path(run.out, task, scheme, seed, tag)
    if randomized:
        start = (checkpoint_step(ckpt) or 0) if run.resume else 0
        model.train_positions = RandomizedTrainPositions(randomized, seed, start)
    until = None
    if cfg.train_until:  # train to the task's criterion (steps is the cap); absent when off: older checkpoints resume
        run_settings.update(train_until=cfg.train_until, check_every=cfg.check_every)
        def until() -> bool:
            with autocast(run.precision, run.device):
                return get_task(task).criterion(run, model, seed) >= cfg.train_until
    job = TrainJob(device=run.device, ckpt_path=ckpt, resume=run.resume, run_settings=run_settings,
                   desc=f"{task} {scheme}{tag} s{seed}", progress=run.progress, precision=run.precision, until=until,
                   check_every=cfg.check_every, check_from=sum(n for _, n in cfg.length_warmup or ()))
    result = train(model, sampler, training(cfg, cfg.steps_for(scheme)), job)
    model.train_positions = None
    return model, result


def task_sampler(run: Run, task: str, seq_len: int, batch_size: int, seed: int):
    """The task's training sampler, its batches checked against what was asked (posenc.lab.tasks.checks)."""
    from posenc.lab.tasks.checks import CheckedSampler

    return CheckedSampler(get_task(task).sampler(run, seq_len, batch_size, seed), get_task(task), seq_len,
                          batch_size, run.cfg.model.vocab_size)


def evaluate(run: Run, ev: Evaluation) -> list[dict]:
    """Score one trained model with its task (under the run's precision). Under torchrun each rank evaluates a
    share (``ev.map``)."""
    from posenc.lab.tasks.checks import evaluate_task

    ev.model.to(run.device).eval()
    with autocast(run.precision, run.device):
        return evaluate_task(get_task(ev.task), ev)


def finetune_length(cfg: LabConfig) -> int:
    """The length a full-length fine-tune trains at: --finetune-len, else the longest evaluation length."""
    return cfg.finetune_len or max(cfg.eval_lens)


def finetune_rows(cfg: LabConfig, length: int) -> int:
    """Rows of the pre-training tokens per step (batch_size x train_len) at ``length``."""
    return cfg.batch_size * cfg.train_len // length


def finetune_batch(cfg: LabConfig, length: int) -> int:
    """Sequences per fine-tuning step at ``length``: the pre-training tokens per step (batch_size x train_len),
    at least one row per rank. Full-length and PoSE fine-tunes thus see about the same tokens per step."""
    return max(current().world_size, finetune_rows(cfg, length))


def evaluate_extensions(run: Run, model: TinyLM, unit: Unit, curves: dict, info: dict | None = None,
                        rows: list | None = None) -> list[dict]:
    """Zero-shot (and with --finetune-steps, fine-tuned) evaluation of an extendable model under each method.

    ``info`` (filled in, for results.json): per method the time and details of its ``fit`` (LongRoPE's search),
    and per fine-tune its steps, length, batch, tokens, position mode and wall time. Fine-tuned rows carry the
    same as ``finetune``. ``rows``: the list the rows are appended to as each evaluation ends (the unit's own, so
    an interrupt keeps the finished ones); returned.
    """
    cfg = run.cfg
    task, scheme, seed = unit.task, unit.scheme, unit.seed
    info = {} if info is None else info
    rows = [] if rows is None else rows
    fit = FitContext(model=model, task=task, corpus=run.corpus, device=run.device, seed=seed,
                     eval_lens=list(cfg.eval_lens), settings=cfg.to_dict(), out=run.out, progress=run.progress,
                     resume=run.resume)
    configs = {}
    for method in cfg.extensions:
        t0, c0 = time.perf_counter(), time.process_time()
        configs[method] = extension_config(method, model, cfg.factor, cfg.train_len, fit, cfg.method_options(method))
        m = None if is_attention_method(method) else get_method(method)   # an attention method fits nothing
        if m is not None and m.fit is not None:
            info.setdefault("fit", {})[method] = {"wall_s": round(time.perf_counter() - t0, 2),
                                                  "cpu_s": round(time.process_time() - c0, 2),
                                                  **configs[method].details}
        if m is not None and m.train_positions is not None:
            continue  # a fine-tuning mode (PoSE): untrained, it is its base method
        apply_extension(model, configs[method])
        bands = band_counts(model.scheme, seq_len=max(cfg.eval_lens))
        rows += evaluate(run, Evaluation(run, model, task, scheme, method, seed=seed, bands=bands, curves=curves))
    apply_extension(model, None)
    if cfg.finetune_steps:
        for method in ["none"] + [m for m in cfg.extensions if not is_attention_method(m)]:
            ft_rows, ft_info = finetune(run, model, unit, method, configs.get(method), curves)
            info.setdefault("finetune", {})[method] = ft_info
            rows += ft_rows
    return rows


def finetune(run: Run, model: TinyLM, unit: Unit, method: str, config, curves: dict) -> tuple[list[dict], dict]:
    """Fine-tune a copy of ``model`` under ``method`` (config: its MethodConfig; None for plain RoPE), then
    evaluate it -> (rows, what it cost).

    Full-length methods train at --finetune-len (default the longest eval length); a method with
    ``train_positions`` (PoSE) trains at the training length with those position ids covering the target, and a
    method that ``recalibrates`` (DroPE) at the training length with ordinary positions. Same
    steps, learning rate (0.3 x the pre-training peak, warmup then cosine) and fine-tuning data for every method.
    """
    cfg = run.cfg
    task, scheme, seed = unit.task, unit.scheme, unit.seed
    m = get_method(method) if method != "none" else None
    pose = m is not None and m.train_positions is not None
    length = cfg.train_len if pose or (m is not None and m.recalibrates) else finetune_length(cfg)
    batch = finetune_batch(cfg, length)
    ft = copy.deepcopy(model)
    if config is not None:
        apply_extension(ft, config)
    if pose:
        spec = lab_spec(method, ft.scheme, cfg.factor, cfg.train_len)
        ft.train_positions = lambda b, t, device: m.train_positions(b, t, spec).to(device)
        torch.manual_seed(seed + 20_000)  # PoSE draws from torch's RNG, which checkpoints restore on --resume
    sampler = task_sampler(run, task, length, batch, seed + 10_000)
    settings = training(cfg, cfg.finetune_steps, cfg.train.lr * 0.3)
    # "base": the trained model this fine-tune starts from; a checkpoint of a fine-tune of another base (the base was
    # retrained with other settings) is refused on --resume instead of reported beside the new base
    run_settings = {"task": task, "seed": seed, "finetune": method, "len": length, "batch": batch,
                    "positions": "pose" if pose else "contiguous", "scaling": config and config.scaling,
                    "base": state_fingerprint(model)}
    t0, c0 = time.perf_counter(), time.process_time()
    out = train(ft, sampler, settings, TrainJob(
        device=run.device, ckpt_path=checkpoint_path(run.out, task, scheme, seed, f"-ft-{method}"),
        resume=run.resume, run_settings=run_settings, desc=f"finetune {method}", progress=run.progress,
        precision=run.precision))
    ft.train_positions = None
    ft_info = {"steps": settings.steps, "len": length, "batch": batch, "tokens": settings.steps * batch * length,
               "positions": "pose" if pose else "contiguous", "lr": settings.lr,
               "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2),
               "resumed_from": out["resumed_from"]}
    bands = band_counts(ft.scheme, seq_len=max(cfg.eval_lens)) if config is not None else None
    rows = evaluate(run, Evaluation(run, ft, task, scheme, method, True, seed, bands, curves))
    for r in rows:
        r["finetune"] = {k: ft_info[k] for k in ("steps", "len", "batch", "tokens", "positions")}
    return rows, ft_info


def aggregate(rows: list[dict]) -> list[dict]:
    """Merge rows that differ only in seed: value = mean, std = sample std (None for one seed), seed = the seed
    (or the list of seeds), values = per-seed values."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in RESULT_KEY), []).append(r)
    out = []
    for group in groups.values():
        first = dict(group[0])
        vals = [r["value"] for r in group]
        seeds = [r["seed"] for r in group]
        if len(group) > 1:
            ok = [v for v in vals if v is not None]
            first["value"] = statistics.fmean(ok) if len(ok) == len(vals) else None
            first["std"] = statistics.stdev(ok) if len(ok) == len(vals) else None
            first["seed"] = seeds
            first["values"] = vals
            missing = [r for r in group if r["value"] is None]
            if ok and missing:  # some seeds have no value: say which and why (not "n/a", which means no encoding)
                note = missing[0].get("note") or "no value"
                first["note"] = f"{note} on seed {', '.join(str(r['seed']) for r in missing)}"
        else:
            first["std"] = None
        out.append(first)
    return out
