"""The CPU RoPE fast path (C kernel and its eager fallback) against the lesson's loops (posenc.reference)."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc._internal.errors import PosencError
from posenc.kernels import cpu_rope
from posenc.rope.apply import default_inv_freq, rope_cos_sin
from posenc_oracles import assert_close_to_oracle, reference_rope

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HAS_CC = cpu_rope._compiler() is not None
# with a compiler the C kernel must be the one running (native=True raises otherwise); without one, only eager
NATIVE = [True, False] if HAS_CC else [False]


def table(positions, rotary_dim, dtype, base=10000.0, scaling=1.0):
    inv = default_inv_freq(rotary_dim, base)
    cos, sin = rope_cos_sin(positions, inv, scaling, torch.float64 if dtype == torch.float64 else torch.float32)
    return inv, cos, sin


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: posenc runs its eager fallback")
def test_native_kernel_builds_here():
    # with a compiler present the fast path must actually be the C kernel, not the fallback
    info = cpu_rope.native_info()
    assert info["available"], info["reason"]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), seq=st.integers(1, 9), half_dim=st.integers(1, 12),
       extra=st.integers(0, 3), layout=st.sampled_from(["interleaved", "half"]), dtype=st.sampled_from(DTYPES),
       native=st.sampled_from(NATIVE), mode=st.sampled_from(["new", "inplace", "out"]),
       offset=st.integers(0, 100_000), scaling=st.sampled_from([1.0, 1.2302585]), seed=st.integers(0, 2**16))
def test_rope_into_matches_reference(batch, heads, seq, half_dim, extra, layout, dtype, native, mode, offset,
                                     scaling, seed):
    rotary_dim = 2 * half_dim
    dim = rotary_dim + 2 * extra                       # partial rotary when extra > 0
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    # per-batch offsets and arbitrary (unsorted, repeated) position ids: [batch, 1, seq]
    positions = offset + torch.randint(0, 5000, (batch, 1, seq), generator=g)
    inv, cos, sin = table(positions, rotary_dim, dtype, scaling=scaling)
    ref = reference_rope(x, positions, inv.tolist(), layout, rotary_dim, scaling)
    x_before = x.clone()
    out = {"new": torch.empty_like(x), "inplace": x, "out": torch.full_like(x, float("nan"))}[mode]
    got = cpu_rope.rope_into(x, cos, sin, out, layout=layout, rotary_dim=rotary_dim, native=native)
    assert got is out and got.dtype == dtype and got.shape == x_before.shape
    assert_close_to_oracle(got, ref, dtype)
    if mode != "inplace":
        assert torch.equal(x, x_before)                # the input is untouched


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_undoes_rotation(layout, dtype):
    x = torch.randn(2, 3, 5, 16, dtype=torch.float64).to(dtype)
    positions = torch.arange(5) + 777
    inv, cos, sin = table(positions, 12, dtype)
    y = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=12)
    ref = reference_rope(y, positions, inv.tolist(), layout, 12, inverse=True)
    back = cpu_rope.rope_into(y, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=12, inverse=True)
    assert_close_to_oracle(back, ref, dtype)


@pytest.mark.parametrize("native", NATIVE)
def test_strided_inputs_and_outputs(native):
    # x laid out [batch, seq, heads, dim] and viewed as [batch, heads, seq, dim]; out a transposed buffer too
    x = torch.randn(2, 7, 3, 32, dtype=torch.float64).transpose(1, 2)
    out = torch.empty(2, 7, 3, 32, dtype=torch.float64).transpose(1, 2)
    positions = torch.arange(7) * 3 + 11
    inv, cos, sin = table(positions, 32, torch.float64)
    cpu_rope.rope_into(x, cos, sin, out, layout="half", rotary_dim=32, native=native)
    assert_close_to_oracle(out, reference_rope(x, positions, inv.tolist(), "half", 32), torch.float64)
    # a head dim that is not contiguous (every other element): the eager path takes it
    wide = torch.randn(2, 3, 7, 64, dtype=torch.float64)
    x2 = wide[..., ::2]
    out2 = cpu_rope.rope_into(x2, cos, sin, torch.empty(2, 3, 7, 32, dtype=torch.float64), layout="half",
                              rotary_dim=32, native=None)
    assert_close_to_oracle(out2, reference_rope(x2, positions, inv.tolist(), "half", 32), torch.float64)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("inverse", [False, True])
def test_native_and_eager_agree_bit_for_bit(dtype, inverse):
    """The C kernel and the eager fallback (no compiler, POSENC_NATIVE=0, a strided view) round alike: both form
    each product, then the sum (no fused multiply-add), so an input's memory layout never changes the bits."""
    q = (torch.randn(1, 8, 300, 128) * 3).to(dtype)
    positions = torch.arange(300) * 37 + 4096
    _, cos, sin = table(positions, 128, torch.float64 if dtype == torch.float64 else torch.float32)
    for layout, rotary_dim in (("interleaved", 128), ("half", 128), ("half", 64)):
        a = cpu_rope.rope_into(q, cos[..., :rotary_dim // 2], sin[..., :rotary_dim // 2], torch.empty_like(q),
                               layout=layout, rotary_dim=rotary_dim, inverse=inverse, native=True)
        b = cpu_rope.rope_into(q, cos[..., :rotary_dim // 2], sin[..., :rotary_dim // 2], torch.empty_like(q),
                               layout=layout, rotary_dim=rotary_dim, inverse=inverse, native=False)
        assert torch.equal(a, b), (layout, rotary_dim)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_large_outputs_stream_past_the_cache(layout):
    # outputs >= 8 MiB are written with non-temporal stores from a row buffer (partial rotary: the tail too);
    # an output that is not 16-byte aligned takes the plain-copy branch
    x = torch.randn(1, 17, 1000, 128)
    positions = torch.arange(1000) + 5
    _, cos, sin = table(positions, 96, torch.float32)
    ref = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=96, native=False)
    aligned = cpu_rope.rope_into(x, cos, sin, torch.full_like(x, float("nan")), layout=layout, rotary_dim=96,
                                 native=True)
    unaligned = torch.full((x.numel() + 1,), float("nan"))[1:].view(x.shape)
    cpu_rope.rope_into(x, cos, sin, unaligned, layout=layout, rotary_dim=96, native=True)
    # a fresh output whose pages were never touched (mapped straight from the OS) takes normal stores instead
    fresh = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=96, native=True)
    for got in (aligned, unaligned, fresh):
        assert torch.allclose(got, ref, atol=1e-6, rtol=1e-6)
        assert torch.equal(got[..., 96:], x[..., 96:])
    assert torch.equal(fresh, aligned)


