"""posenc tune with RULER's tasks on the race's survivors, on a tiny random Llama (trained at 32 byte tokens, tuned
for 512: the shortest length niah_single_1's template fits): each survivor's scores with n == --ruler-samples and
the Wilson interval around them, --resume measuring nothing again, the plan's retrieval lines (--dry-run), the
group name ``ruler`` as its eleven tasks, the answer's note when the perplexity winner retrieves worse (and posenc
pick --evidence citing the scores, with its own note), and bad --tasks as one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc.cli import main  # noqa: E402
from posenc.hf.tune import command, measure, plan as planning  # noqa: E402
from posenc.hf.tune.report import retrieval_note  # noqa: E402
from posenc.lab.tasks.ruler import RULER_TASKS  # noqa: E402
from posenc.tools.pick import pick  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails, tiny_llama  # noqa: E402

transformers.logging.set_verbosity_error()
TARGET = 16 * TRAIN_LEN


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("tune") / "llama"))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """12,000 characters of posenc's own source: its held-out tenth holds two windows of 512 byte tokens."""
    import posenc

    root = Path(posenc.__file__).parent
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("".join((root / n).read_text() for n in ("cli.py", "gguf.py", "hf/tune/plan.py"))[:12000])
    return str(path)


def tune(model, text, *extra) -> int:
    return main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 "--methods", "linear,yarn", *extra])


def test_ruler_scores_each_survivor_and_resume_measures_nothing(model, text, tmp_path, monkeypatch):
    out = tmp_path / "o"
    assert tune(model, text, "--tasks", "lm,niah_single_1", "--ruler-samples", "2", "--out", str(out)) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["tasks"] == ["lm", "niah_single_1"] and set(doc["ruler"]) == set(doc["race"]["alive"])
    for name, scores in doc["ruler"].items():
        s = scores["niah_single_1"]
        assert s["n"] == 2 and s["ci_low"] <= s["value"] <= s["ci_high"], (name, s)
        assert doc["measurements"][f"{name}@{TARGET}#niah_single_1/2"] == s
    report = (out / "report.md").read_text()
    assert "## RULER (survivors, 512 tokens, 2 samples per task)" in report
    assert "| survivor | niah_single_1 | pooled |" in report and ", n 2 |" in report

    def measured(*a, **k):
        pytest.fail("measured again")

    for name in ("window_loss", "passkey_rate", "ruler_scores"):
        monkeypatch.setattr(measure, name, measured)
    assert tune(model, text, "--tasks", "lm,niah_single_1", "--ruler-samples", "2", "--out", str(out),
                "--resume") == 0
    again = json.loads((out / "results.json").read_text())
    assert again["measurements"] == doc["measurements"] and again["ruler"] == doc["ruler"]
    # an interruption before the last survivor's RULER: only that survivor is measured on resume
    last = doc["race"]["alive"][-1]
    del doc["measurements"][f"{last}@{TARGET}#niah_single_1/2"]
    (out / "results.json").write_text(json.dumps({"key": doc["key"], "incomplete": True,
                                                  "measurements": doc["measurements"]}))
    calls = []

    def scores(model_dir, settings):
        calls.append((settings.methods[0], settings.tasks, settings.options["ruler_samples"]))
        return {"niah_single_1": {"value": 0.5, "n": 2, "ci_low": 0.09, "ci_high": 0.91}}

    monkeypatch.setattr(measure, "ruler_scores", scores)
    assert tune(model, text, "--tasks", "lm,niah_single_1", "--ruler-samples", "2", "--out", str(out),
                "--resume") == 0
    assert calls == [(last, ["niah_single_1"], 2)]


