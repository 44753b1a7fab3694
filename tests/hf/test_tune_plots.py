"""posenc tune's plots on a tiny random Llama (trained at 32 tokens, tuned for 64) with synthetic scorers (the
answer is known, no model runs): the perplexity plot draws results.json's means, survivors and the trained-length
check; the heat map's cells are results.json's retrieval scores and n; both are valid PNGs that report.md links
and results.json lists; they are drawn after every stage (an interrupted tune has them) and again on --resume; a
tune without retrieval draws no heat map and says so; without matplotlib the tune completes and says why."""

from __future__ import annotations

import json
import math
import struct
import sys

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc._internal.errors import DataError  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure, plots  # noqa: E402
from posenc_hf_folders import TRAIN_LEN  # noqa: E402
from posenc_hf_folders import tune_model_fixture, tune_text_fixture  # noqa: E402,F401 (fixtures model, text)

transformers.logging.set_verbosity_error()
TARGET = 2 * TRAIN_LEN
# log-perplexity at the target per method (rerope's three settings share it): yarn best, linear close, rerope out
AT_TARGET = {"yarn": 1.0, "linear": 1.01, "rerope": 2.0}


def loss(model_dir, s) -> float:
    """A synthetic window loss: linear raises the trained length's loss by 0.1 nats (flagged); at the target the
    windows differ a little, so that linear stays within the noise of yarn for a while."""
    method, length, window = s.methods[0], s.eval_lens[0], s.eval_offset // s.eval_lens[0]
    if length == TRAIN_LEN:
        return 3.0 + (0.1 if method == "linear" else 0.0)
    return AT_TARGET[method] + 0.02 * (window % 2) * (1 if method == "linear" else -1)


def ruler(model_dir, settings) -> dict:
    value = 0.5 if settings.methods[0] == "yarn" else 1.0
    return {t: {"value": value, "n": 4, "ci_low": 0.1, "ci_high": 1.0} for t in settings.tasks}


@pytest.fixture
def drawn(monkeypatch):
    """Every plot's data as drawn (the draw functions still write their PNGs): {"ppl": [...], "heat": [...]}."""
    calls = {"ppl": [], "heat": []}
    for key, name in (("ppl", "draw_ppl"), ("heat", "draw_heatmap")):
        original = getattr(plots, name)
        monkeypatch.setattr(plots, name, lambda data, path, o=original, k=key: (calls[k].append(data), o(data, path)))
    monkeypatch.setattr(measure, "window_loss", loss)
    monkeypatch.setattr(measure, "ruler_scores", ruler)
    monkeypatch.setattr(measure, "passkey_rate", lambda m, s: 0.25 if s.methods[0] == "yarn" else 0.75)
    return calls