def _unfused_rope(x, cos, sin, layout, rotary_dim, inverse):
    """The kernel's arithmetic spelled out in torch ops (fp32, a*c - b*s unfused, one rounding at the end)."""
    xf, out = x.float(), x.float().clone()
    s = -sin if inverse else sin
    if layout == "half":
        ia, ib = slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    else:
        ia, ib = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    a, b = xf[..., ia], xf[..., ib]
    out[..., ia], out[..., ib] = a * cos - b * s, a * s + b * cos
    return out.to(x.dtype)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [32, 96, 128])
def test_vector_rows_are_bit_exact(layout, dtype, rotary_dim, monkeypatch):
    # rows of 16k pairs take the AVX-512 rows where the CPU has them: same rounding as torch, bit for bit, over
    # magnitudes from subnormal to near overflow, inverse and in place; small table blocks force the blocked
    # launch order with a leftover block
    monkeypatch.setattr(cpu_rope, "_TABLE_BLOCK_BYTES", 7 * rotary_dim * 4)
    cpu_rope._plans.clear()
    g = torch.Generator().manual_seed(rotary_dim)
    t = 37
    scale = torch.logspace(-42, 36, t * 128, dtype=torch.float64).view(t, 128)[torch.randperm(t, generator=g)]
    x = (torch.randn(2, 3, t, 128, generator=g, dtype=torch.float64) * scale).to(dtype)
    angles = torch.randn(t, rotary_dim // 2, generator=g) * 50
    cos, sin = angles.cos(), angles.sin()
    try:
        for inverse in (False, True):
            ref = _unfused_rope(x, cos, sin, layout, rotary_dim, inverse)
            new = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=rotary_dim,
                                     inverse=inverse, native=True)
            y = x.clone()
            cpu_rope.rope_into(y, cos, sin, y, layout=layout, rotary_dim=rotary_dim, inverse=inverse, native=True)
            bits = torch.int32 if dtype == torch.float32 else torch.int16
            assert not ref.isnan().any()
            for got in (new, y):
                assert torch.equal(got.view(bits), ref.view(bits))
    finally:
        cpu_rope._plans.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multithreaded_split_covers_every_row(dtype):
    # big enough for several threads: every row written exactly as the single-row path would
    x = torch.randn(3, 5, 211, 64).to(dtype)
    positions = torch.arange(211)
    inv, cos, sin = table(positions, 64, dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        out = cpu_rope.rope_into(x, cos, sin, torch.full_like(x, float("nan")), layout="half", rotary_dim=64,
                                 native=HAS_CC)
    finally:
        torch.set_num_threads(threads)
    ref = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout="half", rotary_dim=64, native=False)
    assert not out.isnan().any()
    assert torch.allclose(out.float(), ref.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_fallback_without_compiler_warns_and_stays_exact(monkeypatch):
    monkeypatch.setattr(cpu_rope, "_state", {"lib": None, "tried": False, "reason": None, "path": None,
                                             "build_seconds": None})
    monkeypatch.setattr(cpu_rope, "_compiler", lambda: None)
    x = torch.randn(2, 4, 6, 16)
    positions = torch.arange(6)
    inv, cos, sin = table(positions, 16, torch.float32)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        out = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout="interleaved", rotary_dim=16)
    assert_close_to_oracle(out, reference_rope(x, positions, inv.tolist(), "interleaved", 16), torch.float32)
    assert cpu_rope.native_info()["reason"].startswith("RuntimeError: no C compiler")
    with pytest.raises(RuntimeError, match="native RoPE kernel cannot"):
        cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout="half", rotary_dim=16, native=True)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(cpu_rope, "_state", {"lib": None, "tried": False, "reason": None, "path": None,
                                             "build_seconds": None})
    monkeypatch.setenv("POSENC_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not cpu_rope.native_available()
    assert "POSENC_NATIVE=0" in cpu_rope.native_info()["reason"]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_build_into_a_fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    from importlib import resources
    source = resources.files("posenc.kernels").joinpath("rope_native.c").read_text()
    path, seconds = cpu_rope._build(source, cpu_rope._compiler())
    assert path.startswith(str(tmp_path)) and seconds is not None
    again, seconds2 = cpu_rope._build(source, cpu_rope._compiler())
    assert again == path and seconds2 is None          # cached: no second compile
    assert [p.name for p in tmp_path.iterdir()] == [path.rsplit("/", 1)[1]]   # no temp files left behind


# ---- through the public API: posenc.apply_rope / apply_rope_qk run the kernel by default -----------------

@settings(max_examples=25, deadline=None)
@given(hq=st.integers(1, 4), hk=st.integers(1, 2), seq=st.integers(1, 8), half_dim=st.integers(1, 8),
       layout=st.sampled_from(["interleaved", "half"]), dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(["new", "inplace", "out"]), start=st.integers(0, 10_000), seed=st.integers(0, 999))
def test_apply_rope_qk_modes_match_reference(hq, hk, seq, half_dim, layout, dtype, mode, start, seed):
    g = torch.Generator().manual_seed(seed)
    dim = 2 * half_dim + 2
    q = torch.randn(2, hq, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, hk, seq, dim, generator=g, dtype=torch.float64).to(dtype)
    positions = start + torch.arange(seq)               # a KV-cache continuation
    inv = default_inv_freq(2 * half_dim)
    ref_q = reference_rope(q, positions, inv.tolist(), layout, 2 * half_dim)
    ref_k = reference_rope(k, positions, inv.tolist(), layout, 2 * half_dim)
    kwargs = dict(layout=layout, rotary_dim=2 * half_dim)
    if mode == "inplace":
        rq, rk = posenc.apply_rope_qk(q, k, positions, inplace=True, **kwargs)
        assert rq is q and rk is k
    elif mode == "out":
        oq, ok = torch.empty_like(q), torch.empty_like(k)
        rq, rk = posenc.apply_rope_qk(q, k, positions, out=(oq, ok), **kwargs)
        assert rq is oq and rk is ok
    else:
        rq, rk = posenc.apply_rope_qk(q, k, positions, **kwargs)
    assert_close_to_oracle(rq, ref_q, dtype)
    assert_close_to_oracle(rk, ref_k, dtype)


def test_apply_rope_out_and_inplace():
    x = torch.randn(2, 3, 6, 16)
    positions = torch.arange(6)
    ref = reference_rope(x, positions, default_inv_freq(16).tolist(), "interleaved", 16)
    out = torch.empty_like(x)
    assert posenc.apply_rope(x, positions, out=out) is out
    assert_close_to_oracle(out, ref, torch.float32)
    y = x.clone()
    assert posenc.apply_rope(y, positions, inplace=True) is y
    assert_close_to_oracle(y, ref, torch.float32)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_gradient_is_the_inverse_rotation(layout):
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[[3, 1, 4, 1, 5]], [[9, 2, 6, 5, 3]]])
    assert torch.autograd.gradcheck(lambda t: posenc.apply_rope(t, positions, layout=layout, rotary_dim=8), (x,))
    q = torch.randn(1, 4, 5, 12, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: posenc.apply_rope_qk(a, b, torch.arange(5), layout=layout),
                                    (q, k))
    # bf16 goes through the same kernel: backward = inverse rotation of the incoming gradient
    xb = torch.randn(1, 2, 5, 8).bfloat16().requires_grad_()
    yb = posenc.apply_rope(xb, torch.arange(5), layout=layout)
    gy = torch.randn_like(yb)
    yb.backward(gy)
    ref = reference_rope(gy, torch.arange(5), default_inv_freq(8).tolist(), layout, 8, inverse=True)
    assert_close_to_oracle(xb.grad, ref, torch.bfloat16)


