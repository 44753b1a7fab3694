"""What reads a ``posenc finetune`` folder, on a tiny random Llama (1 layer, hidden 32, trained context 32, byte
tokenizer) fine-tuned 2 steps with YaRN to 128 tokens:

- ``posenc eval`` scores DIR/model at the target length.
- ``posenc tune`` races the model as configured ("yarn as configured (fine-tuned)") against every other method
  re-extended from the config's original RoPE parameters (frequency methods as ``--replace`` computes them,
  attention methods on the unscaled RoPE); a re-extension equal to the configured scaling is left out as that
  candidate; the trained-length check compares with the model as configured; each measurement is the one eval
  makes of that setting; the deploy config of a re-extension is built from the original parameters (factor L / 32,
  not L / 128 on top of YaRN's 4).
- ``posenc pick --evidence`` cites an eval of the fine-tuned model as measured on it (its method, steps, tokens),
  an eval of an unscaled model as measured zero-shot, and refuses a bad folder in one line naming --evidence.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

from posenc.cli import main  # noqa: E402
from posenc.finetune.run import finetune  # noqa: E402
from posenc.finetune.settings import FinetuneSettings  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails, short_text, tiny_llama  # noqa: E402

TARGET = 128
CONFIGURED = "yarn as configured (fine-tuned)"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """The source model, its fine-tune (DIR/model beside DIR/finetune.json), the fine-tune's text, and a longer
    text whose held-out part holds 3 windows of TARGET byte tokens (the race) and one of 2 x TARGET."""
    import posenc

    root = tmp_path_factory.mktemp("readers")
    source, text = tiny_llama(root / "source"), short_text(root / "text.txt")
    finetune(FinetuneSettings(model=str(source), target_length=TARGET, out=str(root / "run"), data=str(text),
                              steps=2, eval_every=2, checkpoint_every=0, warmup=1, lr=1e-2, progress=False),
             log=lambda *a: None)
    code = Path(posenc.__file__).parent
    long = root / "long.txt"
    long.write_text("".join((code / n).read_text() for n in ("cli.py", "gguf.py", "pose.py", "angles.py"))[:4000])
    return {"source": source, "model": root / "run" / "model", "run": root / "run", "text": text, "long": long}


def _loss(model, data, methods, **extra) -> float:
    """Window 0's log-perplexity at TARGET as posenc eval measures ``methods`` on ``model``."""
    from posenc.hf.eval.loop import evaluate_model
    from posenc.hf.eval.settings import EvalSettings

    s = EvalSettings(eval_lens=[TARGET], tasks=["lm"], methods=methods, data=str(data), eval_tokens=TARGET,
                     eval_offset=0, sliding_stride=0, **extra)
    doc = evaluate_model(str(model), s, progress=False, log=lambda *a: None)
    return math.log(next(r["value"] for r in doc["results"] if r["metric"] == "ppl"))


def _eval(model, data, out, lens: str = f"{TRAIN_LEN},{TARGET}", *extra) -> Path:
    from posenc.hf.eval.command import eval_main

    assert eval_main([str(model), "--data", str(data), "--eval-lens", lens, "--eval-tokens", str(TARGET),
                      "--tasks", "lm", "--out", str(out), "--no-progress", *extra]) == 0
    return out


def test_posenc_eval_scores_the_folder_at_the_target_length(made, tmp_path):
    rows = json.loads((_eval(made["model"], made["text"], tmp_path / "eval") / "results.json").read_text())["results"]
    lm = [r for r in rows if r["task"] == "lm" and r["eval_len"] == TARGET]
    assert lm and all(r["value"] > 1 and r["value"] == r["value"] for r in lm)


# ---- posenc tune -------------------------------------------------------------------------------------------------

def _plan(capsys, model, data, target: int = TARGET) -> str:
    capsys.readouterr()
    assert main(["tune", str(model), "--target-length", str(target), "--data", str(data),
                 "--methods", "yarn,linear,rerope", "--dry-run", "--no-progress"]) == 0
    return capsys.readouterr().out


