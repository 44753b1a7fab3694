"""The picker's real-model evidence: when a committed study measured this very model at the target length.

``real_model_evidence`` reads the study (posenc.tools.evidence) and, for an existing model used as is (budget none),
recommends the best zero-shot frequency method measured there, citing every method's number beside the papers' and
the lab's (posenc.tools.pick_rules); the papers' choice stays when it measured best too. The attention methods the
study measured are named apart (a config can carry only a frequency method), with the passkey results where the
study has them.
"""

from __future__ import annotations

from typing import Any

from posenc.attention import get_attention_method, is_attention_method
from posenc.extensions import ExtensionSpec, get_method, method_config, method_label
from posenc.tools.pick_rules import Recommendation, alt, extension_factor, yarn_betas


def _label(method: str) -> str:
    return "unscaled" if method == "none" else method_label(method)


def _value(e: dict) -> str:
    return f"{e['ppl']:.2f}" + (f" +- {e['std']:.2f}" if e.get("std") is not None else "")


def _report(study: dict, path) -> str:
    return study.get("report") or f"docs/results/{path.parent.name}/report.md"


def real_model_evidence(rec: Recommendation, config, L: int, T: int, theta: float, entry: dict) -> None:
    """When a committed real-model study measured this very model at the target length (posenc.tools.evidence):
    recommend its best zero-shot method, citing every method's number there beside the papers' and the lab's."""
    from posenc.tools.evidence import FIRST_TEXT, matching_study, passkey, zero_shot

    found = matching_study(config)
    if found is None:
        return
    path, study = found
    where = study.get("results") or str(path)  # a packaged extract names the full study it was made from
    table = zero_shot(study, T, text=FIRST_TEXT)
    if not table:
        lens = sorted({r["eval_len"] for r in study.get("rows", []) if r.get("task") == "lm"})
        rec.notes.append(f"the real-model study of this model ({where}) measured lengths {lens}, not {T:,}: the "
                         "recommendation rests on the papers and the lab")
        return
    base = next((e for e in zero_shot(study, L, text=FIRST_TEXT) if e["method"] == "none"), None)
    # a config can carry only a frequency method: the attention methods measured in the study are weighed apart
    everything = table
    attention = [e for e in table if is_attention_method(e["method"])]
    table = [e for e in table if e not in attention]
    # LongRoPE's rows ran with the factors the study searched: only those can be recommended, never unsearched ones
    searched = study.get("search") if isinstance(study.get("search"), dict) else {}
    if any(e["method"] == "longrope" for e in table) and not isinstance(searched.get("rope_parameters"), dict):
        table = [e for e in table if e["method"] != "longrope"]
        rec.notes.append(f"LongRoPE's row in {where} ran with searched factors the study does not record, so it is "
                         "not recommended here")
    windows = table[0]["windows"]
    measured = (f"measured on this model ({study.get('name', 'real model')}; {where}): zero-shot perplexity at "
                f"{T:,} tokens ({windows} window{'s' if windows != 1 else ''} of {T:,} tokens of the CPython "
                "validation text, bf16" + ("; mean +- std over the windows" if windows > 1 else "") + ") "
                + ", ".join(f"{_label(e['method'])} {_value(e)}" for e in everything)
                + (f"; unscaled at the trained {L:,}: {base['ppl']:.2f}" if base else ""))
    _attention_notes(rec, study, path, T, table, attention, passkey(study, T))
    best = table[0]["method"]
    if len(table) == 1:
        rec.notes.append(measured + f": the study has no extension method at {T:,} yet, so the recommendation rests "
                                    "on the papers and the lab")
        return
    if best == "none":
        rec.reasons.insert(0, measured + ": no method beat the unscaled model at this length")
        return
    old_method = rec.method
    old_type = (rec.config_snippet.get("rope_parameters") or {}).get("rope_type")
    old_measured = next((e for e in table if e["method"] == old_type), None)
    if old_measured is not None and old_measured["ppl"] <= table[0]["ppl"]:
        # the papers' choice measured best here too (or tied: dynamic NTK at exactly its static base), so it stays
        tied = [_label(e["method"]) for e in table if e["ppl"] == old_measured["ppl"] and e["method"] != old_type]
        rec.reasons.insert(0, measured + f": {_label(old_type)} measures best here"
                           + (f" (tied with {', '.join(tied)})" if tied else ""))
        return
    _adopt(rec, _measured_snippet(best, searched, entry, L, T, theta), best, T)
    papers = list(rec.reasons)
    if papers:
        papers[0] = f"the papers and the lab, which rank {old_method} first for this case: {papers[0]}"
    rec.reasons = [measured, *papers]
    mine = next(e for e in table if e["method"] == best)
    rec.alternatives.insert(0, alt(old_method, "the papers' and the lab's choice for this case; "
                                   + (f"measured on this model at {T:,}: {old_measured['ppl']:.2f} vs "
                                      f"{_label(best)} {mine['ppl']:.2f}" if old_measured else
                                      f"not measured in this model's study at {T:,}")))
    # the generic list's entry for the method now recommended argued against it from other models' numbers
    rec.alternatives = [a for a in rec.alternatives if not a["option"].startswith(_label(best))]
    _close_call_note(rec, study, table, mine, T, windows)
    rec.notes = [n for n in rec.notes if "dynamic NTK scales" not in n and not n.startswith("factor 1:")]
    how = (f"these are the factors the study's search found ({searched.get('config', 'its search')}: `"
           f"{searched.get('command', 'posenc search')}`); `posenc search MODEL --target-length {T}` searches your own"
           if best == "longrope" else f"`posenc extend CONFIG --method {best} --target-length {T}` writes this config")
    rec.notes.append(how + "; the study's settings, wall times and coverage are in " + _report(study, path))