def test_learned_frequencies_still_get_gradients():
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    inv = default_inv_freq(8).double().requires_grad_()
    assert torch.autograd.gradcheck(lambda f: posenc.apply_rope(x, torch.arange(5), inv_freq=f), (inv,))


def test_bad_out_and_inplace_arguments():
    x = torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)
    with pytest.raises(PosencError, match="out must match"):
        posenc.apply_rope(x, pos, out=torch.empty(1, 2, 4, 6))
    with pytest.raises(PosencError, match="out must match"):
        posenc.apply_rope(x, pos, out=torch.empty(1, 2, 4, 8, dtype=torch.float64))
    with pytest.raises(PosencError, match="either inplace=True or out="):
        posenc.apply_rope(x, pos, inplace=True, out=torch.empty_like(x))
    with pytest.raises(PosencError, match="tuple of 2 tensors"):
        posenc.apply_rope_qk(x, x, pos, out=torch.empty_like(x))
    with pytest.raises(PosencError, match="leaf Variable that requires grad"):
        posenc.apply_rope(x.clone().requires_grad_(), pos, inplace=True)
    with pytest.raises(PosencError, match="inv_freq requires grad"):
        posenc.apply_rope(x, pos, inv_freq=default_inv_freq(8).requires_grad_(), inplace=True)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_every_bf16_bit_pattern_rounds_like_torch(layout):
    # all 65536 bf16 values (normals, subnormals, zeros, infinities, NaNs) as both members of a pair: the vector
    # rounding (vcvtne2ps2bf16 where the CPU has AVX512-BF16, with subnormal results routed to integer rounding)
    # must match torch's unfused fp32 ops rounded to bf16, bit for bit
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    a = bits.reshape(512, 128)
    b = bits[torch.randperm(1 << 16, generator=g)].reshape(512, 128)
    x = torch.stack((a, b), 0)[:, None]                                 # [2, 1, 512, 128]
    angles = torch.cat((torch.zeros(1, 64), torch.full((1, 64), 1e-30), torch.randn(510, 64, generator=g) * 9))
    cos, sin = angles.cos(), angles.sin()
    for inverse in (False, True):
        got = cpu_rope.rope_into(x, cos, sin, torch.empty_like(x), layout=layout, rotary_dim=128, inverse=inverse,
                                 native=True)
        want = _unfused_rope(x, cos, sin, layout, 128, inverse)
        nan = want.isnan()                  # (torch writes one canonical NaN; the kernel keeps the payload)
        assert torch.equal(got.isnan(), nan) and nan.any()
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_index_path_through_blocked_launches(dtype, monkeypatch):
    # the public call reads cos/sin rows through the positions; small table blocks force the blocked order
    # (blocks of 5 rows plus a leftover) with per-batch positions [batch, 1, seq], q and k in one call
    monkeypatch.setattr(cpu_rope, "_TABLE_BLOCK_BYTES", 5 * 64 * 4)
    cpu_rope._plans.clear()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 23, 64, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 1, 23, 64, generator=g, dtype=torch.float64).to(dtype)
    positions = (torch.arange(23) + torch.tensor([[5000], [17]]))[:, None]        # [2, 1, 23]
    try:
        for layout in ("interleaved", "half"):
            rq, rk = posenc.apply_rope_qk(q, k, positions, layout=layout)
            for t, r in ((q, rq), (k, rk)):
                assert_close_to_oracle(r, reference_rope(t, positions, default_inv_freq(64).tolist(), layout, 64),
                                       dtype)
    finally:
        cpu_rope._plans.clear()
