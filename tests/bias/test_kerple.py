"""KERPLE against the paper's formulas written as plain loops, ALiBi as its special case, and its KV-cache rows."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.alibi import alibi_bias, alibi_slopes
from posenc.bias.kerple import KerpleBias, kerple_bias
from posenc.bias.positions import end_aligned_positions
from posenc._internal.errors import PosencError


def loop_bias(r1, r2, q_pos, k_pos, variant):
    out = torch.zeros(len(r1), len(q_pos), len(k_pos), dtype=torch.float64)
    for h in range(len(r1)):
        for a, i in enumerate(q_pos):
            for b, j in enumerate(k_pos):
                d = abs(i - j)
                out[h, a, b] = -r1[h] * (math.log(1 + r2[h] * d) if variant == "log" else d ** r2[h])
    return out


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 4), q_len=st.integers(1, 6), extra=st.integers(0, 6), offset=st.integers(0, 100_000),
       variant=st.sampled_from(["log", "power"]), seed=st.integers(0, 2**16))
def test_matches_plain_loop(h, q_len, extra, offset, variant, seed):
    g = torch.Generator().manual_seed(seed)
    r1 = (0.01 + 2 * torch.rand(h, generator=g, dtype=torch.float64)).tolist()
    r2 = (0.01 + 1.9 * torch.rand(h, generator=g, dtype=torch.float64)).tolist()
    q, k = end_aligned_positions(q_len, q_len + extra, offset=offset)
    want = loop_bias(r1, r2, q.tolist(), k.tolist(), variant)
    got64 = kerple_bias(torch.tensor(r1, dtype=torch.float64), torch.tensor(r2, dtype=torch.float64), q, k,
                        variant=variant)
    assert got64.dtype == torch.float64 and torch.allclose(got64, want, rtol=1e-12, atol=1e-12)
    got32 = kerple_bias(torch.tensor(r1), torch.tensor(r2), q, k, variant=variant)
    assert got32.dtype == torch.float32 and torch.allclose(got32.double(), want, rtol=1e-5, atol=1e-5)


def test_power_variant_with_unit_exponent_is_alibi():
    slopes = alibi_slopes(8)
    got = kerple_bias(slopes, torch.ones(8), *end_aligned_positions(5, 12), variant="power")
    assert torch.allclose(got, alibi_bias(8, 5, 12), atol=1e-7)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_module_ranges_cache_rows_and_gradients(variant):
    torch.manual_seed(1)
    m = KerpleBias(4, variant=variant)
    assert (m.r1 > 0).all() and (m.r2 > 0).all() and (m.r2 <= (2 if variant == "power" else math.inf)).all()
    full = m(*end_aligned_positions(40))
    assert full.shape == (4, 40, 40)
    for t in (0, 9, 39):  # vectorised pow may round the last ulp differently for different shapes
        torch.testing.assert_close(m(*end_aligned_positions(1, t + 1))[:, 0], full[:, t, : t + 1],
                                   rtol=1e-6, atol=0)
    # the bias decreases with distance (a penalty), zero on the diagonal
    assert torch.equal(full.diagonal(dim1=-2, dim2=-1), torch.zeros(4, 40))
    assert (full[:, -1, :-1].diff(dim=-1) > 0).all()
    full.sum().backward()
    for p in (m.raw_r1, m.raw_r2):
        assert p.grad is not None and torch.isfinite(p.grad).all() and (p.grad != 0).all()


def test_set_parameters_round_trip_and_bad_values():
    m = KerpleBias(3, variant="power")
    m.set_parameters([0.5, 1.0, 2.5], 1.5)
    assert torch.allclose(m.r1, torch.tensor([0.5, 1.0, 2.5])) and torch.allclose(m.r2, torch.full((3,), 1.5))
    with pytest.raises(PosencError, match=r"r2 in \(0, 2.0\)"):
        m.set_parameters(1.0, 2.0)
    with pytest.raises(PosencError, match="r1 must be > 0"):
        KerpleBias(2).set_parameters(0.0, 1.0)


@pytest.mark.parametrize("call, match", [
    (lambda: kerple_bias(torch.ones(2), torch.ones(3), [0], [0]), r"r1 and r2 must both have shape \[n_heads\]"),
    (lambda: kerple_bias(torch.ones(2), torch.ones(2), [0], [0], variant="exp"), "variant: expected one of log"),
    (lambda: KerpleBias(2, variant="cubic"), "variant: expected one of log, power"),
    (lambda: kerple_bias(torch.ones(2), torch.ones(2), torch.tensor([1.0], dtype=torch.bfloat16), [0]),
     "positions must be integers, float32 or float64"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


@pytest.mark.parametrize("r1, r2, message", [
    ([1.0, 2.0, 3.0], 0.5, r"r1 must be a scalar or have shape \[n_heads\] = \[2\], got \(3,\)"),
    (1.0, [0.5] * 4, r"r2 must be a scalar or have shape \[n_heads\] = \[2\]"),
    ("abc", 0.5, "r1 must be a number or 2 numbers")])
def test_set_parameters_names_a_value_of_the_wrong_shape(r1, r2, message):
    k = KerpleBias(2)
    before = [p.clone() for p in k.parameters()]
    with pytest.raises(PosencError, match=message):
        k.set_parameters(r1, r2)
    assert all(torch.equal(a, b) for a, b in zip(before, k.parameters()))
    k.set_parameters([1.0, 2.0], 0.5)
    torch.testing.assert_close(k.r1, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(k.r2, torch.full((2,), 0.5))
