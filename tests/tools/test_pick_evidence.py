"""posenc pick cites a committed real-model study (posenc.tools.evidence) when the config is that study's model:
it recommends the method with the lowest measured perplexity at the target, cites every number the file holds, and
writes the snippet ``posenc extend`` writes for that method. The studies here are files written by the test."""

from __future__ import annotations

import json

import pytest

from posenc.attention import get_attention_method

from posenc.tools import evidence
from posenc.tools.extend import extend_config
from posenc.tools.pick import pick

CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 1024, "head_dim": 16,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def _study(root, values: dict, length=2048, name="tiny"):
    rows = [{"task": "lm", "scaling": m, "eval_len": length, "value": v, "n_scored": length, "finetuned": False,
             "protocol": "non-overlapping"} for m, v in values.items()]
    rows.append({"task": "lm", "scaling": "none", "eval_len": 1024, "value": 5.0, "n_scored": 2048,
                 "finetuned": False, "protocol": "non-overlapping"})
    folder = root / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"study": "real-model", "name": name,
                                                     "model": evidence.identity(CONFIG), "rows": rows}))


@pytest.mark.parametrize("values, best", [({"none": 19.0, "linear": 14.0, "ntk": 9.5, "dynamic": 9.9, "yarn": 12.0},
                                           "ntk"),
                                          ({"none": 19.0, "linear": 14.0, "yarn": 8.0}, "yarn")])
def test_pick_recommends_the_measured_best(tmp_path, monkeypatch, values, best):
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, values)
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith(best)
    cited = rec.reasons[0]
    assert all(f"{v:.2f}" in cited for v in values.values()) and "unscaled at the trained 1,024: 5.00" in cited
    written = extend_config(CONFIG, 2048, best).config
    assert rec.config_snippet["rope_parameters"]["rope_type"] == written["rope_parameters"]["rope_type"]
    for key, value in written["rope_parameters"].items():
        assert rec.config_snippet["rope_parameters"][key] == pytest.approx(value), key


@pytest.mark.parametrize("attention", ["self-extend", "rerope", "sinks"])
def test_an_attention_method_measured_best_is_named_beside_the_best_config(tmp_path, monkeypatch, attention):
    # a config can only carry a frequency method: the recommendation is the best of those, and the attention method
    # that measured lower still is named with its number, how to run it and its costs
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "linear": 14.0, "yarn": 8.0, attention: 7.5})
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("yarn") and rec.config_snippet["rope_parameters"]["rope_type"] == "yarn"
    label = get_attention_method(attention).label
    note = next(n for n in rec.notes if "measured lower still" in n)
    assert f"{label} 7.50" in note and f"method='{attention}'" in note and get_attention_method(attention).costs in note
    assert f"{label} 7.50" in rec.reasons[0]
    # measured worse than the best frequency method: cited, not promoted
    (tmp_path / "tiny" / "results.json").unlink()
    _study(tmp_path, {"none": 19.0, "yarn": 8.0, attention: 9.0}, name="tiny2")
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("yarn") and not any("measured lower still" in n for n in rec.notes)


def test_searched_longrope_is_recommended_with_the_searched_factors_only(tmp_path, monkeypatch):
    # LongRoPE's rows ran with factors a search found: the snippet must be those factors (posenc extend would write
    # unsearched ones, which is not what was measured); a study without them must not recommend LongRoPE at all
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "yarn": 8.0, "longrope": 7.0})
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("yarn") and any("LongRoPE" in n and "searched factors" in n for n in rec.notes)
    assert "LongRoPE 7.00" in rec.reasons[0]

    searched = {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 1024,
                "long_factor": [1.0, 1.1, 1.3, 1.6, 1.8, 1.9, 2.0, 2.2], "short_factor": [1.0] * 8}
    path = tmp_path / "tiny" / "results.json"
    doc = json.loads(path.read_text())
    doc["search"] = {"config": "docs/results/tiny/config.longrope-2048.json", "command": "posenc search tiny",
                     "rope_parameters": searched, "max_position_embeddings": 1024}
    path.write_text(json.dumps(doc))
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("longrope")
    assert rec.config_snippet["rope_parameters"] == {"rope_theta": 10000.0, **searched}
    assert "max_position_embeddings" not in rec.config_snippet   # the searched config kept the trained 1024
    assert any("posenc search tiny" in n and "config.longrope-2048.json" in n for n in rec.notes)
    assert not any("posenc extend CONFIG --method longrope" in n for n in rec.notes)


