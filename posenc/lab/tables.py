"""How results look: model labels, display order and markdown cells, for the report, the tasks' tables and plots.

The order of schemes and extension methods is the registries' order (built-ins first, plug-ins after); labels
of methods come from the method registries (frequency and attention).
"""

from __future__ import annotations

from posenc.extensions import all_method_names, method_label
from posenc.schemes import scheme_names


def model_label(row: dict) -> str:
    """"rope + YaRN, zero-shot", "alibi", "rope, fine-tuned", "rope, positions randomized N=1024", ..."""
    label = row["scheme"]
    if row.get("positions"):  # trained on other than plain positions: "rope, positions randomized N=1024"
        label += f", positions {row['positions']}"
    if row["scaling"] != "none":
        label += f" + {method_label(row['scaling'])}"
    if row["finetuned"]:
        label += ", fine-tuned"
    elif row["scaling"] != "none":
        label += ", zero-shot"
    return label


def sort_key(row: dict):
    """Zero-shot before fine-tuned, then schemes and methods in registry order (unknown names last)."""
    schemes, methods = scheme_names(), ("none",) + all_method_names()
    s = schemes.index(row["scheme"]) if row["scheme"] in schemes else len(schemes)
    c = methods.index(row["scaling"]) if row["scaling"] in methods else len(methods)
    return (row["finetuned"], s, bool(row.get("positions")), c)


def fmt(row: dict | None, digits: int = 2, percent: bool = False) -> str:
    """A cell: value (± std over seeds), or the row's note when it has no value."""
    if row is None:
        return ""
    if row["value"] is None:
        return row.get("note", "n/a")
    v, sd = row["value"], row.get("std")
    if percent:
        return f"{100 * v:.0f}%" + (f" ± {100 * sd:.0f}" if sd is not None else "")
    return f"{v:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def bands_cell(row: dict) -> str:
    """Rotary pairs kept / blended / interpolated by the row's extension method ("" when not applicable)."""
    b = row.get("bands")
    if not b:
        return ""
    if "keeps" in b:  # an attention method: what it keeps instead of frequency bands
        return str(b["keeps"])
    keys = [k for k in ("kept", "blended", "interpolated") if k in b]
    return "/".join(str(b[k]) for k in keys) if keys else ""


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pivot(results: list[dict], task: str, metric: str, protocol: str | None = None, depth="any"):
    """-> (eval lengths, {model label: (first row, {eval_len: row})}) in display order."""
    rows = [r for r in results if r["task"] == task and r["metric"] == metric
            and (protocol is None or r.get("protocol") == protocol) and (depth == "any" or r.get("depth") == depth)]
    lens = sorted({r["eval_len"] for r in rows})
    table: dict[str, tuple[dict, dict]] = {}
    for r in sorted(rows, key=sort_key):
        table.setdefault(model_label(r), (r, {}))[1][r["eval_len"]] = r
    return lens, table
