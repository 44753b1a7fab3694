"""The copy task: episode layout, sampler determinism, scoring against oracle models."""

from __future__ import annotations

import math
import random

import pytest
import torch

from posenc.lab.data import IGNORE
from posenc.errors import ConfigError, DataError
from posenc.lab.presets import get_preset
from posenc.lab.tasks.copy import COPY_SEP, CopySampler, copy_eval, copy_example, copy_len, shortest_copy
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import NoPEScheme


def test_copy_example_layout():
    inputs, targets = copy_example(4, 12, random.Random(0))
    xs = inputs[:4]
    assert inputs[4] == COPY_SEP and inputs[5:9] == xs and len(inputs) == 12
    assert targets[4:8] == xs and all(t == IGNORE for i, t in enumerate(targets) if not 4 <= i < 8)
    x, y = CopySampler(21, 5, 0).batch(0)
    assert x.shape == y.shape == (5, 21) and (y != IGNORE).sum(1).min() >= 1
    assert torch.equal(x, CopySampler(21, 5, 0).batch(0)[0])


class _Copier(torch.nn.Module):
    """Oracle for the copy task: after the separator at position n, predicts the token n + 1 places back."""

    scheme = NoPEScheme()

    def __init__(self, wrong_last: bool = False):
        super().__init__()
        self.wrong_last = wrong_last

    def forward(self, tokens):
        B, T = tokens.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            n = (tokens[b] == COPY_SEP).nonzero()[0].item()
            for i in range(n):
                tok = int(tokens[b, i]) if not (self.wrong_last and i == n - 1) else 1 + int(tokens[b, i]) % 255
                logits[b, n + i, tok] = 1.0
        return logits


def test_copy_scoring_with_oracle_models():
    assert copy_eval(_Copier(), 21, n_examples=3, seed=0) == {"exact_match": 1.0, "token_accuracy": 1.0}
    r = copy_eval(_Copier(wrong_last=True), 21, n_examples=3, seed=0)
    assert r == {"exact_match": 0.0, "token_accuracy": pytest.approx(9 / 10)}


def test_learned_model_is_not_evaluated_past_its_table():
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="learned", d_model=32, n_layers=1, n_heads=2, max_len=16)).eval()
    assert copy_eval(model, 32, n_examples=2, seed=0) is None


def test_default_bytes_are_the_uniform_draw_of_randrange():
    # the repeated-bytes episode is the plain draw (results of earlier runs stay reproducible)
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert copy_example(40, 81, rng_a)[0][:40] == [rng_b.randrange(1, 256) for _ in range(40)]


@pytest.mark.parametrize("seq_len", [9, 128, 512])
def test_distinct_copies_and_their_lengths(seq_len):
    sampler = CopySampler(seq_len, 64, seed=3, distinct=True, min_fraction=0.5)
    x, y = sampler.batch(5)
    longest = copy_len(seq_len)
    for row, target in zip(x.tolist(), y.tolist()):
        n = row.index(COPY_SEP)
        assert math.ceil(0.5 * longest) <= n <= longest
        assert len(set(row[:n])) == n and COPY_SEP not in row[:n]  # no repeats, no separator in the content
        assert row[n + 1:2 * n + 1] == row[:n] and [t for t in target if t != IGNORE] == row[:n]
    assert shortest_copy(128, 0.0) == 1 and shortest_copy(128, 1.0) == copy_len(128) == 63
    assert shortest_copy(128, 0.5) == 32  # ceil(31.5)


def test_distinct_scoring_and_limits():
    assert copy_eval(_Copier(), 512, n_examples=2, seed=0, distinct=True) == {"exact_match": 1.0,
                                                                              "token_accuracy": 1.0}
    with pytest.raises(DataError, match="seq_len.*512"):
        CopySampler(1024, 2, 0, distinct=True)
    with pytest.raises(ConfigError, match="eval_lens.*512"):
        get_preset("copy-cpu", copy_distinct=True, eval_lens=[128, 1024])
    with pytest.raises(ConfigError, match="copy_min_fraction"):
        get_preset("copy-cpu", copy_min_fraction=1.5)
