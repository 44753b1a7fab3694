"""posenc tune with a fixed grid, the form a study of fixed windows takes (scripts/smollm2_study.py): ``--race none``
measures every candidate on every window, ``--windows N`` caps the windows, ``--method-options`` races an
attention method once with exactly the options given, and ``--methods none`` races the unchanged model as a
baseline (its deploy file is the model's own config). Bad values of each are one line. The scorer is synthetic
(measure.window_loss replaced), so no model runs a window here."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure, plan as planning  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails  # noqa: E402
from posenc_hf_folders import tune_model_fixture, tune_text_fixture  # noqa: E402,F401 (fixtures model, text)

TARGET = 2 * TRAIN_LEN
# what the synthetic scorer returns at the target length: none is worst, yarn best by far, self-extend between
AT_TARGET = {"none": 3.0, "yarn": 1.0, "self-extend": 2.0}


def tune(model, text, *extra) -> int:
    return main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 *extra])


@pytest.fixture
def seen(monkeypatch):
    """The measurements asked for: (method, length, window, options), each answered by the synthetic scorer."""
    calls = []

    def loss(model_dir, s):
        method, length, window = s.methods[0], s.eval_lens[0], s.eval_offset // s.eval_lens[0]
        calls.append((method, length, window, tuple(sorted(s.method_options.items()))))
        return 3.0 if length == TRAIN_LEN else AT_TARGET[method] + 0.01 * window
    monkeypatch.setattr(measure, "window_loss", loss)
    return calls


GRID = ("--race", "none", "--windows", "3", "--methods", "none,yarn,self-extend", "--method-options",
        "self-extend.window=8,self-extend.group_size=4", "--search", "none")


def test_race_none_measures_every_candidate_on_every_window(model, text, tmp_path, seen, capsys):
    out = tmp_path / "o"
    assert tune(model, text, *GRID, "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "--race none: every candidate on every window" in printed
    doc = json.loads((out / "results.json").read_text())
    names = [c["name"] for c in doc["plan"]["candidates"]]
    assert names == ["none", "yarn", "self-extend(window=8,group_size=4)"]    # one self-extend: the options given
    at_target = sorted((m, w) for m, L, w, _ in seen if L == TARGET)
    assert at_target == sorted((m, w) for m in AT_TARGET for w in range(3))   # nobody eliminated, 3 windows each
    assert doc["race"]["rounds"] == [names] * 3 and doc["plan"]["rounds"] == [doc["plan"]["rounds"][0]] * 3
    se = {opts for m, L, w, opts in seen if m == "self-extend"}
    assert se == {(("self-extend.group_size", 4), ("self-extend.window", 8))}
    # the baseline is the trained-length check's reference, measured once there and not checked against itself
    assert sum(m == "none" and L == TRAIN_LEN for m, L, w, _ in seen) == 1 and "none" not in doc["trained_check"]
    assert len(seen) == len(set(seen))
    assert doc["answer"]["winner"] == "yarn" and doc["rules"]["race"].startswith("--race none")


def test_windows_caps_the_race(model, text, tmp_path, seen):
    assert tune(model, text, "--methods", "none,yarn", "--race", "none", "--windows", "1", "--search", "none",
                "--out", str(tmp_path / "o")) == 0
    assert sorted((m, w) for m, L, w, _ in seen if L == TARGET) == [("none", 0), ("yarn", 0)]


def test_the_baseline_winning_deploys_the_models_own_config(model, text, tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "window_loss", lambda model_dir, s: 0.5 if s.methods[0] == "none" else 2.0)
    out = tmp_path / "o"
    assert tune(model, text, "--methods", "none,linear", "--search", "none", "--out", str(out)) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["answer"]["winner"] == "none" and doc["deploy_files"] == ["config.json"]
    written = json.loads((out / "config.json").read_text())
    assert written["max_position_embeddings"] == TRAIN_LEN and not written.get("rope_scaling")
    assert (written.get("rope_parameters") or {}).get("rope_type", "default") == "default"


def test_plan_estimates_every_window_for_every_candidate_under_race_none():
    cands = [planning.Candidate("yarn", "config"), planning.Candidate("none", "config"),
             planning.Candidate("rerope", "attention", {"window": 8}, 2)]
    kw = dict(target=64, trained=32, windows=3, budget_s=100.0, peak_flops=1e9, flops=1e9, flops_trained=0.5e9)
    assert planning.make_plan(cands, [], race="none", **kw).rounds == [8.0, 8.0, 8.0]
    assert planning.make_plan(cands, [], **kw).rounds == [8.0, 4.0, 4.0]   # the default race halves the field
    # the trained-length check: yarn, rerope and the unchanged model once (the baseline is that model)
    assert planning.make_plan(cands, [], **kw).trained_check_s == pytest.approx(1.0 + 2.0 + 1.0)


@pytest.mark.parametrize("extra, expected", [
    (("--windows", "0"), "windows must be an integer in [1, 10000], got 0"),
    (("--windows", "two"), "argument --windows: expected an integer, got 'two'"),
    (("--race", "halving"), "argument --race: invalid choice: 'halving'"),
    (("--methods", "yarn,self-extend", "--method-options", "yarn.window=8"),
     "method_options: expected method.option=value with one of the run's methods (self-extend), got 'yarn.window'"),
    (("--methods", "self-extend", "--method-options", "self-extend.reach=8"), "self-extend takes no option 'reach'"),
    (("--methods", "self-extend", "--method-options", "self-extend.window=-1"),
     "method_options: self-extend: window must be a positive integer, got -1"),
    (("--methods", "none,nope"), "methods: expected one of none, "),
])
def test_bad_fixed_grid_input_is_one_line(model, text, capsys, extra, expected):
    err = fails(capsys, main, "tune", ["tune", model, "--target-length", str(TARGET), "--data", text, "--dry-run",
                                       *extra])
    assert expected in err, err