def test_tune_plans_the_model_as_configured_and_re_extensions(made, capsys):
    """At the fine-tune's own length YaRN re-extended is the configured scaling (left out as it); at twice that
    length it is another candidate (factor 8 from the original 32)."""
    out = _plan(capsys, made["model"], made["long"])
    assert f"at {TARGET} tokens (trained {TRAIN_LEN}, factor 4)" in out
    assert "the config already applies yarn (method yarn fine-tuned 2 steps, 64 tokens, from 32 to 128 tokens)" in out
    assert f"\n  {CONFIGURED} " in out and "\n  linear " in out and "\n  rerope(window=8) " in out
    assert f"left out: yarn: at factor 4 it is the configured scaling: raced as {CONFIGURED}" in out
    out = _plan(capsys, made["model"], made["long"], 2 * TARGET)
    assert f"(trained {TRAIN_LEN}, factor 8)" in out and "\n  yarn " in out and f"\n  {CONFIGURED} " in out


def test_without_a_finetune_record_the_candidate_is_as_configured(made, tmp_path, capsys):
    copy = shutil.copytree(made["model"], tmp_path / "elsewhere" / "model")
    out = _plan(capsys, copy, made["long"])
    assert "\n  yarn as configured " in out and "fine-tuned" not in out


@pytest.fixture(scope="module")
def raced(made, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tune") / "out"
    assert main(["tune", str(made["model"]), "--target-length", str(TARGET), "--data", str(made["long"]),
                 "--methods", "linear,rerope", "--budget", "30m", "--out", str(out), "--no-progress"]) == 0
    return {"out": out, "doc": json.loads((out / "results.json").read_text())}


def test_a_short_tune_ranks_the_configured_model_and_the_re_extensions(raced):
    doc = raced["doc"]
    names = [r["name"] for r in doc["answer"]["ranking"]]
    assert CONFIGURED in names and "linear" in names and "rerope(window=16)" in names
    assert doc["configured"]["label"] == "as configured (fine-tuned)" and doc["trained"] == TRAIN_LEN
    assert "fine-tuned 2 steps, 64 tokens" in doc["configured"]["fine_tuned"]
    # the model as configured is the trained-length check's reference, measured at the original context
    assert CONFIGURED not in doc["trained_check"] and "linear" in doc["trained_check"]
    assert f"none@{TRAIN_LEN}#0" in doc["measurements"]
    assert all((raced["out"] / name).is_file() for name in doc["deploy_files"])
    assert doc["answer"]["winner"] in names


def test_each_candidate_is_measured_as_eval_measures_it(made, raced):
    """As configured: the folder as it is; linear: eval --replace at factor 4 (from the original RoPE); rerope: on
    the original (unscaled) RoPE, which differs from rerope on top of the fine-tune's YaRN."""
    m, model, data = raced["doc"]["measurements"], made["model"], made["long"]
    assert m[f"{CONFIGURED}@{TARGET}#0"] == pytest.approx(_loss(model, data, ["none"]), rel=1e-9)
    assert m[f"linear@{TARGET}#0"] == pytest.approx(_loss(model, data, ["linear"], factor=4.0, replace_scaling=True),
                                                    rel=1e-9)
    options = {"method_options": {"rerope.window": 16}, "factor": 4.0}
    on_original = _loss(model, data, ["rerope"], replace_scaling=True, **options)
    assert m[f"rerope(window=16)@{TARGET}#0"] == pytest.approx(on_original, rel=1e-9)
    assert not math.isclose(on_original, _loss(model, data, ["rerope"], **options), rel_tol=1e-6)


def test_eval_replace_runs_an_attention_method_on_the_original_rope(made):
    from posenc.hf.eval.loop import evaluate_model
    from posenc.hf.eval.settings import EvalSettings

    s = EvalSettings(eval_lens=[TARGET], tasks=["lm"], methods=["rerope"], factor=4.0, data=str(made["long"]),
                     eval_tokens=TARGET, sliding_stride=0, replace_scaling=True)
    meta = evaluate_model(str(made["model"]), s, progress=False, log=lambda *a: None)["meta"]["methods"]["rerope"]
    assert meta["rope_parameters"]["rope_type"] == "default" and meta["original_context"] == TRAIN_LEN


@pytest.mark.parametrize("target", [TARGET, 2 * TARGET])
def test_a_re_extension_deploys_from_the_original_parameters(made, tmp_path, target):
    """config.json of a re-extended winner: factor target / 32 from the original RoPE (not doubly scaled); the
    configured winner's is the model's own config; an attention winner's config.json is the unscaled RoPE."""
    from posenc.hf.loading import check_model_folder
    from posenc.hf.tune.report import write_deploy

    config = check_model_folder(made["model"])
    assert write_deploy(tmp_path, {"method": "linear", "kind": "config", "options": {}}, config, target, TRAIN_LEN,
                        replace=True) == ["config.json"]
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"]["rope_type"] == "linear"
    assert written["rope_parameters"]["factor"] == target / TRAIN_LEN and written["max_position_embeddings"] == target
    write_deploy(tmp_path, {"method": "yarn", "kind": "config", "options": {}, "configured": CONFIGURED}, config,
                 target, TRAIN_LEN, replace=True)
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(json.dumps(config.to_dict()))
    assert write_deploy(tmp_path, {"method": "rerope", "kind": "attention", "options": {"window": 16}}, config,
                        target, TRAIN_LEN, replace=True) == ["patch_spec.json", "config.json"]
    unscaled = json.loads((tmp_path / "config.json").read_text())
    assert unscaled["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert unscaled["max_position_embeddings"] == TRAIN_LEN
    assert json.loads((tmp_path / "patch_spec.json").read_text())["method"] == "rerope"


# ---- posenc pick --evidence --------------------------------------------------------------------------------------

def _ppl(results: Path, method: str, length: int) -> float:
    rows = [r["value"] for r in json.loads(results.read_text())["results"] if r["task"] == "lm"
            and r["scaling"] == method and r["eval_len"] == length and r["protocol"] == "non-overlapping"]
    return sum(rows) / len(rows)


def test_pick_cites_an_eval_of_the_fine_tuned_model(made, tmp_path, capsys):
    scored = _eval(made["model"], made["text"], tmp_path / "eval")
    capsys.readouterr()
    assert main(["pick", "--target-length", str(TARGET), "--config", str(made["model"]), "--budget", "finetune",
                 "--evidence", str(scored)]) == 0
    out = capsys.readouterr().out
    ppl = _ppl(scored / "results.json", "none", TARGET)
    assert (f"measured on this fine-tuned model: perplexity {ppl:.2f} at length {TARGET} (method yarn fine-tuned 2 "
            "steps, 64 tokens, from 32 to 128 tokens") in out
    why = out[out.index("Why:"):out.index("Alternatives")]
    assert "measured on this fine-tuned model" in why.splitlines()[1]           # the first reason


def test_pick_cites_an_eval_of_an_unscaled_model_as_zero_shot(made, tmp_path, capsys):
    scored = _eval(made["source"], made["text"], tmp_path / "eval", str(TARGET), "--methods", "none,yarn",
                   "--factor", "4")
    capsys.readouterr()
    assert main(["pick", "--target-length", str(TARGET), "--config", str(made["source"]), "--evidence",
                 str(scored)]) == 0
    out = capsys.readouterr().out
    yarn, none = _ppl(scored / "results.json", "yarn", TARGET), _ppl(scored / "results.json", "none", TARGET)
    assert f"measured zero-shot on this model ({'posenc eval, ' + str(scored)}/results.json)" in out
    best_first = sorted([("yarn", yarn), ("none", none)], key=lambda kv: kv[1])
    assert ", ".join(f"{m} {p:.2f}" for m, p in best_first) in out and "fine-tuned model" not in out


def test_bad_evidence_is_one_line_naming_the_flag(made, tmp_path, capsys):
    argv = ["pick", "--target-length", str(TARGET), "--config", str(made["model"]), "--budget", "finetune",
            "--evidence"]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "results.json").write_text('{"meta": {')
    err = fails(capsys, main, "pick", [*argv, str(damaged)])
    assert "--evidence" in err and "cannot read" in err
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "results.json").write_text('{"rows": []}')
    err = fails(capsys, main, "pick", [*argv, str(neither)])
    assert "--evidence" in err and "nor a posenc eval result" in err
    other = _eval(tiny_llama(tmp_path / "wide", hidden=64), made["text"], tmp_path / "other", str(TARGET))
    err = fails(capsys, main, "pick", [*argv, str(other)])
    assert "--evidence" in err and "the eval measured another model" in err and "hidden_size" in err
    err = fails(capsys, main, "pick", [*argv, str(tmp_path / "absent")])
    assert "--evidence" in err
