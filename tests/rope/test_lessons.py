"""Resonance RoPE's and DroPE's rope types against the paper's formula written as a plain loop, and the laws that
define them: a rounded wavelength repeats every angle exactly, a dropped RoPE rotates nothing."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import Rotary, rope_parameters
from posenc._internal.errors import ConfigError
from posenc.rope.lessons import round_wavelengths


def _loop_resonance(head_dim: int, theta: float) -> list[float]:
    """Wang et al. 2024, Algorithm 1: per pair lambda = 2 pi / theta_j, rounded; theta_j~ = 2 pi / round(lambda)."""
    out = []
    for j in range(head_dim // 2):
        inv = 1.0 / theta ** (2 * j / head_dim)
        out.append(2 * math.pi / round(2 * math.pi / inv))
    return out


@settings(max_examples=30, deadline=None)
@given(head_dim=st.sampled_from([8, 16, 64, 128]), theta=st.sampled_from([10.0, 500.0, 10000.0, 1e6]))
def test_resonance_is_the_papers_rounding(head_dim, theta):
    inv, scaling = rope_parameters({"head_dim": head_dim, "rope_theta": theta,
                                    "rope_scaling": {"rope_type": "resonance"}})
    assert scaling == 1.0 and inv.dtype == torch.float32
    torch.testing.assert_close(inv, torch.tensor(_loop_resonance(head_dim, theta), dtype=torch.float32),
                               rtol=1e-6, atol=0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 4096), pair=st.integers(0, 7))
def test_every_angle_repeats_after_an_integer_wavelength(n, pair):
    inv, _ = rope_parameters({"head_dim": 16, "rope_scaling": {"rope_type": "resonance"}})
    wavelength = round(2 * math.pi / float(inv[pair]))
    a, b = n * float(inv[pair]), (n + wavelength) * float(inv[pair])
    assert math.cos(a) == pytest.approx(math.cos(b), abs=2e-3) and math.sin(a) == pytest.approx(math.sin(b), abs=2e-3)


def test_resonance_yarn_rounds_yarns_frequencies_and_keeps_its_scaling():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    base = {"head_dim": 32, "max_position_embeddings": 512}
    inv_yarn, scale_yarn = rope_parameters({**base, "rope_scaling": yarn})
    inv, scale = rope_parameters({**base, "rope_scaling": {**yarn, "rope_type": "resonance"}})
    assert scale == scale_yarn == pytest.approx(0.1 * math.log(4.0) + 1)
    want = [2 * math.pi / round(2 * math.pi / float(f)) for f in inv_yarn]
    torch.testing.assert_close(inv, torch.tensor(want, dtype=torch.float32), rtol=1e-6, atol=0)
    with pytest.raises(ConfigError, match="needs original_max_position_embeddings"):
        rope_parameters({"head_dim": 32, "rope_scaling": {"rope_type": "resonance", "factor": 4.0}})


def test_rounding_keeps_zero_frequencies_and_never_divides_by_zero():
    got = round_wavelengths(torch.tensor([0.0, 1.0, 20.0]))      # 2 pi / 20 = 0.31 rounds to 0: kept at 1
    assert got.tolist() == pytest.approx([0.0, 2 * math.pi / 6, 2 * math.pi])


def test_drope_rotates_nothing():
    inv, scaling = rope_parameters({"head_dim": 16, "rope_scaling": {"rope_type": "drope"}})
    assert inv.tolist() == [0.0] * 8 and scaling == 1.0
    rotary = Rotary.from_config({"head_dim": 16, "rope_scaling": {"rope_type": "drope"}})
    q, k = torch.randn(2, 3, 9, 16), torch.randn(2, 3, 9, 16)
    got_q, got_k = rotary(q, k, torch.arange(100, 109))
    assert torch.equal(got_q, q) and torch.equal(got_k, k)
