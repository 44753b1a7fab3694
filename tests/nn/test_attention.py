"""Attention with pluggable schemes: SDPA path vs an explicit softmax oracle, and KV-cache decoding vs one full
forward for every scheme (and for length-dependent RoPE scalings)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import reference
from posenc.nn.attention import CausalSelfAttention, KVCache, attention_mask
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import make_scheme, scheme_names

torch.set_default_dtype(torch.float32)


def _explicit_attention(attn: CausalSelfAttention, x, scheme_name):
    """softmax(q k^T / sqrt(d) - m_h |i - j| + causal) v, with the lesson's reference loops for RoPE and ALiBi."""
    B, T, D = x.shape
    H, Dh = attn.n_heads, attn.head_dim
    q, k, v = (t.view(B, T, H, Dh).transpose(1, 2).double() for t in attn.qkv(x).split(D, -1))
    if "rope" in scheme_name:
        rot = lambda t: torch.tensor([[[reference.apply_rope_half(t[b, h, i].tolist(), i) for i in range(T)]
                                       for h in range(H)] for b in range(B)], dtype=torch.float64)
        q, k = rot(q), rot(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    if "alibi" in scheme_name:
        scores = scores + torch.tensor(reference.alibi_bias(H, T), dtype=torch.float64)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = scores.softmax(-1) @ v
    return attn.proj(y.transpose(1, 2).reshape(B, T, D).float())


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "rope+alibi"])
def test_sdpa_path_matches_explicit_softmax(name):
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 4)
    scheme = make_scheme(name, d_model=32, n_heads=4, max_len=64)
    x = torch.randn(2, 9, 32)
    got = attn(x, scheme, torch.arange(9))
    torch.testing.assert_close(got, _explicit_attention(attn, x, name), atol=2e-5, rtol=1e-4)


def test_mask_aligns_queries_to_the_end_of_the_keys():
    assert attention_mask(None, 5, 5, "cpu") is None and attention_mask(None, 1, 5, "cpu") is None
    m = attention_mask(None, 2, 5, "cpu")
    assert m.shape == (1, 1, 2, 5)  # always 4-D: SDPA's fast CPU path
    assert torch.equal(torch.isinf(m[0, 0]), torch.tensor([[False] * 4 + [True], [False] * 5]))


def _decode_vs_full(model, tokens, prefill):
    full = model(tokens)
    cache = model.new_cache()
    steps = [model(tokens[:, :prefill], cache)]
    for t in range(prefill, tokens.shape[1]):
        steps.append(model(tokens[:, t:t + 1], cache))
    assert len(cache) == tokens.shape[1]
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("name", scheme_names())
def test_kv_cache_decode_equals_full_forward(name):
    torch.manual_seed(1)
    model = TinyLM(ModelConfig(scheme=name, d_model=32, n_layers=2, n_heads=4, max_len=40)).eval()
    tokens = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        full, inc = _decode_vs_full(model, tokens, prefill=7)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scaling", [{"rope_type": "ntk", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
                                     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8}])
def test_kv_cache_with_static_scalings(scaling):
    torch.manual_seed(2)
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_layers=2, n_heads=2, max_len=32,
                               rope_scaling=scaling)).eval()
    tokens = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        full, inc = _decode_vs_full(model, tokens, prefill=3)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


def test_dynamic_ntk_caches_keys_before_rotation():
    """Dynamic NTK's frequencies change with the length. With one layer, each decode step must equal a full
    forward over the prefix so far (keys re-rotated with the new frequencies), also past max_position_embeddings;
    caching rotated keys would not."""
    torch.manual_seed(3)
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_layers=1, n_heads=2, max_len=8,
                               rope_scaling={"rope_type": "dynamic", "factor": 2.0})).eval()
    assert model.scheme.length_dependent
    tokens = torch.randint(0, 256, (1, 24))
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens[:, :4], cache)
        for t in range(4, 24):
            step = model(tokens[:, t:t + 1], cache)[:, -1]
            prefix = model(tokens[:, :t + 1])[:, -1]
            torch.testing.assert_close(step, prefix, atol=1e-5, rtol=1e-5)
    assert model.scheme.rotary.inv_freq[-1] < model.scheme.rotary.original_inv_freq[-1]  # the scaling did change


def test_cache_reports_per_layer_length_and_key_positions():
    cache = KVCache(2)
    cache.update(0, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.arange(3))
    assert len(cache) == 3 and cache.layer_len(1) == 0
    cache.update(0, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.tensor([[7]]))  # per-row positions
    assert cache.key_positions(0).tolist() == [[0, 1, 2, 7]]
