"""GPU RoPE in Triton: q and k rotated in one launch, one pass over their bytes, fp32 math.

Each program rotates BLOCK_M rows (head vectors) of q or of k: program ids below ``blocks_q`` take q, the rest k,
so both tensors share one launch and one cos/sin table. The table ([..., rotary_dim // 2], float32; float64
for float64 inputs) is indexed through strides, so per-token position ids, per-batch offsets (positions
[batch, 1, seq]) and broadcasting over heads cost nothing extra. Rows are addressed through up to four leading
dims with arbitrary strides (x [B, H, T, D] or a transposed [B, T, H, D] view alike); the head dim must be
contiguous (copied otherwise).

In place: pass the inputs as outputs (each program reads its row before writing it).
Backward: posenc.kernels.rope_dispatch wraps this in an autograd.Function whose backward is this same kernel
with the angle negated (``inverse=True``).

The kernel is jitted on first use rather than at import, because triton decides between compiling and its CPU
interpreter (TRITON_INTERPRET=1, used by the tests) when ``triton.jit`` runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from posenc.kernels.cpu_rope import collapse_dims, eager_rope_into

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None
    tl = None

_N_DIMS = 4                       # leading dims the kernel addresses
_kernels: dict[bool, object] = {}  # interpret mode -> jitted kernel


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def available() -> bool:
    """True when triton is importable and can run here (a CUDA device, or the interpreter)."""
    return triton is not None and (torch.cuda.is_available() or _interpret())


_INT_ARGS = ["blocks_q", "k_x_delta", "k_o_delta",
             "nq", "q_s1", "q_s2", "q_s3", "xq0", "xq1", "xq2", "xq3", "oq0", "oq1", "oq2", "oq3",
             "tq0", "tq1", "tq2", "tq3",
             "nk", "k_s1", "k_s2", "k_s3", "xk0", "xk1", "xk2", "xk3", "ok0", "ok1", "ok2", "ok3",
             "tk0", "tk1", "tk2", "tk3"]


def _rope_kernel(
    XQ, OQ, C, S,
    blocks_q, k_x_delta, k_o_delta, sign,
    nq, q_s1, q_s2, q_s3, xq0, xq1, xq2, xq3, oq0, oq1, oq2, oq3, tq0, tq1, tq2, tq3,
    nk, k_s1, k_s2, k_s3, xk0, xk1, xk2, xk3, ok0, ok1, ok2, ok3, tk0, tk1, tk2, tk3,
    DIM: tl.constexpr, ROT: tl.constexpr, HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid = tl.program_id(0)
    # programs [0, blocks_q) take q, the rest k. Selection is arithmetic (no branch), so q's and k's integer
    # arguments never need matching types; k's data is addressed from q's pointers plus an element delta.
    is_k = pid >= blocks_q
    which = is_k.to(tl.int64)
    blk = pid.to(tl.int64) - which * blocks_q
    X = XQ + which * k_x_delta
    O = OQ + which * k_o_delta

    n = tl.where(is_k, nk.to(tl.int64), nq.to(tl.int64))
    s1 = tl.where(is_k, k_s1.to(tl.int64), q_s1.to(tl.int64))
    s2 = tl.where(is_k, k_s2.to(tl.int64), q_s2.to(tl.int64))
    s3 = tl.where(is_k, k_s3.to(tl.int64), q_s3.to(tl.int64))
    x0 = tl.where(is_k, xk0.to(tl.int64), xq0.to(tl.int64))
    x1 = tl.where(is_k, xk1.to(tl.int64), xq1.to(tl.int64))
    x2 = tl.where(is_k, xk2.to(tl.int64), xq2.to(tl.int64))
    x3 = tl.where(is_k, xk3.to(tl.int64), xq3.to(tl.int64))
    o0 = tl.where(is_k, ok0.to(tl.int64), oq0.to(tl.int64))
    o1 = tl.where(is_k, ok1.to(tl.int64), oq1.to(tl.int64))
    o2 = tl.where(is_k, ok2.to(tl.int64), oq2.to(tl.int64))
    o3 = tl.where(is_k, ok3.to(tl.int64), oq3.to(tl.int64))
    t0 = tl.where(is_k, tk0.to(tl.int64), tq0.to(tl.int64))
    t1 = tl.where(is_k, tk1.to(tl.int64), tq1.to(tl.int64))
    t2 = tl.where(is_k, tk2.to(tl.int64), tq2.to(tl.int64))
    t3 = tl.where(is_k, tk3.to(tl.int64), tq3.to(tl.int64))

    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)                         # [M] row ids
    rmask = rows < n
    r = rows
    i3 = r % s3
    r = r // s3
    i2 = r % s2
    r = r // s2
    i1 = r % s1
    i0 = r // s1
    xoff = i0 * x0 + i1 * x1 + i2 * x2 + i3 * x3                       # [M] element offsets
    ooff = i0 * o0 + i1 * o1 + i2 * o2 + i3 * o3
    toff = i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3

    j = tl.arange(0, HALF_PAD)                                          # [H] pair index
    m = rmask[:, None] & (j < ROT // 2)[None, :]
    if INTERLEAVED:
        ia = 2 * j
        ib = 2 * j + 1
    else:
        ia = j
        ib = j + ROT // 2
    c = tl.load(C + toff[:, None] + j[None, :], mask=m, other=0.0)
    s = tl.load(S + toff[:, None] + j[None, :], mask=m, other=0.0) * sign
    a = tl.load(X + xoff[:, None] + ia[None, :], mask=m, other=0.0).to(c.dtype)
    b = tl.load(X + xoff[:, None] + ib[None, :], mask=m, other=0.0).to(c.dtype)
    tl.store(O + ooff[:, None] + ia[None, :], (a * c - b * s).to(O.dtype.element_ty), mask=m)
    tl.store(O + ooff[:, None] + ib[None, :], (a * s + b * c).to(O.dtype.element_ty), mask=m)
    if COPY_TAIL:  # partial rotary, out of place: the unrotated dims pass through
        t = ROT + tl.arange(0, TAIL_PAD)
        tm = rmask[:, None] & (t < DIM)[None, :]
        v = tl.load(X + xoff[:, None] + t[None, :], mask=tm)
        tl.store(O + ooff[:, None] + t[None, :], v, mask=tm)


def _kernel():
    mode = _interpret()
    if mode not in _kernels:
        # integers are not specialised (a stride or size of 1 would otherwise become a compile-time constant,
        # and every new geometry a recompile)
        _kernels[mode] = triton.jit(_rope_kernel, do_not_specialize=_INT_ARGS)
    return _kernels[mode]


def _describe(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor):
    """(n_rows, [s1, s2, s3], x strides[4], out strides[4], table strides[4]) or None if > 4 leading dims."""
    sizes, xs, os_, ts = collapse_dims(list(x.shape[:-1]), list(x.stride()[:-1]), list(out.stride()[:-1]),
                                   list(cos.stride()[:-1]))
    if len(sizes) > _N_DIMS:
        return None
    pad = _N_DIMS - len(sizes)
    sizes, xs, os_, ts = [1] * pad + sizes, [0] * pad + xs, [0] * pad + os_, [0] * pad + ts
    n = 1
    for v in sizes:
        n *= v
    return n, sizes[1:], xs, os_, ts


def rope_into(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, *,
              layout: str, rotary_dim: int, inverse: bool = False) -> None:
    """Write RoPE(xs[i]) into outs[i] for one or two tensors (q, k) in a single launch.

    xs[i], outs[i]: [..., dim] on the same device, one dtype; outs[i] may be xs[i] (in place).
    cos, sin: broadcastable to [..., rotary_dim // 2] for every x, float32 (float64 for float64 x).
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    if not 1 <= len(xs) <= 2 or len(outs) != len(xs):
        raise ValueError(f"rope_into takes one or two tensors with as many outputs, got {len(xs)} and {len(outs)}")
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if sin.stride() != cos.stride():
        sin = sin.expand_as(cos).contiguous()
        cos = cos.expand_as(sin).contiguous()
    work, writeback, descs = [], [], []
    for x, o in zip(xs, outs):
        c = cos.expand(*x.shape[:-1], rotary_dim // 2)
        in_place = o.data_ptr() == x.data_ptr()
        d = _describe(x, o, c) if x.stride(-1) == 1 and o.stride(-1) == 1 else None
        if d is None:  # unusual strides or > 4 leading dims: rotate a dense copy, then write back
            xc = x.contiguous()
            oc = xc if in_place else torch.empty_like(xc)
            d = _describe(xc, oc, c)
            if d is None:  # positions with > 4 non-broadcast dims: rare; plain torch ops
                eager_rope_into(x, cos, sin, o, layout, rotary_dim, inverse)
                continue
            writeback.append((o, oc))
            x, o = xc, oc
        work.append((x, o, in_place))
        descs.append(d)
    if not work:
        return
    if len(work) == 1:  # a single tensor: the k branch is never taken
        work.append(work[0])
        descs.append(descs[0])
    dim = xs[0].shape[-1]
    half = rotary_dim // 2
    half_pad = triton.next_power_of_2(half)
    tail_pad = triton.next_power_of_2(max(dim - rotary_dim, 1))
    block_m = max(1, min(64, 4096 // (2 * half_pad)))
    nq = descs[0][0]
    blocks_q = triton.cdiv(nq, block_m)
    blocks_k = triton.cdiv(descs[1][0], block_m) if work[1] is not work[0] else 0
    if blocks_q + blocks_k == 0:
        return
    copy_tail = rotary_dim < dim and not all(w[2] for w in work)
    (xq, oq, _), (xk, ok, _) = work[0], work[1]
    esize = xq.element_size()
    args = [xq, oq, cos, sin, blocks_q, (xk.data_ptr() - xq.data_ptr()) // esize,
            (ok.data_ptr() - oq.data_ptr()) // esize, -1.0 if inverse else 1.0]
    for n, sz, xst, ost, tst in descs:
        args += [n, *sz, *xst, *ost, *tst]
    _kernel()[(blocks_q + blocks_k,)](
        *args, DIM=dim, ROT=rotary_dim, HALF_PAD=half_pad, TAIL_PAD=tail_pad,
        INTERLEAVED=layout == "interleaved", COPY_TAIL=copy_tail, BLOCK_M=block_m)
    for o, oc in writeback:
        o.copy_(oc)
