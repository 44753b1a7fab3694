"""Run a lab experiment end to end: train one model per (task, scheme, seed), evaluate it (and the RoPE model
under each extension method), aggregate over seeds, write results.json, report.md and plots into the out dir.

Every scheme gets the same model size, data order, steps and seeds. Only the main process writes files.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from posenc.lab.data import CopySampler, LMSampler, PasskeySampler, load_corpus
from posenc.lab.distributed import current, map_across_ranks
from posenc.lab.evaluate import band_counts, copy_eval, extension_scaling, lm_eval, passkey_eval
from posenc._atomic import atomic_write_json
from posenc.lab.io import is_main_process
from posenc.lab.presets import LabConfig
from posenc.lab.train import TrainSettings, train
from posenc.model import ModelConfig, TinyLM

RESULT_KEY = ("task", "scheme", "scaling", "finetuned", "train_len", "eval_len", "metric", "protocol", "depth")


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device: {name} requested but CUDA is not available (use --device auto or cpu)")
    return name


def auto_threads() -> int:
    """CPU threads to use: torch's default, but no more than the cores other work leaves idle.

    Oversubscribed OpenMP threads wait on each other: on a shared 2-core machine 2 threads ran 2-3x slower than 1.
    """
    import os

    default = torch.get_num_threads()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        return default
    return max(1, min(default, (os.cpu_count() or 1) - int(round(busy))))


def out_dir(cfg: LabConfig) -> Path:
    return Path(cfg.out) if cfg.out else Path("runs") / cfg.preset


def model_config(cfg: LabConfig, scheme: str) -> ModelConfig:
    return ModelConfig(scheme=scheme, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                       max_len=cfg.train_len, rope_base=cfg.rope_base, rope_layout=cfg.rope_layout,
                       scale_embeddings=cfg.scale_embeddings)


def train_settings(cfg: LabConfig, steps: int | None = None, lr: float | None = None) -> TrainSettings:
    steps = steps or cfg.steps
    return TrainSettings(steps=steps, lr=lr or cfg.lr, warmup=min(cfg.warmup, max(1, steps // 10)),
                         weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, ckpt_every=cfg.ckpt_every)


def make_sampler(task: str, cfg: LabConfig, corpus, seq_len: int, batch_size: int, seed: int):
    if task == "lm":
        return LMSampler(corpus.train, seq_len, batch_size, seed)
    if task == "copy":
        return CopySampler(seq_len, batch_size, seed)
    return PasskeySampler(seq_len, batch_size, seed)


def run_lab(cfg: LabConfig, *, resume: bool = False, progress: bool = True, log=print) -> dict:
    """Run ``cfg``; returns the results document {"meta", "results", "curves"} (also written to the out dir)."""
    from posenc.lab.report import main_table, write_report

    cfg.validate()
    t_start = time.perf_counter()
    device = resolve_device(cfg.device)
    if cfg.threads or device == "cpu":
        torch.set_num_threads(cfg.threads or auto_threads())
    out = out_dir(cfg)
    corpus = load_corpus(cfg.data) if "lm" in cfg.tasks else None
    meta = {
        "preset": cfg.preset, "settings": cfg.to_dict(), "device": device, "threads": torch.get_num_threads(),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
        "data": corpus.meta if corpus else None, "extension_factor": cfg.factor, "timings_s": {},
        "loadavg_start": _loadavg(),
    }
    raw: list[dict] = []
    curves: dict[str, list[float]] = {}
    for task in cfg.tasks:
        for scheme in cfg.schemes:
            for seed in cfg.seeds:
                t0 = time.perf_counter()
                model = _train_model(task, scheme, seed, cfg, corpus, device, out, resume, progress)
                t_train = time.perf_counter() - t0
                raw += _evaluate(task, model, scheme, "none", False, seed, cfg, corpus, device, curves)
                if scheme == "rope":
                    raw += _extensions(task, model, seed, cfg, corpus, device, curves, out, resume, progress)
                meta["timings_s"][f"{task}/{scheme}/seed{seed}"] = {
                    "train": round(t_train, 1), "eval": round(time.perf_counter() - t0 - t_train, 1)}
                if progress and is_main_process():
                    log(f"  {task:7s} {scheme:11s} seed {seed}: train {t_train:5.1f} s, "
                        f"eval {time.perf_counter() - t0 - t_train:5.1f} s")
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    meta["loadavg_end"] = _loadavg()
    doc = {"meta": meta, "results": aggregate(raw), "curves": curves}
    if is_main_process():
        atomic_write_json(out / "results.json", doc)
        write_report(doc, out)
        log(main_table(doc))
        log(f"wrote {out}/results.json, report.md and plots (wall {meta['wall_s']:.0f} s)")
    return doc


def _loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other work on the machine changes every timing."""
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _ckpt_path(out: Path, task: str, scheme: str, seed: int, tag: str = "") -> Path:
    return out / "checkpoints" / f"{task}-{scheme}{tag}-seed{seed}.safetensors"


def _train_model(task, scheme, seed, cfg, corpus, device, out, resume, progress) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(model_config(cfg, scheme))
    sampler = make_sampler(task, cfg, corpus, cfg.train_len, cfg.batch_size, seed)
    run_settings = {"task": task, "seed": seed, "model": model.cfg.to_dict(), "batch_size": cfg.batch_size,
                    "data": corpus.meta.get("files_sha256") if corpus else None}
    train(model, sampler, train_settings(cfg), device=device, ckpt_path=_ckpt_path(out, task, scheme, seed),
          resume=resume, run_settings=run_settings, desc=f"{task} {scheme} s{seed}", progress=progress)
    return model


