"""The copy task: episode layout, sampler determinism, scoring against oracle models."""

from __future__ import annotations

import random

import pytest
import torch

from posenc.lab.data import IGNORE
from posenc.lab.tasks.copy import COPY_SEP, CopySampler, copy_eval, copy_example
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
