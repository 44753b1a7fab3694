"""posenc tune on a tiny random Llama (trained at 32 tokens, tuned for 64): the plan lists every candidate with its
estimate, --dry-run measures nothing, the race's rule on known paired differences (a clear winner, a tie, the
config-over-patch preference), the deploy files (config.json transformers loads; a patch spec posenc.patch reads,
giving the typed rule's logits), --resume measuring nothing twice, and bad input as one line each."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

import posenc  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure, plan as planning, race as racing  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails  # noqa: E402
from posenc_hf_folders import tune_model_fixture, tune_text_fixture  # noqa: E402,F401 (fixtures model, text)

transformers.logging.set_verbosity_error()
TARGET = 2 * TRAIN_LEN


def tune(model, text, *extra) -> int:
    return main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 *extra])


def test_plan_lists_every_candidate_with_its_estimate(model, text, capsys):
    assert tune(model, text, "--dry-run") == 0
    out = capsys.readouterr().out
    for method in planning.tunable_methods():
        assert f"\n  {method}" in out, method
    assert "estimate per window = passes x model FLOPs / (0.5 x matmul peak)" in out
    assert "estimated total" in out and "the budget holds the whole plan" in out
    # three settings each where the trained length allows them (window / chunk derived from 32)
    assert out.count("\n  self-extend(") == 3 and out.count("\n  rerope(") == 3


def test_estimate_rule():
    """passes x model_flops / (EFFICIENCY x peak); the rounds halve the field; the budget leaves rounds out."""
    cands = [planning.Candidate("yarn", "config"), planning.Candidate("rerope", "attention", {"window": 8}, 2)]
    plan = planning.make_plan(cands, [], target=64, trained=32, windows=3, budget_s=10.0, peak_flops=1e9,
                              flops=1e9, flops_trained=0.5e9)
    assert plan.seconds == {"yarn": 2.0, "rerope(window=8)": 4.0}
    assert plan.rounds == [6.0, 6.0, 6.0]            # two candidates: the field stays at two
    assert plan.trained_check_s == pytest.approx(1.0 + 2.0 + 1.0)
    assert plan.fitting_rounds() == 1
    assert "leaves out windows 2..3" in planning.format_plan(plan)
    plan.budget_s = 4.5
    text = planning.format_plan(plan, lambda L: 1e9 * L / 64)
    assert "cannot measure one window per candidate" in text and "fewer candidates: 1 of 2 fit (yarn)" in text


def test_dry_run_measures_nothing(model, text, monkeypatch, capsys):
    def forbidden(*a, **k):
        raise AssertionError("dry run measured")

    monkeypatch.setattr(measure, "window_loss", forbidden)
    monkeypatch.setattr("posenc.hf.eval.loop.evaluate_model", forbidden)
    assert tune(model, text, "--dry-run", "--out", str(text) + ".out") == 0
    assert "plan:" in capsys.readouterr().out


def test_survivors_clear_winner_and_tie():
    clear = {"a": [1.0, 1.1, 0.9], "b": [1.5, 1.62, 1.39]}           # b worse by 0.5 +- 0.01
    assert racing.survivors(clear) == ["a"]
    tie = {"a": [1.0, 1.1, 0.9], "b": [1.02, 1.07, 0.93]}            # differences +0.02, -0.03, +0.03
    assert racing.survivors(tie) == ["a", "b"]
    one = {"a": [1.0], "b": [1.1], "c": [1.2], "d": [1.3], "e": [1.4]}
    assert racing.survivors(one) == ["a", "b", "c"]                   # one window: the better half


def test_race_spends_windows_on_survivors_only():
    truth = {"good": 1.0, "close": 1.001, "bad": 2.0, "worse": 3.0}
    calls = []

    def score(name, w):
        calls.append((name, w))
        return truth[name] + 0.1 * math.sin(w) + (0.01 * w if name == "close" else 0.0)

    result = racing.race(list(truth), 4, score, log=lambda *_: None)
    assert {n for n, w in calls if w > 0} <= {"good", "close"}
    assert result["alive"][0] == "good"
    assert racing.answer(result["losses"], dict.fromkeys(truth, "config"))["winner"] == "good"


def test_answer_prefers_a_config_within_the_noise():
    losses = {"att": [1.0, 1.1, 0.9], "cfg": [1.02, 1.07, 0.93]}
    ans = racing.answer(losses, {"att": "attention", "cfg": "config"})
    assert ans["best"] == "att" and ans["winner"] == "cfg" and ans["tie"] == ["att", "cfg"]
    assert "config deploys" in ans["reason"]
    clear = racing.answer({"att": [1.0, 1.1, 0.9], "cfg": [1.5, 1.62, 1.39]}, {"att": "attention", "cfg": "config"})
    assert clear["winner"] == "att" and clear["tie"] == ["att"]


def test_synthetic_scorer_known_answer_and_trained_length_flag(model, text, tmp_path, monkeypatch):
    """A scorer whose answer is known (through the command, no model run): yarn is best at the target by a clear
    margin, linear is worse and raises the trained length's loss by 0.1 nats (flagged), rerope's windows lose."""
    at_target = {"yarn": 1.0, "linear": 1.5, "rerope": 2.0}
    seen = []

    def loss(model_dir, s):
        method, length, window = s.methods[0], s.eval_lens[0], s.eval_offset // s.eval_lens[0]
        seen.append((method, length, window, tuple(sorted(s.method_options.items()))))
        if length == TRAIN_LEN:
            return 3.0 + (0.1 if method == "linear" else 0.0)
        return at_target[method] + 0.01 * window * (1 if method == "yarn" else -1) + 0.001 * (window % 2)

    monkeypatch.setattr(measure, "window_loss", loss)
    out = tmp_path / "o"
    assert tune(model, text, "--methods", "linear,yarn,rerope", "--out", str(out)) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["answer"]["winner"] == "yarn" and doc["answer"]["tie"] == ["yarn"]
    assert doc["flagged"] == ["linear"]
    assert "linear: +0.1000 nats vs unchanged **flagged**" in (out / "report.md").read_text()
    # window 1 for all five candidates (rerope has three settings); window 2 for the better half (three); then
    # yarn alone is left, and the third window is not measured
    at = [sum(L == TARGET and w == k for m, L, w, _ in seen) for k in range(3)]
    assert at == [5, 3, 0]
    assert len(seen) == len(set(seen))         # nothing measured twice


def test_frequency_winner_writes_a_config_transformers_loads(model, text, tmp_path, capsys):
    out = tmp_path / "o"
    assert tune(model, text, "--methods", "linear,yarn", "--out", str(out)) == 0
    doc = json.loads((out / "results.json").read_text())
    winner = doc["answer"]["winner"]
    assert winner in ("linear", "yarn") and (out / "report.md").is_file()
    config = transformers.AutoConfig.from_pretrained(str(out))
    assert config.rope_parameters["rope_type"] == winner and config.rope_parameters["factor"] == 2.0
    assert f"Winner: **{winner}**" in (out / "report.md").read_text()
    # every candidate raced the same windows first: window 0 of both at the target length
    assert {f"linear@{TARGET}#0", f"yarn@{TARGET}#0", f"none@{TRAIN_LEN}#0"} <= set(doc["measurements"])


def test_attention_winner_writes_a_patch_spec(model, text, tmp_path):
    out = tmp_path / "o"
    assert tune(model, text, "--methods", "rerope", "--out", str(out)) == 0
    spec = json.loads((out / "patch_spec.json").read_text())
    assert spec["method"] == "rerope" and set(spec) == {"method", "window"}
    tokens = torch.randint(0, 256, (1, TARGET))
    ids = {}
    for form in ("spec", "typed"):
        m = transformers.AutoModelForCausalLM.from_pretrained(model)
        posenc.patch(m, str(out / "patch_spec.json") if form == "spec" else posenc.ReRoPE(window=spec["window"]))
        ids[form] = m(tokens).logits
    torch.testing.assert_close(ids["spec"], ids["typed"], rtol=0, atol=0)


def test_patch_spec_refusals_are_one_line(tmp_path):
    from posenc._internal.errors import ConfigError
    from posenc.attention import read_patch_spec, rule_spec

    bad = tmp_path / "spec.json"
    bad.write_text('{"window": 8}')
    with pytest.raises(ConfigError, match='expected a JSON object with "method"'):
        read_patch_spec(bad)
    with pytest.raises(ConfigError, match="takes no option group_size"):
        read_patch_spec({"method": "rerope", "group_size": 2})
    assert read_patch_spec(rule_spec(posenc.ReRoPE(window=8))) == \
        posenc.ReRoPE(window=8)


def test_eval_reads_a_patch_spec_as_its_method_and_options(model, text, tmp_path, capsys):
    """`posenc eval --methods none,SPEC.json` gives the rows of `--methods none,self-extend --method-options ...`
    (the spec's fields become the method's options); a spec whose field --method-options also sets is refused."""
    from posenc.attention import rule_spec

    spec = tmp_path / "patch_spec.json"
    spec.write_text(json.dumps(rule_spec(posenc.SelfExtend(group_size=2, window=8))))
    common = ["eval", model, "--eval-lens", f"{TRAIN_LEN},{TARGET}", "--eval-tokens", str(TARGET), "--data", text,
              "--sliding-stride", "0", "--threads", "1", "--no-progress", "--factor", "2"]
    rows = {}
    for form, methods in (("spec", ["--methods", f"none,{spec}"]),
                          ("options", ["--methods", "none,self-extend", "--method-options",
                                       "self-extend.group_size=2,self-extend.window=8"])):
        assert main([*common, *methods, "--out", str(tmp_path / form)]) == 0
        # the rows without their timings (wall, rate, memory: this machine's, not the method's)
        rows[form] = [{k: r[k] for k in ("scaling", "eval_len", "metric", "protocol", "value", "n_scored")}
                      for r in json.loads((tmp_path / form / "results.json").read_text())["results"]]
    assert rows["spec"] == rows["options"] and {r["scaling"] for r in rows["spec"]} >= {"none"}
    assert len({r["scaling"] for r in rows["spec"]}) == 2
    err = fails(capsys, main, "eval", [*common, "--methods", f"none,{spec}", "--method-options",
                                       "self-extend.window=4"])
    assert f"--methods: patch spec {spec} sets self-extend.window, and --method-options sets it too" in err


def test_gguf_plan(tmp_path, capsys):
    """A GGUF file is planned as a folder is (its config from the file's metadata; trained 64 here)."""
    from posenc_hf_folders import tiny_gguf

    path = tiny_gguf(tmp_path / "m.gguf")
    assert main(["tune", str(path), "--target-length", "128", "--methods", "yarn,rerope", "--dry-run",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "(trained 64, factor 2)" in out and "\n  yarn" in out and "\n  rerope(window=32)" in out


def test_resume_measures_nothing_twice(model, text, tmp_path, monkeypatch):
    out = tmp_path / "o"
    assert tune(model, text, "--methods", "linear,yarn", "--out", str(out)) == 0
    first = json.loads((out / "results.json").read_text())
    # an interruption: only the measurements were saved
    (out / "results.json").write_text(json.dumps({"key": first["key"], "incomplete": True,
                                                  "measurements": first["measurements"]}))
    (out / "report.md").unlink()
    monkeypatch.setattr(measure, "window_loss", lambda *a, **k: pytest.fail("measured twice"))
    assert tune(model, text, "--methods", "linear,yarn", "--out", str(out), "--resume") == 0
    again = json.loads((out / "results.json").read_text())
    assert again["answer"] == first["answer"] and again["measurements"] == first["measurements"]


def test_bad_input_is_one_line(model, text, tmp_path, capsys):
    assert "methods: expected one of" in fails(capsys, main, "tune", [
        "tune", model, "--target-length", "64", "--methods", "nope", "--dry-run"])
    assert "target_length: expected more than the model's trained length 32" in fails(capsys, main, "tune", [
        "tune", model, "--target-length", "16", "--dry-run"])
    assert "budget: expected a positive duration" in fails(capsys, main, "tune", [
        "tune", model, "--target-length", "64", "--budget", "0", "--dry-run"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("[1]")
    assert "expected a JSON object" in fails(capsys, main, "tune", ["tune", str(broken), "--target-length", "64",
                                                                     "--dry-run"])
    err = fails(capsys, main, "tune", ["tune", model, "--target-length", "64", "--data", text, "--budget",
                                       "0.000001s", "--out", str(tmp_path / "o"), "--threads", "1"])
    assert "cannot measure one window per candidate" in err
    assert not (tmp_path / "o").exists()
