"""posenc pick --evidence DIR cites a posenc tune result of the --config model (tune run here on a tiny random Llama):
its winner, runners-up and paired differences, a config winner recommended with the config tune wrote, an attention
winner named with its patch spec; a folder that is not a tune result, or a tune of another model, is refused in one
line naming --evidence. Without --evidence, the committed study of another model is labelled as such."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

import posenc  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure  # noqa: E402
from posenc.tools.pick import format_recommendation, pick  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails, tiny_llama  # noqa: E402
from posenc_hf_folders import tune_model_fixture, tune_text_fixture  # noqa: E402,F401 (fixtures model, text)

transformers.logging.set_verbosity_error()
TARGET = 2 * TRAIN_LEN


def tune(model, text, out, methods) -> str:
    assert main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 "--methods", methods, "--out", str(out)]) == 0
    return str(out)


@pytest.fixture(scope="module")
def config_tune(model, text, tmp_path_factory):
    """A real tune of the tiny model: linear against yarn."""
    return tune(model, text, tmp_path_factory.mktemp("ev") / "o", "linear,yarn")


def test_pick_cites_and_recommends_a_config_winner(model, config_tune):
    doc = json.loads(open(f"{config_tune}/results.json").read())
    winner = doc["answer"]["winner"]
    other = next(r for r in doc["answer"]["ranking"] if r["name"] != winner)
    rec = pick(TARGET, budget="none", config=model, evidence=config_tune)
    assert rec.method.startswith(f"{winner} (the best measured on this model by posenc tune at {TARGET})")
    written = json.loads(open(f"{config_tune}/config.json").read())
    assert rec.config_snippet["rope_parameters"] == written["rope_parameters"]
    why = rec.reasons[0]
    assert why.startswith(f"measured on this model by posenc tune ({config_tune}/results.json")
    assert f"winner {winner}" in why and f"{other['name']} {other['diff_to_best']:+.4f}" in why
    # the papers' choice (dynamic NTK at 2x) stays an alternative; this tune did not race it
    assert rec.alternatives[0]["option"].startswith("dynamic") and \
        rec.alternatives[0]["why_not"].endswith("not among tune's candidates")
    assert "another model" not in format_recommendation(rec)    # the study of SmolLM2 is not cited


def test_pick_names_an_attention_winner_with_its_patch_spec(model, text, tmp_path, monkeypatch):
    """A synthetic scorer makes rerope win by a clear margin: the config stays the papers' choice, the reason names
    the patch spec."""
    def loss(model_dir, s):
        if s.eval_lens[0] == TRAIN_LEN:
            return 3.0
        return (1.0 if s.methods[0] == "rerope" else 2.0) + 0.01 * (s.eval_offset // s.eval_lens[0])

    monkeypatch.setattr(measure, "window_loss", loss)
    out = tune(model, text, tmp_path / "o", "yarn,rerope")
    plain = pick(TARGET, budget="none", config=model)
    rec = pick(TARGET, budget="none", config=model, evidence=out)
    assert rec.method == plain.method and rec.config_snippet == plain.config_snippet
    assert "winner rerope(" in rec.reasons[0] and f"posenc.patch(model, '{out}/patch_spec.json')" in rec.reasons[0]
    assert "yarn +1.0" in rec.reasons[0]


def test_evidence_refusals_are_one_line(model, config_tune, tmp_path, capsys):
    other = str(tiny_llama(tmp_path / "wide", hidden=64))
    err = fails(capsys, main, "pick", ["pick", "--target-length", str(TARGET), "--config", other, "--evidence",
                                       config_tune])
    assert "--evidence" in err and "tune measured another model" in err and "hidden_size" in err
    study = posenc.__file__.rsplit("/", 1)[0] + "/tools/measured/smollm2"     # a real-model study, not a tune
    err = fails(capsys, main, "pick", ["pick", "--target-length", str(TARGET), "--config", model, "--evidence", study])
    assert "--evidence" in err and "is not a finished posenc tune result" in err
    err = fails(capsys, main, "pick", ["pick", "--target-length", str(TARGET), "--config", model, "--evidence",
                                       str(tmp_path)])
    assert "--evidence" in err and "cannot read" in err
    err = fails(capsys, main, "pick", ["pick", "--target-length", str(TARGET), "--train-context", "32",
                                       "--evidence", config_tune])
    assert "--evidence" in err and "pass --config" in err


def test_without_evidence_another_models_study_is_labelled(model, capsys):
    assert main(["pick", "--target-length", str(TARGET), "--config", model]) == 0
    out = capsys.readouterr().out
    assert "real-model evidence measured on another model: SmolLM2" in out
    assert "hidden_size" in out and "posenc pick --evidence DIR" in out
