"""posenc pick --evidence cites retrieval beside perplexity (posenc.tools.pick_retrieval): an eval's passkey rows as
keys found / trials and its RULER rows per task (score, n, Wilson 95% interval as recorded), their mean over the
tasks and its effective length where the rows allow it; a tune's survivors' passkey and RULER scores. A note says
when the method with the lowest perplexity retrieves clearly worse (Wilson intervals apart), exactly then; an eval
or tune without retrieval cites perplexity only, as before.

The eval folders are written here with rows in the exact form ``posenc eval`` writes (posenc.lab.context.row, the
RULER report's score_rows, the passkey task's per-depth rows; checked against a real ``posenc eval --tasks
lm,passkey,niah_single_1,vt`` of a tiny Llama), beside a model folder holding the config the eval fingerprinted.
Every expected number is computed here from those rows, with this file's own Wilson interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posenc._internal.fingerprint import file_fingerprint
from posenc.tools.evidence import identity
from posenc.tools.pick import format_recommendation, pick

# the tiny Llama of tests/_support/posenc_hf_folders.py, as transformers 5 saves its config.json
CONFIG = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
          "bos_token_id": None, "dtype": "float32", "eos_token_id": None, "head_dim": 16, "hidden_act": "silu",
          "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 32,
          "mlp_bias": False, "model_type": "llama", "num_attention_heads": 2, "num_hidden_layers": 1,
          "num_key_value_heads": 2, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
          "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
          "use_cache": True, "vocab_size": 256}
T = 512
DEPTHS = (0.1, 0.5, 0.9)
TRIALS = 2
SAMPLES = 10
TASKS = ("niah_single_1", "vt")
TOO_SHORT = "n/a (too short for the task's template)"


def wilson(hits: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's 95% score interval, written out here (not posenc's) so that the test checks the cited numbers."""
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))


def _base(method: str, length: int, task: str, metric: str, value) -> dict:
    return {"task": task, "scheme": "rope", "scaling": method, "finetuned": False, "train_len": 32,
            "eval_len": length, "metric": metric, "value": value, "seed": 0, "protocol": None, "depth": None}


def lm_row(method: str, length: int, ppl: float) -> dict:
    return {**_base(method, length, "lm", "ppl", ppl), "protocol": "non-overlapping", "n_scored": length,
            "std": None, "model": "llama"}


def passkey_rows(method: str, length: int, found: list[int]) -> list[dict]:
    """One row per depth, its value the exact-match rate over TRIALS keys (``found``: keys found per depth)."""
    return [{**_base(method, length, "passkey", "exact_match", f / TRIALS), "depth": d, "chars": length,
             "std": None, "model": "llama"} for d, f in zip(DEPTHS, found)]


def ruler_row(method: str, length: int, task: str, hits: int | None) -> dict:
    """RULER's row (score_rows): the mean over SAMPLES samples with its Wilson interval, or n/a (too short)."""
    if hits is None:
        return {**_base(method, length, task, "string_match_all", None), "note": TOO_SHORT, "std": None,
                "model": "llama", "threshold": 0.856}
    low, high = wilson(hits, SAMPLES)
    return {**_base(method, length, task, "string_match_all", hits / SAMPLES), "ci_low": round(low, 4),
            "ci_high": round(high, 4), "n_samples": SAMPLES, "prompt_tokens": 345.0, "nulls": 0, "std": None,
            "model": "llama", "threshold": 0.856}


@pytest.fixture
def model(tmp_path) -> Path:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return folder


def write_eval(folder: Path, model: Path, rows: list[dict]) -> str:
    """A finished posenc eval's results.json (meta as evaluate_model writes it) holding ``rows``."""
    folder.mkdir()
    options = {"passkey_depths": list(DEPTHS), "passkey_trials": TRIALS, "ruler_samples": SAMPLES,
               "ruler_threshold": 0.856}
    meta = {"model": str(model), "config": None, "byte_tokens": True,
            "settings": {"eval_lens": sorted({r["eval_len"] for r in rows}), "options": options, **options},
            "model_files": [file_fingerprint(model / "config.json")], "methods": {}}
    (folder / "results.json").write_text(json.dumps({"meta": meta, "results": rows, "curves": {}}))
    return str(folder)


def keys(rows: list[dict], method: str, length: int = T) -> tuple[int, int]:
    """(keys found, trials) of ``method``'s passkey rows at ``length``, from the rows."""
    mine = [r for r in rows if r["task"] == "passkey" and r["scaling"] == method and r["eval_len"] == length]
    return sum(round(r["value"] * TRIALS) for r in mine), TRIALS * len(mine)


