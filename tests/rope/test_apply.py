"""posenc.rope.apply against the lesson's loops (posenc.reference), plus RoPE's laws as property tests."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc._internal.errors import PosencError
from posenc.rope.apply import (apply_rope, apply_rope_qk, default_inv_freq, half_to_interleaved_permutation,
                               interleaved_to_half_permutation, permute_qk_weight, rope_cos_sin)

LAYOUT_REF = {"interleaved": reference.apply_rope, "half": reference.apply_rope_half}


def ref_rows(x: torch.Tensor, positions: torch.Tensor, layout: str, inv_freq, rotary_dim: int,
             attention_scaling: float = 1.0) -> torch.Tensor:
    """Apply the lesson's loop to every row of x [N, dim] at positions [N] (float64 out)."""
    rows = []
    for row, pos in zip(x.double().tolist(), positions.double().tolist()):
        rot = LAYOUT_REF[layout](row[:rotary_dim], pos, inv_freq=inv_freq, attention_scaling=attention_scaling)
        rows.append(rot + row[rotary_dim:])
    return torch.tensor(rows, dtype=torch.float64)


def test_default_inv_freq_is_the_lesson_formula():
    for dim, base in [(2, 10000.0), (64, 10000.0), (128, 500000.0), (96, 1e6)]:
        exact = torch.tensor([1 / base ** (2 * j / dim) for j in range(dim // 2)], dtype=torch.float64)
        got = default_inv_freq(dim, base)
        assert got.dtype == torch.float32 and got.shape == (dim // 2,)
        got = got.double()
        # float32 exponent and power, exactly as transformers computes them: a few ulps from the exact value
        assert ((got - exact).abs() / exact).max() < 5e-7


def test_transformers_regression_value():
    # transformers' own test: d=128, theta=1e4 -> inv_freq[1] = 0.86596
    assert default_inv_freq(128, 10000.0)[1].item() == pytest.approx(0.86596, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(half_dim=st.integers(1, 24), extra=st.integers(0, 3), n=st.integers(1, 6),
       layout=st.sampled_from(["interleaved", "half"]), base=st.sampled_from([100.0, 10000.0, 500000.0]),
       offset=st.integers(0, 50_000), dtype=st.sampled_from([torch.float32, torch.float64]),
       scaling=st.sampled_from([1.0, 1.2302585]), seed=st.integers(0, 2**16))
def test_matches_reference_loop(half_dim, extra, n, layout, base, offset, dtype, scaling, seed):
    rotary_dim = 2 * half_dim
    dim = rotary_dim + 2 * extra  # partial rotary when extra > 0
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64).to(dtype)
    positions = offset + torch.randint(0, 4096, (n,), generator=g)
    inv = default_inv_freq(rotary_dim, base)
    # x [n, dim] is one sequence of n tokens: positions [n]
    out = apply_rope(x, positions, base=base, layout=layout, rotary_dim=rotary_dim, attention_scaling=scaling)
    ref = ref_rows(x, positions, layout, inv.tolist(), rotary_dim, scaling)
    assert out.dtype == dtype and out.shape == x.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert torch.allclose(out.double(), ref, atol=tol * 4, rtol=tol)
    # dims past rotary_dim pass through untouched
    assert torch.equal(out[:, rotary_dim:], x[:, rotary_dim:])


def test_batched_positions_and_broadcasting():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)                  # [batch, heads, seq, dim]
    positions = torch.tensor([[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]])
    out = apply_rope(x, positions[:, None, :])                 # [batch, 1, seq]
    for b in range(2):
        for h in range(3):
            ref = ref_rows(x[b, h], positions[b], "interleaved", default_inv_freq(8).tolist(), 8)
            assert torch.allclose(out[b, h].double(), ref, atol=1e-5)


def test_fractional_positions_follow_the_formula():
    x = torch.randn(4, 6, dtype=torch.float64)
    pos = torch.tensor([0.5, 1.25, 7.75, 1000.125])
    ref = ref_rows(x, pos, "half", default_inv_freq(6).tolist(), 6)
    assert torch.allclose(apply_rope(x, pos, layout="half"), ref, atol=1e-12)


def test_bf16_large_positions_keep_position_precision():
    """Angles in fp32+ whatever x's dtype: bf16 output must match float64 to bf16 rounding at pos ~100,000."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    positions = 100_000 + torch.arange(64)
    inv = default_inv_freq(64)
    out = apply_rope(x, positions).double()
    truth = ref_rows(x.double(), positions, "interleaved", inv.tolist(), 64)
    err = (out - truth).abs()
    # bf16 keeps 8 significant bits: one rounding of the output plus the input's own rounding already in x
    assert (err <= 2 ** -8 * truth.abs() + 2 ** -8 * x.double().abs().max() * 0.05).all(), err.max()
    # the bug this guards against: positions held in bf16 (100,000 rounds to a multiple of 512) fail the same bound
    bad_pos = positions.to(torch.bfloat16).double()
    bad = ref_rows(x.double(), bad_pos, "interleaved", inv.tolist(), 64)
    assert not torch.allclose(bad, truth, atol=0.05)


@settings(max_examples=100, deadline=None)
@given(pa=st.integers(0, 200_000), pb=st.integers(0, 200_000), k=st.integers(-100_000, 100_000),
       half_dim=st.integers(1, 64), layout=st.sampled_from(["interleaved", "half"]), seed=st.integers(0, 2**16))
def test_relative_shift_invariance(pa, pb, k, half_dim, layout, seed):
    """q'_m . k'_n depends only on m - n: shifting both positions by k keeps the dot product (float32)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(1, 2 * half_dim, generator=g), torch.randn(1, 2 * half_dim, generator=g)
    pa_k, pb_k = max(pa + k, 0), max(pb + k, 0)
    shift_a, shift_b = pa_k - pa, pb_k - pb
    if shift_a != shift_b:  # keep the shift common after clamping at 0
        pa_k, pb_k = pa + max(k, -min(pa, pb)), pb + max(k, -min(pa, pb))
    d0 = (apply_rope(a, [pa], layout=layout) * apply_rope(b, [pb], layout=layout)).sum()
    d1 = (apply_rope(a, [pa_k], layout=layout) * apply_rope(b, [pb_k], layout=layout)).sum()
    assert abs(float(d0 - d1)) <= 2e-6 * float(a.norm() * b.norm())


@settings(max_examples=50, deadline=None)
@given(half_dim=st.integers(1, 64), pos=st.floats(0, 1e6), seed=st.integers(0, 2**16))
def test_rotation_preserves_norm(half_dim, pos, seed):
    x = torch.randn(1, 2 * half_dim, generator=torch.Generator().manual_seed(seed))
    for layout in ("interleaved", "half"):
        assert float(apply_rope(x, [pos], layout=layout).norm()) == pytest.approx(float(x.norm()), rel=1e-6)


def test_dot_product_picks_up_cos_of_relative_angle():
    """The lesson's step 2 claim, closed form: for a = b = e_{2i}, q'.k' = cos((m - n) theta_i)."""
    dim, m, n = 16, 37, 5
    inv = default_inv_freq(dim).double()
    for i in range(dim // 2):
        e = torch.zeros(1, dim, dtype=torch.float64)
        e[0, 2 * i] = 1.0
        d = (apply_rope(e, [m]) * apply_rope(e, [n])).sum()
        assert float(d) == pytest.approx(math.cos((m - n) * float(inv[i])), abs=1e-12)


def test_layout_permutation_equivalence():
    dim = 12
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, dim, generator=g)
    pos = torch.arange(7) * 13
    perm = interleaved_to_half_permutation(dim)
    assert torch.allclose(apply_rope(x[..., perm], pos, layout="half"), apply_rope(x, pos)[..., perm], atol=1e-6)
    inv = half_to_interleaved_permutation(dim)
    assert torch.equal(perm[inv], torch.arange(dim))
    assert torch.allclose(apply_rope(x[..., inv], pos), apply_rope(x, pos, layout="half")[..., inv], atol=1e-6)


@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_permute_qk_weight_converts_checkpoints(rotary_dim):
    """Interleaved-trained q/k projections, permuted, give the same attention scores under half-split RoPE."""
    n_heads, n_kv, head_dim, d_in, seq = 4, 2, 8, 16, 6
    g = torch.Generator().manual_seed(2)
    wq, wk = torch.randn(n_heads * head_dim, d_in, generator=g), torch.randn(n_kv * head_dim, d_in, generator=g)
    h = torch.randn(seq, d_in, generator=g)
    pos = torch.arange(seq) + 40

    def scores(wq, wk, layout):
        q = (h @ wq.T).view(seq, n_heads, head_dim).transpose(0, 1)
        k = (h @ wk.T).view(seq, n_kv, head_dim).transpose(0, 1).repeat_interleave(n_heads // n_kv, 0)
        q, k = apply_rope_qk(q, k, pos, layout=layout, rotary_dim=rotary_dim)
        return q @ k.transpose(-1, -2)

    ref = scores(wq, wk, "interleaved")
    wq_h = permute_qk_weight(wq, n_heads, head_dim, to="half", rotary_dim=rotary_dim)
    wk_h = permute_qk_weight(wk, n_kv, head_dim, to="half", rotary_dim=rotary_dim)
    assert torch.allclose(scores(wq_h, wk_h, "half"), ref, atol=1e-4)
    assert not torch.allclose(scores(wq, wk, "half"), ref, atol=1e-2)  # unpermuted weights do differ
    back = permute_qk_weight(wq_h, n_heads, head_dim, to="interleaved", rotary_dim=rotary_dim)
    assert torch.equal(back, wq)


def test_apply_rope_qk_gqa_equals_separate_calls():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 8, 5, 16, generator=g), torch.randn(2, 2, 5, 16, generator=g)
    pos = torch.arange(5) + 1000
    inv = default_inv_freq(16, 5e5) / 4
    for layout in ("interleaved", "half"):
        qr, kr = apply_rope_qk(q, k, pos, inv_freq=inv, layout=layout, attention_scaling=1.1)
        assert torch.equal(qr, apply_rope(q, pos, inv_freq=inv, layout=layout, attention_scaling=1.1))
        assert torch.equal(kr, apply_rope(k, pos, inv_freq=inv, layout=layout, attention_scaling=1.1))


def test_attention_scaling_multiplies_cos_and_sin():
    pos = torch.arange(10)
    c1, s1 = rope_cos_sin(pos, default_inv_freq(8))
    c2, s2 = rope_cos_sin(pos, default_inv_freq(8), attention_scaling=1.5)
    assert torch.allclose(c2, 1.5 * c1) and torch.allclose(s2, 1.5 * s1)
    assert c1.dtype == torch.float32 and c1.shape == (10, 4)


def test_position_zero_is_identity_and_inputs_untouched():
    x = torch.randn(2, 4, 10)
    before = x.clone()
    assert torch.equal(apply_rope(x, torch.zeros(4, dtype=torch.long)), x)
    apply_rope(x, torch.arange(4) + 9)
    assert torch.equal(x, before)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rotary_dim=7), "rotary_dim must be even"),
    (dict(rotary_dim=12), "rotary_dim must be <="),
    (dict(rotary_dim=0), "rotary_dim must be a positive integer"),
    (dict(layout="neox"), "layout must be one of"),
    (dict(inv_freq=torch.ones(3), rotary_dim=8), r"inv_freq must have shape \[rotary_dim // 2\]"),
    (dict(base=-1.0), "base must be a positive"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(PosencError, match=match):
        apply_rope(torch.randn(2, 5, 8), torch.arange(5), **kwargs)


def test_positions_on_the_meta_device_are_named():
    with pytest.raises(PosencError, match="positions are on the meta device"):
        apply_rope(torch.randn(2, 5, 8), torch.arange(5, device="meta"))


def test_odd_head_dim_is_rejected():
    with pytest.raises(PosencError, match="rotary_dim must be even"):
        apply_rope(torch.randn(5, 7), torch.arange(5))


def test_mismatched_positions_are_rejected():
    with pytest.raises(PosencError, match=r"positions must have shape \[seq\] = \[5\]"):
        apply_rope(torch.randn(2, 5, 8), torch.arange(6))
    with pytest.raises(PosencError, match="positions must have shape"):
        apply_rope(torch.randn(2, 3, 5, 8), torch.zeros(2, 5))  # [batch, seq] needs [batch, 1, seq]
    with pytest.raises(PosencError, match="q and k must share seq and dim"):
        apply_rope_qk(torch.randn(2, 5, 8), torch.randn(2, 4, 8), torch.arange(5))


def test_inputs_that_would_give_silent_wrong_answers_are_rejected():
    with pytest.raises(PosencError, match="x must be a floating-point tensor"):
        apply_rope(torch.arange(32).reshape(4, 8), torch.arange(4))       # int x would truncate the rotation
    for dtype in (torch.bfloat16, torch.float16):                          # bf16 rounds position 257 to 256
        with pytest.raises(PosencError, match="positions must be integers, float32 or float64"):
            apply_rope(torch.randn(300, 8), torch.arange(300).to(dtype))
    with pytest.raises(PosencError, match="attention_scaling must be a positive finite number"):
        apply_rope(torch.randn(4, 8), torch.arange(4), attention_scaling=float("nan"))
    from posenc.absolute import SinusoidalPositionalEncoding
    with pytest.raises(PosencError, match="positions must be integers, float32 or float64"):
        SinusoidalPositionalEncoding(8)(torch.zeros(1, 4, 8), torch.arange(4).to(torch.bfloat16))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_apply_rope_table_matches_lesson_loop_per_row(layout):
    """A table built per row (any positions per batch row) rotates exactly like the lesson's loop."""
    from posenc.rope.apply import apply_rope_table

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)                     # [batch, seq, dim]
    positions = torch.tensor([[0, 3, 7, 100, 2049], [5, 5, 1, 0, 9]])
    inv = default_inv_freq(6, 500.0)                                  # partial rotary: 6 of 8 dims
    cos, sin = rope_cos_sin(positions, inv, dtype=torch.float64)      # [batch, seq, 3]
    got = apply_rope_table(x, cos, sin, layout=layout)
    want = ref_rows(x.reshape(-1, 8), positions.reshape(-1), layout, inv.double().tolist(), 6).reshape(2, 5, 8)
    assert torch.allclose(got, want, atol=1e-12)
    with pytest.raises(PosencError, match="cos/sin"):
        apply_rope_table(x.float(), cos, sin)                          # float64 table for float32 x


# ---- nonsense input: clear errors, no NaN tables ----------------------------------------------------------------

@pytest.mark.parametrize("positions, match", [
    ("01234", "positions must be integers .* got the string '01234'"),
    (["0", "1"], "positions must be integers"),
    (object(), "positions must be integers"),
    (torch.tensor([0.0, float("nan"), 2.0, 3.0]), "positions must be finite"),
    (torch.tensor([0.0, 1.0, float("inf"), 3.0], dtype=torch.float64), "positions must be finite"),
])
def test_nonsense_positions_are_refused(positions, match):
    from posenc.rope.apply import apply_rope_qk
    with pytest.raises(PosencError, match=match):
        apply_rope(torch.randn(2, 4, 8), positions)
    with pytest.raises(PosencError, match=match):
        apply_rope_qk(torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), positions)
    from posenc.rope.module import Rotary                     # the module reads positions the same way
    with pytest.raises(PosencError, match=match):
        Rotary(8)(torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), positions)


