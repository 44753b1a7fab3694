"""Tables for the terminal and report.md, built from a results document {"meta", "results", "curves"}."""

from __future__ import annotations

from pathlib import Path

from posenc._atomic import atomic_write_text

SCHEME_ORDER = ["nope", "sinusoidal", "learned", "rope", "alibi", "rope+alibi"]
SCALING_ORDER = ["none", "linear", "ntk", "dynamic", "yarn", "llama3"]
SCALING_LABEL = {"linear": "PI", "ntk": "NTK-aware", "dynamic": "dynamic NTK", "yarn": "YaRN",
                 "llama3": "Llama 3"}


def model_label(row: dict) -> str:
    label = row["scheme"]
    if row["scaling"] != "none":
        label += f" + {SCALING_LABEL.get(row['scaling'], row['scaling'])}"
    if row["finetuned"]:
        label += ", fine-tuned"
    elif row["scaling"] != "none":
        label += ", zero-shot"
    return label


def _sort_key(row: dict):
    s = SCHEME_ORDER.index(row["scheme"]) if row["scheme"] in SCHEME_ORDER else 99
    c = SCALING_ORDER.index(row["scaling"]) if row["scaling"] in SCALING_ORDER else 99
    return (row["finetuned"], s, c)


def fmt(row: dict | None, digits: int = 2, percent: bool = False) -> str:
    if row is None:
        return ""
    if row["value"] is None:
        return row.get("note", "n/a")
    v, sd = row["value"], row.get("std")
    if percent:
        return f"{100 * v:.0f}%" + (f" ± {100 * sd:.0f}" if sd is not None else "")
    return f"{v:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def _bands(row: dict) -> str:
    b = row.get("bands")
    if not b:
        return ""
    keys = [k for k in ("kept", "blended", "interpolated") if k in b]
    return "/".join(str(b[k]) for k in keys) if keys else ""


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _pivot(results: list[dict], task: str, metric: str, protocol: str | None = None, depth="any"):
    """-> (eval lengths, {model label: (first row, {eval_len: row})}) in display order."""
    rows = [r for r in results if r["task"] == task and r["metric"] == metric
            and (protocol is None or r.get("protocol") == protocol) and (depth == "any" or r.get("depth") == depth)]
    lens = sorted({r["eval_len"] for r in rows})
    table: dict[str, tuple[dict, dict]] = {}
    for r in sorted(rows, key=_sort_key):
        table.setdefault(model_label(r), (r, {}))[1][r["eval_len"]] = r
    return lens, table


def lm_table(results: list[dict], protocol: str = "non-overlapping") -> str:
    lens, table = _pivot(results, "lm", "ppl", protocol)
    if not table:
        return ""
    train_len = next(iter(table.values()))[0]["train_len"]
    has_bands = any(_bands(first) for first, _ in table.values())
    header = ["model"] + (["bands k/b/i"] if has_bands else []) + [f"{L} ({L / train_len:g}x)" for L in lens]
    body = [[label] + ([_bands(first)] if has_bands else []) + [fmt(cells.get(L)) for L in lens]
            for label, (first, cells) in table.items()]
    return _markdown(header, body)


def copy_table(results: list[dict]) -> str:
    lens, em = _pivot(results, "copy", "exact_match")
    _, acc = _pivot(results, "copy", "token_accuracy")
    if not em:
        return ""
    body = []
    for label, (first, cells) in em.items():
        acc_cells = acc.get(label, (None, {}))[1]
        body.append([label] + [_pair(cells.get(L), acc_cells.get(L)) for L in lens])
    return _markdown(["model"] + [f"{L} (EM / token acc)" for L in lens], body)


def _pair(em: dict | None, acc: dict | None) -> str:
    if em is None or em["value"] is None:
        return fmt(em)
    return f"{fmt(em, percent=True)} / {fmt(acc, percent=True)}"


