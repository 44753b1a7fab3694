"""Lab evaluation: perplexity protocols against brute-force oracles, copy/passkey scoring against oracle models,
and the extension-method configs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc import rope_parameters
from posenc.lab import data as D
from posenc.lab.evaluate import (EXTENSION_METHODS, band_counts, copy_eval, extension_scaling, lm_eval,
                                 passkey_eval)
from posenc.model import ModelConfig, TinyLM
from posenc.schemes import NoPEScheme

TOKENS = torch.tensor(list(b"def f(x):\n    return x * 2 + 1\n" * 40), dtype=torch.uint8)


def _model(scheme="rope", max_len=16):
    torch.manual_seed(0)
    return TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2, max_len=max_len)).eval()


def _loss_of_next(model, context: torch.Tensor, target: int) -> float:
    logits = model(context.long()[None])[0, -1]
    return F.cross_entropy(logits[None], torch.tensor([target])).item()


@torch.no_grad()
def test_non_overlapping_matches_a_window_by_window_loop():
    model = _model()
    r = lm_eval(model, TOKENS, 12, n_tokens=60, batch_tokens=30)
    losses = []
    for w in range(5):
        win = TOKENS[w * 12: w * 12 + 13]
        losses += [_loss_of_next(model, win[:t + 1], int(win[t + 1])) for t in range(12)]
    assert r["n_scored"] == 60
    assert r["ppl"] == pytest.approx(math.exp(sum(losses) / 60), rel=1e-5)
    per_pos = [sum(losses[w * 12 + t] for w in range(5)) / 5 for t in range(12)]
    assert r["per_position"] == pytest.approx(per_pos, rel=1e-5)


@torch.no_grad()
def test_sliding_window_gives_every_late_token_full_context():
    model = _model()
    L = 10
    r = lm_eval(model, TOKENS, L, n_tokens=40, stride=1)
    # oracle: the first window scores its L tokens; then each token t >= L is scored with the L tokens before it
    losses = [_loss_of_next(model, TOKENS[:t + 1], int(TOKENS[t + 1])) for t in range(L)]
    losses += [_loss_of_next(model, TOKENS[t - L + 1:t + 1], int(TOKENS[t + 1])) for t in range(L, 40)]
    assert r["n_scored"] == 40
    assert r["ppl"] == pytest.approx(math.exp(sum(losses) / 40), rel=1e-5)
    same = lm_eval(model, TOKENS, L, n_tokens=40, stride=L)
    assert same["ppl"] == pytest.approx(lm_eval(model, TOKENS, L, n_tokens=40)["ppl"], rel=1e-6)


def test_learned_model_is_not_evaluated_past_its_table():
    model = _model("learned", max_len=16)
    assert lm_eval(model, TOKENS, 32, n_tokens=64) is None
    assert copy_eval(model, 32, n_examples=2, seed=0) is None
    assert passkey_eval(model, 100, 0.5, n_trials=1, seed=0) is None
    assert lm_eval(model, TOKENS, 16, n_tokens=64) is not None


def test_bad_stride_is_rejected():
    with pytest.raises(ValueError, match="--sliding-stride"):
        lm_eval(_model(), TOKENS, 8, n_tokens=32, stride=9)


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
            n = (tokens[b] == D.COPY_SEP).nonzero()[0].item()
            for i in range(n):
                tok = int(tokens[b, i]) if not (self.wrong_last and i == n - 1) else 1 + int(tokens[b, i]) % 255
                logits[b, n + i, tok] = 1.0
        return logits


def test_copy_scoring_with_oracle_models():
    assert copy_eval(_Copier(), 21, n_examples=3, seed=0) == {"exact_match": 1.0, "token_accuracy": 1.0}
    r = copy_eval(_Copier(wrong_last=True), 21, n_examples=3, seed=0)
    assert r == {"exact_match": 0.0, "token_accuracy": pytest.approx(9 / 10)}


class _KeyReader(torch.nn.Module):
    """Oracle for passkey retrieval: reads the key out of the prompt text."""

    scheme = NoPEScheme()

    def generate(self, prompts, n_new):
        out = []
        for row in prompts:
            text = bytes(row.tolist()).decode()
            at = text.index("The pass key is ") + len("The pass key is ")
            out.append(list(text[at:at + n_new].encode()))
        return torch.tensor(out)


def test_passkey_scoring_with_an_oracle_and_a_real_model():
    for depth in (0.0, 0.5, 1.0):
        assert passkey_eval(_KeyReader(), 200, depth, n_trials=4, seed=1) == 1.0
    v = passkey_eval(_model("alibi"), 100, 0.5, n_trials=3, seed=0)
    assert v in (0.0, 1 / 3, 2 / 3, 1.0)


@pytest.mark.parametrize("method", EXTENSION_METHODS)
def test_extension_configs_use_train_length_as_original(method):
    scaling, max_pos = extension_scaling(method, 8.0, 128)
    config = {"rope_theta": 1e4, "head_dim": 32, "num_attention_heads": 2, "hidden_size": 64,
              "max_position_embeddings": max_pos, "rope_scaling": scaling}
    inv, _ = rope_parameters(config, seq_len=1024)
    assert inv.shape == (16,)
    if method in ("yarn", "llama3"):
        assert scaling["original_max_position_embeddings"] == 128 and max_pos == 1024
    if method == "dynamic":
        assert max_pos == 128
    if method == "linear":  # PI: every frequency divided by the factor
        base, _ = rope_parameters({**config, "rope_scaling": None})
        torch.testing.assert_close(inv, base / 8)
    with pytest.raises(ValueError, match="--extensions"):
        extension_scaling("rerope", 2.0, 128)


def test_band_counts_cover_every_pair():
    model = _model()
    scaling, max_pos = extension_scaling("yarn", 8.0, 128)
    model.scheme.set_scaling(scaling, max_pos)
    bands = band_counts(model.scheme, 1024)
    assert sum(bands[k] for k in ("kept", "blended", "interpolated")) == 8  # head_dim 16 -> 8 pairs
    model.scheme.set_scaling(*extension_scaling("linear", 8.0, 128))
    assert band_counts(model.scheme)["interpolated"] == 8