@pytest.mark.parametrize("kwargs, match", [
    (dict(inv_freq=torch.tensor([1.0, float("nan"), 0.1, 0.01])), "inv_freq must be finite"),
    (dict(inv_freq=[1.0, float("inf"), 0.1, 0.01]), "inv_freq must be finite"),
    (dict(inv_freq=["1", "2", "3", "4"]), "inv_freq must be a 1-D"),
    (dict(attention_scaling="2"), "attention_scaling must be a number, got '2'"),
    (dict(attention_scaling=float("inf")), "attention_scaling must be a positive finite number"),
    (dict(attention_scaling=0.0), "attention_scaling must be a positive finite number"),
    (dict(base="1e4"), "base must be a number, got '1e4'"),
    (dict(base=float("nan")), "base must be a positive"),
])
def test_nonsense_frequencies_are_refused(kwargs, match):
    with pytest.raises(PosencError, match=match):
        apply_rope(torch.randn(2, 4, 8), torch.arange(4), **kwargs)
    with pytest.raises(PosencError, match=match):           # a second call (the cache) refuses it too
        apply_rope(torch.randn(2, 4, 8), torch.arange(4), **kwargs)
    if "inv_freq" in kwargs or "attention_scaling" in kwargs:
        with pytest.raises(PosencError, match=match):
            rope_cos_sin(torch.arange(4), kwargs.get("inv_freq", default_inv_freq(8)),
                         kwargs.get("attention_scaling", 1.0))


