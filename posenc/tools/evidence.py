"""Measured evidence for ``posenc pick``: extracts of the studies under docs/results/, shipped inside the package.

A real-model study (``"study": "real-model"``; scripts/smollm2_study.py writes docs/results/smollm2/results.json)
names its model by the config keys that fix its positions and size (``model``: model_type, hidden_size, layers,
heads, vocabulary, rope_theta, original context) and holds ``posenc eval``'s rows. What the picker reads of it,
and the lab's numbers posenc cites (posenc.tools.lab_evidence), ships in
``posenc/tools/measured/<study>/results.json`` (read through ``importlib.resources``, so an installed wheel cites the
same numbers as a checkout): ``extract_study`` and ``extract_lab`` make those files from the full results, the
study command writes them, and a test checks them against docs/results/. ``matching_study(config)`` finds the study
of the model a config describes (a config.json, a folder or a .gguf: posenc.tools._io.read_config);
``zero_shot(study, length)`` lists each method's measured perplexity at that length, best first, every method on
the same windows. Nothing here is typed in by hand: the picker cites what the files hold.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

# the packaged extracts: one folder per study, each with a results.json (a Traversable: a Path in a normal install)
RESULTS = resources.files("posenc.tools").joinpath("measured")
# the row keys the picker reads (zero_shot, passkey_cells); an extract keeps these and drops timings and machine
ROW_KEYS = ("task", "scheme", "scaling", "finetuned", "train_len", "eval_len", "metric", "value", "values", "std",
            "protocol", "depth", "n_scored", "part", "text", "offset", "variant")
# a row without a "text" is of the study's first text: posenc's lab corpus, the CPython standard library's source
FIRST_TEXT = "cpython"


def _results_files(root) -> list:
    """``root/*/results.json`` for a Path or an importlib.resources Traversable, sorted by folder name."""
    if not root.is_dir():
        return []
    folders = sorted((f for f in root.iterdir() if f.is_dir()), key=lambda f: f.name)
    return [f.joinpath("results.json") for f in folders if f.joinpath("results.json").is_file()]


def read_results(name: str, root=None) -> dict[str, Any] | None:
    """The packaged (or ``root``'s) ``name/results.json`` as a dict, or None when it is missing or unreadable."""
    path = (RESULTS if root is None else Path(root)).joinpath(name, "results.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def studies(root: Path | None = None, kind: str = "real-model") -> list[tuple[Path, dict[str, Any]]]:
    """(path, document) of every study of ``kind`` ("real-model", or "real-model-finetune": the fine-tune studies
    posenc.tools.pick_finetune reads) under ``root`` (default: the packaged extracts)."""
    root = RESULTS if root is None else Path(root)
    found = []
    for path in _results_files(root):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("study") == kind and isinstance(doc.get("model"), dict):
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
        if not differing_keys(mine, doc["model"]):
            return path, doc
    return None


def differing_keys(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The keys of a recorded model identity ``theirs`` (a study's ``model``, a tune's ``identity``) on which the
    identity ``mine`` differs (rope_theta compared as a float); [] for the same model."""
    theta = theirs.get("rope_theta")
    theirs = {**theirs, "rope_theta": None if theta is None else float(theta)}
    return [k for k, v in theirs.items() if mine.get(k) != v]


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


def _keep(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ROW_KEYS if k in row}


def extract_study(study: dict[str, Any], name: str) -> dict[str, Any]:
    """What the picker reads of a real-model study's full results.json (``name``: its folder under docs/results):
    identity, rows (ROW_KEYS), each part's passkey trials, the searched LongRoPE factors, and where the full study
    is, for citations."""
    out = {k: study[k] for k in ("study", "name", "source", "model") if k in study}
    out["results"] = f"docs/results/{name}/results.json"
    out["report"] = f"docs/results/{name}/report.md"
    out["parts"] = {p: {"passkey_trials": v.get("passkey_trials")} for p, v in (study.get("parts") or {}).items()
                    if isinstance(v, dict) and v.get("passkey_trials")}
    search = study.get("search")
    if isinstance(search, dict) and isinstance(search.get("rope_parameters"), dict):
        out["search"] = {k: search[k] for k in ("rope_parameters", "max_position_embeddings", "config", "command")
                         if k in search}
    out["rows"] = [_keep(r) for r in study.get("rows", [])]
    return out


# the rows each lab extract keeps (a row is kept when it matches one of its study's selectors: every key's value
# among the listed ones; a missing key reads None): what posenc.tools.lab_evidence's sentences cite and the copy-cpu
# count reads, at the lengths they name. tests/tools/test_evidence_data.py formats every sentence from the extracts.
_NON_OVERLAPPING = ("non-overlapping",)
LAB_ROWS: dict[str, tuple[dict[str, tuple], ...]] = {
    "copy-cpu": ({"metric": ("exact_match",)},
                 {"metric": ("token_accuracy",), "eval_len": (256, 512)}),
    "default": ({"scheme": ("rope", "alibi"), "protocol": _NON_OVERLAPPING},),
    "schemes": ({"eval_len": (128, 1024), "protocol": _NON_OVERLAPPING, "positions": (None,)},),
    "attention-extension": ({"eval_len": (128, 1024), "protocol": _NON_OVERLAPPING},),
}


def extract_finetune(study: dict[str, Any], name: str) -> dict[str, Any]:
    """What the picker reads of a real-model fine-tune study (scripts/smollm2_finetune.py): identity, each run's
    method, steps, tokens and training time, the rows (ROW_KEYS, the run, and the zero-shot perplexities on the
    same windows) and where the full study is."""
    keep = ("steps", "tokens", "train_s", "tokens_per_s", "peak_rss_bytes", "mfu", "torch_threads", "extension")
    out = {k: study[k] for k in ("study", "name", "model") if k in study}
    out["results"] = f"docs/results/{name}/results.json"
    out["report"] = f"docs/results/{name}/report.md"
    out["runs"] = {run: {k: (r.get("finetune") or {}).get(k) for k in keep} for run, r in study.get("runs", {}).items()}
    out["rows"] = [{**_keep(r), "run": r.get("run"), **({"zero_shot": r["zero_shot"]} if "zero_shot" in r else {})}
                   for r in study.get("rows", [])]
    return out


EXTRACTORS = {"real-model": extract_study, "real-model-finetune": extract_finetune}


def _selected(row: dict[str, Any], selectors) -> bool:
    return any(all(row.get(k) in allowed for k, allowed in sel.items()) for sel in selectors)


def extract_lab(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """What posenc cites of a lab preset's results.json (``name``: its folder under docs/results): the rows
    ``LAB_ROWS[name]`` selects (exact-match rows for a study it does not name), their settings kept (ROW_KEYS)."""
    selectors = LAB_ROWS.get(name, ({"metric": ("exact_match",)},))
    return {"study": "lab", "preset": (doc.get("meta") or {}).get("preset"),
            "results": f"docs/results/{name}/results.json",
            "rows": [_keep(r) for r in doc.get("results", []) if _selected(r, selectors)]}


def write_extracts(docs_results: Path, names: dict[str, str], out=None) -> list[Path]:
    """Write the packaged extract of each ``docs_results/NAME/results.json`` (``names``: NAME -> a kind of
    EXTRACTORS, or "lab") under ``out`` (default: the package's measured/ folder), atomically. Returns the files written."""
    from posenc._internal.atomic import atomic_write_json

    out = Path(str(RESULTS)) if out is None else Path(out)
    written = []
    for name, kind in names.items():
        doc = json.loads((docs_results / name / "results.json").read_text(encoding="utf-8"))
        extract = EXTRACTORS.get(kind, extract_lab)(doc, name)
        target = out / name / "results.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(target, extract)
        written.append(target)
    return written


# the studies whose extracts ship with posenc (scripts/evidence.py writes them; tests/tools/test_evidence_data.py
# checks them against docs/results/)
SHIPPED = {"smollm2": "real-model", "smollm2-finetune": "real-model-finetune", "copy-cpu": "lab", "default": "lab", "schemes": "lab",
           "attention-extension": "lab"}
