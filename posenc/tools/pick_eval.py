"""The picker's evidence from ``posenc eval``: ``posenc pick --config MODEL --evidence DIR`` where DIR is the --out
folder of an eval of that model (its results.json), cited as what was measured on the user's own model.

An eval of a model ``posenc finetune`` wrote (its finetune.json beside the evaluated folder: DIR/model and
DIR/finetune.json) is cited as measured on this fine-tuned model, with the fine-tune's method, steps and tokens;
an eval of any other model as measured zero-shot on it. Its passkey and RULER rows are cited beside the
perplexities (posenc.tools.pick_retrieval), with a note when the method with the lowest perplexity retrieves
clearly worse. A folder that is neither a finished tune nor a finished eval, a damaged file, or an eval of another
model than --config describes is one line naming --evidence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc._internal.errors import ConfigError, PosencError
from posenc.tools.pick_rules import Recommendation

# the keys every posenc eval results.json holds (posenc.hf.eval.loop.evaluate_model) and its meta's
EVAL_KEYS = ("meta", "results", "curves")
META_KEYS = ("model", "settings", "model_files", "methods")


def _fail(folder, text: str) -> PosencError:
    return PosencError(f"evidence {folder} (--evidence): {text}")


def read_evidence(folder) -> dict[str, Any]:
    """DIR/results.json as JSON; PosencError naming --evidence when it is missing, unreadable or not an object."""
    path = Path(folder) / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(folder, f"expected a posenc tune or posenc eval output folder with results.json, cannot read "
                            f"{path} ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise _fail(folder, f"{path} is not a posenc tune or posenc eval result (not a JSON object)")
    return doc


def is_eval_result(doc: dict[str, Any]) -> bool:
    """Whether a results.json document is a posenc eval's (its meta, results and curves), not a tune's."""
    return all(k in doc for k in EVAL_KEYS) and isinstance(doc["meta"], dict) and "identity" not in doc


def _model_identity(config) -> dict[str, Any]:
    """The identity posenc.tools.evidence records, with the trained (original) context: a fine-tune of a model
    and the model itself share it, while another model's sizes, base or context differ."""
    from posenc.rope.contexts import trained_length
    from posenc.tools._io import read_config
    from posenc.tools.evidence import identity

    raw = read_config(config)
    out = identity(raw)
    try:
        out["original_context"] = trained_length(raw) or out["original_context"]
    except (ValueError, KeyError, TypeError):   # a config posenc cannot read RoPE from: its stated context
        pass
    return out


def read_eval_result(folder, config) -> tuple[dict[str, Any], Path]:
    """A finished posenc eval in ``folder`` of the model ``config`` describes -> (its document, the evaluated
    model folder); PosencError naming --evidence otherwise."""
    from posenc._internal.fingerprint import file_fingerprint
    from posenc.gguf import gguf_config
    from posenc.tools.evidence import differing_keys

    doc = read_evidence(folder)
    meta = doc.get("meta") or {}
    if not is_eval_result(doc) or any(k not in meta for k in META_KEYS) or not isinstance(doc["results"], list):
        raise _fail(folder, f"{Path(folder) / 'results.json'} is not a finished posenc eval result (expected the "
                            f"keys {', '.join(EVAL_KEYS)} and its meta's {', '.join(META_KEYS)})")
    if meta.get("incomplete"):
        raise _fail(folder, "the eval is interrupted (posenc eval --resume finishes it); pass a finished one")
    model = Path(str(meta["model"]))
    # the config the eval loaded: its --config file, else the folder's config.json (a GGUF file: its own bytes)
    evaluated = Path(str(meta["config"])) if meta.get("config") else (model if model.is_file()
                                                                        else model / "config.json")
    try:
        mine = file_fingerprint(evaluated)
        theirs = _model_identity(evaluated if evaluated.suffix == ".json" else gguf_config(evaluated))
    except (OSError, ConfigError) as exc:
        raise _fail(folder, f"the evaluated model {model} (recorded in its results.json) cannot be read "
                            f"({type(exc).__name__}): its config and finetune.json are read from it") from None
    if mine not in meta["model_files"]:
        raise _fail(folder, f"{evaluated} differs from the file the eval measured (changed since): run the eval "
                            "again")
    differ = differing_keys(_model_identity(config), theirs)
    if differ:
        raise _fail(folder, f"the eval measured another model ({model}; its {', '.join(differ)} "
                            f"{'differs' if len(differ) == 1 else 'differ'} from --config's): pass an eval of "
                            "this model")
    return doc, model


