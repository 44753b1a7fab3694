"""iRoPE pieces against transformers' Llama 4: its default no_rope_layers schedule and a tiny random-weight
Llama4TextAttention NoPE layer (temperature tuning on), prefill and KV-cache decoding."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc._internal.errors import PosencError
from posenc.rope.layers import TemperatureTuning
from posenc.irope import AttentionTemperature, apply_attention_temperature, attention_temperature, irope_rope_layers

llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
from transformers import Llama4TextConfig  # noqa: E402


@pytest.mark.parametrize("n_layers, interval", [(1, 4), (4, 4), (9, 3), (48, 4), (7, 1), (5, 8)])
def test_schedule_equals_llama4_default(n_layers, interval):
    cfg = Llama4TextConfig(num_hidden_layers=n_layers, no_rope_layer_interval=interval)
    assert irope_rope_layers(n_layers, interval) == list(cfg.no_rope_layers)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 20_000_000), floor_scale=st.sampled_from([8192, 4, 3, 1000]),
       attn_scale=st.sampled_from([0.1, 0.5, 0.0]))
def test_temperature_is_the_formula(n, floor_scale, attn_scale):
    want = 1 + attn_scale * math.log(1 + math.floor((n + 1) / floor_scale))
    got = attention_temperature(torch.tensor([n]), floor_scale=floor_scale, attn_scale=attn_scale)
    assert got.dtype == torch.float32 and got.item() == pytest.approx(want, rel=1e-6)
    if n + 1 < floor_scale:
        assert got.item() == 1.0


def _ours(attn, x, positions, k_all, v_all, temperature):
    """Llama 4's NoPE-layer attention rebuilt from posenc's temperature (no mask, as the module is called)."""
    b, t, _ = x.shape
    q = attn.q_proj(x).view(b, t, -1, attn.head_dim).transpose(1, 2)
    q = temperature(q, positions)
    w = torch.softmax(q @ k_all.transpose(-1, -2) * attn.scaling, dim=-1)
    return attn.o_proj((w @ v_all).transpose(1, 2).reshape(b, t, -1)), w


def test_nope_layer_equals_llama4_attention_with_cache():
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    cfg = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                           num_hidden_layers=4, intermediate_size=64, intermediate_size_mlp=64,
                           no_rope_layers=[0, 1, 1, 1], floor_scale=3, attn_scale=0.5, attention_chunk_size=None)
    cfg._attn_implementation = "eager"
    attn = llama4.Llama4TextAttention(cfg, layer_idx=0).eval()
    assert attn.use_rope == 0 and attn.attn_temperature_tuning
    temperature = AttentionTemperature(floor_scale=3, attn_scale=0.5)
    x = torch.randn(2, 14, 32)
    b = 2

    def kv(xs):
        k = attn.k_proj(xs).view(b, xs.shape[1], -1, 8).transpose(1, 2)
        v = attn.v_proj(xs).view(b, xs.shape[1], -1, 8).transpose(1, 2)
        return k, v

    with torch.no_grad():
        k_all, v_all = kv(x)
        # prefill of 10 tokens, then 4 decoding steps through transformers' cache
        cache = DynamicCache(config=cfg)
        hf_out, hf_w = attn(x[:, :10], None, None, cache=cache)
        out, w = _ours(attn, x[:, :10], torch.arange(10), k_all[:, :, :10], v_all[:, :, :10], temperature)
        torch.testing.assert_close(w, hf_w, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out, hf_out, rtol=1e-5, atol=1e-6)
        for t in range(10, 14):
            hf_out, hf_w = attn(x[:, t:t + 1], None, None, cache=cache)
            out, w = _ours(attn, x[:, t:t + 1], torch.tensor([t]), k_all[:, :, : t + 1], v_all[:, :, : t + 1],
                           temperature)
            torch.testing.assert_close(w, hf_w, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(out, hf_out, rtol=1e-5, atol=1e-6)
    # the temperature really acted (floor_scale 3: positions >= 2 are scaled)
    assert attention_temperature(torch.arange(14), floor_scale=3, attn_scale=0.5)[2:].gt(1).all()


def test_dtype_and_batched_positions():
    q = torch.randn(2, 3, 5, 4, dtype=torch.bfloat16)
    pos = torch.tensor([[0, 1, 2, 3, 4], [8190, 8191, 8192, 8193, 20000]])
    out = apply_attention_temperature(q, pos[:, None, :])
    assert out.dtype == torch.bfloat16
    tau = attention_temperature(pos)
    assert tau[0].eq(1).all() and tau[1, 0] == 1 and tau[1, 1] > 1
    torch.testing.assert_close(out, (q.float() * tau[:, None, :, None]).bfloat16())


@pytest.mark.parametrize("call, match", [
    (lambda: irope_rope_layers(0), "n_layers must be a positive integer"),
    (lambda: irope_rope_layers(4, 0), "nope_interval must be a positive integer"),
    (lambda: attention_temperature([1], floor_scale=0), "floor_scale must be a positive"),
    (lambda: apply_attention_temperature(torch.zeros(3, 4), torch.arange(5)), r"positions must have shape \[seq\]"),
    (lambda: apply_attention_temperature(torch.zeros(3, 4, dtype=torch.long), torch.arange(3)), "floating-point"),
    (lambda: attention_temperature([-10000, -5, 0]), r"positions must be >= 0 \(absolute positions\), got -10000"),
    (lambda: apply_attention_temperature(torch.zeros(3, 4), torch.tensor([-1, 0, 1])), "positions must be >= 0"),
    (lambda: TemperatureTuning(8192.0, 0.1).query_scale(torch.tensor([-5, 3])), "positions must be >= 0"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


def test_temperature_positions_must_not_broadcast_batch_against_heads():
    q = torch.randn(2, 2, 5, 8)                       # B == H: a [B, T] tensor would silently scale per head
    with pytest.raises(PosencError, match="positions must have shape"):
        apply_attention_temperature(q, torch.arange(10).view(2, 5))
    with pytest.raises(PosencError, match="positions must have shape"):
        apply_attention_temperature(torch.randn(3, 2, 5, 8), torch.arange(10).view(2, 1, 5))
    out = apply_attention_temperature(q, torch.arange(10).view(2, 1, 5) * 4000, floor_scale=8, attn_scale=0.1)
    tau = attention_temperature(torch.arange(10).view(2, 1, 5) * 4000, floor_scale=8, attn_scale=0.1)
    torch.testing.assert_close(out, q * tau.unsqueeze(-1))
