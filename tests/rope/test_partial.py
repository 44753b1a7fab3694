"""p-RoPE: the kept pairs equal plain RoPE (the lesson's loop), the others pass through, and the frequencies
equal transformers' proportional RoPE."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc._internal.errors import PosencError
from posenc.rope.apply import apply_rope, default_inv_freq
from posenc.rope.partial import PRoPE, p_rope_inv_freq


@settings(max_examples=40, deadline=None)
@given(half=st.integers(1, 32), fraction=st.floats(0.01, 1.0), theta=st.sampled_from([10000.0, 1e6]))
def test_frequencies_keep_the_highest_pairs(half, fraction, theta):
    d = 2 * half
    n = int(fraction * d // 2)
    if n == 0:                                   # a fraction too small to keep one pair is refused, not NoPE
        with pytest.raises(PosencError, match="rotates no pair"):
            p_rope_inv_freq(d, fraction, theta)
        return
    inv = p_rope_inv_freq(d, fraction, theta)
    assert inv.shape == (half,) and inv.dtype == torch.float32
    assert torch.equal(inv[:n], default_inv_freq(d, theta)[:n])   # the fastest pairs, RoPE's own frequencies
    assert torch.equal(inv[n:], torch.zeros(half - n))


@settings(max_examples=30, deadline=None)
@given(half=st.integers(1, 16), fraction=st.sampled_from([0.25, 0.5, 0.75, 1.0, 0.3]),
       layout=st.sampled_from(["interleaved", "half"]), offset=st.integers(0, 50_000), seed=st.integers(0, 2**16))
def test_rotated_pairs_equal_rope_and_the_rest_pass_through(half, fraction, layout, offset, seed):
    d = 2 * half
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 2, 5, d, generator=g, dtype=torch.float64)
    pos = offset + torch.arange(5)
    if int(fraction * d // 2) == 0:
        with pytest.raises(PosencError, match="rotates no pair"):
            PRoPE(d, fraction, layout=layout)
        return
    m = PRoPE(d, fraction, layout=layout)
    n = m.rotated_pairs
    assert n == int(fraction * d // 2)
    q2, k2 = m(q, k, pos)
    kept = list(range(n))
    idx = [2 * j + s for j in kept for s in (0, 1)] if layout == "interleaved" else kept + [j + half for j in kept]
    rest = sorted(set(range(d)) - set(idx))
    assert torch.equal(q2[..., rest], q[..., rest]) and torch.equal(k2[..., rest], k[..., rest])
    # the kept pairs: the lesson's RoPE loop on those pairs alone, with the full head's frequencies
    loop = reference.apply_rope if layout == "interleaved" else reference.apply_rope_half
    inv = default_inv_freq(d)[:n].tolist()
    for b in range(2):
        for t in range(5):
            # idx lists the kept pairs in the layout's own order, so the loop sees a rotary vector of 2n dims
            want = torch.tensor(loop(q[0, b, t, idx].tolist(), float(pos[t]), inv_freq=inv), dtype=torch.float64)
            # Rotary keeps float32 cos/sin tables for every input dtype: float32 accuracy
            torch.testing.assert_close(q2[0, b, t, idx], want, rtol=1e-6, atol=1e-6)


def test_full_fraction_is_rope_and_matches_transformers_proportional():
    x = torch.randn(1, 2, 7, 32)
    pos = torch.arange(7)
    q, _ = PRoPE(32, 1.0, layout="half")(x, x, pos)
    assert torch.equal(q, apply_rope(x, pos, layout="half"))
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import Gemma3TextConfig
    cfg = Gemma3TextConfig(head_dim=64, hidden_size=256, num_attention_heads=4,
                           rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.25})
    want, _ = rope_utils.ROPE_INIT_FUNCTIONS["proportional"](cfg, "cpu")
    assert torch.equal(p_rope_inv_freq(64, 0.25), want)


@pytest.mark.parametrize("call, match", [
    (lambda: p_rope_inv_freq(64, 0.0), "fraction 0 of head_dim 64 rotates no pair"),
    (lambda: p_rope_inv_freq(64, 1.5), "fraction must be"),
    (lambda: p_rope_inv_freq(63, 0.5), "head_dim must be even"),
    (lambda: PRoPE(16, 0.5, layout="pairs"), "layout must be one of"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()
