"""CoPE against the paper's definition written as a plain loop over i, j, and its KV-cache rows."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch.nn.functional as F

from posenc.bias import cope as cope_module
from posenc.bias.cope import CoPE, cope_attention, cope_bias
from posenc._internal.errors import PosencError


def loop_bias(q, k, emb, scale):
    """q [Tq, d], k [Tk, d] (queries are the last Tq keys), emb [P, d] -> [Tq, Tk] (masked entries NaN)."""
    q_len, k_len, npos = len(q), len(k), len(emb)
    out = torch.full((q_len, k_len), math.nan, dtype=torch.float64)
    for a in range(q_len):
        i = a + k_len - q_len
        for j in range(i + 1):
            p = sum(1 / (1 + math.exp(-float(q[a] @ k[t]) * scale)) for t in range(j, i + 1))
            p = min(p, npos - 1)
            lo, hi = math.floor(p), math.ceil(p)
            w = p - lo
            out[a, j] = (1 - w) * float(q[a] @ emb[lo]) + w * float(q[a] @ emb[hi])
    return out


@settings(max_examples=25, deadline=None)
@given(q_len=st.integers(1, 6), extra=st.integers(0, 6), d=st.integers(1, 8), npos=st.integers(1, 12),
       temp=st.sampled_from([0.3, 1.0, 4.0]), seed=st.integers(0, 2**16))
def test_matches_plain_loop(q_len, extra, d, npos, temp, seed):
    g = torch.Generator().manual_seed(seed)
    k_len = q_len + extra
    k = torch.randn(k_len, d, generator=g, dtype=torch.float64) * temp
    q = k[extra:] + 0.5 * torch.randn(q_len, d, generator=g, dtype=torch.float64)
    emb = torch.randn(npos, d, generator=g, dtype=torch.float64)
    scale = 1 / math.sqrt(d)
    want = loop_bias(q, k, emb, scale)
    got = cope_bias(q, q @ k.T * scale, emb)
    visible = ~want.isnan()
    assert got.dtype == torch.float64 and got.shape == (q_len, k_len)
    torch.testing.assert_close(got[visible], want[visible], rtol=1e-10, atol=1e-10)
    # float32 inputs: float32 math, same values to float32 precision
    got32 = cope_bias(q.float(), (q @ k.T * scale).float(), emb.float())
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double()[visible], want[visible], rtol=1e-4, atol=1e-4)


def test_masked_logits_equal_causal_gating():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 3, 9, 4, generator=g)
    emb = torch.randn(6, 4, generator=g)
    logits = q @ k.transpose(-1, -2) / 2
    mask = torch.ones(9, 9, dtype=torch.bool).triu(1)
    causal = cope_bias(q, logits, emb)
    via_mask = cope_bias(q, logits.masked_fill(mask, -math.inf), emb, causal=False)
    torch.testing.assert_close(causal[..., ~mask], via_mask[..., ~mask])


def test_decoding_row_equals_full_row_and_gradients():
    torch.manual_seed(0)
    m = CoPE(8, 16)
    with torch.no_grad():
        m.pos_emb.normal_()
    q, k = torch.randn(2, 4, 20, 16), torch.randn(2, 4, 20, 16)
    full = m(q, q @ k.transpose(-1, -2) / 4)                                    # [B, H, 20, 20]
    for t in (0, 7, 19):
        row = m(q[..., t:t + 1, :], q[..., t:t + 1, :] @ k[..., : t + 1, :].transpose(-1, -2) / 4)
        torch.testing.assert_close(row[..., 0, :], full[..., t, : t + 1], rtol=1e-6, atol=1e-6)
    qg = q.clone().requires_grad_()
    m(qg, qg @ k.transpose(-1, -2) / 4).sum().backward()
    assert torch.isfinite(qg.grad).all() and qg.grad.abs().sum() > 0 and m.pos_emb.grad.abs().sum() > 0


def test_positions_are_clamped_and_zero_init_gives_zero_bias():
    q = torch.ones(1, 30, 2)
    logits = torch.full((1, 30, 30), 50.0)                    # every gate ~1: p_ij = i - j + 1, clamped at 3
    emb = torch.arange(4.0)[:, None].expand(4, 2)             # q . e[p] = 2p: the bias reads back the position
    bias = cope_bias(q, logits, emb)
    i, j = torch.arange(30)[:, None], torch.arange(30)
    want = 2 * (i - j + 1).clamp(max=3).float()
    assert torch.allclose(bias[0][j.expand(30, 30) <= i], want[j.expand(30, 30) <= i])
    assert torch.equal(CoPE(4, 2)(q, logits), torch.zeros(1, 30, 30))


@pytest.mark.parametrize("call, match", [
    (lambda: cope_bias(torch.zeros(3, 4), torch.zeros(3, 3), torch.zeros(5, 2)), "must match pos_emb's head_dim"),
    (lambda: cope_bias(torch.zeros(3, 4), torch.zeros(3, 2), torch.zeros(5, 4)), "Tk >= Tq"),
    (lambda: cope_bias(torch.zeros(4), torch.zeros(3, 3), torch.zeros(5, 4)), r"query must be \[..., Tq, head_dim\]"),
    (lambda: CoPE(0, 4), "npos_max must be a positive integer"),
    (lambda: cope_attention(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 2, 4), torch.zeros(5, 4),
                            scale=1.0), "key and value"),
    (lambda: cope_attention(torch.zeros(2, 3, 4), torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), torch.zeros(5, 4),
                            scale=1.0), "Tk >= Tq"),
    (lambda: cope_attention(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(5, 3),
                            scale=1.0), "pos_emb"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


# --- the fused attention against the reference: SDPA over cope_bias + the causal mask, both differentiated by autograd

def _reference_attention(q, k, v, emb, scale):
    q_len, k_len = q.shape[-2], k.shape[-2]
    hidden = torch.ones(q_len, k_len, dtype=torch.bool).triu(k_len - q_len + 1)
    mask = cope_bias(q, q @ k.transpose(-1, -2) * scale, emb).masked_fill(hidden, -math.inf).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _inputs(q_len, k_len, d, npos, seed, dtype=torch.float64, temp=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, d, generator=g, dtype=dtype) * temp for n in (q_len, k_len, k_len))
    emb = torch.randn(npos, d, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, emb)]


@settings(max_examples=25, deadline=None)
@given(q_len=st.integers(1, 9), extra=st.integers(0, 6), d=st.integers(1, 8), npos=st.integers(1, 12),
       temp=st.sampled_from([0.3, 1.0, 3.0]), seed=st.integers(0, 2**16))
def test_fused_attention_equals_sdpa_over_the_bias_in_value_and_gradient(q_len, extra, d, npos, temp, seed):
    q, k, v, emb = _inputs(q_len, q_len + extra, d, npos, seed, temp=temp)
    scale = 1 / math.sqrt(d)
    grad_out = torch.randn(2, 3, q_len, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    got = cope_attention(q, k, v, emb, scale=scale)
    want = _reference_attention(q, k, v, emb, scale)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    got_grads = torch.autograd.grad(got, (q, k, v, emb), grad_out)
    want_grads = torch.autograd.grad(want, (q, k, v, emb), grad_out)
    for name, a, b in zip("qkve", got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"grad {name}: {m}")


@pytest.mark.parametrize("min_rows", [32, 1])
def test_fused_attention_passes_gradcheck_including_clamped_counts(monkeypatch, min_rows):
    # npos 3 with 6 keys: the counts of the early keys pass npos - 1 and are clamped; min_rows 1: four query
    # blocks of one row, each against its own key prefix (autograd sums their key, value and table gradients)
    monkeypatch.setattr(cope_module, "_MIN_TRAIN_ROWS", min_rows)
    q, k, v, emb = _inputs(4, 6, 3, 3, seed=5, temp=2.0)
    assert torch.autograd.gradcheck(lambda *a: cope_attention(*a, scale=0.9), (q, k, v, emb))
    grad_out = torch.randn(2, 3, 4, 3, dtype=torch.float64)
    got = torch.autograd.grad(cope_attention(q, k, v, emb, scale=0.9), (q, k, v, emb), grad_out)
    want = torch.autograd.grad(_reference_attention(q, k, v, emb, 0.9), (q, k, v, emb), grad_out)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_training_shape_matches_reference_and_inference_blocks_match(monkeypatch):
    q, k, v, emb = (t.detach().float().requires_grad_() for t in _inputs(64, 64, 16, 64, seed=2))
    got, want = cope_attention(q, k, v, emb, scale=0.25), _reference_attention(q, k, v, emb, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v, emb)), torch.autograd.grad(want.sum(), (q, k, v, emb))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # without gradients the query rows run in blocks against their causal key prefix: same values
    monkeypatch.setattr(cope_module, "_BLOCK_ENTRIES", 2 * 3 * 64 * 10)      # 10 rows per block, a ragged last one
    with torch.no_grad():
        blocked = cope_attention(q, k, v, emb, scale=0.25)
    torch.testing.assert_close(blocked, want.detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():                                  # decoding: the last 3 queries over every key
        tail = cope_attention(q[..., -3:, :], k, v, emb, scale=0.25)
    torch.testing.assert_close(tail, want.detach()[..., -3:, :], rtol=1e-5, atol=1e-5)


def test_low_precision_inputs_compute_in_float32_and_keep_their_dtype():
    q, k, v, emb = (t.detach().float() for t in _inputs(5, 5, 8, 6, seed=4))
    out = cope_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), emb, scale=0.3)
    assert out.dtype == torch.bfloat16
    want = _reference_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), emb, 0.3)
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