def tune(model, text, out, *extra) -> int:
    return main(["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
                 "--methods", "linear,yarn,rerope", "--out", str(out), *extra])


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails when the file is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def test_plots_draw_results_json(model, text, tmp_path, drawn):
    out = tmp_path / "o"
    assert tune(model, text, out, "--tasks", "lm,passkey,niah_single_1,vt", "--ruler-samples", "4") == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["plots"] == [plots.PPL_PLOT, plots.HEATMAP] and doc["plots_not_drawn"] == []
    for name in doc["plots"]:
        width, height = png_size(out / name)
        assert width > 200 and height > 200
    report = (out / "report.md").read_text()
    assert "![perplexity.png](perplexity.png)" in report and "![retrieval_heatmap.png](retrieval_heatmap.png)" in report

    ppl = drawn["ppl"][-1]           # the answer's plot: the means results.json holds, in the answer's order
    ranking = doc["answer"]["ranking"]
    assert [c["name"] for c in ppl["candidates"]] == [r["name"] for r in ranking]
    for c, r in zip(ppl["candidates"], ranking):
        assert c["mean_ppl"] == pytest.approx(math.exp(r["mean_loss"]), rel=1e-12)
        assert c["window_ppl"] == [None if x is None else pytest.approx(math.exp(x))
                                   for x in doc["race"]["losses"][c["name"]]]
        assert c["alive"] == (c["name"] in doc["race"]["alive"]) and c["tie"] == r["tie"]
        assert c["flagged"] == (c["name"] in doc["flagged"])
        assert c["trained_ppl"] == pytest.approx(math.exp(doc["measurements"][f"{c['name']}@{TRAIN_LEN}#0"]))
    assert ppl["winner"] == doc["answer"]["winner"] == "yarn" and doc["flagged"] == ["linear"]
    assert ppl["unchanged_trained_ppl"] == pytest.approx(math.exp(3.0))
    assert not all(c["alive"] for c in ppl["candidates"])       # rerope's settings were eliminated

    heat = drawn["heat"][-1]         # the heat map's cells: results.json's passkey and RULER scores and n
    assert heat["rows"] == doc["race"]["alive"] and heat["columns"] == ["passkey", "niah_single_1", "vt"]
    for name, scores, n in zip(heat["rows"], heat["scores"], heat["n"]):
        assert scores == [doc["passkey"][name], doc["ruler"][name]["niah_single_1"]["value"],
                          doc["ruler"][name]["vt"]["value"]]
        assert n == [doc["plan"]["retrieval"]["passkey"]["samples"], 4, 4]
    # drawn after every stage: the trained-length check, each window, each survivor's passkey and RULER, the answer
    survivors = len(doc["race"]["alive"])
    assert len(drawn["ppl"]) == 1 + len(doc["race"]["rounds"]) + 2 * survivors + 1
    assert drawn["ppl"][0]["candidates"][0]["mean_ppl"] is None           # the trained-length check alone
    assert len(drawn["heat"]) == 2 * survivors + 1
    first = drawn["heat"][0]         # after the first survivor's passkey: its one cell
    assert (first["rows"], first["columns"], first["scores"]) == (["yarn"], ["passkey"], [[0.25]])


def test_an_interrupted_tune_has_its_plots_and_resume_draws_them_again(model, text, tmp_path, drawn, monkeypatch):
    out = tmp_path / "o"

    def stop_at_second_window(model_dir, s):
        if s.eval_lens[0] == TARGET and s.eval_offset:
            raise DataError("interrupted")
        return loss(model_dir, s)

    monkeypatch.setattr(measure, "window_loss", stop_at_second_window)
    assert tune(model, text, out) != 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["incomplete"] and doc["plots"] == [plots.PPL_PLOT] and png_size(out / plots.PPL_PLOT)
    assert not (out / "report.md").exists()
    before = len(drawn["ppl"])
    monkeypatch.setattr(measure, "window_loss", loss)
    assert tune(model, text, out, "--resume") == 0
    assert len(drawn["ppl"]) > before and json.loads((out / "results.json").read_text())["plots"] == [plots.PPL_PLOT]


def test_a_tune_without_retrieval_draws_no_heat_map_and_says_so(model, text, tmp_path, drawn):
    out = tmp_path / "o"
    assert tune(model, text, out) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["plots"] == [plots.PPL_PLOT] and not (out / plots.HEATMAP).exists() and drawn["heat"] == []
    assert doc["plots_not_drawn"] == ["no retrieval heat map: --tasks lm measures no retrieval (add passkey or ruler)"]
    assert "Note: No retrieval heat map: --tasks lm measures no retrieval" in (out / "report.md").read_text()


def test_without_matplotlib_the_tune_completes_and_says_why(model, text, tmp_path, drawn, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] or ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)         # None in sys.modules: the import raises ImportError
    out = tmp_path / "o"
    assert tune(model, text, out, "--tasks", "lm,passkey") == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["plots"] == [] and doc["plots_not_drawn"][0].startswith("plots skipped: matplotlib cannot be imported")
    assert not any((out / name).exists() for name in plots.PLOTS) and drawn["ppl"] == []
    assert "Note: Plots skipped: matplotlib cannot be imported" in (out / "report.md").read_text()
    assert doc["answer"]["winner"] == "yarn"
