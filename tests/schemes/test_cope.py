"""The ``cope`` scheme: gates sigmoid(q.k * scale), counts summed from each key to the query, interpolated
embeddings, written as plain loops; one table per layer."""

import math

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.schemes import AttentionContext, make_scheme


def _loops(q, k, e, scale):
    """q [Tq, d], k [Tk, d] (queries = the last Tq keys), e [npos, d] -> [Tq, Tk] (0 for masked keys)."""
    Tq, Tk = q.shape[0], k.shape[0]
    out = torch.zeros(Tq, Tk, dtype=torch.float64)
    for a in range(Tq):
        i = Tk - Tq + a
        for j in range(i + 1):
            p = min(sum(1 / (1 + math.exp(-float(q[a] @ k[t]) * scale)) for t in range(j, i + 1)), e.shape[0] - 1)
            lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
            out[a, j] = (1 - w) * float(q[a] @ e[lo]) + w * float(q[a] @ e[hi])
    return out


def test_bias_matches_the_papers_loops_per_layer():
    torch.manual_seed(0)
    s = make_scheme("cope", d_model=16, n_heads=2, max_len=16, n_layers=2, cope_npos=4)
    with torch.no_grad():
        for layer in s.layers:
            layer.pos_emb.normal_()
    q, k = torch.randn(1, 2, 3, 8, dtype=torch.float64), torch.randn(1, 2, 7, 8, dtype=torch.float64)
    for layer in range(2):
        c = AttentionContext(torch.arange(4, 7), torch.arange(7), layer=layer, scale=8 ** -0.5)
        got = s.bias(q, k, c)
        for h in range(2):
            want = _loops(q[0, h], k[0, h], s.layers[layer].pos_emb.detach().double(), c.scale)
            causal = torch.ones(3, 7, dtype=torch.bool).tril(4)
            torch.testing.assert_close(got[0, h][causal], want[causal], rtol=1e-9, atol=1e-9)


def test_default_table_size_is_the_training_length():
    s = make_scheme("cope", d_model=16, n_heads=2, max_len=24)
    assert s.layers[0].pos_emb.shape == (24, 8)
    with pytest.raises(ConfigError, match="cope_npos"):
        make_scheme("cope", d_model=16, n_heads=2, max_len=24, cope_npos=0)


def test_model_through_the_fused_attention_equals_sdpa_over_the_bias(monkeypatch):
    from posenc.nn.model import ModelConfig, TinyLM
    from posenc.schemes.cope import CoPEScheme

    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="cope", vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=12))
    with torch.no_grad():
        for layer in model.scheme.layers:
            layer.pos_emb.normal_()
    tokens = torch.randint(0, 32, (3, 12))

    def run():
        model.zero_grad()
        logits = model(tokens)
        logits.square().mean().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    fused = run()
    monkeypatch.setattr(CoPEScheme, "attend", lambda self, q, k, v, ctx: None)    # SDPA with bias() instead
    reference = run()
    torch.testing.assert_close(fused[0], reference[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1], reference[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
