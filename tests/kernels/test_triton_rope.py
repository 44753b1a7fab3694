"""The Triton RoPE kernel against the lesson's loops: on the CPU through triton's interpreter, on a GPU if present.

TRITON_INTERPRET must be set when the kernel is jitted; posenc jits it on first use per mode, and the fixture
below sets the variable only while these tests run (so other tests in the process are unaffected).
"""

import pytest
import torch

import posenc
from posenc.kernels import rope_dispatch
from posenc.rope.apply import default_inv_freq, rope_cos_sin

from ._oracle import assert_close_to_oracle, reference_rope

pytest.importorskip("triton")
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
def test_gpu_frequencies_are_the_cpu_ones():
    # the cause of an fp32 GPU/CPU mismatch that grew with the position (6.6e-4 at position ~5300 on an H200):
    # inv_freq computed by CUDA's float32 pow, 1-2 ulp off the CPU's (and transformers') values
    from posenc.rope.apply import _table_for  # the table cache is the subject of this test

    for dim, base in [(96, 10000.0), (128, 500000.0), (64, 1e6)]:
        cuda = _table_for(base, None, dim, 1.0, dim, torch.device("cuda"), torch.float32).inv64
        cpu = _table_for(base, None, dim, 1.0, dim, torch.device("cpu"), torch.float32).inv64
        assert torch.equal(cuda.cpu(), cpu)
        assert torch.equal(posenc.default_inv_freq(dim, base, device="cuda").cpu(), posenc.default_inv_freq(dim, base))
