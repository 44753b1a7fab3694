"""posenc tune's short LongRoPE search on the tiny random Llama (trained at 32 tokens, tuned for 64): the dry-run
plan puts the searched candidate in or leaves it out by the budget, with the reason; a run searches on the training
split with posenc search's own code (the factors equal what `posenc search` writes with the same settings), races
the searched config on the validation windows like the rest, resumes an interrupted search without redoing its
finished evaluations, and a winning searched candidate deploys a config transformers loads that reproduces the
reported first-window perplexity."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure, plan as planning, searched  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, short_text, tiny_llama  # noqa: E402

transformers.logging.set_verbosity_error()
TARGET = 2 * TRAIN_LEN
SMALL = ("--population", "4", "--generations", "1")     # 4 + 1 x 2 = 6 evaluations, up to 5 held out
SEARCHED = "longrope (searched)"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("tune-search") / "llama"))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return str(short_text(tmp_path_factory.mktemp("text") / "text.txt"))


def tune(model, text, *extra) -> int:
    return main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 "--methods", "linear,longrope", *SMALL, *extra])


def test_evaluations_are_the_searchs_own_count():
    from posenc.search.longrope import LongRopeSettings

    st = LongRopeSettings(population=8, parents=4, generations=4, heldout_top=2)
    assert st.evaluations() == (8 + 4 * 4, 2 + 3) and st.evaluations(heldout=False) == (24, 0)
    plan = planning.make_plan([planning.Candidate("yarn", "config")], [], target=64, trained=32, windows=2,
                              budget_s=100.0, peak_flops=1e9, flops=1e9, flops_trained=0.5e9,
                              search={"included": True, "evaluations": 24, "heldout": 5})
    assert plan.search_s == pytest.approx(29 * 2.0) and plan.total_s == pytest.approx(58 + 2 + 2 * 2)
    plan.budget_s = 58 + 2 + 1              # the search and the check fit, a window (2 s) does not
    assert plan.fitting_rounds() == 0


def test_dry_run_puts_the_search_in_or_leaves_it_out_by_budget(model, text, monkeypatch, capsys):
    monkeypatch.setattr("posenc.hf.throughput.matmul_peak", lambda *a, **k: 1e6)   # estimates of seconds
    assert tune(model, text, "--dry-run", "--budget", "1h") == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("LongRoPE search:"))
    assert line.startswith("LongRoPE search: in,") and "the budget holds it" in line
    assert "6 + up to 5 held-out evaluations (population 4, 1 generations)" in line
    assert f"\n  {SEARCHED}" in out
    search_s, first = (float(x) for x in re.search(r"\(search (\S+) s \+ .* = (\S+) s, budget", line).groups())
    # a budget between one window per candidate with and without the search leaves it out, with the sums
    assert tune(model, text, "--dry-run", "--budget", f"{first - search_s / 2}s") == 0
    out = capsys.readouterr().out
    assert f"\n  {SEARCHED}" not in out
    assert "LongRoPE search: left out: the budget does not hold it beside one window per candidate (search" in out
    assert "the budget cannot measure one window per candidate" not in out
    # --search longrope puts it in whatever the budget; --search none leaves it out; --methods without longrope too
    assert tune(model, text, "--dry-run", "--budget", f"{first - search_s / 2}s", "--search", "longrope") == 0
    assert "LongRoPE search: in," in capsys.readouterr().out
    assert tune(model, text, "--dry-run", "--search", "none") == 0
    assert "LongRoPE search: left out: --search none" in capsys.readouterr().out
    assert main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--dry-run",
                 "--methods", "yarn"]) == 0
    assert "left out: --methods does not name longrope" in capsys.readouterr().out


@pytest.fixture(scope="module")
def run(model, text, tmp_path_factory):
    """One tune with the search, every window's settings recorded; the searched candidate's measurements are the
    real ones, the others' raised by one nat at the target so that the searched one wins (the deploy test)."""
    real, seen = measure.window_loss, []

    def spy(model_dir, s):
        seen.append(s)
        loss = real(model_dir, s)
        return loss if s.config or s.eval_lens[0] != TARGET else loss + 1.0

    out = tmp_path_factory.mktemp("run") / "o"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "window_loss", spy)
        assert tune(model, text, "--out", str(out), "--search", "longrope") == 0
    return out, json.loads((out / "results.json").read_text()), seen