def ruler_mean(rows: list[dict], method: str, length: int = T) -> tuple[float, float, float, int]:
    """The mean over ``method``'s scored RULER tasks at ``length`` (every sample pooled) with its Wilson interval."""
    mine = [r for r in rows if r["metric"] == "string_match_all" and r["scaling"] == method
            and r["eval_len"] == length and r["value"] is not None]
    n = sum(r["n_samples"] for r in mine)
    hits = sum(r["value"] * r["n_samples"] for r in mine)
    return (hits / n, *wilson(hits, n), n)


def _rows(ppl: dict[str, float], found: dict[str, list[int]], hits: dict[str, dict[str, int | None]],
          lengths=(T,)) -> list[dict]:
    rows = []
    for m in ppl:
        for L in lengths:
            rows.append(lm_row(m, L, ppl[m]))
            rows += passkey_rows(m, L, found[m]) if m in found else []
            rows += [ruler_row(m, L, t, h) for t, h in hits.get(m, {}).items()]
    return rows


def cited(model: Path, folder: str, target: int = T):
    rec = pick(target, budget="none", config=str(model / "config.json"), evidence=folder)
    return rec, format_recommendation(rec)


def test_an_eval_cites_passkey_and_ruler_beside_perplexity(model, tmp_path):
    """The SmolLM2 lesson in small: sinks has the lowest perplexity and finds 1 key in 6, yarn all 6."""
    rows = _rows({"sinks": 5.86, "yarn": 6.05}, {"sinks": [1, 0, 0], "yarn": [2, 2, 2]},
                 {"sinks": {"niah_single_1": 2, "vt": 1}, "yarn": {"niah_single_1": 9, "vt": 10}})
    rec, text = cited(model, write_eval(tmp_path / "ev", model, rows))
    why = rec.reasons[0]
    assert why.startswith("measured zero-shot on this model (posenc eval, ")
    assert "best first: sinks 5.86, yarn 6.05" in why
    (sf, sn), (yf, yn) = keys(rows, "sinks"), keys(rows, "yarn")
    assert (sf, sn, yf, yn) == (1, 6, 6, 6)
    assert f"retrieval at length {T}: passkey keys found / trials: sinks {sf}/{sn}, yarn {yf}/{yn}" in why
    for r in rows:
        if r["metric"] == "string_match_all":
            assert (f"{r['task']} {r['value']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}] n {r['n_samples']}"
                    in why), r
    for m in ("sinks", "yarn"):
        mean, low, high, n = ruler_mean(rows, m)
        assert f"{m}: niah_single_1" in why and (f"mean over niah_single_1 + vt {mean:.2f} [{low:.2f}, {high:.2f}] "
                                                  f"n {n}") in why
    # one length measured: the mean reaches 85.6% there (yarn) or not (sinks)
    assert "effective length 512 or more" in why and "effective length below 512" in why
    # the note, with both numbers
    note = next(n for n in rec.notes if "lowest perplexity" in n)
    assert note.startswith("sinks has the lowest perplexity (5.86 at length 512) but retrieves clearly worse")
    lo, hi = wilson(yf, yn)
    assert f"passkey: yarn finds {yf}/{yn} keys [{lo:.2f}, {hi:.2f}], sinks {sf}/{sn} keys" in note
    ym, sm = ruler_mean(rows, "yarn"), ruler_mean(rows, "sinks")
    assert f"RULER mean over niah_single_1 + vt: yarn {ym[0]:.2f} [{ym[1]:.2f}, {ym[2]:.2f}], sinks {sm[0]:.2f}" in note
    plain = pick(T, budget="none", config=str(model / "config.json"))
    assert rec.method == plain.method and rec.config_snippet == plain.config_snippet   # cited, not ranked on
    assert note in text


