"""posenc.Rotary: application against the lesson's loops, caching, and the dynamic / longrope length rules."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import Rotary, apply_rope_qk, reference, rope_parameters
from posenc._internal.errors import PosencError

CONFIGS = {
    "default": dict(),
    "linear": dict(factor=4.0),
    "dynamic": dict(factor=4.0, max_position_embeddings=16),
    "yarn": dict(factor=4.0, original_max_position_embeddings=16, beta_fast=8.0),
    "llama3": dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16,
                   max_position_embeddings=64),
    "longrope": dict(short_factor=[1.0 + j / 4 for j in range(8)], long_factor=[2.0 + j for j in range(8)],
                     original_max_position_embeddings=16, max_position_embeddings=64),
    "ntk": dict(factor=4.0),
}


def rotary(rope_type, head_dim=16, **kwargs):
    return Rotary(head_dim, rope_type=rope_type, **{**CONFIGS[rope_type], **kwargs})


def reference_rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq, scaling, layout) -> torch.Tensor:
    """Apply the lesson's per-vector loops (posenc.reference) to x [B, H, T, D], positions [B, T]."""
    fn = reference.apply_rope if layout == "interleaved" else reference.apply_rope_half
    out = torch.empty_like(x, dtype=torch.float64)
    for b in range(x.shape[0]):
        for h in range(x.shape[1]):
            for t in range(x.shape[2]):
                out[b, h, t] = torch.tensor(fn(x[b, h, t].double().tolist(), float(positions[b, t]),
                                               inv_freq=inv_freq, attention_scaling=scaling))
    return out


