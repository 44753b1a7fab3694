"""Measured real-model evidence for ``posenc pick``: the studies committed under docs/results/*/results.json.

A real-model study (``"study": "real-model"``; scripts/smollm2_study.py writes docs/results/smollm2/results.json)
names its model by the config keys that fix its positions and size (``model``: model_type, hidden_size, layers,
heads, vocabulary, rope_theta, original context) and holds ``posenc eval``'s rows. ``matching_study(config)``
finds the study of the model a config describes (a config.json, a folder or a .gguf: posenc.tools._io.read_config);
``zero_shot(study, length)`` lists each method's measured perplexity at that length, best first, every method
on the same windows. Nothing here is
typed in by hand: the picker cites what the files hold. In an install without the repository's docs/ there are no
studies, and the picker says so.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent.parent / "docs" / "results"
# a row without a "text" is of the study's first text: posenc's lab corpus, the CPython standard library's source
FIRST_TEXT = "cpython"


def studies(root: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """(path, document) of every real-model study under ``root`` (default: the repository's docs/results)."""
    root = RESULTS if root is None else Path(root)
    found = []
    for path in sorted(root.glob("*/results.json")) if root.is_dir() else []:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("study") == "real-model" and isinstance(doc.get("model"), dict):
            found.append((path, doc))
    return found


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The keys a study's ``model`` records, read from a config mapping (top-level or rope_parameters' theta)."""
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    out = {k: config.get(k) for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size")}
    theta = rope.get("rope_theta", config.get("rope_theta"))
    out["rope_theta"] = None if theta is None else float(theta)
    out["original_context"] = config.get("max_position_embeddings")
    return out


def matching_study(config, root: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The study whose model is the one ``config`` describes (every recorded key equal), or None."""
    from posenc.tools._io import read_config

    mine = identity(read_config(config))
    for path, doc in studies(root):
        theirs = {**doc["model"], "rope_theta": None if doc["model"].get("rope_theta") is None
                  else float(doc["model"]["rope_theta"])}
        if all(mine.get(k) == v for k, v in theirs.items()):
            return path, doc
    return None


def _blocks(rows: list[dict[str, Any]], length: int) -> list[tuple[frozenset, float, float, float]]:
    """A method's rows at ``length`` as (window starts covered, tokens scored, mean log-perplexity, perplexity): a row
    scores n_scored // length consecutive windows from its ``offset`` (the tokens skipped before its first window)."""
    out = []
    for r in rows:
        n = r.get("n_scored") or 0
        if n >= length and r["value"] > 0:
            start = int(r.get("offset") or 0)
            out.append((frozenset(range(start, start + (n // length) * length, length)), float(n),
                        math.log(r["value"]), float(r["value"])))
    return out


def _covers(blocks) -> dict[frozenset, tuple]:
    """Every window set a method's rows cover as a disjoint union -> the blocks (the fewest) that make it."""
    found: dict[frozenset, tuple] = {}
    for k in range(1, len(blocks) + 1):
        for combo in itertools.combinations(blocks, k):
            union = frozenset().union(*(b[0] for b in combo))
            if sum(len(b[0]) for b in combo) == len(union) and union not in found:
                found[union] = combo
    return found


def row_text(row: dict[str, Any]) -> str:
    """The text a study row was measured on (``FIRST_TEXT`` when the row names none)."""
    return row.get("text") or FIRST_TEXT


def other_texts(study: dict[str, Any]) -> list[str]:
    """The study's texts besides the first, sorted."""
    return sorted({row_text(r) for r in study.get("rows", [])} - {FIRST_TEXT})


def zero_shot(study: dict[str, Any], length: int, text: str | None = None) -> list[dict[str, Any]]:
    """Each method's perplexity at ``length`` (non-overlapping windows, zero-shot), best first, every method on the
    same windows: the largest set of windows that all of them were measured on. [{"method", "ppl" (over those
    windows' tokens), "std" (of the per-window perplexities, when each window was a row of its own and there are two
    or more; else None), "windows", "tokens", "part"}]. ``text``: only rows of that text (rows without one count as
    the study's first text)."""
    by_method: dict[str, list[dict]] = {}
    for r in study.get("rows", []):
        if (r.get("task") == "lm" and r.get("eval_len") == length and r.get("value") is not None
                and not r.get("finetuned") and (r.get("protocol") or "non-overlapping") == "non-overlapping"
                and not r.get("variant") and (text is None or row_text(r) == text)):
            by_method.setdefault(r["scaling"], []).append(r)
    covers = {m: _covers(_blocks(rows, length)) for m, rows in by_method.items()}
    common = set.intersection(*(set(c) for c in covers.values())) if covers else set()
    if not common:
        return []
    # the most windows; among equals the earliest (the windows a one-window study measured first)
    chosen = max(common, key=lambda s: (len(s), [-w for w in sorted(s)]))
    out = []
    for method, rows in by_method.items():
        combo = covers[method][chosen]
        tokens = sum(b[1] for b in combo)
        ppl = combo[0][3] if len(combo) == 1 else math.exp(sum(b[1] * b[2] for b in combo) / tokens)
        singles = [b[3] for b in combo if len(b[0]) == 1]
        std = statistics.stdev(singles) if len(singles) == len(combo) and len(singles) >= 2 else None
        parts = sorted({r.get("part") for r in rows if r.get("part")})
        out.append({"method": method, "ppl": ppl, "std": std, "tokens": int(tokens), "windows": len(chosen),
                    "offsets": sorted(chosen), "part": ", ".join(parts) if parts else None})
    return sorted(out, key=lambda e: e["ppl"] if math.isfinite(e["ppl"]) else math.inf)


def passkey_cells(study: dict[str, Any], length: int,
                  variant: str | None = None) -> dict[str, dict[float, tuple[float, int]]]:
    """The passkey rows at ``length``: {method: {depth: (exact-match rate, trials)}} (the trials per depth are the
    row's part's ``passkey_trials``; rows of several parts at the same method and depth, e.g. a second trial with
    other keys, pool their trials). Rows of a ``variant`` (a side check with other options) are left out unless
    ``variant`` names it."""
    found: dict[str, dict[float, tuple[int, int]]] = {}
    for r in study.get("rows", []):
        if (r.get("task") == "passkey" and r.get("eval_len") == length and r.get("value") is not None
                and r.get("variant") == variant):
            trials = int((study.get("parts", {}).get(r.get("part"), {}) or {}).get("passkey_trials") or 1)
            hits, n = found.setdefault(r["scaling"], {}).get(r["depth"], (0, 0))
            found[r["scaling"]][r["depth"]] = (hits + round(float(r["value"]) * trials), n + trials)
    return {m: {d: (hits / n, n) for d, (hits, n) in cells.items()} for m, cells in found.items()}


def passkey(study: dict[str, Any], length: int) -> dict[str, tuple[int, int]]:
    """Each method's passkey retrieval at ``length`` over every depth measured: {method: (keys found, trials)}."""
    return {m: (sum(round(v * t) for v, t in cells.values()), sum(t for _, t in cells.values()))
            for m, cells in passkey_cells(study, length).items()}