# ---- the cos/sin table cache: "we test what we cache" ------------------------------------------------------------

def _cached_rows(inv_freq=None, base=10000.0, scaling=1.0, dim=8, dtype=torch.float32):
    """The table apply_rope keeps for these frequencies (looked up the way apply_rope does)."""
    from posenc.rope.tables import table_for
    return table_for(base, inv_freq, None, scaling, dim, torch.device("cpu"), dtype)


def test_changed_frequencies_or_scaling_give_fresh_correct_results():
    x = torch.randn(3, 5, 8, dtype=torch.float64).float()
    pos = torch.arange(5) + 100
    inv = default_inv_freq(8)
    for layout in ("interleaved", "half"):
        for inv_freq, scaling in [(None, 1.0), (inv * 0.5, 1.0), (inv * 0.5, 1.3), (inv, 1.3), (None, 1.0)]:
            got = apply_rope(x, pos, inv_freq=inv_freq, attention_scaling=scaling, layout=layout)
            f = (inv if inv_freq is None else inv_freq).tolist()
            want = ref_rows(x.reshape(-1, 8), pos.repeat(3), layout, f, 8, scaling).reshape(3, 5, 8)
            assert torch.allclose(got.double(), want, atol=1e-5), (inv_freq, scaling)
    # the same tensor changed in place between calls: its values are the key, so the next call sees the change
    mine = inv.clone()
    a = apply_rope(x, pos, inv_freq=mine)
    mine.mul_(0.25)
    b = apply_rope(x, pos, inv_freq=mine)
    want = ref_rows(x.reshape(-1, 8), pos.repeat(3), "interleaved", mine.tolist(), 8).reshape(3, 5, 8)
    assert torch.allclose(b.double(), want, atol=1e-5) and not torch.allclose(a, b, atol=1e-3)


