"""FIRE against the paper's formula written as plain loops (MLP included), its [0, 1] law and KV-cache rows."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.bias.fire import FIREBias, fire_bias, fire_inputs
from posenc.bias.positions import end_aligned_positions
from posenc._internal.errors import PosencError


def loop_bias(module: FIREBias, q_pos, k_pos):
    c, L = module.c.item(), module.threshold.item()
    w1, b1 = module.mlp[0].weight.double()[:, 0].tolist(), module.mlp[0].bias.double().tolist()
    w2, b2 = module.mlp[2].weight.double().tolist(), module.mlp[2].bias.double().tolist()
    out = torch.zeros(module.n_heads, len(q_pos), len(k_pos), dtype=torch.float64)
    for a, i in enumerate(q_pos):
        for b, j in enumerate(k_pos):
            x = math.log(c * max(i - j, 0) + 1) / math.log(c * max(L, i) + 1)
            hidden = [max(w * x + bb, 0.0) for w, bb in zip(w1, b1)]
            for h in range(module.n_heads):
                out[h, a, b] = sum(wh * hh for wh, hh in zip(w2[h], hidden)) + b2[h]
    return out


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 3), q_len=st.integers(1, 5), extra=st.integers(0, 6), offset=st.integers(0, 3000),
       c=st.floats(0.01, 3.0), L=st.floats(1.0, 600.0), seed=st.integers(0, 2**16))
def test_matches_plain_loop(h, q_len, extra, offset, c, L, seed):
    torch.manual_seed(seed)
    m = FIREBias(h, width=8, init_c=c, init_threshold=L)
    assert m.c.item() == pytest.approx(c, rel=1e-5) and m.threshold.item() == pytest.approx(L, rel=1e-5)
    q, k = end_aligned_positions(q_len, q_len + extra, offset=offset)
    got = m(q, k)
    assert got.shape == (h, q_len, q_len + extra) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), loop_bias(m, q.tolist(), k.tolist()), rtol=1e-4, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), c=st.floats(1e-3, 10.0), L=st.floats(1e-2, 1e3))
def test_inputs_lie_in_unit_interval_at_any_length(n, c, L):
    x = fire_inputs(*end_aligned_positions(n), c=c, threshold=L)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert (x[causal] >= 0).all() and (x[causal] <= 1 + 1e-6).all()
    assert (x[~causal] == 0).all()            # keys after the query: distance clamped to 0 (masked anyway)
    if n - 1 >= L:                            # past the threshold the farthest key of the last query maps to 1
        assert x[-1, 0].item() == pytest.approx(1.0, rel=1e-5)


def test_cache_rows_batched_positions_and_gradients():
    torch.manual_seed(0)
    m = FIREBias(4, init_threshold=16.0)
    full = m(*end_aligned_positions(48))
    for t in (0, 15, 47):
        torch.testing.assert_close(m(*end_aligned_positions(1, t + 1))[:, 0], full[:, t, : t + 1],
                                   rtol=1e-6, atol=1e-7)
    pos = torch.tensor([[0, 4, 9, 30], [1, 2, 3, 100]])
    batched = m(pos, pos)
    assert batched.shape == (2, 4, 4, 4)
    torch.testing.assert_close(batched[1], m(pos[1], pos[1]))
    full.sum().backward()
    for p in (m.raw_c, m.raw_threshold, m.mlp[0].weight, m.mlp[2].weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_functional_core_takes_any_mlp():
    got = fire_bias(torch.arange(3), torch.arange(3), c=1.0, threshold=2.0, mlp=lambda x: torch.cat([x, -x], -1))
    want = fire_inputs(torch.arange(3), torch.arange(3), c=1.0, threshold=2.0)
    assert torch.equal(got, torch.stack([want, -want]))


@pytest.mark.parametrize("call, match", [
    (lambda: FIREBias(2, init_c=0.0), "init_c must be a positive finite number"),
    (lambda: FIREBias(2, width=0), "width must be a positive integer"),
    (lambda: fire_inputs([0], [0], c=torch.ones(2), threshold=1.0), "c and threshold must be scalars"),
    (lambda: fire_inputs(torch.zeros(2, 3), torch.zeros(4, 3), c=1.0, threshold=1.0), "must share their leading"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


@settings(max_examples=40, deadline=None)
@given(q_len=st.integers(1, 12), extra=st.integers(0, 12), c=st.floats(0.01, 3.0),
       L=st.one_of(st.floats(0.5, 30.0), st.integers(1, 24).map(float)), seed=st.integers(0, 2**16))
def test_contiguous_path_equals_the_general_one_in_value_and_gradient(q_len, extra, c, L, seed):
    # queries below L use the distance table, those at or past L (an integer L can equal a position) the general
    # form; either way the same values and gradients as the general form on every row
    torch.manual_seed(seed)
    m = FIREBias(3, width=8, init_c=c, init_threshold=L)
    k_len = q_len + extra
    fast = m.contiguous(q_len, k_len)
    general = m(torch.arange(extra, k_len), torch.arange(k_len))
    assert fast.shape == general.shape == (3, q_len, k_len)
    torch.testing.assert_close(fast, general, rtol=1e-6, atol=1e-6)
    weights = torch.randn_like(general)
    fast_grads = torch.autograd.grad((fast * weights).sum(), list(m.parameters()))
    general_grads = torch.autograd.grad((general * weights).sum(), list(m.parameters()))
    for a, b in zip(fast_grads, general_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_scheme_uses_the_contiguous_path_at_default_positions_only():
    from posenc.schemes import AttentionContext, make_scheme

    s = make_scheme("fire", d_model=16, n_heads=2, max_len=8, n_layers=1)             # L starts at 8
    calls = []
    layer = s.layers[0]
    original = layer.contiguous
    layer.contiguous = lambda *a: calls.append(a) or original(*a)
    q = torch.zeros(1, 2, 4, 8)
    for k_len in (8, 9, 12):                                        # all rows below L; the last at L; two past it
        calls.clear()
        ctx = AttentionContext(torch.arange(k_len - 4, k_len), torch.arange(k_len), scale=1.0)
        torch.testing.assert_close(s.bias(q, q, ctx), layer(ctx.q_positions, ctx.k_positions), rtol=1e-6, atol=1e-6)
        assert calls == [(4, k_len)]
    # custom positions (randomized, PoSE): the general form
    calls.clear()
    s.bias(q, q, AttentionContext(torch.tensor([0, 2, 5, 7]), torch.tensor([0, 2, 5, 7]), contiguous=False))
    assert calls == []


def test_a_module_cast_to_bf16_runs_its_mlp_in_bf16_on_float32_inputs():
    """model.to(torch.bfloat16) casts the MLP; its float32 inputs meet it in bf16, and the bias is the float32
    module's to bf16 precision (c and L are then bf16 parameters too)."""
    torch.manual_seed(0)
    f = FIREBias(3, init_threshold=6.0)
    pos = torch.arange(12)
    full, contiguous = f(pos, pos), f.contiguous(12, 12)
    g = FIREBias(3, init_threshold=6.0)
    g.load_state_dict(f.state_dict())
    g = g.to(torch.bfloat16)
    assert g(pos, pos).dtype == g.contiguous(12, 12).dtype == torch.bfloat16
    torch.testing.assert_close(g(pos, pos).float(), full, atol=0.03, rtol=0.03)
    torch.testing.assert_close(g.contiguous(12, 12).float(), contiguous, atol=0.03, rtol=0.03)


@pytest.mark.parametrize("q_len, k_len, message", [(5, 3, "k_len must be >= q_len"), (0, 3, "q_len"),
                                                   (3.5, 4, "q_len"), (2, -1, "k_len")])
def test_contiguous_lengths_are_checked(q_len, k_len, message):
    with pytest.raises(PosencError, match=message):
        FIREBias(2, init_threshold=4.0).contiguous(q_len, k_len)