@pytest.mark.parametrize("rope_type", sorted(CONFIGS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_matches_lesson_loops(rope_type, layout):
    torch.manual_seed(0)
    rot = rotary(rope_type, layout=layout)
    q, k = torch.randn(2, 3, 5, 16), torch.randn(2, 1, 5, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    q2, k2 = rot(q, k, positions)
    inv, scaling = rope_parameters(rot.config, seq_len=12)
    torch.testing.assert_close(q2.double(), reference_rotate(q, positions, inv.tolist(), scaling, layout),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k2.double(), reference_rotate(k, positions, inv.tolist(), scaling, layout),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope_type", sorted(CONFIGS))
def test_equals_apply_rope_qk(rope_type):
    """The module is the functional API plus caching: same numbers for 1-D positions."""
    rot = rotary(rope_type, layout="half")
    q, k = torch.randn(1, 4, 12, 16), torch.randn(1, 2, 12, 16)
    positions = torch.arange(12)
    inv, scaling = rope_parameters(rot.config, seq_len=12)
    expected = apply_rope_qk(q, k, positions, inv_freq=inv, attention_scaling=scaling, layout="half")
    for got, want in zip(rot(q, k, positions), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rope_type=st.sampled_from(sorted(CONFIGS)), lengths=st.lists(st.integers(1, 80), min_size=1, max_size=6),
       layout=st.sampled_from(["interleaved", "half"]))
def test_cached_equals_uncached_and_cache_grows(rope_type, lengths, layout):
    cached, uncached = rotary(rope_type, layout=layout), rotary(rope_type, layout=layout, cache=False)
    for n in lengths:
        q, k = torch.randn(2, 2, n, 16), torch.randn(2, 2, n, 16)
        positions = torch.stack([torch.arange(n), torch.arange(n) + 3])   # batch rows with different offsets
        a, b = cached(q, k, positions), uncached(q, k, positions)
        torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
        assert cached.cos_cached.shape[0] >= n + 3          # covers every position used
        assert uncached.cos_cached.shape[0] == 0            # cache=False never builds a table
        assert torch.equal(cached.inv_freq, uncached.inv_freq)


def test_cache_grows_by_doubling_and_keeps_rows():
    rot = Rotary(16, layout="half")
    cos, _ = rot.cos_sin(torch.arange(10))
    assert rot.cos_cached.shape == (10, 8)
    rot.cos_sin(torch.arange(5))                              # shorter: no rebuild
    assert rot.cos_cached.shape == (10, 8)
    rot.cos_sin(torch.arange(11))                             # one past: doubles
    assert rot.cos_cached.shape == (20, 8)
    rot.cos_sin(torch.tensor([100]))
    assert rot.cos_cached.shape == (101, 8)
    torch.testing.assert_close(rot.cos_cached[:10], cos, rtol=0, atol=0)
    expected = torch.cos(torch.arange(101, dtype=torch.float64)[:, None] * rot.inv_freq.double()).float()
    torch.testing.assert_close(rot.cos_cached, expected, rtol=0, atol=1e-7)


def test_dynamic_follows_transformers_rule():
    """Grow past Lmax -> rescale at that length; in between -> keep the larger scale; below Lmax -> restore."""
    rot = rotary("dynamic")                                    # Lmax = 16
    config = rot.config
    default, _ = rope_parameters(config)

    def after(n):
        rot.cos_sin(torch.arange(n))
        return rot.inv_freq.clone(), rot.max_seq_len_cached

    # a forward re-evaluates the type as transformers' dynamic_rope_update does: with a tensor length
    at_40 = rope_parameters(config, torch.tensor(40))[0]
    assert torch.equal(after(10)[0], default) and rot.max_seq_len_cached == 16
    inv, cached = after(40)
    assert cached == 40 and torch.equal(inv, at_40) and not torch.equal(inv, default)
    inv, cached = after(30)                                    # Lmax < 30 < 40: keep the 40-length scale
    assert cached == 40 and torch.equal(inv, at_40)
    inv, cached = after(16)                                    # == Lmax: not below, keep
    assert cached == 40 and torch.equal(inv, at_40)
    inv, cached = after(15)                                    # below Lmax: restore the originals
    assert cached == 16 and torch.equal(inv, default)
    assert rot.cos_cached.shape[0] >= 15 and torch.allclose(
        rot.cos_cached[:15], torch.cos(torch.arange(15.)[:, None] * default), atol=1e-6)


def test_longrope_switches_per_call():
    rot = rotary("longrope")                                   # L0 = 16
    short, scaling = rope_parameters(rot.config, 16)
    long, _ = rope_parameters(rot.config, 17)
    rot.cos_sin(torch.arange(16))
    assert torch.equal(rot.inv_freq, short) and rot.attention_scaling == scaling
    cos17, _ = rot.cos_sin(torch.arange(17))
    assert torch.equal(rot.inv_freq, long)
    torch.testing.assert_close(cos17, torch.cos(torch.arange(17.)[:, None] * long.double()).float() * scaling)
    rot.cos_sin(torch.arange(3))
    assert torch.equal(rot.inv_freq, short)


def test_partial_rotary_passes_the_rest_through():
    rot = Rotary(16, partial_rotary_factor=0.5, layout="half")
    assert rot.rotary_dim == 8
    q = torch.randn(1, 2, 6, 16)
    q2, _ = rot(q, q, torch.arange(6))
    torch.testing.assert_close(q2[..., 8:], q[..., 8:], rtol=0, atol=0)
    assert not torch.allclose(q2[..., :8], q[..., :8])


def test_low_precision_inputs_keep_dtype_and_fp32_angles():
    rot = Rotary(64, layout="half")
    q = torch.randn(1, 1, 4, 64)
    positions = torch.tensor([257, 1000, 4097, 65537])       # bf16 cannot even hold 257
    q16, _ = rot(q.bfloat16(), q.bfloat16(), positions)
    q32, _ = rot(q, q, positions)
    assert q16.dtype == torch.bfloat16
    torch.testing.assert_close(q16.float(), q32, rtol=2e-2, atol=2e-2)


def test_half_precision_module_keeps_fp32_frequencies():
    rot = rotary("yarn", layout="half")
    q = torch.randn(1, 2, 8, 16)
    want, _ = rot(q, q, torch.arange(8) + 1000)
    rot.half()                                                  # e.g. model.half(): buffers must stay float32
    assert rot.inv_freq.dtype == rot.original_inv_freq.dtype == rot.cos_cached.dtype == torch.float32
    got, _ = rot(q.half(), q.half(), torch.arange(8) + 1000)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)


def test_from_config_defaults_to_half_layout():
    rot = Rotary.from_config("tests/fixtures/configs/llama-3.1-8b.json")
    assert rot.layout == "half" and rot.rotary_dim == 128 and rot.config.rope_type == "llama3"
    assert Rotary(16).layout == "interleaved"


def test_proportional_rotates_with_zero_frequencies():
    rot = Rotary(16, rope_type="proportional", partial_rotary_factor=0.5, layout="half")
    assert rot.rotary_dim == 16                                 # whole head, zeros for the unrotated pairs
    q = torch.randn(1, 1, 5, 16)
    q2, _ = rot(q, q, torch.arange(5))
    torch.testing.assert_close(q2[..., 4:8], q[..., 4:8], rtol=0, atol=0)   # zero-frequency pairs unchanged
    torch.testing.assert_close(q2[..., 12:], q[..., 12:], rtol=0, atol=0)


def test_module_copies_and_moves():
    rot = rotary("dynamic")
    rot.cos_sin(torch.arange(40))
    clone = copy.deepcopy(rot)
    assert torch.equal(clone.inv_freq, rot.inv_freq) and clone.max_seq_len_cached == 40
    assert rot.state_dict() == {}                               # nothing persistent: rebuilt from the config


@pytest.mark.parametrize("call, match", [
    (lambda r: r(torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.arange(5)), r"\[batch, heads, seq, head_dim\]"),
    (lambda r: r(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.arange(5)), "head_dim=16"),
    (lambda r: r(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 4, 16), torch.arange(5)), "share batch and seq"),
    (lambda r: r(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16), torch.arange(4)), r"positions must have shape"),
    (lambda r: r(torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16), torch.zeros(3, 5)), r"\[batch, seq\] = \[2, 5\]"),
    (lambda r: r.cos_sin(torch.tensor([-1, 0])), "positions must be >= 0"),
    (lambda r: r.cos_sin(torch.tensor([], dtype=torch.long)), "must not be empty"),
    (lambda r: r.cos_sin(torch.tensor([True])), "integers or real numbers"),
])
def test_bad_inputs(call, match):
    with pytest.raises(PosencError, match=match):
        call(Rotary(16))