def test_table_grows_on_demand_keeping_earlier_rows_bit_identical():
    from posenc.rope.apply import TABLES
    inv = default_inv_freq(8, 777.0)                   # a frequency set no other test uses
    x = torch.randn(1, 4, 8)
    apply_rope(x, torch.arange(4), inv_freq=inv)
    entry = _cached_rows(inv)
    cos0, sin0 = entry.cos_sin
    assert cos0.shape[0] == TABLES.min_rows and cos0.dtype == torch.float32
    apply_rope(x, torch.arange(4) + TABLES.min_rows - 4)              # inside the table: no rebuild
    apply_rope(x, torch.arange(4) + 17, inv_freq=inv)
    assert entry.cos_sin[0] is cos0
    apply_rope(x, torch.arange(4) + 3 * TABLES.min_rows, inv_freq=inv)   # past it: grows
    cos1, sin1 = entry.cos_sin
    assert cos1.shape[0] >= 3 * TABLES.min_rows + 4
    assert torch.equal(cos1[:cos0.shape[0]], cos0) and torch.equal(sin1[:sin0.shape[0]], sin0)
    # every row is the float64 formula rounded once to float32
    angle = torch.arange(cos1.shape[0], dtype=torch.float64)[:, None] * inv.double()
    assert torch.equal(cos1, angle.cos().float()) and torch.equal(sin1, angle.sin().float())