def test_other_models_and_lengths_keep_the_papers(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "ntk": 9.5})
    other = {**CONFIG, "hidden_size": 128}
    assert not any("measured on this model" in r for r in pick(2048, budget="none", config=other).reasons)
    rec = pick(4096, budget="none", config=CONFIG)
    assert rec.method.startswith("dynamic") and any("not 4,096" in n for n in rec.notes)
    (tmp_path / "tiny" / "results.json").unlink()
    _study(tmp_path, {"none": 19.0, "linear": 30.0}, name="tiny2")
    rec = pick(2048, budget="none", config=CONFIG)
    assert "no method beat the unscaled model" in rec.reasons[0]


def test_a_tie_keeps_the_papers_choice(tmp_path, monkeypatch):
    """Dynamic NTK (the papers' zero-shot choice) tied with NTK-aware: the recommendation stays dynamic NTK, and the
    reason cites the measurement and the tie."""
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "linear": 14.0, "ntk": 4.85, "dynamic": 4.85})
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("dynamic") and rec.config_snippet["rope_parameters"]["rope_type"] == "dynamic"
    assert "4.85" in rec.reasons[0] and "tied with NTK-aware" in rec.reasons[0]


@pytest.mark.parametrize("prose, order", [(None, None), ((7.9, 8.2), "the same order"),
                                          ((8.3, 8.1), "the other order")])
def test_a_close_call_says_whether_the_other_text_agrees(tmp_path, monkeypatch, prose, order):
    """YaRN leads NTK-aware by under 5% on the first text: the note says so, and, where the study measured both on
    another text, which way that text orders them."""
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "ntk": 8.2, "yarn": 8.0})
    if prose is not None:
        path = tmp_path / "tiny" / "results.json"
        doc = json.loads(path.read_text())
        doc["rows"] += [{"task": "lm", "scaling": m, "eval_len": 2048, "value": v, "n_scored": 2048,
                         "finetuned": False, "protocol": "non-overlapping", "text": "prose"}
                        for m, v in zip(("yarn", "ntk"), prose)]
        path.write_text(json.dumps(doc))
    rec = pick(2048, budget="none", config=CONFIG)
    assert rec.method.startswith("yarn")
    note = next(n for n in rec.notes if n.startswith("a close call"))
    assert "YaRN leads NTK-aware by 2.5% over 1 window" in note
    if prose is None:
        assert "another text may reorder them" in note
    else:
        assert (f"on the study's prose text (1 window) YaRN {prose[0]:.2f} against NTK-aware {prose[1]:.2f}, {order}"
                in note)


def test_methods_are_compared_on_the_same_windows():
    """A part that measured one method on a second window does not put its two-window mean beside the others'
    one-window numbers: every method is read at the largest token count all of them share."""
    rows = [{"task": "lm", "scaling": m, "eval_len": 16, "value": v, "n_scored": n, "protocol": "non-overlapping"}
            for m, v, n in (("yarn", 4.8, 16), ("ntk", 4.85, 16), ("yarn", 5.5, 32))]
    table = evidence.zero_shot({"rows": rows}, 16)
    assert [(e["method"], e["ppl"], e["windows"]) for e in table] == [("yarn", 4.8, 1), ("ntk", 4.85, 1)]
    rows.append({"task": "lm", "scaling": "ntk", "eval_len": 16, "value": 5.0, "n_scored": 32})
    table = evidence.zero_shot({"rows": rows}, 16)
    assert [(e["method"], e["ppl"], e["windows"]) for e in table] == [("ntk", 5.0, 2), ("yarn", 5.5, 2)]


def test_windows_at_offsets_give_mean_and_spread():
    """Windows measured as parts of their own (offset = tokens skipped) combine into one perplexity over all their
    tokens (the geometric mean of equal windows) with the sample std of the windows; a method missing a window
    brings every method down to the windows all share."""
    import math
    import statistics

    w = {"yarn": [4.0, 6.0, 5.0], "ntk": [4.2, 6.1, 5.3]}
    rows = [{"task": "lm", "scaling": m, "eval_len": 16, "value": v, "n_scored": 16, "offset": 16 * i}
            for m, vs in w.items() for i, v in enumerate(vs)]
    table = evidence.zero_shot({"rows": rows}, 16)
    for e in table:
        vs = w[e["method"]]
        assert e["windows"] == 3 and e["offsets"] == [0, 16, 32]
        assert e["ppl"] == pytest.approx(math.exp(sum(map(math.log, vs)) / 3))
        assert e["std"] == pytest.approx(statistics.stdev(vs))
    assert [e["method"] for e in table] == ["yarn", "ntk"]
    rows.append({"task": "lm", "scaling": "none", "eval_len": 16, "value": 9.0, "n_scored": 16, "offset": 16})
    table = evidence.zero_shot({"rows": rows}, 16)
    assert all(e["windows"] == 1 and e["offsets"] == [16] and e["std"] is None for e in table)
    assert {e["method"]: e["ppl"] for e in table} == {"none": 9.0, "yarn": 6.0, "ntk": 6.1}
    # a two-window row from offset 0 equals the two single windows it spans
    rows = [{"task": "lm", "scaling": "a", "eval_len": 16, "value": 5.0, "n_scored": 32},
            {"task": "lm", "scaling": "b", "eval_len": 16, "value": 4.0, "n_scored": 16},
            {"task": "lm", "scaling": "b", "eval_len": 16, "value": 9.0, "n_scored": 16, "offset": 16}]
    (a, b) = sorted(evidence.zero_shot({"rows": rows}, 16), key=lambda e: e["method"])
    assert a["windows"] == b["windows"] == 2 and b["ppl"] == pytest.approx(6.0) and a["std"] is None
    assert evidence.zero_shot({"rows": rows}, 16, text="prose") == []


