"""GPU RoPE in Triton: q and k rotated in one launch, one pass over their bytes, fp32 math.

The work is split by *tokens* (an element of the positions, or of the cos/sin table's leading dims) and *heads*
(every leading dim the positions broadcast over). Each program takes BLOCK_T tokens and a run of heads of q and
then k: it forms the [BLOCK_T, rotary_dim // 2] cos/sin tile once and applies it to every head of the run, each
head a [BLOCK_T, dim] tile of contiguous rows. Two sources of angles:

- ``Angles`` (positions, float64 frequencies, scaling): cos/sin computed in the kernel, so there is no table to
  build, cache or read, and no host sync: one launch per call. The angle position * inv_freq is formed in float64
  and reduced to [-pi, pi] in float64 (exact to ~1e-16 rad at any position); cos/sin of the reduced angle are
  float32 (libdevice's accurate cosf/sinf), within 2e-7 of the float64 values the CPU table rounds. float64 inputs
  get float64 cos/sin. (float64 cos/sin for every input cost 168-255 registers a thread: too few warps resident.)
- a cos/sin table ([..., rotary_dim // 2] in the math dtype, broadcastable to x.shape[:-1]), read through strides.

Rows are addressed through up to three token dims and two head dims with arbitrary strides (x [B, H, T, D] or a
transposed [B, T, H, D] view alike); the head dim must be contiguous (copied otherwise). When every stride and
pointer is a multiple of 16 bytes the kernel is told so (``ALIGNED``, ``TABLE_VEC``), which lets it use 16-byte
loads and stores.

In place: pass the inputs as outputs (each program reads a tile before writing it, and tiles do not overlap).
Backward: posenc.kernels.rope_dispatch wraps this in an autograd.Function whose backward is this same kernel
with the angle negated (``inverse=True``).

The kernel and the device functions it calls (``_token_index``, ``_cos_sin_tile``, ``_rotate_rows``; triton inlines
them) are jitted on first use rather than at import, because triton decides between compiling and its CPU
interpreter (TRITON_INTERPRET=1, used by the tests) when ``triton.jit`` runs.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Sequence

import torch

from posenc.kernels.cpu_rope import collapse_dims, eager_rope_into
from posenc.angles import Angles

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None
    tl = None

_TOKEN_DIMS, _HEAD_DIMS = 3, 2     # leading dims the kernel addresses, after merging contiguous ones
# Elements of one head's [BLOCK_T, dim] tile, and of that tile a thread holds (8 warps for 4096). Register counts
# from compiling for sm_90 here: 64-110 a thread at 16 elements, 126-210 at 32 (fewer resident warps to hide
# memory latency). Chosen without a GPU: benchmarks/triton_sweep.py times the alternatives on one.
_TILE = 4096
_THREAD_ELEMS = 16
_kernels: dict[bool, object] = {}  # interpret mode -> jitted kernel


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def available() -> bool:
    """True when triton is importable and can run here (a CUDA device, or the interpreter)."""
    return triton is not None and (torch.cuda.is_available() or _interpret())


_INT_ARGS = ["n_tok", "heads_per_prog",
             "qt1", "qt2", "xq_t0", "xq_t1", "xq_t2", "oq_t0", "oq_t1", "oq_t2", "s_t0", "s_t1", "s_t2",
             "kt1", "kt2", "xk_t0", "xk_t1", "xk_t2", "ok_t0", "ok_t1", "ok_t2",
             "nhq", "qh1", "xq_h0", "xq_h1", "oq_h0", "oq_h1",
             "nhk", "kh1", "xk_h0", "xk_h1", "ok_h0", "ok_h1"]


def _token_index(tok, t1, t2):
    """The row-major index (i0, i1, i2) over three dims [*, t1, t2] of tokens ``tok`` [T]."""
    return tok // t2 // t1, (tok // t2) % t1, tok % t2


def _cos_sin_tile(SA, SB, s_tok, tmask, j, jmask, ROT: tl.constexpr, ANGLES: tl.constexpr, SCALED: tl.constexpr,
                  MATH64: tl.constexpr, INVERSE: tl.constexpr, TABLE_VEC: tl.constexpr):
    """The [T, HALF] cos and sin of tokens at angle-source offsets s_tok [T], pairs j [HALF] (-sin if INVERSE)."""
    if ANGLES:   # SA: positions, SB: [ROT // 2] float64 frequencies followed by the scaling
        pos = tl.load(SA + s_tok, mask=tmask, other=0).to(tl.float64)
        inv = tl.load(SB + j, mask=jmask, other=0.0)
        angle = pos[:, None] * inv[None, :]
        if MATH64:
            c = tl.cos(angle)
            s = tl.sin(angle)
        else:
            # reduce to [-pi, pi] in float64 (2 pi split in two parts: the reduction is exact to ~1e-16 rad at
            # any position), then float32 cos/sin of the reduced angle
            turns = tl.floor(angle * 0.15915494309189535 + 0.5)                    # angle / 2 pi, rounded
            reduced = ((angle - turns * 6.283185307179586) - turns * 2.4492935982947064e-16).to(tl.float32)
            c = tl.cos(reduced)
            s = tl.sin(reduced)
        if SCALED:
            scaling = tl.load(SB + ROT // 2)
            c = (c * scaling).to(c.dtype)
            s = (s * scaling).to(s.dtype)
    else:        # SA, SB: cos and sin tables in the math dtype, read through the token strides
        m = tmask[:, None] & jmask[None, :]
        c = tl.load(SA + s_tok[:, None] + j[None, :], mask=m, other=0.0)
        s = tl.load(SB + s_tok[:, None] + j[None, :], mask=m, other=0.0)
    if INVERSE:
        s = -s
    return c, s


def _rotate_rows(X, O, xoff, ooff, c, s, tmask, j, jmask, DIM: tl.constexpr, ROT: tl.constexpr,
                 HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                 INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr):
    """Rotate one head's [T, DIM] rows of X (row offsets xoff [T]) by the [T, HALF] c, s; write them at O + ooff."""
    if INTERLEAVED:   # pairs (2j, 2j + 1): load whole rows and split the last dim in two
        col = tl.arange(0, 2 * HALF_PAD)
        m2 = tmask[:, None] & (col < ROT)[None, :]
        v = tl.load(X + xoff[:, None] + col[None, :], mask=m2, other=0.0).to(c.dtype)
        a, b = tl.split(tl.reshape(v, (BLOCK_T, HALF_PAD, 2)))
        r = tl.reshape(tl.join(a * c - b * s, a * s + b * c), (BLOCK_T, 2 * HALF_PAD))
        tl.store(O + ooff[:, None] + col[None, :], r.to(O.dtype.element_ty), mask=m2)
    else:             # pairs (j, j + ROT / 2): two contiguous halves
        m = tmask[:, None] & jmask[None, :]
        a = tl.load(X + xoff[:, None] + j[None, :], mask=m, other=0.0).to(c.dtype)
        b = tl.load(X + xoff[:, None] + (j + ROT // 2)[None, :], mask=m, other=0.0).to(c.dtype)
        tl.store(O + ooff[:, None] + j[None, :], (a * c - b * s).to(O.dtype.element_ty), mask=m)
        tl.store(O + ooff[:, None] + (j + ROT // 2)[None, :], (a * s + b * c).to(O.dtype.element_ty), mask=m)
    if COPY_TAIL:     # partial rotary, out of place: the unrotated dims pass through
        t = ROT + tl.arange(0, TAIL_PAD)
        tm = tmask[:, None] & (t < DIM)[None, :]
        tl.store(O + ooff[:, None] + t[None, :], tl.load(X + xoff[:, None] + t[None, :], mask=tm), mask=tm)


def _rope_kernel(
    XQ, OQ, XK, OK, SA, SB,
    n_tok, heads_per_prog,
    qt1, qt2, xq_t0, xq_t1, xq_t2, oq_t0, oq_t1, oq_t2, s_t0, s_t1, s_t2,
    kt1, kt2, xk_t0, xk_t1, xk_t2, ok_t0, ok_t1, ok_t2,
    nhq, qh1, xq_h0, xq_h1, oq_h0, oq_h1,
    nhk, kh1, xk_h0, xk_h1, ok_h0, ok_h1,
    DIM: tl.constexpr, ROT: tl.constexpr, HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
    ANGLES: tl.constexpr, SCALED: tl.constexpr, MATH64: tl.constexpr, INVERSE: tl.constexpr,
    INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr, ALIGNED: tl.constexpr, VEC: tl.constexpr,
    TABLE_VEC: tl.constexpr,
):
    # ---- this program's tokens, and their element offsets in q, k (and their outputs) and the angle source;
    # q's and k's token dims may merge differently, and the angle source follows q's
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)           # [T]
    tmask = tok < n_tok
    q0, q1, q2 = _token_index(tok, qt1, qt2)
    k0, k1, k2 = _token_index(tok, kt1, kt2)
    xq_tok = q0 * xq_t0 + q1 * xq_t1 + q2 * xq_t2
    oq_tok = q0 * oq_t0 + q1 * oq_t1 + q2 * oq_t2
    s_tok = q0 * s_t0 + q1 * s_t1 + q2 * s_t2
    xk_tok = k0 * xk_t0 + k1 * xk_t1 + k2 * xk_t2
    ok_tok = k0 * ok_t0 + k1 * ok_t1 + k2 * ok_t2

    # ---- the [T, HALF] cos/sin tile, formed once for every head this program rotates
    j = tl.arange(0, HALF_PAD)                                                        # [HALF] pair index
    jmask = j < ROT // 2
    if TABLE_VEC > 1:   # table rows start on 16 bytes (said here: a hint given inside the callee is lost, and
        s_tok = tl.multiple_of(s_tok, TABLE_VEC)    # the table loads compile to 4-byte accesses, not 16)
    c, s = _cos_sin_tile(SA, SB, s_tok, tmask, j, jmask, ROT, ANGLES, SCALED, MATH64, INVERSE, TABLE_VEC)

    # ---- heads [h0, h1) of the list q's heads then k's heads
    h0 = tl.program_id(1).to(tl.int64) * heads_per_prog
    h1 = tl.minimum(h0 + heads_per_prog, nhq + nhk)
    for h in range(h0, h1):
        is_k = h >= nhq
        hh = tl.where(is_k, h - nhq, h)
        hs1 = tl.where(is_k, kh1, qh1).to(tl.int64)
        i0 = hh // hs1
        i1 = hh % hs1
        xoff = tl.where(is_k, xk_tok, xq_tok) + i0 * tl.where(is_k, xk_h0, xq_h0) + i1 * tl.where(is_k, xk_h1,
                                                                                               xq_h1)
        ooff = tl.where(is_k, ok_tok, oq_tok) + i0 * tl.where(is_k, ok_h0, oq_h0) + i1 * tl.where(is_k, ok_h1,
                                                                                               oq_h1)
        if ALIGNED:  # every row starts on 16 bytes: lets the loads and stores below be 16 bytes wide
            xoff = tl.multiple_of(xoff, VEC)
            ooff = tl.multiple_of(ooff, VEC)
        _rotate_rows(tl.where(is_k, XK, XQ), tl.where(is_k, OK, OQ), xoff, ooff, c, s, tmask, j, jmask,
                     DIM, ROT, HALF_PAD, TAIL_PAD, BLOCK_T, INTERLEAVED, COPY_TAIL)


_DEVICE_FUNCTIONS = ("_token_index", "_cos_sin_tile", "_rotate_rows")    # what _rope_kernel calls


def _jit_kernel():
    """_rope_kernel and the device functions it calls, jitted in the mode triton is in now (compiled, or the
    interpreter under TRITON_INTERPRET). The kernel looks its callees up in its globals, so each jitting gets its
    own copy of the module's namespace holding that mode's callees: a mode's kernel never calls the other's."""
    namespace = dict(globals())

    def rebind(fn):
        bound = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
        bound.__qualname__, bound.__module__ = fn.__qualname__, fn.__module__
        return bound

    for name in _DEVICE_FUNCTIONS:
        namespace[name] = triton.jit(rebind(globals()[name]))
    # integers are not specialised (a size or stride of 1 would otherwise become a compile-time constant, and
    # every new geometry a recompile); ALIGNED carries the one fact about them that matters for speed
    return triton.jit(rebind(_rope_kernel), do_not_specialize=_INT_ARGS)


def _kernel():
    mode = _interpret()
    if mode not in _kernels:
        _kernels[mode] = _jit_kernel()
    return _kernels[mode]


# --------------------------------------------------------------------------------------------------- geometry

def _split(shape, x_st, o_st, s_st):
    """Leading dims of one tensor split into tokens (source stride != 0) and heads (the source broadcasts).

    Returns ((token sizes, x strides, out strides, source strides), (head sizes, x strides, out strides)), each
    list merged where contiguous and left-padded to the kernel's dim counts, or None if there are too many."""
    tok = [(n, a, b, c) for n, a, b, c in zip(shape, x_st, o_st, s_st) if c != 0 and n != 1]
    head = [(n, a, b) for n, a, b, c in zip(shape, x_st, o_st, s_st) if c == 0 and n != 1]
    t_n, t_x, t_o, t_s = collapse_dims([d[0] for d in tok], [d[1] for d in tok], [d[2] for d in tok],
                                       [d[3] for d in tok])
    h_n, h_x, h_o = collapse_dims([d[0] for d in head], [d[1] for d in head], [d[2] for d in head])
    if len(t_n) > _TOKEN_DIMS or len(h_n) > _HEAD_DIMS:
        return None
    pt, ph = _TOKEN_DIMS - len(t_n), _HEAD_DIMS - len(h_n)
    return (([1] * pt + t_n, [0] * pt + t_x, [0] * pt + t_o, [0] * pt + t_s),
            ([1] * ph + h_n, [0] * ph + h_x, [0] * ph + h_o))


def _prod(v) -> int:
    n = 1
    for s in v:
        n *= s
    return n


_SMS: dict = {}


def _programs_wanted(device: torch.device) -> int:
    """Enough programs to keep every SM busy (8 per SM). Under the interpreter (CPU tensors) a few, so that the
    tests split heads into runs too, some straddling q's last head and k's first."""
    if device.type != "cuda":
        return 6
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SMS:
        _SMS[key] = 8 * torch.cuda.get_device_properties(key).multi_processor_count
    return _SMS[key]


def _broadcast_strides(shape, stride, target) -> list[int]:
    """Strides of a tensor of ``shape``/``stride`` expanded to ``target`` (0 where it broadcasts): torch's expand."""
    n, m = len(target), len(shape)
    return [stride[i - n + m] if i - n + m >= 0 and shape[i - n + m] != 1 else 0 for i in range(n)]


_PLANS: dict = {}           # call geometry -> (grid, integer args, meta-parameters); see _plan
_MAX_PLANS = 256


def rope_into(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], cos, sin: torch.Tensor | None, *,
              layout: str, rotary_dim: int, inverse: bool = False) -> None:
    """Write RoPE(xs[i]) into outs[i] for one or two tensors (q, k) in a single launch.

    xs[i], outs[i]: [..., dim] on the same device, one dtype; outs[i] may be xs[i] (in place).
    cos, sin: broadcastable to [..., rotary_dim // 2] for every x, float32 (float64 for float64 x); or cos an
    ``Angles`` (positions broadcastable to x.shape[:-1]) and sin None.

    The launch geometry of a call (grid, sizes, strides, block sizes) is worked out once per shape and stride
    pattern and cached (``_PLANS``): a decode step pays a dict lookup, not the planning.
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    if not 1 <= len(xs) <= 2 or len(outs) != len(xs):
        raise ValueError(f"rope_into takes one or two tensors with as many outputs, got {len(xs)} and {len(outs)}")
    angles = cos if isinstance(cos, Angles) else None
    if angles is None:
        cos = cos if cos.stride(-1) == 1 else cos.contiguous()
        sin = sin if sin.stride(-1) == 1 else sin.contiguous()
        if sin.stride() != cos.stride():
            sin = sin.expand_as(cos).contiguous()
            cos = cos.expand_as(sin).contiguous()
        src, src_a, src_b = cos, cos, sin
        scaled = False
    else:
        src, src_a, src_b = angles.positions, angles.positions, angles.packed_frequencies()
        scaled = float(angles.scaling) != 1.0
    x0, xk, ok = xs[0], xs[-1], outs[-1]
    aligned = not (x0.data_ptr() | outs[0].data_ptr() | xk.data_ptr() | ok.data_ptr() |
                   (0 if angles is not None else cos.data_ptr() | sin.data_ptr())) % 16
    key = (layout, rotary_dim, inverse, scaled, angles is None, aligned, src.shape, src.stride(), x0.device,
           *[(x.shape, x.stride(), o.stride(), x.dtype, x.data_ptr() == o.data_ptr()) for x, o in zip(xs, outs)])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(xs, outs, src, angles is not None, scaled, aligned, layout, rotary_dim, inverse)
        if plan is not None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan is not None:
        if plan[0]:
            grid, ints, meta = plan
            _kernel()[grid](x0, outs[0], xk, ok, src_a, src_b, *ints, **meta)
        return
    _rope_general(xs, outs, src, src_b, cos, sin, angles, layout, rotary_dim, inverse, scaled)


def _rope_general(xs, outs, src, src_b, cos, sin, angles, layout, rotary_dim, inverse, scaled):
    """Inputs the kernel cannot address directly: dense copies written back, or plain torch ops."""
    work, writeback = [], []
    for x, o in zip(xs, outs):
        s_st = _broadcast_strides(src.shape[:-1] if angles is None else src.shape,
                                  src.stride()[:-1] if angles is None else src.stride(), x.shape[:-1])
        in_place = o.data_ptr() == x.data_ptr()
        if x.stride(-1) == 1 and o.stride(-1) == 1 and _split(x.shape[:-1], x.stride()[:-1], o.stride()[:-1], s_st):
            work.append((x, o))
            continue
        xc = x.contiguous()
        oc = xc if in_place else torch.empty_like(xc)
        if _split(xc.shape[:-1], xc.stride()[:-1], oc.stride()[:-1], s_st) is None:
            # positions or a table with > 3 non-broadcast dims: rare; plain torch ops
            c, s = (cos, sin) if angles is None else angles.table(
                torch.float64 if x.dtype == torch.float64 else torch.float32)
            eager_rope_into(x, c, s, o, layout, rotary_dim, inverse)
            continue
        writeback.append((o, oc))
        work.append((xc, oc))
    if work:
        plan = _plan([w[0] for w in work], [w[1] for w in work], src, angles is not None, scaled,
                     False, layout, rotary_dim, inverse)
        if plan[0]:
            grid, ints, meta = plan
            xk, ok = work[-1]
            _kernel()[grid](work[0][0], work[0][1], xk, ok, src, src_b, *ints, **meta)
    for o, oc in writeback:
        o.copy_(oc)


def _plan(xs, outs, src, angles: bool, scaled: bool, ptrs_aligned: bool, layout, rotary_dim, inverse):
    """(grid, integer args, meta-parameters) of the launch; (None, None, None) when there is nothing to do; None
    when some tensor needs ``_rope_general`` (a non-contiguous head dim or too many leading dims)."""
    geoms = []
    for x, o in zip(xs, outs):
        if x.stride(-1) != 1 or o.stride(-1) != 1:
            return None
        lead = x.shape[:-1]
        s_st = (_broadcast_strides(src.shape, src.stride(), lead) if angles else
                _broadcast_strides(src.shape[:-1], src.stride()[:-1], lead))
        g = _split(lead, x.stride()[:-1], o.stride()[:-1], s_st)
        if g is None:
            return None
        geoms.append(g)
    (tq, hq), (tk, hk), x0 = geoms[0], geoms[-1], xs[0]
    n_tok = _prod(tq[0])
    nhq, nhk = _prod(hq[0]), (_prod(hk[0]) if len(xs) == 2 else 0)
    if n_tok == 0 or nhq + nhk == 0:
        return None, None, None
    dim = x0.shape[-1]
    half_pad = triton.next_power_of_2(rotary_dim // 2)
    block_t = max(1, min(triton.next_power_of_2(n_tok), _TILE // (2 * half_pad)))
    blocks = -(-n_tok // block_t)
    groups = max(1, min(nhq + nhk, -(-_programs_wanted(x0.device) // blocks)))
    heads_per_prog = -(-(nhq + nhk) // groups)
    groups = -(-(nhq + nhk) // heads_per_prog)
    vec = max(1, 16 // x0.element_size())
    table_vec = 2 if x0.dtype == torch.float64 else 4                 # 16 bytes of the float64 / float32 table
    strides = [*tq[1], *tq[2], *hq[1], *hq[2], *tk[1], *tk[2], *hk[1], *hk[2]]
    ints = [n_tok, heads_per_prog,
            tq[0][1], tq[0][2], *tq[1], *tq[2], *tq[3],
            tk[0][1], tk[0][2], *tk[1], *tk[2],
            nhq, hq[0][1], *hq[1], *hq[2],
            nhk, hk[0][1], *hk[1], *hk[2]]
    meta = dict(DIM=dim, ROT=rotary_dim, HALF_PAD=half_pad, TAIL_PAD=triton.next_power_of_2(max(dim - rotary_dim, 1)),
                BLOCK_T=block_t, ANGLES=angles, SCALED=scaled, MATH64=x0.dtype == torch.float64, INVERSE=inverse,
                INTERLEAVED=layout == "interleaved",
                COPY_TAIL=rotary_dim < dim and not all(x.data_ptr() == o.data_ptr() for x, o in zip(xs, outs)),
                ALIGNED=ptrs_aligned and all(s % vec == 0 for s in strides), VEC=vec,
                TABLE_VEC=table_vec if ptrs_aligned and not angles and all(s % table_vec == 0 for s in tq[3]) else 1,
                num_warps=max(1, min(16, block_t * 2 * half_pad // (32 * _THREAD_ELEMS))),
                enable_fp_fusion=True)      # a * c - b * s as one fused multiply-add: one rounding, not two
    return (blocks, groups), ints, meta


# ------------------------------------------------------------------------------- offline compilation (no GPU)

def compile_offline(dtype: str, layout: str, angles: bool, *, arch: int = 90, dim: int = 128, block_t: int = 32,
                    num_warps: int = 8):
    """The kernel compiled for sm_<arch> without a GPU (triton ships ptxas), as rope_into launches it with aligned
    rows: a triton CompiledKernel whose ``asm`` holds "ptx" and "cubin". dtype: "fp32", "bf16" or "fp16".
    For inspecting what the GPU will run (benchmarks/triton_compile.py, the tests)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _jit_kernel()
    const = dict(DIM=dim, ROT=dim, HALF_PAD=triton.next_power_of_2(dim // 2), TAIL_PAD=1, BLOCK_T=block_t,
                 ANGLES=angles, SCALED=False, MATH64=False, INVERSE=False, INTERLEAVED=layout == "interleaved",
                 COPY_TAIL=False, ALIGNED=True, VEC=16 // {"fp32": 4, "bf16": 2, "fp16": 2}[dtype],
                 TABLE_VEC=1 if angles else 4)
    sig = {a: "i32" for a in fn.arg_names}
    sig.update({a: "*" + dtype for a in ("XQ", "OQ", "XK", "OK")})
    sig.update({"SA": "*i64", "SB": "*fp64"} if angles else {"SA": "*fp32", "SB": "*fp32"})
    sig.update({a: "constexpr" for a in const})
    pointers_aligned = {(i,): [["tt.divisibility", 16]] for i in range(6)}     # as torch's allocations are
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=pointers_aligned)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, enable_fp_fusion=True))


def global_access_bytes(ptx: str, op: str) -> set[int]:
    """Widths in bytes of the global loads (op "ld") or stores ("st") in PTX text (16: one 16-byte vector)."""
    pattern = rf"{op}\.global(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)"
    return {int(n or 1) * int(bits) // 8 for n, bits in re.findall(pattern, ptx)}