def test_tables_are_keyed_by_dtype_and_bounded():
    from posenc.rope.angles import angles_cos_sin
    from posenc.rope.tables import RopeTableCache, _Table
    x64 = torch.randn(2, 4, 8, dtype=torch.float64)
    pos = torch.arange(4) + 50_000
    got = apply_rope(x64, pos, base=321.0)                             # float64 activations: a float64 table
    assert _cached_rows(base=321.0, dtype=torch.float64).cos_sin[0].dtype == torch.float64
    assert torch.allclose(got, ref_rows(x64.reshape(-1, 8), pos.repeat(2), "interleaved",
                                        default_inv_freq(8, 321.0).tolist(), 8).reshape(2, 4, 8), atol=1e-12)
    # bounded: entries, total bytes and rows per table
    cache = RopeTableCache(max_bytes=1 << 20, max_table_bytes=1 << 16, max_entries=2, min_rows=16)
    entries = []
    for i in range(4):
        e = cache.get(("k", i), lambda i=i: _Table(default_inv_freq(8).double() * (i + 1), 1.0, torch.float32))
        assert cache.grow(e, 100)
        entries.append(e)
    assert len(cache) == 2 and cache.nbytes <= 1 << 20
    assert cache.get(("k", 2), None) is entries[2]                      # a hit makes it the most recent...
    cache.get(("k", 4), lambda: _Table(default_inv_freq(8).double(), 1.0, torch.float32))
    assert cache.get(("k", 2), None) is entries[2]                      # ...so ("k", 3) went first
    assert not cache.grow(entries[-1], 1 << 20)                        # past max_table_bytes: refused
    cos, _ = entries[-1].cos_sin
    want, _ = angles_cos_sin(torch.arange(cos.shape[0]), entries[-1].inv64, 1.0, torch.float32)
    assert torch.equal(cos, want)