def _attention_notes(rec: Recommendation, study: dict, path, T: int, table: list[dict], attention: list[dict],
                     keys: dict) -> None:
    """Notes for the study's passkey results at T and for the attention methods that measured below the best
    frequency method (they change attention, not the config, so they are named rather than recommended)."""
    if keys:
        rec.notes.append(f"passkey retrieval on this model at {T:,} tokens (keys found / trials over the depths "
                         "measured, greedy decoding): " + ", ".join(f"{_label(m)} {f}/{n}" for m, (f, n) in keys.items())
                         + (f"; attention sinks only see the first tokens and a recent window: {get_attention_method('sinks').costs}"
                            if "sinks" in keys else ""))
    better = [e for e in attention if e["ppl"] < table[0]["ppl"]]
    if not better:
        return

    # the one to run: the lowest perplexity among those that retrieved best where passkey was measured (a
    # method that keeps perplexity by dropping the middle, as sinks do, should not be the first named)
    def retrieval(e):
        found, trials = keys.get(e["method"], (None, None))
        return -(found / trials) if trials else 0.0
    first = min(better, key=lambda e: (retrieval(e), e["ppl"]))
    why = (f", the lowest of those that found the passkey in {keys[first['method']][0]}/"
           f"{keys[first['method']][1]}" if first is not better[0] and first["method"] in keys else "")
    rec.notes.append(
        "measured lower still on this model, by changing attention rather than the config: "
        + ", ".join(f"{_label(e['method'])} {e['ppl']:.2f}" for e in better)
        + f" (run the model under posenc.patch(model, method='{first['method']}', ...){why}, with the study's "
        f"options, {_report(study, path)}; costs: {get_attention_method(first['method']).costs})")


def _measured_snippet(best: str, searched: dict, entry: dict, L: int, T: int, theta: float) -> dict[str, Any]:
    """The config snippet of the method the study measured best: LongRoPE with the factors its rows ran with (the
    study's posenc search), any other method as the registry writes it for this model."""
    from posenc.extensions import transformers_config

    snippet: dict[str, Any] = {}
    if best == "longrope":
        if searched.get("max_position_embeddings") not in (None, entry["max_position_embeddings"] or L):
            snippet["max_position_embeddings"] = searched["max_position_embeddings"]
        snippet["rope_parameters"] = {"rope_theta": theta, **searched["rope_parameters"]}
    else:
        factor = get_method(best).lab_factor or extension_factor(T, L)
        spec = ExtensionSpec(original=L, factor=factor, rotary_dim=entry["rotary_dim"], theta=theta, target=T)
        written = transformers_config(best, method_config(best, spec), spec)
        if written.max_position_embeddings != (entry["max_position_embeddings"] or L):
            snippet["max_position_embeddings"] = written.max_position_embeddings
        snippet["rope_parameters"] = {"rope_theta": theta, **written.scaling}
    return yarn_betas(snippet) if best == "yarn" else snippet


def _adopt(rec: Recommendation, snippet: dict[str, Any], best: str, T: int) -> None:
    """Make the study's best method the recommendation: its method, snippet and parameters."""
    rec.method = f"{best} (zero-shot: the best measured on this model at {T:,})"
    rec.config_snippet = snippet
    rec.parameters = {**snippet["rope_parameters"], **{k: v for k, v in snippet.items() if k != "rope_parameters"}}


def _close_call_note(rec: Recommendation, study: dict, table: list[dict], mine: dict, T: int, windows: int) -> None:
    """When the runner-up is within 5% of the best, a note saying whether the study's other texts keep the order."""
    from posenc.tools.evidence import other_texts, zero_shot

    best = mine["method"]
    runner = next((e for e in table[1:] if e["ppl"] > mine["ppl"]), None)
    if not (runner is not None and runner["ppl"] < 1.05 * mine["ppl"]):
        return
    elsewhere = []
    for text in other_texts(study):
        other = {e["method"]: e for e in zero_shot(study, T, text=text)}
        if best in other and runner["method"] in other:
            a, b = other[best], other[runner["method"]]
            elsewhere.append(f"on the study's {text} text ({a['windows']} window"
                             f"{'s' if a['windows'] != 1 else ''}) {_label(best)} {a['ppl']:.2f} against "
                             f"{_label(runner['method'])} {b['ppl']:.2f}, "
                             + ("the same order" if a["ppl"] < b["ppl"] else "the other order"))
    rec.notes.append(f"a close call: {_label(best)} leads {_label(runner['method'])} by "
                     f"{100 * (runner['ppl'] / mine['ppl'] - 1):.1f}% over {windows} window"
                     f"{'s' if windows != 1 else ''}; "
                     + ("; ".join(elsewhere) if elsewhere else "more windows or another text may reorder them"))
