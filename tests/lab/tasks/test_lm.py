"""The lm task: perplexity protocols against brute-force oracles; refusal past a learned table."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

from posenc._internal.errors import ConfigError
from posenc.lab.tasks.lm import lm_eval
from posenc.perplexity import evaluation_prefix
from posenc.nn.model import ModelConfig, TinyLM

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
    assert lm_eval(model, TOKENS, 16, n_tokens=64) is not None


def test_bad_stride_is_rejected():
    with pytest.raises(ConfigError, match="stride must be an integer in \\[1, 8\\]"):
        lm_eval(_model(), TOKENS, 8, n_tokens=32, stride=9)


@settings(max_examples=60, deadline=None)
@given(eval_tokens=st.integers(0, 300), sliding_tokens=st.integers(0, 300),
       eval_lens=st.lists(st.integers(8, 200), min_size=1, max_size=3, unique=True),
       sliding_lens=st.lists(st.integers(8, 200), max_size=2, unique=True), stride=st.integers(-1, 6))
def test_evaluation_prefix_covers_every_token_the_evaluation_reads(eval_tokens, sliding_tokens, eval_lens,
                                                                  sliding_lens, stride):
    """LongRoPE's search starts after evaluation_prefix: every token lm_eval reads (windows + their next-token
    target), for both protocols, lies before it, also when a window is longer than the token budget."""
    import posenc.lab.tasks.lm as lm

    read = set()

    def spy(model, tokens, starts, length, **kw):
        for s in starts:
            read.update(range(s, s + length + 1))
        yield from real(model, tokens, starts, length, **kw)

    real = lm.window_losses
    model = lambda ids: torch.zeros(*ids.shape, 256)  # noqa: E731 - a uniform model: only the reads matter
    val = torch.zeros(2000, dtype=torch.uint8)
    cfg = {"eval_tokens": eval_tokens, "sliding_tokens": sliding_tokens, "eval_lens": eval_lens,
           "sliding_lens": sliding_lens, "sliding_stride": stride}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lm, "window_losses", spy)
        m.setattr(lm, "supports_length", lambda model, n: True)
        for L in eval_lens:
            lm.lm_eval(model, val, L, n_tokens=eval_tokens)
        if stride:
            for L in sliding_lens or [max(eval_lens)]:
                lm.lm_eval(model, val, L, n_tokens=sliding_tokens, stride=lm.sliding_stride(stride, L))
    assert max(read) < evaluation_prefix(cfg)