def test_passkey_rows_are_counted_and_cited(tmp_path, monkeypatch):
    """Passkey rows (a rate per depth, trials per depth from the part) become keys found / trials per method, and
    the picker cites them with what sinks cannot see."""
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "yarn": 8.0, "sinks": 7.0})
    path = tmp_path / "tiny" / "results.json"
    doc = json.loads(path.read_text())
    doc["parts"] = {"pk": {"passkey_trials": 2}}
    doc["rows"] += [{"task": "passkey", "scaling": m, "eval_len": 2048, "depth": d, "value": v, "part": "pk"}
                    for m, d, v in (("yarn", 0.1, 1.0), ("yarn", 0.9, 0.5), ("sinks", 0.1, 0.0), ("sinks", 0.9, 1.0))]
    # a side check with other options (a variant) is kept apart from the method's own rows
    doc["rows"] += [{"task": "passkey", "scaling": "sinks", "eval_len": 2048, "depth": 0.1, "value": 1.0, "part": "pk",
                     "variant": "small cache"},
                    {"task": "lm", "scaling": "sinks", "eval_len": 2048, "value": 1.5, "n_scored": 2048,
                     "variant": "small cache"}]
    path.write_text(json.dumps(doc))
    assert evidence.passkey(doc, 2048) == {"yarn": (3, 4), "sinks": (2, 4)}
    assert evidence.passkey_cells(doc, 2048, "small cache") == {"sinks": {0.1: (1.0, 2)}}
    assert {e["method"]: e["ppl"] for e in evidence.zero_shot(doc, 2048)}["sinks"] == 7.0
    assert evidence.passkey(doc, 1024) == {}
    rec = pick(2048, budget="none", config=CONFIG)
    note = next(n for n in rec.notes if n.startswith("passkey retrieval"))
    assert "YaRN 3/4" in note and "attention sinks 2/4" in note and get_attention_method("sinks").costs in note
    # a second part at the same method and depth (more trials, other keys) pools with the first, never replaces it
    doc["parts"]["pk2"] = {"passkey_trials": 1}
    doc["rows"] += [{"task": "passkey", "scaling": "yarn", "eval_len": 2048, "depth": 0.1, "value": 0.0,
                     "part": "pk2"}]
    assert evidence.passkey_cells(doc, 2048)["yarn"] == {0.1: (pytest.approx(2 / 3), 3), 0.9: (0.5, 2)}
    assert evidence.passkey(doc, 2048)["yarn"] == (3, 5)


def test_the_attention_method_named_first_is_one_that_retrieved(tmp_path, monkeypatch):
    """Sinks measured lowest but found no passkey; Self-Extend found every one: the note names Self-Extend to run."""
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"none": 19.0, "yarn": 8.0, "sinks": 7.0, "self-extend": 7.2})
    path = tmp_path / "tiny" / "results.json"
    doc = json.loads(path.read_text())
    doc["parts"] = {"pk": {"passkey_trials": 1}}
    doc["rows"] += [{"task": "passkey", "scaling": m, "eval_len": 2048, "depth": d, "value": v, "part": "pk"}
                    for m, v in (("sinks", 0.0), ("self-extend", 1.0)) for d in (0.1, 0.9)]
    path.write_text(json.dumps(doc))
    note = next(n for n in pick(2048, budget="none", config=CONFIG).notes if "measured lower still" in n)
    assert "method='self-extend'" in note and "found the passkey in 2/2" in note
    assert "attention sinks 7.00" in note    # still cited with its number
