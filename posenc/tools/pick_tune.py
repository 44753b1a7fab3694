"""The picker's evidence from ``posenc tune``: a tune result of this very model (``posenc pick --evidence DIR``), or,
without one, a label on the committed real-model studies that measured another model.

``read_tune_result(dir, config)`` reads DIR/results.json and refuses (one line naming --evidence) a file that is not
a finished tune result or that measured another model (the model identity posenc.tools.evidence records).
``tune_evidence`` cites its winner, runners-up and paired differences (and the survivors' passkey and RULER
scores, with a note when the lowest perplexity retrieves clearly worse: posenc.tools.pick_retrieval), and makes a
config winner the recommendation (the config tune wrote is the one it measured). ``other_model_evidence`` names
the studies of other models as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc._internal.errors import PosencError
from posenc.tools.pick_rules import Recommendation, alt

# the keys every finished tune results.json holds (posenc.hf.tune.command.Tune.document)
TUNE_KEYS = ("identity", "target", "trained", "answer", "race", "deploy", "winner_kind")


def _keys(differ: list[str]) -> str:
    return f"{', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'}"


def read_tune_result(folder, config) -> dict[str, Any]:
    """DIR/results.json of a finished ``posenc tune`` of the model ``config`` describes; PosencError naming
    --evidence for a missing or unreadable file, one that is not a finished tune result, or another model's."""
    from posenc.tools._io import read_config
    from posenc.tools.evidence import differing_keys, identity

    path = Path(folder) / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PosencError(f"evidence {folder} (--evidence): expected a posenc tune output folder with results.json, "
                          f"cannot read {path} ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("incomplete") or any(k not in doc for k in TUNE_KEYS):
        raise PosencError(f"evidence {folder} (--evidence): {path} is not a finished posenc tune result (expected "
                          f"the keys {', '.join(TUNE_KEYS)}; an interrupted tune continues with --resume) nor a "
                          "posenc eval result")
    differ = differing_keys(identity(read_config(config)), doc["identity"])
    if differ:
        raise PosencError(f"evidence {folder} (--evidence): tune measured another model ({doc.get('model')}; its "
                          f"{_keys(differ)} from --config's): pass the tune of this model")
    return doc


def _num(x) -> str:
    return "n/a" if x is None else f"{x:+.4f}"


def _runner(r: dict[str, Any]) -> str:
    sd = "n/a" if r["sd"] is None else f"{r['sd']:.4f}"
    return (f"{r['name']} {_num(r['diff_to_best'])} (sd {sd}, {r['shared_windows']} paired window"
            f"{'s' if r['shared_windows'] != 1 else ''}"
            + (", tie)" if r["tie"] else ")"))


def tune_summary(doc: dict[str, Any], folder) -> str:
    """One sentence: the winner, every runner-up with its mean paired difference, spread and windows, and ties; then
    the survivors' passkey and RULER scores when the tune measured them (posenc.tools.pick_retrieval)."""
    from posenc.tools.pick_retrieval import cite, from_tune

    ans = doc["answer"]
    win = next((r for r in ans.get("ranking", []) if r["name"] == ans["winner"]), None)
    runners = [r for r in ans.get("ranking", []) if r["name"] != ans["winner"]]
    rows = [_runner(r) for r in runners]
    retrieval = from_tune(doc)
    return (f"measured on this model by posenc tune ({folder}/results.json, {doc['target']:,} tokens, trained "
            f"{doc['trained']:,}): winner {ans['winner']} ({ans['reason']})"
            + (f", mean log-perplexity {win['mean_loss']:.4f} over {win['windows']} windows" if win else "")
            + ("; runners-up, mean paired log-perplexity difference to the best: " + ", ".join(rows) if rows else "")
            + (f"; flagged at the trained length: {', '.join(doc['flagged'])}" if doc.get("flagged") else "")
            + ("" if retrieval is None else "; survivors' " + cite(retrieval, doc["target"],
                                                                   [r["name"] for r in ans.get("ranking", [])])))


def tune_retrieval_note(rec: Recommendation, doc: dict[str, Any]) -> None:
    """A note when the tune's lowest-perplexity candidate (its ``best``, which a tied config method may have
    displaced as the winner) retrieves clearly worse than another survivor (posenc.tools.pick_retrieval)."""
    from posenc.tools.pick_retrieval import from_tune, worse_note

    retrieval, best = from_tune(doc), doc["answer"].get("best", doc["answer"]["winner"])
    row = next((r for r in doc["answer"].get("ranking", []) if r["name"] == best), None)
    if retrieval is None or row is None or row.get("mean_loss") is None:
        return
    note = worse_note(retrieval, best, f"mean log-perplexity {row['mean_loss']:.4f} at length {doc['target']:,}")
    if note is not None:
        rec.notes.append(note)


def tune_evidence(rec: Recommendation, folder, config, L: int, T: int, entry: dict) -> None:
    """Cite the tune result in ``folder`` (read_tune_result); a config winner at the target length becomes the
    recommendation with the config tune wrote, an attention winner is named with its patch spec."""
    doc = read_tune_result(folder, config)
    measured = tune_summary(doc, folder)
    tune_retrieval_note(rec, doc)
    if doc["target"] != T:
        rec.notes.insert(0, measured + f": measured at {doc['target']:,}, not {T:,}, so the recommendation rests "
                                       f"on the papers and the lab (`posenc tune MODEL --target-length {T}` measures "
                                       "this length)")
        return
    winner = doc["answer"]["winner"]
    if doc["winner_kind"] != "config":
        rec.reasons.insert(0, measured + f"; {winner} changes attention, not the config: posenc.patch(model, "
                           f"'{folder}/patch_spec.json') runs it in transformers (not in vLLM or llama.cpp); the "
                           "snippet below is the config-only choice")
        return
    written = json.loads((Path(folder) / doc["deploy"]).read_text(encoding="utf-8"))
    snippet: dict[str, Any] = {"rope_parameters": written["rope_parameters"]}
    if written.get("max_position_embeddings") not in (None, entry["max_position_embeddings"] or L):
        snippet["max_position_embeddings"] = written["max_position_embeddings"]
    old = rec.method
    old_type = (rec.config_snippet.get("rope_parameters") or {}).get("rope_type")
    rec.method = f"{winner} (the best measured on this model by posenc tune at {T:,})"
    rec.config_snippet = snippet
    rec.parameters = {**snippet["rope_parameters"], **{k: v for k, v in snippet.items() if k != "rope_parameters"}}
    rec.reasons = [measured, *[f"the papers and the lab, which rank {old} first for this case: {r}"
                               if i == 0 else r for i, r in enumerate(rec.reasons)]]
    raced = old_type in {r["name"] for r in doc["answer"]["ranking"]}
    rec.alternatives.insert(0, alt(old, "the papers' and the lab's choice for this case; " +
                                   ("tune measured it on this model (see the runners-up above)" if raced else
                                    "not among tune's candidates")))
    rec.notes.append(f"the snippet is {folder}/{doc['deploy']}'s RoPE entry, the config tune measured; copy that "
                     "file beside the weights to deploy it")


def other_model_evidence(rec: Recommendation, config, T: int) -> None:
    """Label each committed real-model study that measured another model than ``config``'s as such (its numbers
    are not this model's), and say how to measure this one."""
    from posenc.tools._io import read_config
    from posenc.tools.evidence import FIRST_TEXT, differing_keys, identity, studies, zero_shot

    mine = identity(read_config(config))
    for path, study in studies():
        differ = differing_keys(mine, study["model"])
        if not differ:
            continue
        table = zero_shot(study, T, text=FIRST_TEXT)
        order = (f": at {T:,} tokens, best first, " + ", ".join(f"{e['method']} {e['ppl']:.2f}" for e in table[:4])
                 if table else f"; it has no measurement at {T:,} tokens")
        rec.notes.append(f"real-model evidence measured on another model: {study.get('name', path.parent.name)} "
                         f"({study.get('results') or path.parent.name}; its {_keys(differ)} from this config's)"
                         f"{order}. Its order need not hold here: `posenc tune MODEL --target-length {T} "
                         "--out DIR` measures this model and `posenc pick --evidence DIR` cites it")
