"""Run a lab experiment end to end: train one model per (task, scheme, seed), evaluate it (and the models of the
``extended_schemes`` under each extension method), aggregate over seeds, write results.json, report.md and plots.

Every scheme gets the same model size, data order, steps and seeds. Only the main process writes files. Tasks,
schemes and extension methods are looked up in their registries (docs/architecture.md).
"""

from __future__ import annotations

import copy
import datetime as _dt
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from posenc._atomic import atomic_write_json
from posenc.extensions import FitContext
from posenc.lab.context import Evaluation, Run
from posenc.lab.data import load_corpus
from posenc.lab.distributed import current, is_main_process, resolve_device
from posenc.lab.evaluate import apply_extension, band_counts, extension_config
from posenc.lab.presets import LabConfig
from posenc.lab.report import main_table, write_report
from posenc.lab.tasks import get_task
from posenc.lab.train import TrainSettings, checkpoint_step, train
from posenc.nn.model import TinyLM
from posenc.randomized import randomized_positions

RESULT_KEY = ("task", "scheme", "positions", "scaling", "finetuned", "train_len", "eval_len", "metric", "protocol",
              "depth")


def auto_threads() -> int:
    """CPU threads to use: torch's default, but no more than the cores other work leaves idle.

    Oversubscribed OpenMP threads wait on each other: on a shared 2-core machine 2 threads ran 2-3x slower than 1.
    """
    default = torch.get_num_threads()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        return default
    return max(1, min(default, (os.cpu_count() or 1) - int(round(busy))))


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
    t_start = time.perf_counter()
    device = device if device is not None else resolve_device(cfg.device)
    if cfg.threads or device.type == "cpu":
        torch.set_num_threads(cfg.threads or auto_threads())
    corpus = load_corpus(cfg.data) if any(get_task(t).needs_corpus for t in cfg.tasks) else None
    run = Run(cfg, corpus, device, out_dir(cfg), resume=resume, progress=progress, log=log)
    meta = {
        "preset": cfg.preset, "settings": cfg.to_dict(), "device": str(device), "threads": torch.get_num_threads(),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
        "data": corpus.meta if corpus else None, "extension_factor": cfg.factor, "timings_s": {},
        "loadavg_start": _loadavg(),
    }
    raw: list[dict] = []
    curves: dict[str, list[float]] = {}
    for task in cfg.tasks:
        for scheme in cfg.schemes:
            for randomized in cfg.position_variants(scheme):
                positions = positions_label(randomized)
                name = scheme + (f" ({positions})" if positions else "")
                for seed in cfg.seeds:
                    t0 = time.perf_counter()
                    model = train_model(run, task, scheme, seed, randomized)
                    t_train = time.perf_counter() - t0
                    raw += evaluate(run, Evaluation(run, model, task, scheme, seed=seed, curves=curves,
                                                    positions=positions))
                    if scheme in cfg.extended_schemes and not randomized:
                        raw += evaluate_extensions(run, model, task, scheme, seed, curves)
                    meta["timings_s"][f"{task}/{name}/seed{seed}"] = {
                        "train": round(t_train, 1), "eval": round(time.perf_counter() - t0 - t_train, 1)}
                    if progress and is_main_process():
                        log(f"  {task:7s} {name:11s} seed {seed}: train {t_train:5.1f} s, "
                            f"eval {time.perf_counter() - t0 - t_train:5.1f} s")
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    meta["loadavg_end"] = _loadavg()
    doc = {"meta": meta, "results": aggregate(raw), "curves": curves}
    if is_main_process():
        atomic_write_json(run.out / "results.json", doc)
        write_report(doc, run.out)
        log(main_table(doc))
        log(f"wrote {run.out}/results.json, report.md and plots (wall {meta['wall_s']:.0f} s)")
    return doc


