"""The Triton RoPE kernel against the lesson's loops: on the CPU through triton's interpreter, on a GPU if present.

TRITON_INTERPRET must be set when the kernel is jitted; posenc jits it on first use per mode, and the fixture
below sets the variable only while these tests run (so other tests in the process are unaffected).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels import cpu_rope, rope_dispatch
from posenc.angles import Angles
from posenc.rope.apply import default_inv_freq, rope_cos_sin

from posenc_oracles import assert_close_to_oracle, reference_rope

triton = pytest.importorskip("triton")
from posenc.kernels import triton_rope  # noqa: E402  (needs triton)


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_rope.available()


def table(positions, rotary_dim, dtype, device="cpu"):
    inv = default_inv_freq(rotary_dim)
    cos, sin = rope_cos_sin(positions.to(device), inv.to(device), 1.0,
                            torch.float64 if dtype == torch.float64 else torch.float32)
    return inv, cos, sin


# the interpreter converts float32 -> bfloat16 by truncation (a GPU rounds to nearest): allow one bf16 ulp
def check(out, ref, dtype):
    if dtype == torch.bfloat16:
        err = (out.double() - ref).abs()
        assert bool((err <= 1e-5 + 2 ** -7 * ref.abs()).all()), err.max()
    else:
        assert_close_to_oracle(out, ref, dtype)


CASES = [  # (layout, dim, rotary_dim, dtype, mode)
    ("interleaved", 16, 16, torch.float32, "new"),
    ("half", 16, 16, torch.float32, "inplace"),
    ("interleaved", 20, 12, torch.float64, "new"),      # partial rotary, non power-of-two sizes
    ("half", 20, 12, torch.float32, "inplace"),
    ("half", 16, 16, torch.bfloat16, "new"),
    ("interleaved", 24, 16, torch.float16, "new"),
]


@pytest.mark.parametrize("layout,dim,rotary_dim,dtype,mode", CASES)
def test_qk_in_one_launch_matches_reference(interpret, layout, dim, rotary_dim, dtype, mode):
    g = torch.Generator().manual_seed(dim * 7 + rotary_dim)
    q = torch.randn(2, 3, 5, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 1, 5, dim, generator=g, dtype=torch.float64).to(dtype)
    # per-token ids with a different offset per batch row: positions [batch, 1, seq]
    positions = torch.tensor([[[0, 1, 2, 3, 4]], [[4100, 4101, 4102, 9000, 7]]])
    inv, cos, sin = table(positions, rotary_dim, dtype)
    ref_q = reference_rope(q, positions, inv.tolist(), layout, rotary_dim)
    ref_k = reference_rope(k, positions, inv.tolist(), layout, rotary_dim)
    outs = [q, k] if mode == "inplace" else [torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))]
    triton_rope.rope_into([q, k], outs, cos, sin, layout=layout, rotary_dim=rotary_dim)
    check(outs[0], ref_q, dtype)
    check(outs[1], ref_k, dtype)


def test_single_tensor_strided_and_inverse(interpret):
    x = torch.randn(2, 6, 3, 16, dtype=torch.float64).transpose(1, 2)      # [B, H, T, D] view of [B, T, H, D]
    positions = torch.arange(6) + 123
    inv, cos, sin = table(positions, 16, torch.float64)
    out = torch.empty(2, 6, 3, 16, dtype=torch.float64).transpose(1, 2)
    triton_rope.rope_into([x], [out], cos, sin, layout="half", rotary_dim=16)
    assert_close_to_oracle(out, reference_rope(x, positions, inv.tolist(), "half", 16), torch.float64)
    back = torch.empty_like(x)
    triton_rope.rope_into([out], [back], cos, sin, layout="half", rotary_dim=16, inverse=True)
    assert torch.allclose(back, x, atol=1e-12)
    # more leading dims than the kernel addresses: handled through a dense copy
    y = torch.randn(2, 2, 2, 2, 3, 8, dtype=torch.float64).transpose(1, 3)
    inv, cos, sin = table(torch.arange(3), 8, torch.float64)
    out = torch.empty_like(y)
    triton_rope.rope_into([y], [out], cos, sin, layout="interleaved", rotary_dim=8)
    assert_close_to_oracle(out, reference_rope(y, torch.arange(3), inv.tolist(), "interleaved", 8), torch.float64)


def test_autograd_backward_is_inverse_rotation(interpret):
    q = torch.randn(1, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([5, 8, 1000])
    _, cos, sin = table(positions, 4, torch.float64)

    def f(a, b):
        return rope_dispatch.rope((a, b), cos, sin, layout="half", rotary_dim=4,
                                  backend=rope_dispatch._triton_backend)

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-8)


ANGLE_CASES = [  # (layout, dim, rotary_dim, dtype, positions kind, mode, scaling)
    ("half", 16, 16, torch.float32, "batch offsets", "new", 1.0),
    ("interleaved", 16, 16, torch.float32, "seq", "inplace", 1.0),
    ("interleaved", 20, 12, torch.float64, "expanded", "new", 1.25),    # partial rotary, stride-0 batch positions
    ("half", 20, 12, torch.float32, "float", "inplace", 0.75),
    ("half", 16, 16, torch.bfloat16, "int32", "new", 1.0),
    ("interleaved", 24, 16, torch.float16, "batch offsets", "new", 1.0),
]


def positions_of(kind):
    seq = torch.arange(5) * 997 + 3                                    # large positions: angle precision matters
    return {"seq": seq, "batch offsets": torch.stack((seq, seq + 40000))[:, None, :],
            "expanded": seq.expand(2, 5)[:, None, :], "float": seq.double() + 0.5,
            "int32": seq.to(torch.int32)}[kind]


@pytest.mark.parametrize("layout,dim,rotary_dim,dtype,kind,mode,scaling", ANGLE_CASES)
def test_angles_computed_in_kernel_match_reference_and_table(interpret, layout, dim, rotary_dim, dtype, kind, mode,
                                                              scaling):
    # cos/sin formed inside the kernel from positions and float64 frequencies (the CUDA default path) against the
    # lesson's loops, and against the same kernel reading the float64-built table: bit for bit in float64 (float64
    # cos/sin), within 3e-7 of each cos/sin otherwise (float64 reduction, float32 cos/sin)
    g = torch.Generator().manual_seed(dim + rotary_dim)
    q = torch.randn(2, 3, 5, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 5, 2, dim, generator=g, dtype=torch.float64).to(dtype).transpose(1, 2)  # [B, Hk, T, D] view
    positions = positions_of(kind)
    inv = default_inv_freq(rotary_dim)
    angles = Angles(positions, inv.double(), scaling)
    outs = [q.clone(), k.clone()] if mode == "inplace" else [torch.full_like(q, float("nan")),
                                                             torch.full_like(k, float("nan"))]
    triton_rope.rope_into([o if mode == "inplace" else x for o, x in zip(outs, (q, k))], outs, angles, None,
                          layout=layout, rotary_dim=rotary_dim)
    for got, x in zip(outs, (q, k)):
        check(got, reference_rope(x, positions, inv.tolist(), layout, rotary_dim, attention_scaling=scaling), dtype)
    cos, sin = rope_cos_sin(positions, inv, scaling, torch.float64 if dtype == torch.float64 else torch.float32)
    via_table = [torch.empty_like(q), torch.empty_like(k)]
    triton_rope.rope_into([q, k], via_table, cos, sin, layout=layout, rotary_dim=rotary_dim)
    for got, table_out, x in zip(outs, via_table, (q, k)):
        if dtype == torch.float64:
            assert torch.equal(got, table_out)
        elif dtype == torch.float32:   # |a cos - b sin| changes by at most (|a| + |b|) * 3e-7 * scaling
            bound = 3e-7 * scaling * 2 * x.abs().amax(-1, keepdim=True) + 2e-7 * table_out.abs()
            assert bool(((got - table_out).abs() <= bound).all())
        else:                          # one rounding of the output dtype apart at most
            check(got, table_out.double(), dtype)


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 2), hq=st.integers(1, 3), hk=st.integers(1, 2), t=st.integers(1, 6),
       half=st.sampled_from([2, 3, 4]), tail=st.sampled_from([0, 2]), layout=st.sampled_from(["half", "interleaved"]),
       k_transposed=st.booleans(), per_batch=st.booleans(), inverse=st.booleans())
def test_angles_any_geometry_matches_reference(b, hq, hk, t, half, tail, layout, k_transposed, per_batch, inverse):
    # any batch/head/seq sizes, q/k head counts, strides and positions broadcasting, in one launch
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        g = torch.Generator().manual_seed(b * 1000 + hq * 100 + t * 10 + half)
        dim, rdim = 2 * half + tail, 2 * half
        q = torch.randn(b, hq, t, dim, generator=g, dtype=torch.float64)
        k = torch.randn(b, t, hk, dim, generator=g, dtype=torch.float64).transpose(1, 2) if k_transposed else \
            torch.randn(b, hk, t, dim, generator=g, dtype=torch.float64)
        positions = torch.randint(0, 70000, (b, 1, t) if per_batch else (t,), generator=g)
        inv = default_inv_freq(rdim)
        outs = [torch.empty_like(q), torch.empty_like(k)]
        triton_rope.rope_into([q, k], outs, Angles(positions, inv.double(), 1.0), None,
                              layout=layout, rotary_dim=rdim, inverse=inverse)
        for got, x in zip(outs, (q, k)):
            ref = reference_rope(x, positions, inv.tolist(), layout, rdim, inverse=inverse)
            assert_close_to_oracle(got, ref, torch.float64)


def test_heads_split_into_runs_straddling_q_and_k(interpret):
    # 40 tokens in 2 blocks of 32; 3 + 2 heads in runs of 2: one program's run is q's last head and k's first
    q = torch.randn(1, 3, 40, 128, dtype=torch.float64)
    k = torch.randn(1, 2, 40, 128, dtype=torch.float64)
    positions = torch.arange(40) * 31
    inv = default_inv_freq(128)
    outs = [torch.empty_like(q), torch.empty_like(k)]
    (grid, ints, meta) = triton_rope._plan([q, k], outs, positions, True, False, True, "interleaved", 128, False)
    assert grid == (2, 3) and ints[1] == 2 and meta["BLOCK_T"] == 32
    triton_rope.rope_into([q, k], outs, Angles(positions, inv.double(), 1.0), None, layout="interleaved",
                          rotary_dim=128)
    for got, x in zip(outs, (q, k)):
        assert_close_to_oracle(got, reference_rope(x, positions, inv.tolist(), "interleaved", 128), torch.float64)


GEOMETRIES = ["transposed views", "batched decode", "float positions", "scaled"]


def model_geometry(case: str, seq: int, hq: int, dim: int):
    """(q, k, positions, apply_rope_qk kwargs) for a shape a model hands RoPE; k has 2 heads (grouped queries)."""
    g = torch.Generator().manual_seed(1)
    kw = {}
    if case == "transposed views":       # [B, T, H, D] projections viewed as [B, H, T, D]
        q = torch.randn(2, seq, hq, dim, generator=g).transpose(1, 2)
        k = torch.randn(2, seq, 2, dim, generator=g).transpose(1, 2)
        positions = torch.arange(seq) + 70000
    elif case == "batched decode":       # one token per sequence, each at its own position
        q, k = torch.randn(3, hq, 1, dim, generator=g), torch.randn(3, 2, 1, dim, generator=g)
        positions = torch.tensor([5, 4097, 131071])[:, None, None]
    elif case == "float positions":
        q, k = torch.randn(1, hq, seq, dim, generator=g), torch.randn(1, 2, seq, dim, generator=g)
        positions = torch.arange(seq, dtype=torch.float64) * 0.37 + 1000.5
    else:                                # scaled frequencies (YaRN) on part of the head dim
        q, k = torch.randn(1, hq, seq, dim, generator=g), torch.randn(1, 2, seq, dim, generator=g)
        positions = torch.arange(seq) * 500
        inv, scaling = posenc.rope_parameters({"rope_theta": 500000.0, "head_dim": dim * 3 // 4, "rope_scaling": {
            "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}})
        assert scaling != 1.0
        kw = dict(inv_freq=inv, attention_scaling=scaling, rotary_dim=dim * 3 // 4)
    return q, k, positions, kw


@pytest.mark.parametrize("case", GEOMETRIES)
def test_public_cuda_route_through_the_interpreter(interpret, monkeypatch, case):
    # posenc.apply_rope_qk's CUDA route end to end (Angles from the table cache, dispatch, kernel, in place,
    # autograd), run on CPU tensors through the interpreter, against the CPU route (C kernel, cached table)
    q, k, positions, kw = model_geometry(case, seq=7, hq=4, dim=16)
    want = {lay: posenc.apply_rope_qk(q, k, positions, layout=lay, **kw) for lay in ("half", "interleaved")}

    def grad_of_rope():                         # d/dx of |RoPE(x)|^2 / 2 (with a scaling s: s^2 x on rotated dims)
        x = q.detach().double().requires_grad_()
        y = posenc.apply_rope(x, positions, **kw)
        y.backward(y.detach())
        return x.grad

    want_grad = grad_of_rope()
    from posenc.rope import apply as apply_module
    monkeypatch.setattr(apply_module, "KERNEL_ANGLE_DEVICES", frozenset({"cuda", "cpu"}))
    # (CPU tensors stand in for CUDA ones here: the CPU-only decode fast path must not take the calls)
    cpu_rope.PLANS.clear()
    monkeypatch.setattr(apply_module, "remember", lambda *args: None)
    monkeypatch.setattr(rope_dispatch, "backend_for", lambda x: rope_dispatch._triton_backend)
    sources, rope_into = [], triton_rope.rope_into

    def spy(xs, outs, cos, sin, **kwargs):
        sources.append(type(cos))
        return rope_into(xs, outs, cos, sin, **kwargs)

    monkeypatch.setattr(triton_rope, "rope_into", spy)
    for lay in ("half", "interleaved"):
        got = posenc.apply_rope_qk(q, k, positions, layout=lay, **kw)
        for a, b in zip(got, want[lay]):
            assert torch.allclose(a, b, atol=2e-6, rtol=2e-6)
        q2, k2 = q.clone(), k.clone()
        posenc.apply_rope_qk(q2, k2, positions, layout=lay, inplace=True, **kw)
        assert torch.equal(q2, got[0]) and torch.equal(k2, got[1])
    assert torch.allclose(grad_of_rope(), want_grad, atol=1e-12)
    assert sources and set(sources) == {Angles}          # every call took the in-kernel cos/sin route


def test_angles_through_dispatch_autograd_and_other_backends(interpret):
    # the Angles route of rope_dispatch: gradients (the inverse rotation, itself differentiable), and the CPU and
    # eager backends, which build the table from the same Angles
    q = torch.randn(1, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([5, 8, 70000])
    angles = Angles(positions, default_inv_freq(4).double(), 1.5)

    def f(a, b):
        return rope_dispatch.rope((a, b), angles, None, layout="interleaved", rotary_dim=4,
                                  backend=rope_dispatch._triton_backend)

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-8)
    assert torch.autograd.gradgradcheck(f, (q, k), eps=1e-6, atol=1e-8)
    got = f(q.detach(), k.detach())
    for backend in (rope_dispatch._cpu_backend, rope_dispatch._eager_backend):
        other = rope_dispatch.rope((q.detach(), k.detach()), angles, None, layout="interleaved", rotary_dim=4,
                                   backend=backend)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, other))


def test_cached_plans_follow_every_fact_they_depend_on(interpret):
    # launch plans are cached per geometry (triton_rope._PLANS): calls with equal shapes that differ in what a plan
    # depends on (in place or not, pointer alignment, positions strides, scaling, a non-contiguous head dim, more
    # token dims than the kernel addresses) must each still match the lesson's loops
    triton_rope._PLANS.clear()
    g = torch.Generator().manual_seed(5)
    inv = default_inv_freq(8)
    base = torch.randn(2, 3, 4, 13, generator=g, dtype=torch.float64)
    seq = torch.tensor([3, 70, 9000, 123456])

    def run(x, positions, scaling=1.0, inplace=False):
        out = x if inplace else torch.full_like(x, float("nan"))
        ref = reference_rope(x, positions, inv.tolist(), "half", 8, attention_scaling=scaling)
        triton_rope.rope_into([x], [out], Angles(positions, inv.double(), scaling), None,
                              layout="half", rotary_dim=8)
        assert_close_to_oracle(out, ref, torch.float64)

    x = base[..., :12]                                   # rows of 13: a 12-dim head (partial rotary: 8 of 12)
    run(x.clone(), seq, inplace=True)
    run(x, seq)                                          # out of place: the 4 unrotated dims must be copied
    run(base[..., 1:], seq)                              # same shapes, pointer off 16-byte alignment
    run(x, seq.expand(2, 4)[:, None, :])                 # stride-0 batch positions
    run(x, torch.stack((seq, seq + 1))[:, None, :], scaling=0.5)
    run(torch.randn(2, 3, 12, 4, generator=g, dtype=torch.float64).transpose(-1, -2), seq)   # head dim strided
    many = torch.randn(2, 2, 2, 2, 4, 12, generator=g, dtype=torch.float64)
    run(many, torch.randint(0, 9999, (2, 2, 2, 2, 4), generator=g))                           # > 3 token dims
    assert len(triton_rope._PLANS) >= 5


@pytest.mark.parametrize("rope_type,params", [("default", {}), ("yarn", {
    "factor": 4.0, "original_max_position_embeddings": 64}), ("llama3", {
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})])
def test_rotary_module_cuda_route_matches_its_cpu_path(interpret, rope_type, params):
    # Rotary's CUDA route (kernel_angles: frequencies and scaling, no table) run on the CPU through the interpreter
    # against the module's own CPU path; the float64 copy it caches follows an in-place change of inv_freq
    rot = posenc.Rotary(16, rope_type=rope_type, layout="half", max_position_embeddings=256, **params)
    q = torch.randn(2, 4, 6, 16)
    k = torch.randn(2, 2, 6, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [700, 701, 9000, 3, 4, 5]])

    def cuda_route():
        return rope_dispatch.rope((q, k), rot.kernel_angles(positions.unsqueeze(1)), None, layout="half",
                                  rotary_dim=rot.rotary_dim, backend=rope_dispatch._triton_backend)

    for _ in range(2):
        for got, want in zip(cuda_route(), rot(q, k, positions)):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-6)     # both: float64 formula, float32 table
        with torch.no_grad():
            rot.inv_freq.mul_(1.5)
        rot.clear_cache()


@pytest.mark.parametrize("dtype,layout,angles", [("fp32", "half", False), ("bf16", "interleaved", False),
                                                  ("fp32", "interleaved", True), ("bf16", "half", True)])
def test_compiled_for_sm90_with_16_byte_accesses(dtype, layout, angles):
    # compiled ahead of time for an H100/H200 (no GPU needed: triton ships ptxas): aligned rows must be read and
    # written 16 bytes at a time. The kernel before this one moved one element per access (2-4 bytes), which is
    # what held it to 8-21% of the copy bandwidth on an H200. With a table every load is 16 bytes wide; with
    # angles the stores are (libdevice's cosf/sinf keep a 4-byte table lookup for huge arguments, never taken
    # here: the argument is reduced to [-pi, pi] first), and the positions are 8-byte loads.
    ptx = triton_rope.compile_offline(dtype, layout, angles, arch=90).asm["ptx"]
    assert triton_rope.global_access_bytes(ptx, "st") == {16}
    if not angles:
        assert triton_rope.global_access_bytes(ptx, "ld") == {16}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_gpu_dispatch_matches_cpu(dtype, layout):
    q = torch.randn(2, 8, 300, 128, dtype=dtype, device="cuda")
    k = torch.randn(2, 2, 300, 128, dtype=dtype, device="cuda")
    positions = torch.arange(300, device="cuda")[None, None] + torch.tensor([[[0]], [[5000]]], device="cuda")
    got_q, got_k = posenc.apply_rope_qk(q, k, positions, layout=layout, rotary_dim=96)
    ref_q, ref_k = posenc.apply_rope_qk(q.cpu(), k.cpu(), positions.cpu(), layout=layout, rotary_dim=96)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert torch.allclose(got_q.cpu().float(), ref_q.float(), atol=tol, rtol=tol)
    assert torch.allclose(got_k.cpu().float(), ref_k.float(), atol=tol, rtol=tol)
    # in place and autograd on the GPU
    q2 = q.clone()
    posenc.apply_rope_qk(q2, k.clone(), positions, layout=layout, rotary_dim=96, inplace=True)
    assert torch.equal(q2, got_q)
    x = q.float().requires_grad_()
    y = posenc.apply_rope(x, positions, layout=layout)
    y.backward(y.detach())                  # gradient of |y|^2 / 2 is R^T y = x
    assert torch.allclose(x.grad, x.detach(), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_rotary_module_matches_cpu(dtype):
    rot = posenc.Rotary(128, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096, layout="half",
                        max_position_embeddings=16384)
    q = torch.randn(2, 8, 300, 128, dtype=dtype)
    k = torch.randn(2, 2, 300, 128, dtype=dtype)
    positions = torch.arange(300)[None] + torch.tensor([[0], [9000]])
    want = rot(q, k, positions)
    got = rot.to("cuda")(q.cuda(), k.cuda(), positions.cuda())
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    for g, w in zip(got, want):
        assert torch.allclose(g.cpu().float(), w.float(), atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", GEOMETRIES)
def test_gpu_geometries_match_cpu(case):
    # the shapes a model hands the CUDA path (cos/sin computed in the kernel) against the CPU path
    q, k, positions, kw = model_geometry(case, seq=200, hq=8, dim=128)
    for layout in ("half", "interleaved"):
        want = posenc.apply_rope_qk(q, k, positions, layout=layout, **kw)
        got = posenc.apply_rope_qk(q.cuda(), k.cuda(), positions.cuda(), layout=layout, **kw)
        for a, b in zip(got, want):
            assert torch.allclose(a.cpu(), b, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_positions_that_require_grad_get_their_gradient():
    x = torch.randn(1, 2, 5, 16, dtype=torch.float64)
    grads = []
    for device in ("cpu", "cuda"):
        p = (torch.arange(5, dtype=torch.float64) * 3.5).to(device).requires_grad_()
        posenc.apply_rope(x.to(device), p).pow(3).sum().backward()
        grads.append(p.grad.cpu())
    assert torch.allclose(grads[0], grads[1], atol=1e-9) and grads[0].abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_frequencies_are_the_cpu_ones():
    # the cause of an fp32 GPU/CPU mismatch that grew with the position (6.6e-4 at position ~5300 on an H200):
    # inv_freq computed by CUDA's float32 pow, 1-2 ulp off the CPU's (and transformers') values
    from posenc.rope.tables import table_for  # the table cache is the subject of this test

    for dim, base in [(96, 10000.0), (128, 500000.0), (64, 1e6)]:
        cuda = table_for(base, None, dim, 1.0, dim, torch.device("cuda"), torch.float32).inv64
        cpu = table_for(base, None, dim, 1.0, dim, torch.device("cpu"), torch.float32).inv64
        assert torch.equal(cuda.cpu(), cpu)
        assert torch.equal(posenc.default_inv_freq(dim, base, device="cuda").cpu(), posenc.default_inv_freq(dim, base))
