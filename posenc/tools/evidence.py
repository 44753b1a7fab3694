"""Measured real-model evidence for ``posenc pick``: the studies committed under docs/results/*/results.json.

A real-model study (``"study": "real-model"``; scripts/smollm2_study.py writes docs/results/smollm2/results.json)
names its model by the config keys that fix its positions and size (``model``: model_type, hidden_size, layers,
heads, vocabulary, rope_theta, original context) and holds ``posenc eval``'s rows. ``matching_study(config)``
finds the study of the model a config describes (a config.json, a folder or a .gguf: posenc.tools._io.read_config);
``zero_shot(study, length)`` lists each method's measured perplexity at that length, best first. Nothing here is
typed in by hand: the picker cites what the files hold. In an install without the repository's docs/ there are no
studies, and the picker says so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent.parent / "docs" / "results"


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


def zero_shot(study: dict[str, Any], length: int) -> list[dict[str, Any]]:
    """Each method's perplexity at ``length`` (non-overlapping windows, zero-shot), best first, all on the same
    windows where the study has them: [{"method", "ppl" (over those windows), "std", "windows", "tokens", "part"}]."""
    by_method: dict[str, list[dict]] = {}
    for r in study.get("rows", []):
        if (r.get("task") == "lm" and r.get("eval_len") == length and r.get("value") is not None
                and not r.get("finetuned") and (r.get("protocol") or "non-overlapping") == "non-overlapping"):
            by_method.setdefault(r["scaling"], []).append(r)
    # every method is compared on the same tokens: the most windows all of them were measured on (a part that
    # measured some methods on more windows, from the same start, does not mix longer means with shorter ones)
    counts = [{r.get("n_scored") or 0 for r in rows} for rows in by_method.values()]
    common = set.intersection(*counts) if counts else set()
    n = max(common) if common else None
    out = []
    for method, rows in by_method.items():
        best = next((r for r in rows if (r.get("n_scored") or 0) == n), None) if n is not None else None
        best = best or max(rows, key=lambda r: r.get("n_scored") or 0)
        out.append({"method": method, "ppl": best["value"], "std": best.get("std"), "tokens": best.get("n_scored"),
                    "windows": (best.get("n_scored") or 0) // length, "part": best.get("part")})
    return sorted(out, key=lambda e: e["ppl"] if math.isfinite(e["ppl"]) else math.inf)