# (passkey keys found per depth, RULER hits per task) of the lowest-perplexity method "a" and of "b", and whether the
# intervals are apart on passkey and on the RULER mean (checked below by this file's Wilson interval)
CASES = [
    (([1, 0, 0], {"niah_single_1": 5, "vt": 5}), ([2, 2, 2], {"niah_single_1": 5, "vt": 5}), (True, False)),
    (([1, 1, 2], {"niah_single_1": 5, "vt": 5}), ([2, 2, 2], {"niah_single_1": 5, "vt": 5}), (False, False)),
    (([0, 0, 1], {"niah_single_1": 1, "vt": 2}), ([1, 1, 1], {"niah_single_1": 9, "vt": 8}), (False, True)),
    (([0, 0, 0], {"niah_single_1": 0, "vt": 1}), ([2, 2, 2], {"niah_single_1": 9, "vt": 10}), (True, True)),
    (([2, 2, 2], {"niah_single_1": 10, "vt": 10}), ([0, 0, 0], {"niah_single_1": 0, "vt": 0}), (False, False)),
    (([1, 1, 1], {"niah_single_1": 4, "vt": 6}), ([2, 2, 1], {"niah_single_1": 7, "vt": 8}), (False, False)),
]


@pytest.mark.parametrize("a, b, apart", CASES)
def test_the_note_appears_exactly_when_the_intervals_are_apart(model, tmp_path, a, b, apart):
    rows = _rows({"a": 5.0, "b": 6.0}, {"a": a[0], "b": b[0]}, {"a": a[1], "b": b[1]})
    rec, _ = cited(model, write_eval(tmp_path / "ev", model, rows))
    apart_keys = wilson(*keys(rows, "a"))[1] < wilson(*keys(rows, "b"))[0]
    apart_ruler = ruler_mean(rows, "a")[2] < ruler_mean(rows, "b")[1]
    assert (apart_keys, apart_ruler) == apart
    notes = [n for n in rec.notes if "lowest perplexity" in n]
    assert len(notes) == (apart_keys or apart_ruler)
    if notes:
        assert ("passkey: b finds" in notes[0]) == apart_keys and ("RULER mean over" in notes[0]) == apart_ruler


def test_an_eval_without_retrieval_cites_perplexity_only(model, tmp_path):
    folder = write_eval(tmp_path / "ev", model, [lm_row("sinks", T, 5.86), lm_row("yarn", T, 6.05)])
    rec, text = cited(model, folder)
    assert rec.reasons[0] == (f"measured zero-shot on this model (posenc eval, {folder}/results.json): perplexity at "
                              f"length {T}, best first: sinks 5.86, yarn 6.05 (none: the model as its config runs it)")
    assert "retrieval at length" not in text and "passkey keys" not in text and "lowest perplexity" not in text


def test_the_longest_length_is_cited_when_the_target_was_not_measured(model, tmp_path):
    rows = _rows({"yarn": 6.0}, {"yarn": [2, 1, 2]}, {"yarn": {"niah_single_1": 7}})
    rec, _ = cited(model, write_eval(tmp_path / "ev", model, rows), target=4 * T)
    assert (f"retrieval at length {T} (not measured at the target {4 * T:,}; the longest length measured): passkey "
            "keys found / trials: yarn 5/6") in rec.reasons[0]


def test_effective_length_by_rulers_rule_where_the_rows_allow_it(model, tmp_path):
    """At 256 and 512: the mean passes 85.6% at 256 only (effective 256), at both (512 or more), or a task is n/a
    at 256 (the mean is unknown there: no effective length claimed)."""
    rows = []
    for m, per_len in {"pass-short": {256: (9, 9), 512: (5, 6)}, "pass-both": {256: (9, 10), 512: (10, 9)},
                       "n/a-short": {256: (None, 9), 512: (10, 10)}}.items():
        rows.append(lm_row(m, T, 6.0))
        rows += [ruler_row(m, L, t, h) for L, hs in per_len.items() for t, h in zip(TASKS, hs)]
    rec, _ = cited(model, write_eval(tmp_path / "ev", model, rows))
    why = rec.reasons[0]
    per_method = dict(part.split(": ", 1) for part in why.split("n samples, ", 1)[1].split("; "))
    # the mean over the two tasks, each length, against the threshold, written out: 256 passes (0.90), 512 not (0.55)
    assert per_method["pass-short"].endswith("effective length 256 (the mean over the tasks stays >= 85.6% up to it, "
                                             "lengths measured 256 / 512)")
    assert "effective length 512 or more" in per_method["pass-both"]
    assert "effective length" not in per_method["n/a-short"] and "vt 1.00" in per_method["n/a-short"]


def test_an_eval_of_retrieval_only_is_cited(model, tmp_path):
    rows = passkey_rows("none", T, [2, 0, 1])
    rec, text = cited(model, write_eval(tmp_path / "ev", model, rows))
    assert rec.reasons[0].startswith("measured zero-shot on this model (posenc eval, ")
    assert "no perplexity rows" in rec.reasons[0] and "passkey keys found / trials: none 3/6" in rec.reasons[0]
    assert "lowest perplexity" not in text