def passkey_table(results: list[dict]) -> str:
    rows = [r for r in results if r["task"] == "passkey"]
    if not rows:
        return ""
    lens = sorted({r["eval_len"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    by_model: dict[str, dict] = {}
    for r in sorted(rows, key=_sort_key):
        by_model.setdefault(model_label(r), {})[(r["eval_len"], r["depth"])] = r
    body = []
    for label, cells in by_model.items():
        row = [label]
        for L in lens:
            vals = [cells[(L, d)]["value"] for d in depths if (L, d) in cells]
            row.append(cells[(L, depths[0])].get("note", "n/a") if None in vals
                       else f"{100 * sum(vals) / len(vals):.0f}% (" + " ".join(f"{100 * v:.0f}" for v in vals) + ")")
        body.append(row)
    depth_txt = ", ".join(f"{d:g}" for d in depths)
    return _markdown(["model"] + [f"{L}: mean (depths {depth_txt})" for L in lens], body)


def main_table(doc: dict) -> str:
    """The tables printed at the end of a run."""
    res = doc["results"]
    parts = []
    if any(r["task"] == "lm" for r in res):
        parts.append("Perplexity (byte-level, non-overlapping windows), train length "
                     f"{res[0]['train_len']}:\n" + lm_table(res))
        sliding = sorted({r["protocol"] for r in res if r["task"] == "lm" and r["protocol"].startswith("sliding")})
        for p in sliding:
            parts.append(f"Perplexity, {p}:\n" + lm_table(res, p))
    if any(r["task"] == "copy" for r in res):
        parts.append("Copy task (teacher-forced argmax; exact match / token accuracy):\n" + copy_table(res))
    if any(r["task"] == "passkey" for r in res):
        parts.append("Passkey retrieval (greedy decode, exact match):\n" + passkey_table(res))
    return "\n\n".join(parts)


def write_report(doc: dict, out: Path) -> Path:
    """Write report.md and the plots into ``out``."""
    from posenc.lab.plots import make_plots

    meta = doc["meta"]
    s = meta["settings"]
    plots = make_plots(doc, out)
    data = meta.get("data") or {}
    lines = [
        f"# posenc lab: preset `{meta['preset']}`",
        "",
        f"Measured wall time: **{meta['wall_s']:.0f} s** on {meta['device']} ({meta['threads']} threads), "
        f"started {meta['started']}; Python {meta['python']}, torch {meta['torch']}; load average (1/5/15 min) "
        f"{meta.get('loadavg_start')} at the start, {meta.get('loadavg_end')} at the end.",
        "",
        "## Settings (identical for every scheme)",
        "",
        f"- tasks: {', '.join(s['tasks'])}; schemes: {', '.join(s['schemes'])}; seeds: {s['seeds']}",
        f"- model: d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads "
        f"(head dim {s['d_model'] // s['n_heads']}), byte vocab 256, RoPE base {s['rope_base']:g} ({s['rope_layout']}), "
        f"token embeddings scaled by sqrt(d_model): {'yes' if s.get('scale_embeddings', True) else 'no'}",
        f"- training: length {s['train_len']}, batch {s['batch_size']}, {s['steps']} AdamW steps, lr {s['lr']:g} "
        f"(warmup {s['warmup']}, cosine), weight decay {s['weight_decay']}, clip {s['grad_clip']}",
        f"- evaluation lengths: {s['eval_lens']}; LM tokens scored per length: {s['eval_tokens']}",
        f"- extension methods on the RoPE model: {', '.join(s['extensions']) or 'none'} with factor "
        f"{meta['extension_factor']:g} and original length = train length {s['train_len']}"
        + (f"; fine-tuned {s['finetune_steps']} steps at {s['finetune_len'] or max(s['eval_lens'])}"
           if s["finetune_steps"] else ""),
    ]
    if data:
        lines.append(f"- data: {data.get('source')} ({data.get('n_files')} files, list hash {data.get('files_sha256')}, "
                     f"Python {data.get('python_version')}), train {data.get('train_bytes')} bytes, validation "
                     f"{data.get('val_bytes')} bytes, split {data.get('split')}")
    lines += ["", "## Results", "", main_table(doc), "",
              "Notes: `n/a (table = N)`: a learned position table has no row past its training length, so the model "
              "cannot run there (nothing is clamped). `bands k/b/i`: rotary pairs kept / blended / interpolated by "
              "the method at this head dimension. Dynamic NTK uses transformers' formula with factor 1, i.e. the "
              "static NTK base for exactly (length / train length) at each length.", ""]
    for name in plots:
        lines += [f"![{name}]({name})", ""]
    lines += ["## Timings (s)", "", _markdown(["model", "train", "eval"],
              [[k, str(v["train"]), str(v["eval"])] for k, v in meta["timings_s"].items()]), ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))
