"""The run's tables for the terminal and report.md, and its plots: each task present in the results contributes
its own section (posenc/lab/tasks/), in registry order."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from posenc._internal.atomic import atomic_write_text
from posenc.extensions import METHODS
from posenc.lab.presets import scaled_steps
from posenc.lab.tables import markdown
from posenc.lab.tasks import TASKS
from posenc.lab.tasks.lm import scored_tokens


def _tasks_in(results: list[dict]):
    present = {r["task"] for r in results}
    return [task for name, task in TASKS.items() if name in present]


def main_table(doc: dict) -> str:
    """The tables printed at the end of a run."""
    res = doc["results"]
    return "\n\n".join(part for part in (task.report(res) for task in _tasks_in(res)) if part)


def make_plots(doc: dict, out: Path) -> list[str]:
    """Write every plot that the run has data for; returns their file names."""
    written: list[str] = []
    for task in _tasks_in(doc["results"]):
        written += task.plot(doc, out)
    return written


def _scheme_steps(scales: dict | None, steps: int) -> str:
    """' (x 1.2 for nope: 3000, ...; each its own cap and schedule)' for the schemes whose models train
    ``steps`` x a multiplier (LabConfig.scheme_step_scale); '' for none."""
    if not scales:
        return ""
    each = ", ".join(f"x {v:g} for {k}: {scaled_steps(steps, v)}" for k, v in scales.items())
    return f" ({each}; each its own cap and schedule)"


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def _processes(n: int) -> str:
    return f" per process, {n} processes (--nproc)" if n > 1 else ""


def _cpu_of(n: int) -> str:
    return ", of rank 0 alone" if n > 1 else ""


def _jobs(n: int) -> str:
    return f" per model, {n} models at once" if n > 1 else ""


def _linked_plots(report: Path) -> set[str]:
    """The plot files an earlier report.md in the folder shows (``![name](name)`` lines written below)."""
    try:
        text = report.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    return {name for name in re.findall(r"^!\[[^\]]*\]\(([^)/\\]+\.png)\)$", text, re.M)}


def write_report(doc: dict, out: Path) -> Path:
    """Write report.md and the plots into ``out``."""
    meta = doc["meta"]
    earlier = _linked_plots(out / "report.md")
    plots = make_plots(doc, out)
    for name in earlier - set(plots):        # an earlier run's plot (a task this run does not have): not ours now
        (out / name).unlink(missing_ok=True)
    incomplete = meta.get("incomplete")
    lines = [
        f"# posenc lab: preset `{meta['preset']}`",
        "",
        *([f"**Incomplete run** ({incomplete}): only the models that finished are reported below; "
           "`posenc lab --resume` with the same settings and --out completes it.", ""] if incomplete else []),
        f"Measured wall time: **{meta['wall_s']:.0f} s** (CPU time {meta.get('cpu_s', '?')} s, workers included"
        f"{_cpu_of(meta.get('processes', 1))}) on "
        f"{meta['device']} ({_threads(meta['threads'])}{_jobs(meta.get('jobs', 1))}"
        f"{_processes(meta.get('processes', 1))}) in "
        f"{meta.get('precision', 'fp32')}, "
        f"started {meta['started']}; {meta.get('cpu') or meta.get('platform', 'CPU not recorded')}; "
        f"Python {meta['python']}, torch {meta['torch']}.",
        "",
        *_settings_lines(meta),
    ]
    lines += ["", "## Results", "", main_table(doc), "",
              "Notes: `n/a (table = N)`: a learned position table has no row past its training length, so the model "
              "cannot run there (nothing is clamped). `bands k/b/i`: rotary pairs kept / blended / interpolated by "
              "the method at this head dimension; for an attention method (Self-Extend, ReRoPE, Dual Chunk, sinks) the "
              "cell says which distances it keeps exact and what it does beyond. Dynamic NTK uses transformers' formula with factor 1, i.e. the "
              "static NTK base for exactly (length / train length) at each length.", ""]
    for name in plots:
        lines += [f"![{name}]({name})", ""]
    steps = criterion_table(meta)
    if steps:
        lines += ["## Training to the criterion", "", steps, ""]
    lines += ["## Timings", "", markdown(["model", "train (s)", "eval (s)", "train tokens/s", "train GFLOP/s", "steps"],
              [[k, str(v["train"]), str(v["eval"]), str(v.get("tokens_per_s", "-")), str(v.get("gflops", "-")),
                _steps(v)] for k, v in meta["timings_s"].items()]), ""]
    costs = extension_costs(meta)
    if costs:
        lines += ["## Extension costs", "", costs, ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


def _settings_lines(meta: dict) -> list[str]:
    """The report's "Settings" section: model, training, evaluation, extension methods, positions and data."""
    s = meta["settings"]
    m, t = s["model"], s["train"]
    data = meta.get("data") or {}
    recalibrated = [e for e in s["extensions"] if e in METHODS and METHODS[e].recalibrates]   # DroPE
    lines = [
        "## Settings (identical for every scheme" + (" but the steps listed per scheme)" if s.get("scheme_step_scale")
                                                       else ")"),
        "",
        f"- tasks: {', '.join(s['tasks'])}; schemes: {', '.join(s['schemes'])}; seeds: {s['seeds']}",
        f"- model: d_model {m['d_model']}, {m['n_layers']} layers, {m['n_heads']} heads "
        f"(head dim {m['d_model'] // m['n_heads']}), byte vocab {m['vocab_size']}, RoPE base {m['rope_base']:g} "
        f"({m['rope_layout']}), token embeddings scaled by sqrt(d_model): {'yes' if m['scale_embeddings'] else 'no'}"
        + ("" if m.get("bias", True) else ", no LayerNorm or MLP biases (MPT's block)")
        + (f", scheme options {m['scheme_options']}" if m.get("scheme_options") else ""),
        f"- training: length {s['train_len']}, batch {s['batch_size']}, {t['steps']} AdamW steps"
        + _scheme_steps(s.get("scheme_step_scale"), t["steps"])
        + f", lr {t['lr']:g} "
        f"(warmup {t['warmup']}, cosine to {t['min_lr_ratio']:g}x), weight decay {t['weight_decay']}, clip "
        f"{t['grad_clip']}"
        + (f", learned attention biases (T5, KERPLE, FIRE) at {t['bias_lr_scale']:g}x the learning rate"
           if t.get("bias_lr_scale", 1.0) != 1.0 else "")
        + (f"; sequence-length warmup first (length x steps, same tokens per step): "
           f"{', '.join(f'{a} x {b}' for a, b in s['length_warmup'])}" if s.get("length_warmup") else "")
        + (f"; each model trained until its criterion at the training length reached {s['train_until']:g} "
           f"(checked every {s['check_every']} steps; the step count is the cap)" if s.get("train_until") else ""),
        f"- evaluation lengths: {s['eval_lens']}; LM tokens scored per length: "
        + ", ".join(f"{scored_tokens(s['eval_tokens'], L)} at {L}" for L in s["eval_lens"])
        + " (whole windows of each length)",
        f"- extension methods on the {', '.join(s['extended_schemes'])} model: {', '.join(s['extensions']) or 'none'} "
        f"with factor {meta['extension_factor']:g} and original length = train length {s['train_len']}"
        + (f"; fine-tuned {s['finetune_steps']} steps at {s['finetune_len'] or max(s['eval_lens'])}"
           if s["finetune_steps"] else "")
        + ("; PoSE methods fine-tune at the train length" if any(e.startswith("pose-") for e in s["extensions"])
           else "")
        + (f"; {', '.join(recalibrated)} recalibrate{'s' if len(recalibrated) == 1 else ''} at the train length"
           if recalibrated and s["finetune_steps"] else ""),
    ]
    if s.get("randomized_positions"):
        which = (", ".join(s["randomized_schemes"]) + ", besides the plain models" if s.get("randomized_schemes")
                 else "every scheme, instead of plain positions")
        lines.append(f"- randomized positions (Ruoss et al. 2023): trained on sorted random positions < "
                     f"{s['randomized_positions']} ({which}); evaluated on plain positions")
    if data:
        lines.append(f"- data: {data.get('source')} ({data.get('n_files')} files, list hash "
                     f"{data.get('files_sha256')}, Python {data.get('python_version')}), train "
                     f"{data.get('train_bytes')} bytes, validation {data.get('val_bytes')} bytes, split "
                     f"{data.get('split')}")
    return lines


