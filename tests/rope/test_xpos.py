"""xPos against the paper's definition as a plain loop (the lesson's RoPE loop plus the per-pair scale), its
shift-invariance law, and plain RoPE as its zeta = 1 case."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc._internal.errors import PosencError
from posenc.rope.apply import apply_rope, default_inv_freq
from posenc.rope.xpos import XPos, apply_xpos, apply_xpos_qk, xpos_max_position, xpos_scale


def loop_xpos(row, pos, *, key, gamma, scale_base, layout):
    d = len(row)
    # the same float32 frequencies as the library (transformers' convention): the loop checks the rest
    rotated = (reference.apply_rope if layout == "interleaved" else reference.apply_rope_half)(
        row, pos, inv_freq=default_inv_freq(d).tolist())
    out = list(rotated)
    for j in range(d // 2):
        zeta = (2 * j / d + gamma) / (1 + gamma)
        s = zeta ** ((-pos if key else pos) / scale_base)
        a, b = (2 * j, 2 * j + 1) if layout == "interleaved" else (j, j + d // 2)
        out[a], out[b] = rotated[a] * s, rotated[b] * s
    return out


@settings(max_examples=40, deadline=None)
@given(half=st.integers(1, 12), n=st.integers(1, 5), offset=st.integers(0, 6000), key=st.booleans(),
       gamma=st.sampled_from([0.4, 0.1, 2.0]), scale_base=st.sampled_from([512.0, 64.0, 4096.0]),
       layout=st.sampled_from(["interleaved", "half"]), seed=st.integers(0, 2**16))
def test_matches_plain_loop(half, n, offset, key, gamma, scale_base, layout, seed):
    d = 2 * half
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    positions = offset + torch.randint(0, 1000, (n,), generator=g)
    if float(positions.max()) > xpos_max_position(d, gamma=gamma, scale_base=scale_base, dtype=torch.float64):
        return
    want = torch.tensor([loop_xpos(r, float(p), key=key, gamma=gamma, scale_base=scale_base, layout=layout)
                         for r, p in zip(x.tolist(), positions.tolist())], dtype=torch.float64)
    got = apply_xpos(x, positions, key=key, gamma=gamma, scale_base=scale_base, layout=layout)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 8000), n=st.integers(0, 8000), shift=st.integers(-4000, 8000),
       layout=st.sampled_from(["interleaved", "half"]), seed=st.integers(0, 2**16))
def test_score_depends_only_on_the_offset(m, n, shift, layout, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 32, generator=g)
    if min(m, n) + shift < 0:
        shift = -min(m, n)

    def score(a, b):
        qa = apply_xpos(q[None], torch.tensor([a]), layout=layout)[0].double()
        kb = apply_xpos(k[None], torch.tensor([b]), key=True, layout=layout)[0].double()
        return float(qa @ kb)

    # closed form: sum_j zeta_j^((m - n)/B) * (RoPE's pair-j contribution)
    rq = apply_rope(q[None].double(), torch.tensor([m]), layout=layout)[0]
    rk = apply_rope(k[None].double(), torch.tensor([n]), layout=layout)[0]
    pair = rq * rk
    pair = pair[0::2] + pair[1::2] if layout == "interleaved" else pair[:16] + pair[16:]
    zeta = (torch.arange(0, 32, 2, dtype=torch.float64) / 32 + 0.4) / 1.4
    closed = float((zeta ** ((m - n) / 512) * pair).sum())
    scale = sum(abs(v) for v in (zeta ** ((m - n) / 512) * pair).tolist()) + 1e-3
    assert score(m, n) == pytest.approx(closed, abs=2e-5 * scale)
    assert score(m + shift, n + shift) == pytest.approx(closed, abs=2e-5 * scale)


def test_infinite_scale_base_is_plain_rope_and_scale_decays():
    x = torch.randn(2, 3, 17, 64)
    pos = torch.arange(100, 117)
    for layout in ("interleaved", "half"):
        assert torch.equal(apply_xpos(x, pos, scale_base=math.inf, layout=layout), apply_rope(x, pos, layout=layout))
        assert torch.equal(apply_xpos(x, pos, key=True, scale_base=math.inf, layout=layout),
                           apply_rope(x, pos, layout=layout))
    s = xpos_scale(torch.arange(0, 4096, 512), 64)
    assert torch.equal(s[0], torch.ones(32))
    assert (s[1:] < s[:-1]).all()                                   # query scales shrink with the position
    # pairs with larger index have zeta closer to 1: they decay least
    assert (s[-1].diff() > 0).all()
    # keys get the reciprocal
    torch.testing.assert_close(xpos_scale(torch.arange(0, 4096, 512), 64, key=True) * s, torch.ones(8, 32))


def test_cached_keys_equal_full_forward_and_module():
    torch.manual_seed(0)
    m = XPos(16, layout="half")
    q, k = torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    pos = torch.arange(30)
    qf, kf = m(q, k, pos)
    q2, k2 = apply_xpos_qk(q, k, pos, inv_freq=default_inv_freq(16), layout="half")
    assert torch.equal(qf, q2) and torch.equal(kf, k2)
    logits = qf @ kf.transpose(-1, -2)
    # decode the last token: its query against keys rotated earlier, one step at a time
    cached = torch.cat([m(q[..., t:t + 1, :], k[..., t:t + 1, :], pos[t:t + 1])[1] for t in range(30)], dim=-2)
    q_last, _ = m(q[..., -1:, :], k[..., -1:, :], pos[-1:])
    torch.testing.assert_close(q_last @ cached.transpose(-1, -2), logits[..., -1:, :], rtol=1e-5, atol=1e-5)


def test_float32_range_limit_is_enforced_and_centering_works():
    limit = xpos_max_position(64)
    assert 17_000 < limit < 19_000                                        # about 18k at gamma 0.4, B 512
    assert xpos_max_position(64, dtype=torch.float16) == pytest.approx(limit * math.log(65504) / math.log(
        torch.finfo(torch.float32).max))
    x = torch.randn(4, 64)
    far = torch.arange(40_000, 40_004)
    with pytest.raises(PosencError, match=r"positions: xPos scale factors overflow torch.float32"):
        apply_xpos(x, far)
    # one common centre for q and k: same scores, finite values
    qc, kc = apply_xpos(x, far - 40_000), apply_xpos(x, far - 40_000, key=True)
    assert torch.isfinite(qc).all() and torch.isfinite(kc).all()


@pytest.mark.parametrize("call, match", [
    (lambda: XPos(15), "head_dim must be even"),
    (lambda: XPos(16, gamma=0.0), "gamma must be > 0"),
    (lambda: XPos(16, scale_base=-1.0), "scale_base must be a positive number"),
    (lambda: XPos(16, layout="pairs"), "layout: expected one of"),
    (lambda: apply_xpos(torch.zeros(3, 8), torch.zeros(3, dtype=torch.bfloat16)), "positions must be integers"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


def test_xpos_keeps_float32_frequencies_when_cast():
    x = XPos(64).to(torch.bfloat16)
    assert x.inv_freq.dtype == torch.float32
    torch.testing.assert_close(x.inv_freq, default_inv_freq(64), rtol=0, atol=0)