def test_dry_run_prints_the_ruler_estimate_and_ruler_is_eleven_tasks(model, text, monkeypatch, capsys):
    monkeypatch.setattr("posenc.hf.eval.loop.evaluate_model", lambda *a, **k: pytest.fail("dry run measured"))
    assert tune(model, text, "--tasks", "ruler", "--ruler-samples", "3", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "retrieval on the race's survivors (estimated 2) at 512 tokens: a sample is one prefill" in out
    lines = [line for line in out.splitlines() if "samples x (prefill + " in line]
    assert [line.split()[0] for line in lines] == list(RULER_TASKS)
    assert "3 samples x (prefill + 128 decode steps)" in lines[0] and "(prefill + 30 decode steps)" in lines[8]
    assert command._tasks("passkey,ruler,lm") == ["lm", "passkey", *RULER_TASKS]
    assert command._tasks("vt,niah_single_1") == ["lm", "vt", "niah_single_1"]


def test_retrieval_estimate_rule():
    """A sample is one prefill plus its decode steps (each flops_step); per survivor a task costs samples x (1 +
    decode x step / window) windows; the survivors are the race's last round, and the budget reserves them."""
    cands = [planning.Candidate("yarn", "config"), planning.Candidate("rerope", "attention", {"window": 8}, 2),
             planning.Candidate("linear", "config")]
    plan = planning.make_plan(cands, [], target=64, trained=32, windows=2, budget_s=100.0, peak_flops=1e9,
                              flops=1e9, flops_trained=0.5e9, retrieval={"niah_single_1": (5, 128)},
                              flops_step=1e7)
    assert plan.survivors == 2 and plan.retrieval["niah_single_1"]["windows"] == pytest.approx(5 * 2.28)
    assert plan.retrieval_s() == pytest.approx(5 * 2.28 * (2.0 + 2.0))          # the two cheapest windows
    assert plan.retrieval_s(["rerope(window=8)"]) == pytest.approx(5 * 2.28 * 4.0)
    assert plan.total_s == pytest.approx(plan.trained_check_s + sum(plan.rounds) + 45.6)
    plan.budget_s = plan.trained_check_s + 45.6 + plan.rounds[0] + 1.0
    assert plan.fitting_rounds() == 1 and "niah_single_1" in planning.format_plan(plan)
    assert planning.retrieval_samples("passkey", 5) == (100, 5)
    assert planning.retrieval_samples("vt", 7) == (7, 30)


def test_answer_notes_a_winner_that_retrieves_worse(model, text, tmp_path, monkeypatch):
    """A synthetic scorer: yarn wins on perplexity within the noise of linear (both survive), linear scores higher
    on RULER."""
    at_target = {("yarn", 0): 1.0, ("yarn", 1): 1.05, ("linear", 0): 1.03, ("linear", 1): 1.03}
    monkeypatch.setattr(measure, "window_loss", lambda m, s: at_target[s.methods[0], s.eval_offset // TARGET]
                        if s.eval_lens[0] == TARGET else 3.0)

    def scores(model_dir, settings):
        value = 0.0 if settings.methods[0] == "yarn" else 1.0
        return {t: {"value": value, "n": 4, "ci_low": 0.0, "ci_high": 1.0}
                for t in settings.tasks}

    monkeypatch.setattr(measure, "ruler_scores", scores)
    out = tmp_path / "o"
    assert tune(model, text, "--tasks", "lm,niah_single_1,vt", "--ruler-samples", "4", "--out", str(out)) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["answer"]["winner"] == "yarn" and set(doc["ruler"]) == {"yarn", "linear"}
    note = doc["answer"]["retrieval"]
    assert note.startswith("The perplexity winner yarn is not the best survivor on retrieval: on RULER")
    assert "linear scores 1.00" in note and "(n 8)" in note and "overlap" not in note
    assert note in (out / "report.md").read_text()
    # posenc pick --evidence cites the survivors' scores as tune recorded them, and the winner's clearly worse RULER
    rec = pick(TARGET, budget="none", config=model, evidence=str(out))
    assert "survivors' retrieval at length 512" in rec.reasons[0]
    assert "yarn: niah_single_1 0.00 [0.00, 1.00] n 4, vt 0.00 [0.00, 1.00] n 4, mean over" in rec.reasons[0]
    assert any(n.startswith("yarn has the lowest perplexity") and "RULER mean over niah_single_1 + vt: linear 1.00 "
               "[0.68, 1.00], yarn 0.00 [0.00, 0.32]" in n for n in rec.notes), rec.notes


def test_retrieval_note_rules():
    one = {"value": 0.5, "n": 4, "ci_low": 0.15, "ci_high": 0.85}
    assert retrieval_note("a", {"a": 1.0, "b": 0.5}, {"a": {"t": one}, "b": {"t": one}}) is None
    note = retrieval_note("a", {"a": 0.4, "b": 0.8}, {"a": {"t": one}, "b": {"t": {**one, "value": 0.75}}})
    assert "on passkey b finds 0.80 of the keys, a 0.40" in note and "intervals overlap" in note
    assert retrieval_note("a", {}, {"b": {"t": one}}) is None         # the winner was not measured


def test_bad_tasks_are_one_line(model, text, capsys):
    err = fails(capsys, main, "tune", ["tune", model, "--target-length", str(TARGET), "--tasks", "lm,nope",
                                       "--dry-run"])
    assert "tasks: expected one of lm, passkey, ruler, niah_single_1" in err and "got 'nope'" in err
    err = fails(capsys, main, "tune", ["tune", model, "--target-length", str(TARGET), "--tasks", "copy",
                                       "--dry-run"])
    assert "tasks: copy is not a retrieval task" in err and "expected one of lm, passkey, ruler" in err
    err = fails(capsys, main, "tune", ["tune", model, "--target-length", str(TARGET), "--tasks", "ruler",
                                       "--ruler-samples", "0", "--dry-run"])
    assert "ruler_samples" in err