# ---- a tune's survivors ------------------------------------------------------------------------------------------

def write_tune(folder: Path, passkey: dict, ruler: dict, losses: dict[str, float], target: int = T) -> str:
    """A finished tune's results.json in the form posenc.hf.tune.command.Tune.document writes (the keys pick reads:
    identity, answer with best and ranking, passkey rates, ruler scores, the plan's passkey samples) and the
    config.json it deploys."""
    folder.mkdir()
    ranked = sorted(losses, key=losses.get)
    best = ranked[0]
    ranking = [{"name": m, "kind": "config", "mean_loss": losses[m], "windows": 2,
                "diff_to_best": losses[m] - losses[best], "sd": 0.01, "shared_windows": 2, "tie": False}
               for m in ranked]
    doc = {"model": "llama", "identity": identity(CONFIG), "target": target, "trained": 32,
           "answer": {"winner": best, "best": best, "reason": "lowest mean log-perplexity on the paired windows",
                      "ranking": ranking, "tie": [best]},
           "race": {"alive": list(passkey or ruler)}, "deploy": "config.json", "winner_kind": "config",
           "flagged": [], "passkey": passkey, "ruler": ruler, "ruler_samples": 4,
           "plan": {"retrieval": {"passkey": {"samples": 100, "decode": 5}}}}
    (folder / "results.json").write_text(json.dumps(doc))
    deployed = {**CONFIG, "rope_parameters": {"rope_type": best, "factor": target / 32, "rope_theta": 10000.0}}
    (folder / "config.json").write_text(json.dumps(deployed))
    return str(folder)


def _score(hits: int, n: int = 4) -> dict:
    low, high = wilson(hits, n)
    return {"value": hits / n, "n": n, "ci_low": low, "ci_high": high}


def test_a_tune_cites_its_survivors_retrieval_and_notes_a_worse_winner(model, tmp_path):
    ruler = {"yarn": {"niah_single_1": _score(0), "vt": _score(1)}, "linear": {"niah_single_1": _score(4),
                                                                              "vt": _score(4)}}
    folder = write_tune(tmp_path / "tuned", {"yarn": 0.12, "linear": 0.95}, ruler, {"yarn": 1.0, "linear": 1.02})
    rec, text = cited(model, folder)
    why = rec.reasons[0]
    assert why.startswith(f"measured on this model by posenc tune ({folder}/results.json")
    assert "survivors' retrieval at length 512: passkey keys found / trials: yarn 12/100, linear 95/100" in why
    assert "yarn: niah_single_1 0.00 [0.00, 0.49] n 4, vt 0.25 [0.05, 0.70] n 4, mean over niah_single_1 + vt 0.12" \
        in why
    assert "linear: niah_single_1 1.00 [0.51, 1.00] n 4" in why and "effective length 512 or more" in why
    note = next(n for n in rec.notes if "lowest perplexity" in n)
    lo, hi = wilson(95, 100)
    assert note.startswith("yarn has the lowest perplexity (mean log-perplexity 1.0000 at length 512)")
    assert f"passkey: linear finds 95/100 keys [{lo:.2f}, {hi:.2f}], yarn 12/100 keys" in note
    assert "RULER mean over niah_single_1 + vt: linear 1.00 [0.68, 1.00], yarn 0.12 [0.02, 0.47]" in note


def test_a_tune_without_retrieval_cites_the_race_only(model, tmp_path):
    folder = write_tune(tmp_path / "tuned", {}, {}, {"yarn": 1.0, "linear": 1.02})
    rec, text = cited(model, folder)
    assert rec.reasons[0].startswith(f"measured on this model by posenc tune ({folder}/results.json")
    assert "retrieval at length" not in text and "passkey keys" not in text and "lowest perplexity" not in text
    # a tune at another length is a note, with its retrieval, and the worse-retrieval note still applies
    other = write_tune(tmp_path / "other", {"yarn": 0.0, "linear": 1.0}, {}, {"yarn": 1.0, "linear": 1.02},
                       target=1024)
    rec, _ = cited(model, other)
    assert ("survivors' retrieval at length 1,024: passkey keys found / trials: yarn 0/100, linear 100/100"
            in rec.notes[0])
    assert any(n.startswith("yarn has the lowest perplexity") for n in rec.notes)