def _steps(timing: dict) -> str:
    if "steps" not in timing:
        return "-"
    return str(timing["steps"]) + ("" if timing.get("criterion_met", True) else " (cap, not met)")


def criterion_table(meta: dict) -> str:
    """With --train-until: per model (all seeds) the steps it trained, mean +- std, and how many met the
    criterion before the cap; "" otherwise."""
    by: dict[str, list] = {}
    for key, timing in meta["timings_s"].items():
        if "steps" in timing:
            by.setdefault(key.rsplit("/seed", 1)[0], []).append(timing)
    body = []
    for label, runs in by.items():
        steps = [r["steps"] for r in runs]
        std = statistics.stdev(steps) if len(steps) > 1 else 0.0  # sample std, as the result rows' (run.aggregate)
        body.append([label, f"{statistics.fmean(steps):.0f} +- {std:.0f}", ", ".join(map(str, steps)),
                     f"{sum(bool(r['criterion_met']) for r in runs)} of {len(runs)}"])
    return markdown(["model", "steps (mean +- std)", "per seed", "met the criterion"], body) if body else ""


def extension_costs(meta: dict) -> str:
    """One row per model and method: the search (a ``fit``) and the fine-tune (steps, length, batch, tokens,
    wall and CPU seconds), from results.json's meta["extensions"]."""
    from posenc.extensions import method_label

    body = []
    for key, info in (meta.get("extensions") or {}).items():
        for method, fit in (info.get("fit") or {}).items():
            body.append([key, method_label(method), f"search: {fit.get('evaluations')} evaluations", "", "",
                         str(fit.get("search_s", fit.get("wall_s"))), ""])
        for method, ft in (info.get("finetune") or {}).items():
            body.append([key, "plain RoPE" if method == "none" else method_label(method),
                         f"fine-tune ({ft['positions']} positions)", f"{ft['steps']} x {ft['batch']} x {ft['len']}",
                         f"{ft['tokens']:,}", str(ft["wall_s"]), str(ft["cpu_s"])])
    if not body:
        return ""
    return markdown(["model", "method", "stage", "steps x batch x length", "tokens", "wall s", "CPU s"], body)