def test_positions_past_the_table_bound_or_negative_are_computed_exactly(monkeypatch):
    from posenc.rope.apply import TABLES
    monkeypatch.setattr(TABLES, "max_table_bytes", 4096)                # 128 rows of a 4-frequency table
    x = torch.randn(2, 3, 8, dtype=torch.float64).float()
    for pos in (torch.tensor([0, 5000, 200]), torch.tensor([-7, 3, 2]), torch.tensor([10**9, 1, 2])):
        got = apply_rope(x, pos, base=12345.0)
        want = ref_rows(x.reshape(-1, 8), pos.repeat(2), "interleaved", default_inv_freq(8, 12345.0).tolist(), 8)
        assert torch.allclose(got.double(), want.reshape(2, 3, 8), atol=2e-5)
    assert _cached_rows(base=12345.0).rows <= 128


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_apply_rope_table_with_index_reads_table_rows(layout):
    from posenc.kernels.rope_checks import TableIndexError
    from posenc.rope.apply import apply_rope_table, apply_rope_table_qk
    inv = default_inv_freq(6, 500.0)
    cos, sin = rope_cos_sin(torch.arange(40), inv)                     # table [40, 3]
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8)
    index = torch.tensor([[0, 3, 7, 39, 2], [5, 5, 1, 0, 9]])[:, None]  # [batch, 1, seq]
    qr, kr = apply_rope_table_qk(q, k, cos, sin, index=index, layout=layout)
    for b in range(2):
        for t, r in ((q, qr), (k, kr)):
            want = ref_rows(t[b].reshape(-1, 8), index[b, 0].repeat(t.shape[1]), layout, inv.tolist(), 6)
            assert torch.allclose(r[b].reshape(-1, 8).double(), want, atol=1e-5)
    assert torch.equal(apply_rope_table(q, cos, sin, index=index, layout=layout), qr)
    for bad in (torch.tensor([0, 1, 2, 3, 40]), torch.tensor([0, -1, 2, 3, 4])):
        with pytest.raises(TableIndexError, match=r"index must hold row numbers in \[0, 40\)"):
            apply_rope_table(q, cos, sin, index=bad, layout=layout)
    with pytest.raises(PosencError, match="integer row numbers"):
        apply_rope_table(q, cos, sin, index=torch.arange(5.0))
    for bad, message in ((torch.ones(5, dtype=torch.bool), "index must be integers or real numbers"),
                         (torch.arange(5).bfloat16(), "index must be integers, float32 or float64")):
        with pytest.raises(PosencError, match=message):
            apply_rope_table(q, cos, sin, index=bad, layout=layout)