def _extensions(task, model, seed, cfg, corpus, device, curves, out, resume, progress) -> list[dict]:
    """Zero-shot (and optionally fine-tuned) evaluation of the RoPE model under each extension method."""
    rows = []
    for method in cfg.extensions:
        scaling, max_pos = extension_scaling(method, cfg.factor, cfg.train_len)
        model.scheme.set_scaling(scaling, max_position_embeddings=max_pos)
        bands = band_counts(model.scheme, seq_len=max(cfg.eval_lens))
        rows += _evaluate(task, model, "rope", method, False, seed, cfg, corpus, device, curves, bands)
    model.scheme.set_scaling(None)
    if cfg.finetune_steps:
        ft_len = cfg.finetune_len or max(cfg.eval_lens)
        # same tokens per step as pre-training, but at least one row per rank
        batch = max(current().world_size, cfg.batch_size * cfg.train_len // ft_len)
        for method in ["none"] + list(cfg.extensions):
            ft = copy.deepcopy(model)
            if method != "none":
                ft.scheme.set_scaling(*extension_scaling(method, cfg.factor, cfg.train_len))
            sampler = make_sampler(task, cfg, corpus, ft_len, batch, seed + 10_000)
            run_settings = {"task": task, "seed": seed, "finetune": method, "len": ft_len, "batch": batch}
            train(ft, sampler, train_settings(cfg, cfg.finetune_steps, cfg.lr * 0.3), device=device,
                  ckpt_path=_ckpt_path(out, task, "rope", seed, f"-ft-{method}"), resume=resume,
                  run_settings=run_settings, desc=f"finetune {method}", progress=progress)
            bands = band_counts(ft.scheme, seq_len=max(cfg.eval_lens)) if method != "none" else None
            rows += _evaluate(task, ft, "rope", method, True, seed, cfg, corpus, device, curves, bands)
    return rows


def _row(task, scheme, scaling, finetuned, seed, cfg, eval_len, metric, value, **extra) -> dict:
    row = {"task": task, "scheme": scheme, "scaling": scaling, "finetuned": finetuned, "train_len": cfg.train_len,
           "eval_len": eval_len, "metric": metric, "value": value, "seed": seed, "protocol": None, "depth": None}
    row.update(extra)
    if value is not None and not math.isfinite(value):
        row["value"], row["note"] = None, "diverged (non-finite)"
    return row


def _na(model) -> str:
    return f"n/a (table = {model.scheme.max_len})"


def _evaluate(task, model, scheme, scaling, finetuned, seed, cfg, corpus, device, curves, bands=None) -> list[dict]:
    """Score one trained model. Under torchrun each rank evaluates a share of the lengths (balanced by length, the
    cost) and every rank receives all results (``map_across_ranks``); in one process it is a plain loop."""
    rows = []
    common = dict(bands=bands) if bands is not None else {}
    args = (task, scheme, scaling, finetuned, seed, cfg)
    model.to(device).eval()
    if task == "lm":
        lm = map_across_ranks(lambda L: lm_eval(model, corpus.val, L, n_tokens=cfg.eval_tokens, device=device),
                              cfg.eval_lens, cost=lambda L: L)
        for L, r in zip(cfg.eval_lens, lm):
            extra = dict(protocol="non-overlapping", **common)
            if r is None:
                extra["note"] = _na(model)
            rows.append(_row(*args, L, "ppl", r and r["ppl"], **extra))
            if r is not None and L == max(cfg.eval_lens):
                curves[f"{scheme}|{scaling}|{'ft' if finetuned else 'zs'}|{seed}"] = [round(x, 4) for x in r["per_position"]]
        if cfg.sliding_stride:
            lens = cfg.sliding_lens or [max(cfg.eval_lens)]

            def sliding(L):
                stride = cfg.sliding_stride if cfg.sliding_stride > 0 else max(1, L // 2)
                return stride, lm_eval(model, corpus.val, L, n_tokens=cfg.sliding_tokens, stride=stride, device=device)

            for L, (stride, r) in zip(lens, map_across_ranks(sliding, lens, cost=lambda L: L)):
                extra = dict(protocol=f"sliding (stride {stride})", **common)
                if r is None:
                    extra["note"] = _na(model)
                rows.append(_row(*args, L, "ppl", r and r["ppl"], **extra))
    elif task == "copy":
        accs = map_across_ranks(lambda L: copy_eval(model, L, n_examples=cfg.copy_examples, seed=seed, device=device),
                                cfg.eval_lens, cost=lambda L: L)
        for L, r in zip(cfg.eval_lens, accs):
            for metric in ("exact_match", "token_accuracy"):
                extra = dict(common, note=_na(model)) if r is None else common
                rows.append(_row(*args, L, metric, r and r[metric], **extra))
    elif task == "passkey":
        grid = [(L, depth) for L in cfg.eval_lens for depth in cfg.passkey_depths]
        values = map_across_ranks(lambda item: passkey_eval(model, item[0], item[1], n_trials=cfg.passkey_trials,
                                                            seed=seed, device=device), grid, cost=lambda item: item[0])
        for (L, depth), v in zip(grid, values):
            extra = dict(common, note=_na(model)) if v is None else common
            rows.append(_row(*args, L, "exact_match", v, depth=depth, **extra))
    return rows


def aggregate(rows: list[dict]) -> list[dict]:
    """Merge rows that differ only in seed: value = mean, std = sample std (None for one seed), seed = the seed
    (or the list of seeds), values = per-seed values."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in RESULT_KEY), []).append(r)
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
