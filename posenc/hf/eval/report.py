"""What ``posenc eval`` writes: the lab's tables (or side-by-side tables when the model's trained length is unknown),
results.json, report.md and the lab's plots in ``--out``, checked before the run and written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

from posenc._internal.errors import ConfigError
from posenc.hf.eval.settings import attention_methods

# what --out receives; a folder already holding one of them (a lab run, an earlier eval) needs --overwrite
OUTPUT_FILES = ("results.json", "report.md", "ppl_vs_length.png", "per_position_loss.png", "passkey_accuracy.png")


def check_out_folder(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """``out_dir`` as a folder ``write_outputs`` may write into, checked before any evaluation: not a file, not
    holding any of ``OUTPUT_FILES`` (results.json, report.md, the plots) unless ``overwrite`` (a lab run's, an
    earlier eval's), and writable."""
    from posenc._internal.atomic import check_writable_folder

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {out_dir}: exists and is not a folder")
    held = [name for name in OUTPUT_FILES if (out / name).exists()]
    if held and not overwrite:
        listed = held[0] if len(held) == 1 else f"{', '.join(held[:-1])} and {held[-1]}"
        what = "a lab run or an earlier eval"
        try:
            if json.loads((out / "results.json").read_text(encoding="utf-8"))["meta"].get("incomplete"):
                what = ("an interrupted eval: --resume continues it with the same settings, --overwrite runs "
                        "every method again")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        raise ConfigError(f"out {out_dir}: already holds {listed} ({what}); pass overwrite (--overwrite) to replace "
                          "them, or choose another folder")
    check_writable_folder(out, f"out {out_dir} (--out)")
    return out


def _lab_readable(doc: dict) -> bool:
    """The lab's tables and plots place lengths against the training length: they need it on every row."""
    return bool(doc["results"]) and all(r.get("train_len") for r in doc["results"])


def report_tables(doc: dict) -> str:
    """The lab's tables for these rows (posenc.lab.report.main_table: one per task and protocol, rows = model and
    method side by side); ``side_by_side`` when the model's original context is unknown."""
    from posenc.hf.lab_bridge import lab_tables

    return lab_tables(doc) if _lab_readable(doc) else side_by_side(doc)


def side_by_side(doc: dict) -> str:
    """Markdown tables, one per task and metric: rows = method and protocol (rows with a depth: the mean over the
    depths), columns = eval length; a bounded metric (an accuracy) with 2 decimals, others with 3."""
    from posenc.lab.tasks.checks import value_range
    from posenc.lab.tasks.registry import TASKS

    out = []
    for task, metric in dict.fromkeys((r["task"], r["metric"]) for r in doc["results"]):
        sel = [r for r in doc["results"] if r["task"] == task and r["metric"] == metric]
        lens = sorted({r["eval_len"] for r in sel})
        groups: dict = {}
        for r in sel:
            sub = r.get("protocol") or ("mean over depths" if r.get("depth") is not None else "")
            groups.setdefault((r["scaling"], sub), {}).setdefault(r["eval_len"], []).append(r["value"])
        spec = ".2f" if value_range(TASKS.get(task), metric) else ".3f"
        out.append(f"{task} {metric}\n\n| method | protocol | " + " | ".join(str(L) for L in lens)
                   + " |\n|---|---|" + "---|" * len(lens))
        for (method, sub), by_len in groups.items():
            cells = ["-" if not by_len.get(L) else "n/a" if None in by_len[L]
                     else format(sum(by_len[L]) / len(by_len[L]), spec) for L in lens]
            out.append(f"| {method} | {sub} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def write_results(doc: dict, out_dir: str) -> Path:
    from posenc._internal.atomic import atomic_write_json

    path = Path(out_dir) / "results.json"
    atomic_write_json(path, doc)
    return path


def write_outputs(doc: dict, out_dir: str, *, overwrite: bool = False) -> list[Path]:
    """results.json, the lab's plots and report.md into ``out_dir`` (created) -> the paths written. A folder already
    holding any of them (a lab run, an earlier eval) is refused unless ``overwrite``, which also removes an earlier
    run's plot this one does not make."""
    from posenc._internal.atomic import atomic_write_text
    from posenc.hf.lab_bridge import lab_plots

    out = check_out_folder(out_dir, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_results(doc, out)]
    plots = lab_plots(doc, out) if _lab_readable(doc) else []
    written += [out / name for name in plots]
    written.append(atomic_write_text(out / "report.md", report_markdown(doc, plots)))
    for name in OUTPUT_FILES:          # an earlier run's plot this run did not make would sit beside its report
        if out / name not in written and (out / name).is_file():
            (out / name).unlink()
    return written


def _data_line(meta: dict) -> str:
    """report.md's line on the text perplexity was scored on: its source and which part of it (--data-split)."""
    data, split = meta["data"], meta["settings"].get("data_split", "validation")
    scored = meta.get("scored_text") or "its validation split"
    size = data.get("val_bytes") if split == "validation" else (data.get("train_bytes") or 0) + (data.get("val_bytes")
                                                                                                 or 0)
    return (f"- data: {data.get('source')} ({data.get('n_files')} files); scored: {scored}, {size} bytes, from "
            f"token {meta['settings'].get('eval_offset') or 0} (--eval-offset)")


def _task_setting_lines(s: dict) -> list[str]:
    """report.md's line per task that declares settings: their values as run (and the seed)."""
    from posenc.lab.tasks.registry import TASKS

    lines = []
    for name in s["tasks"]:
        declared = [d.name for d in getattr(TASKS.get(name), "settings", ()) if d.name in s]
        if declared:
            lines.append(f"- {name}: " + ", ".join(f"{k} {s[k]}" for k in declared) + f"; seed {s['seed']}")
    return lines


def report_markdown(doc: dict, plots: list[str] = ()) -> str:
    """report.md: what was measured, on what, how long; the lab's tables and plots."""
    meta, s = doc["meta"], doc["meta"]["settings"]
    tokens = ("the model's byte tokenizer: the corpus bytes, the lab's stream" if meta["byte_tokens"]
              else "the model's tokenizer (lengths count its tokens)")
    data = meta.get("data") or {}
    lines = [f"# posenc eval: `{meta['model']}`", "",
             f"Measured wall time: **{meta['wall_s']:.0f} s** on {s['device']} ({s['dtype']}, {meta['threads']} "
             f"threads), started {meta['started']}; Python {meta['python']}, torch {meta['torch']}, "
             f"{meta['platform']}, {meta.get('cpu', 'CPU not recorded')}.", "", "## Settings", "",
             f"- tasks: {', '.join(s['tasks'])}; evaluation lengths: {s['eval_lens']} tokens; tokens: {tokens}",
             f"- perplexity: about {s['eval_tokens']} tokens scored per length "
             f"({s.get('sliding_tokens') or s['eval_tokens']} per sliding length); "
             f"sliding stride {s['sliding_stride']} "
             f"(-1: half the length, 0: off) on {s['sliding_lens'] or [max(s['eval_lens'])]}"]
    lines += _task_setting_lines(s)
    if data:
        lines.append(_data_line(meta))
    for method, m in meta["methods"].items():
        what = ("the config as it is" if method == "none" else
                f"{method} on attention through posenc.patch" if attention_methods([method]) else
                f"{method} at factor {s['factor']:g}")
        lines.append(f"- method {method}: {what}; scheme {m['scheme']}, original context {m['original_context']}, "
                     f"attention {m.get('attention_path') or m['attn_implementation']}"
                     + (f"; config: {'; '.join(m['changes'])}" if m["changes"] else ""))
    lines += ["", "## Results", "", report_tables(doc), ""]
    lines += [line for name in plots for line in (f"![{name}]({name})", "")]
    lines += ["## Timings (s)", "", "| method | load + evaluate |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["timings_s"].items()]
    return "\n".join(lines) + "\n"