def test_a_list_of_scalar_tensors_as_inv_freq_is_read_by_value_every_call():
    """The table cache keys a sequence by its values: a 0-d tensor element edited in place is a new key."""
    x, pos = torch.randn(1, 4, 8), torch.arange(4)
    inv = [torch.tensor(v) for v in default_inv_freq(8).tolist()]
    apply_rope(x, pos, inv_freq=inv)
    inv[0].fill_(0.5)
    want = apply_rope(x, pos, inv_freq=torch.stack(inv))
    torch.testing.assert_close(apply_rope(x, pos, inv_freq=inv), want, rtol=0, atol=0)


def test_negative_view_inv_freq_is_read_as_its_values():
    x, pos = torch.randn(1, 4, 8), torch.arange(4)
    neg = (-default_inv_freq(8))._neg_view()                      # values +inv_freq, stored negated
    torch.testing.assert_close(apply_rope(x, pos, inv_freq=neg), apply_rope(x, pos), rtol=0, atol=0)


def test_inplace_must_be_a_bool():
    x = torch.randn(1, 4, 8)
    before = x.clone()
    with pytest.raises(PosencError, match="inplace must be True or False"):
        apply_rope(x, torch.arange(4), inplace="no")
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_wide_unsigned_positions_equal_int64(dtype):
    from posenc import Rotary
    from posenc.absolute import LearnedPositionalEmbedding

    torch.manual_seed(0)
    q, k, pos = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8), torch.tensor([0, 3, 1, 7, 2])
    want = apply_rope_qk(q, k, pos)
    for got, ref in zip(apply_rope_qk(q, k, pos.to(dtype)), want):
        assert torch.equal(got, ref)
    for got, ref in zip(Rotary(8)(q, k, pos.to(dtype)), Rotary(8)(q, k, pos)):
        assert torch.equal(got, ref)
    table = LearnedPositionalEmbedding(8, 4)
    e = torch.zeros(1, 5, 4)
    assert torch.equal(table(e, pos.to(dtype)), table(e, pos))


def test_uint64_positions_past_int64_are_refused():
    with pytest.raises(PosencError, match="fit in int64"):
        apply_rope(torch.randn(1, 1, 8), torch.tensor([2**63], dtype=torch.uint64))


@pytest.mark.parametrize("layout", ["sparse", "mkldnn"])
def test_non_dense_tensors_are_named_not_crashed_on(layout):
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 2, 8)
    odd = q.to_sparse() if layout == "sparse" else q.to_mkldnn()
    positions = torch.arange(2)
    apply_rope_qk(q, k, positions)          # the same shapes, dense: fine (and remembered by the fast path)
    with pytest.raises(PosencError, match="q must be a dense .strided. tensor"):
        apply_rope_qk(odd, k, positions)
    with pytest.raises(PosencError, match="x must be a dense"):
        apply_rope(odd, positions)
    from posenc import Rotary

    with pytest.raises(PosencError, match="q and k must be dense"):
        Rotary(8)(odd, k, positions)