def test_bad_construction():
    with pytest.raises(PosencError, match="layout must be one of"):
        Rotary(16, layout="rotate_half")
    with pytest.raises(PosencError, match="needs head_dim"):
        Rotary()
    with pytest.raises(ValueError, match="missing required keys"):
        Rotary(16, rope_type="dynamic", factor=2.0)             # no max_position_embeddings


@pytest.mark.parametrize("change", ["in-place inv_freq", "assigned inv_freq", "attention_scaling",
                                    "inv_freq through .data"])
def test_the_cached_table_follows_the_frequencies_it_was_made_from(change):
    """Editing inv_freq in place, assigning it, or setting attention_scaling after a call must not leave the cached
    cos/sin table (and the CPU fast path that reads it) behind: the result equals a fresh apply_rope_qk."""
    torch.manual_seed(0)
    q, k, pos = torch.randn(1, 2, 6, 16), torch.randn(1, 1, 6, 16), torch.arange(6)
    rot = Rotary(16)
    rot(q, k, pos)                                                # builds and caches the table
    if change == "in-place inv_freq":
        with torch.no_grad():
            rot.inv_freq.mul_(0.5)
    elif change == "assigned inv_freq":
        rot.inv_freq = rot.inv_freq * 0.25
    elif change == "inv_freq through .data":         # weight loaders do this: no version-counter bump
        rot.inv_freq.data.mul_(2.0)
    else:
        rot.attention_scaling = 2.0
    got_q, got_k = rot(q, k, pos)
    want_q, want_k = apply_rope_qk(q, k, pos, inv_freq=rot.inv_freq, attention_scaling=rot.attention_scaling)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-6)
    cos, _ = rot.cos_sin(pos)
    want_cos = (pos[:, None].double() * rot.inv_freq.double()).cos() * rot.attention_scaling
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=1e-6)