def _perplexities(doc: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Eval length -> method -> perplexity (the mean of its non-overlapping lm rows; a sliding-only length its
    sliding rows)."""
    rows = [r for r in doc["results"] if isinstance(r, dict) and r.get("task") == "lm" and r.get("metric") == "ppl"
            and isinstance(r.get("value"), (int, float))]
    out: dict[int, dict[str, list]] = {}
    for r in sorted(rows, key=lambda r: r.get("protocol") != "non-overlapping"):
        by_method = out.setdefault(int(r["eval_len"]), {})
        chosen = by_method.setdefault(r["scaling"], (r.get("protocol"), []))
        if chosen[0] == r.get("protocol"):
            chosen[1].append(float(r["value"]))
    return {L: {m: sum(v) / len(v) for m, (_, v) in ms.items()} for L, ms in out.items()}


def _ppl_sentence(table: dict[int, dict[str, float]], folder, record: dict | None, T: int) -> str:
    """What the eval measured of perplexity at the target (else its longest length): on this fine-tuned model (with
    the fine-tune's method, steps and tokens) or zero-shot on this model, each method's perplexity."""
    from posenc.tools.finetune_record import describe

    source = f"posenc eval, {folder}/results.json"
    if not table:       # an eval of retrieval only (posenc eval --tasks ruler)
        what = (f"measured on this fine-tuned model ({describe(record)}; {source})" if record is not None else
                f"measured zero-shot on this model ({source})")
        return what + ", no perplexity rows (posenc eval --tasks lm measures them)"
    N = T if T in table else max(table)
    where = "" if N == T else f" (not measured at the target {T:,}; the eval's longest length)"
    if record is not None:
        own = table[N].get("none")
        others = {m: p for m, p in table[N].items() if m != "none"}
        text = (f"measured on this fine-tuned model: perplexity {own:.2f} at length {N:,}{where} ({describe(record)};"
                f" {source})" if own is not None else
                f"measured on this fine-tuned model ({describe(record)}; {source}) at length {N:,}{where}")
        if others:
            text += "; with other methods on it: " + ", ".join(f"{m} {p:.2f}" for m, p in sorted(
                others.items(), key=lambda kv: kv[1]))
        return text
    ranked = ", ".join(f"{m} {p:.2f}" for m, p in sorted(table[N].items(), key=lambda kv: kv[1]))
    return (f"measured zero-shot on this model ({source}): perplexity at length {N:,}{where}, best first: "
            f"{ranked} (none: the model as its config runs it)")


def eval_summary(doc: dict[str, Any], folder, record: dict | None, T: int) -> tuple[str, str | None]:
    """(the citation, the note or None): what the eval measured at the target (else its longest length), its
    perplexities (``_ppl_sentence``) and, when it measured them, its passkey and RULER scores per method
    (posenc.tools.pick_retrieval); the note when the method with the lowest perplexity retrieves clearly worse."""
    from posenc.tools.pick_retrieval import cite, from_eval, worse_note

    table = _perplexities(doc)
    retrieval = from_eval(doc, T)
    if not table and retrieval is None:
        raise _fail(folder, "the eval holds no perplexity or retrieval rows (posenc eval --tasks lm,passkey,ruler "
                            "measures them)")
    text = _ppl_sentence(table, folder, record, T)
    if retrieval is None:
        return text, None
    N = (T if T in table else max(table)) if table else None
    order = sorted(table[N], key=table[N].get) if table else []
    note = worse_note(retrieval, order[0], f"{table[N][order[0]]:.2f} at length {N:,}") if order else None
    return f"{text}; {cite(retrieval, T, order)}", note


def eval_evidence(rec: Recommendation, folder, config, budget: str, T: int) -> None:
    """Cite the eval in ``folder`` (read_eval_result) among the reasons, as measured on this (fine-tuned) model;
    with --budget pretrain among the notes (a new model does not build on these weights)."""
    from posenc.tools.finetune_record import finetune_record

    doc, model = read_eval_result(folder, config)
    try:
        record = finetune_record(model)
    except ConfigError as exc:
        raise _fail(folder, f"the evaluated model's fine-tune record: {exc}") from None
    measured, note = eval_summary(doc, folder, record, T)
    if note is not None:
        rec.notes.append(note)
    if budget == "pretrain":
        rec.notes.append(measured + ": a new model is pretrained from scratch, so the recommendation does not "
                                    "build on these weights")
    else:
        rec.reasons.insert(0, measured)