def test_the_searched_factors_are_posenc_searchs(model, text, run, tmp_path):
    from posenc.hf.search import search_main

    out, doc, _ = run
    oracle = tmp_path / "oracle.json"
    assert search_main([model, "--target-length", str(TARGET), "--data", text, "--windows", "1", "--heldout-windows",
                        "1", "--heldout-top", str(searched.HELDOUT_TOP), *SMALL, "--threads", "1", "--no-progress",
                        "--out", str(oracle)]) == 0
    expected = json.loads(oracle.read_text())["rope_parameters"]
    got = json.loads((out / searched.CONFIG).read_text())["rope_parameters"]
    assert got["rope_type"] == "longrope" and got["long_factor"] == expected["long_factor"]
    assert got["short_factor"] == expected["short_factor"]
    assert doc["search"]["long_factor"] == expected["long_factor"]
    assert doc["search"]["evaluations"] == 6 and doc["plan"]["search"]["included"]


def test_searched_on_training_raced_on_validation(text, run):
    from posenc._internal.fingerprint import tensor_fingerprint
    from posenc.hf.lab_bridge import scored_text, training_bytes

    out, doc, seen = run
    # the search scored the training split (byte tokens: the split's first 2 x 65 bytes) ...
    problem = json.loads((out / searched.CHECKPOINT).read_text())["search"]["problem"]
    train = training_bytes(text)[0]
    assert problem["search_tokens"] == tensor_fingerprint(train[:TARGET + 1])
    # ... the race the validation split: every candidate, the searched one too, on the same windows
    at_target = [s for s in seen if s.eval_lens[0] == TARGET]
    windows = {}
    for s in at_target:
        assert s.data_split == "validation" and s.eval_tokens == TARGET
        windows.setdefault(s.config or s.methods[0], set()).add(s.eval_offset // TARGET)
    assert windows[str(out / searched.CONFIG)] >= {0} and windows["linear"] >= {0} and windows["longrope"] >= {0}
    assert f"{SEARCHED}@{TARGET}#0" in doc["measurements"] and f"{SEARCHED}@{TRAIN_LEN}#0" in doc["measurements"]
    val = scored_text(text, "validation")[0]
    assert len(train) + len(val) == len(open(text, "rb").read())     # two disjoint parts of the file


def test_a_searched_winner_deploys_its_config(model, text, run):
    from posenc.perplexity import lm_perplexity
    from posenc.hf.lab_bridge import scored_text

    out, doc, _ = run
    assert doc["answer"]["winner"] == SEARCHED and doc["deploy_files"] == ["config.json"]
    assert json.loads((out / "config.json").read_text()) == json.loads((out / searched.CONFIG).read_text())
    config = transformers.AutoConfig.from_pretrained(str(out))
    assert config.rope_parameters["long_factor"] == doc["search"]["long_factor"]
    m = transformers.AutoModelForCausalLM.from_pretrained(model, config=config).eval()
    tokens = scored_text(text, "validation")[0][:TARGET + 1].long()
    with torch.no_grad():
        ppl = lm_perplexity(m, tokens, TARGET, windows=1)
    assert ppl == pytest.approx(math.exp(doc["measurements"][f"{SEARCHED}@{TARGET}#0"]), rel=1e-4)
    report = (out / "report.md").read_text()
    assert "## LongRoPE search" in report and f"Winner: **{SEARCHED}**" in report


def test_resume_redoes_no_finished_search_evaluation(model, text, tmp_path, monkeypatch):
    """Interrupted in the search's second generation: --resume scores only what the checkpoint lacks."""
    import posenc.search.fitness as fitness

    real, calls = fitness.lm_perplexity, []

    class Interrupted(Exception):
        pass

    def counting(*a, **k):
        calls.append(1)
        if stop_at and len(calls) == stop_at:
            raise Interrupted
        return real(*a, **k)

    monkeypatch.setattr(fitness, "lm_perplexity", counting)
    out, args = tmp_path / "o", ("--search", "longrope", "--generations", "2")
    stop_at = 4 + 2 + 1                         # the initial 4 and generation 1's 2 are committed
    try:
        status = tune(model, text, "--out", str(out), *args)
    except Interrupted:
        status = None
    assert status != 0
    kept = json.loads((out / searched.CHECKPOINT).read_text())
    assert len(kept["evaluated"]) == 6 and kept["result"] is None
    calls.clear()
    stop_at = None
    assert tune(model, text, "--out", str(out), "--resume", *args) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["search"]["evaluations"] == 8
    assert len(calls) == 2 + doc["search"]["heldout_evaluations"]     # generation 2 and the held-out choice