def _loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other work on the machine changes every timing."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def checkpoint_path(out: Path, task: str, scheme: str, seed: int, tag: str = "") -> Path:
    return out / "checkpoints" / f"{task}-{scheme}{tag}-seed{seed}.safetensors"


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


def train_model(run: Run, task: str, scheme: str, seed: int, randomized: int = 0) -> TinyLM:
    """Train (or resume) the model of (task, scheme, seed); same initial shared weights and data for every scheme.

    ``randomized`` > 0: train on randomized positions below it (evaluation uses plain positions).
    """
    cfg = run.cfg
    torch.manual_seed(seed)
    model = TinyLM(cfg.model_config(scheme))
    sampler = get_task(task).sampler(run, cfg.train_len, cfg.batch_size, seed)
    run_settings = {"task": task, "seed": seed, "model": model.cfg.to_dict(), "batch_size": cfg.batch_size,
                    "data": run.corpus.meta.get("files_sha256") if run.corpus else None}
    tag = ""
    if randomized:
        run_settings["randomized_positions"] = randomized
        tag = f"-rand{randomized}"
    ckpt = checkpoint_path(run.out, task, scheme, seed, tag)
    if randomized:
        start = (checkpoint_step(ckpt) or 0) if run.resume else 0
        model.train_positions = RandomizedTrainPositions(randomized, seed, start)
    train(model, sampler, training(cfg), device=run.device, ckpt_path=ckpt, resume=run.resume,
          run_settings=run_settings, desc=f"{task} {scheme}{tag} s{seed}", progress=run.progress)
    model.train_positions = None
    return model


def evaluate(run: Run, ev: Evaluation) -> list[dict]:
    """Score one trained model with its task. Under torchrun each rank evaluates a share (``ev.map``)."""
    ev.model.to(run.device).eval()
    return get_task(ev.task).evaluate(ev)


def evaluate_extensions(run: Run, model: TinyLM, task: str, scheme: str, seed: int, curves: dict) -> list[dict]:
    """Zero-shot (and optionally fine-tuned) evaluation of an extendable model under each extension method."""
    cfg = run.cfg
    rows = []
    fit = FitContext(model=model, task=task, corpus=run.corpus, device=run.device, seed=seed,
                     eval_lens=list(cfg.eval_lens), settings=cfg.to_dict(), out=run.out, progress=run.progress)
    configs = {}
    for method in cfg.extensions:
        configs[method] = extension_config(method, model, cfg.factor, cfg.train_len, fit)
        apply_extension(model, configs[method])
        bands = band_counts(model.scheme, seq_len=max(cfg.eval_lens))
        rows += evaluate(run, Evaluation(run, model, task, scheme, method, seed=seed, bands=bands, curves=curves))
    apply_extension(model, None)
    if cfg.finetune_steps:
        ft_len = cfg.finetune_len or max(cfg.eval_lens)
        # same tokens per step as pre-training, but at least one row per rank
        batch = max(current().world_size, cfg.batch_size * cfg.train_len // ft_len)
        for method in ["none"] + list(cfg.extensions):
            ft = copy.deepcopy(model)
            if method != "none":
                apply_extension(ft, configs[method])
            sampler = get_task(task).sampler(run, ft_len, batch, seed + 10_000)
            run_settings = {"task": task, "seed": seed, "finetune": method, "len": ft_len, "batch": batch}
            train(ft, sampler, training(cfg, cfg.finetune_steps, cfg.train.lr * 0.3), device=run.device,
                  ckpt_path=checkpoint_path(run.out, task, scheme, seed, f"-ft-{method}"), resume=run.resume,
                  run_settings=run_settings, desc=f"finetune {method}", progress=run.progress)
            bands = band_counts(ft.scheme, seq_len=max(cfg.eval_lens)) if method != "none" else None
            rows += evaluate(run, Evaluation(run, ft, task, scheme, method, True, seed, bands, curves))
    return rows


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
        else:
            first["std"] = None
        out.append(first)
    return out
