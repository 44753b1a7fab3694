"""The ``fope`` rope type: default RoPE frequencies with every one below 2 pi / L zeroed (Hua et al. 2024), checked
against a plain-Python loop of that rule; the training length's keys; bands and inspect read it."""

import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from posenc._internal.errors import ConfigError
from posenc.rope.scaling import frequency_bands, rope_parameters
from posenc.tools.inspect import inspect_config

FAST = settings(max_examples=60, deadline=None, derandomize=True)


def config(head_dim: int, theta: float, **top) -> dict:
    return {"head_dim": head_dim, "rope_theta": theta, "rope_scaling": {"rope_type": "fope"}, **top}


def loop_frequencies(head_dim: int, theta: float, length: int) -> list[float]:
    """The paper's rule, pair by pair: theta^(-2j/d), or 0 when its wavelength 2 pi / w exceeds the length."""
    out = []
    for j in range(head_dim // 2):
        w = theta ** (-2 * j / head_dim)
        out.append(w if 2 * math.pi / w <= length else 0.0)
    return out


@FAST
@given(st.integers(1, 64).map(lambda n: 2 * n), st.floats(10.0, 1e6), st.integers(1, 10**6))
def test_frequencies_equal_the_loop(head_dim, theta, length):
    want = loop_frequencies(head_dim, theta, length)
    # a frequency within float32 rounding of 2 pi / L may fall on either side: not what this law is about
    assume(all(abs(theta ** (-2 * j / head_dim) * length / (2 * math.pi) - 1) > 1e-6 for j in range(head_dim // 2)))
    inv, scaling = rope_parameters(config(head_dim, theta, original_max_position_embeddings=length))
    assert scaling == 1.0 and inv.dtype == torch.float32 and len(inv) == head_dim // 2
    torch.testing.assert_close(inv.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert [w == 0 for w in inv.tolist()] == [w == 0 for w in want]


def test_original_length_wins_and_max_position_embeddings_is_the_fallback():
    both = config(64, 1e4, original_max_position_embeddings=512, max_position_embeddings=4096)
    only_max = config(64, 1e4, max_position_embeddings=512)
    torch.testing.assert_close(rope_parameters(both)[0], rope_parameters(only_max)[0], rtol=0, atol=0)
    assert int((rope_parameters(both)[0] > 0).sum()) == 16      # theta 1e4, d 64, L 512: pairs 0 .. 15 turn
    longer = rope_parameters(config(64, 1e4, max_position_embeddings=4096))[0]
    assert int((longer > 0).sum()) > 16


def test_a_config_without_a_length_names_the_keys():
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        rope_parameters(config(64, 1e4))


def test_kept_pairs_are_the_default_ones():
    inv = rope_parameters(config(32, 1e4, max_position_embeddings=100))[0]
    default = rope_parameters({"head_dim": 32, "rope_theta": 1e4})[0]
    kept = inv > 0
    assert torch.equal(inv[kept], default[kept]) and bool((default[~kept] < 2 * math.pi / 100).all())


def test_bands_and_inspect_read_the_type():
    raw = config(64, 1e4, max_position_embeddings=512, num_attention_heads=4, hidden_size=256)
    bands = frequency_bands(raw)
    assert (bands["kept"], bands["removed"], bands["blended"], bands["interpolated"]) == (16, 16, 0, 0)
    assert "fope" in str(inspect_config(raw))
