"""The ``p-rope`` scheme: equal to the library's PRoPE (the proportional rope type) and to the lesson's RoPE loop
on the rotated pairs; the other pairs pass through; refuses extension methods."""

import pytest
import torch

from posenc import reference
from posenc._internal.errors import ConfigError
from posenc.rope.partial import PRoPE
from posenc.schemes import AttentionContext, make_scheme


@pytest.mark.parametrize("p", [0.25, 0.5, 1.0])
def test_rotates_the_fastest_fraction_only(p):
    s = make_scheme("p-rope", d_model=64, n_heads=4, max_len=32, p=p)   # head dim 16: 8 pairs
    q, k = torch.randn(2, 4, 6, 16, dtype=torch.float64), torch.randn(2, 4, 6, 16, dtype=torch.float64)
    pos = torch.arange(10, 16)
    got_q, got_k = s.rotate_qk(q, k, AttentionContext(pos, pos))
    want_q, want_k = PRoPE(16, p, layout="half")(q, k, pos)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    n = int(p * 8)
    full = torch.tensor([reference.apply_rope_half(q[0, 0, t].tolist(), float(pos[t])) for t in range(6)],
                        dtype=torch.float64)
    kept = [j for j in range(16) if j % 8 < n]
    torch.testing.assert_close(got_q[0, 0][:, kept], full[:, kept], rtol=1e-6, atol=1e-6)
    still = [j for j in range(16) if j % 8 >= n]
    assert torch.equal(got_q[0, 0][:, still], q[0, 0][:, still])


def test_option_and_extension_refused():
    with pytest.raises(ConfigError, match="p must be"):
        make_scheme("p-rope", d_model=64, n_heads=4, max_len=32, p=-0.5)
    for p in (0, 0.05):                          # head_dim 16: int(p * 16 // 2) = 0 pairs
        with pytest.raises(ConfigError, match=f"p = {p:g} of head_dim 16 rotates no pair"):
            make_scheme("p-rope", d_model=64, n_heads=4, max_len=32, p=p)
    s = make_scheme("p-rope", d_model=64, n_heads=4, max_len=32)
    assert not s.capabilities.extendable
    with pytest.raises(ConfigError, match="p-rope"):
        s.set_rope_scaling({"rope_type": "linear", "factor": 2.0})
