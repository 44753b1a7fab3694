"""posenc's kernels as torch custom ops (``torch.library``): what torch.compile and torch.export see of them.

Dynamo cannot trace the eager routes: they call the C kernel through ctypes and Triton from Python helpers that
keep plan caches, compare ``data_ptr()``s and read positions on the host. Under a trace (``under_trace``) posenc
calls these ops instead; eager calls never do (the decode fast paths stay direct: no dispatcher round trip).

    posenc::rope(x, cos, sin, index, layout, rotary_dim, inverse) -> Tensor            one tensor, fresh output
    posenc::rope_qk(q, k, cos, sin, index, ...) -> (Tensor, Tensor)                    q and k in one kernel call
    posenc::rope_(Tensor(a!) x, ...) / rope_qk_(Tensor(a!) q, Tensor(b!) k, ...)      in place
    posenc::rope_out(x, ..., Tensor(a!) out) / rope_qk_out(q, k, ..., Tensor(a!) q_out, Tensor(b!) k_out)
    posenc::alibi_attention(q, k, v, slopes, causal, q_offset, scale, block_size, backend) -> Tensor
    posenc::alibi_attention_backward(grad, q, k, v, slopes, ...) -> (dq, dk, dv, dslopes)

cos, sin: a table in the math dtype (float32; float64 for float64 inputs), broadcastable to x.shape[:-1] + [R/2],
or with ``index`` (int64, broadcastable to x.shape[:-1]) a [rows, R/2] table whose row index[...] rotates each
vector. Each op has a fake implementation (outputs ``empty_like`` the inputs, as the kernels allocate them),
device implementations (CPU: the C kernel of posenc.kernels.cpu_rope, or its eager fallback; CUDA: the Triton
kernel of posenc.kernels.triton_rope; any other device: the eager fallback) and, for the functional forms, autograd:
RoPE's backward is the same op with the angle negated (so double backward works too), ALiBi's is the backward op,
which recomputes the attention under autograd. The in-place and out= forms declare what they write in their schema
(torch bumps those tensors' version counters) and apply posenc.kernels.rope_checks' memory rules when they run.

Under a trace the cos/sin of the positions are computed by ``angles_cos_sin`` in the graph (float64 angles, as
the tables are built) instead of read from posenc's cached tables, whose growth depends on the positions' values.
Length-dependent rope types (dynamic NTK, LongRoPE), whose frequencies depend on the largest position, and
multi-axis positions keep their eager route (a graph break, as transformers' own ``dynamic_rope_update`` makes).
Checks that need values (finite positions and slopes, negative positions on the CPU) are skipped under a trace: a
NaN then shows in the output.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from posenc.errors import PosencError
from posenc.kernels import rope_checks, rope_dispatch
from posenc.rope.angles import Angles, angles_cos_sin

_Tensor = torch.Tensor
_dynamo_compiling = torch.compiler.is_dynamo_compiling     # eager: returns False (cheap); dynamo folds it to True
_is_compiling = torch.compiler.is_compiling                 # also True while torch.export / AOT traces with fakes


def under_trace(x) -> bool:
    """Whether this call is being traced by torch.compile or torch.export (then the custom ops run).

    Dynamo folds ``is_dynamo_compiling`` to True; non-strict export and AOT tracing hand the Python code fake or
    functional tensors (a Tensor subclass) while the compiling flag is up. A plain tensor in eager costs one call."""
    return _dynamo_compiling() or (type(x) is not _Tensor and _is_compiling())


# --------------------------------------------------------------------------------------------------- backends

def _cuda_backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
    from posenc.kernels import triton_rope
    backend = rope_dispatch._triton_backend if triton_rope.available() else rope_dispatch._eager_backend
    backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse)


_DEVICE_BACKENDS = {"cpu": rope_dispatch._cpu_backend, "cuda": _cuda_backend}


def _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse) -> None:
    if xs[0].numel():
        backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse)


def _check_spec(layout: str, rotary_dim: int, x: Tensor) -> None:
    if layout not in ("interleaved", "half"):
        raise PosencError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > x.shape[-1]:
        raise PosencError(f"rotary_dim must be even, in [2, {x.shape[-1]}], got {rotary_dim}")


# --------------------------------------------------------------------------------------------------- RoPE ops
# One body per form; each op registers it with the eager fallback as its default and the CPU / CUDA backends as
# its device implementations.

def _fresh(backend, xs, cos, sin, index, layout, rotary_dim, inverse):
    _check_spec(layout, rotary_dim, xs[0])
    outs = [torch.empty_like(x) for x in xs]
    _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse)
    return outs


def _inplace(backend, xs, cos, sin, index, layout, rotary_dim, inverse, names):
    _check_spec(layout, rotary_dim, xs[0])
    rope_checks.check_writes(xs, xs, names, names)
    _rotate_into(backend, xs, xs, cos, sin, index, layout, rotary_dim, inverse)


def _into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse, names, out_names):
    _check_spec(layout, rotary_dim, xs[0])
    for x, o, name in zip(xs, outs, out_names):
        if o.shape != x.shape or o.dtype != x.dtype or o.device != x.device:
            raise PosencError(f"{name} must match the input's shape, dtype and device {list(x.shape)} {x.dtype} "
                              f"{x.device}; got {list(o.shape)} {o.dtype} {o.device}")
    rope_checks.check_writes(xs, outs, names, out_names)
    _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse)


@torch.library.custom_op("posenc::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
         inverse: bool) -> Tensor:
    """RoPE(x) (RoPE^-1 when ``inverse``) as a new tensor like x."""
    return _fresh(rope_dispatch._eager_backend, (x,), cos, sin, index, layout, rotary_dim, inverse)[0]


@torch.library.custom_op("posenc::rope_qk", mutates_args=())
def rope_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
            inverse: bool) -> tuple[Tensor, Tensor]:
    """(RoPE(q), RoPE(k)) with one table, in one kernel call."""
    return tuple(_fresh(rope_dispatch._eager_backend, (q, k), cos, sin, index, layout, rotary_dim, inverse))


@torch.library.custom_op("posenc::rope_", mutates_args=("x",))
def rope_(x: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
          inverse: bool) -> None:
    """x = RoPE(x), in place."""
    _inplace(rope_dispatch._eager_backend, (x,), cos, sin, index, layout, rotary_dim, inverse, ("x",))


@torch.library.custom_op("posenc::rope_qk_", mutates_args=("q", "k"))
def rope_qk_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
             inverse: bool) -> None:
    """q, k = RoPE(q), RoPE(k), in place (q and k must not share memory)."""
    _inplace(rope_dispatch._eager_backend, (q, k), cos, sin, index, layout, rotary_dim, inverse, ("q", "k"))


@torch.library.custom_op("posenc::rope_out", mutates_args=("out",))
def rope_out(x: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
             inverse: bool, out: Tensor) -> None:
    """out = RoPE(x) (out like x, not overlapping it)."""
    _into(rope_dispatch._eager_backend, (x,), (out,), cos, sin, index, layout, rotary_dim, inverse, ("x",),
          ("out",))


@torch.library.custom_op("posenc::rope_qk_out", mutates_args=("q_out", "k_out"))
def rope_qk_out(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str,
                rotary_dim: int, inverse: bool, q_out: Tensor, k_out: Tensor) -> None:
    """q_out, k_out = RoPE(q), RoPE(k)."""
    _into(rope_dispatch._eager_backend, (q, k), (q_out, k_out), cos, sin, index, layout, rotary_dim, inverse,
          ("q", "k"), ("out[0]", "out[1]"))


def _register_devices() -> None:
    for device, backend in _DEVICE_BACKENDS.items():
        def kernels(b=backend):
            return {
                rope: lambda x, c, s, i, lay, r, inv: _fresh(b, (x,), c, s, i, lay, r, inv)[0],
                rope_qk: lambda q, k, c, s, i, lay, r, inv: tuple(_fresh(b, (q, k), c, s, i, lay, r, inv)),
                rope_: lambda x, c, s, i, lay, r, inv: _inplace(b, (x,), c, s, i, lay, r, inv, ("x",)),
                rope_qk_: lambda q, k, c, s, i, lay, r, inv: _inplace(b, (q, k), c, s, i, lay, r, inv, ("q", "k")),
                rope_out: lambda x, c, s, i, lay, r, inv, o: _into(b, (x,), (o,), c, s, i, lay, r, inv, ("x",),
                                                                  ("out",)),
                rope_qk_out: lambda q, k, c, s, i, lay, r, inv, qo, ko: _into(b, (q, k), (qo, ko), c, s, i, lay, r,
                                                                             inv, ("q", "k"), ("out[0]", "out[1]")),
            }
        for op, fn in kernels().items():
            op.register_kernel(device)(fn)


_register_devices()


@rope.register_fake
def _(x, cos, sin, index, layout, rotary_dim, inverse):
    return torch.empty_like(x)


@rope_qk.register_fake
def _(q, k, cos, sin, index, layout, rotary_dim, inverse):
    return torch.empty_like(q), torch.empty_like(k)


for _op in (rope_, rope_qk_, rope_out, rope_qk_out):
    _op.register_fake(lambda *args: None)


def _save_table(ctx, inputs, n: int) -> None:
    cos, sin, index, layout, rotary_dim, inverse = inputs[n:]
    ctx.save_for_backward(cos, sin, index)
    ctx.spec = (layout, rotary_dim, inverse)


def _grad_operand(g: Tensor | None, shape, like: Tensor) -> Tensor:
    """A gradient the kernels can read: dense in the head dim, not a negated view; zeros for an unused output."""
    if g is None:
        return like.new_zeros(shape)
    return g if g.stride(-1) == 1 and not g.is_neg() else g.resolve_neg().contiguous()


def _rope_backward(ctx, grad):
    cos, sin, index = ctx.saved_tensors
    layout, rotary_dim, inverse = ctx.spec
    dx = rope(_grad_operand(grad, None, grad), cos, sin, index, layout, rotary_dim, not inverse)
    return dx, None, None, None, None, None, None


def _rope_qk_backward(ctx, grad_q, grad_k):
    cos, sin, index = ctx.saved_tensors
    layout, rotary_dim, inverse = ctx.spec
    given = grad_q if grad_q is not None else grad_k
    dq, dk = rope_qk(_grad_operand(grad_q, ctx.shapes[0], given), _grad_operand(grad_k, ctx.shapes[1], given),
                     cos, sin, index, layout, rotary_dim, not inverse)
    return dq, dk, None, None, None, None, None, None


def _setup_rope_qk(ctx, inputs, output):
    _save_table(ctx, inputs, 2)
    ctx.shapes = (inputs[0].shape, inputs[1].shape)


rope.register_autograd(_rope_backward, setup_context=lambda ctx, inputs, output: _save_table(ctx, inputs, 1))
rope_qk.register_autograd(_rope_qk_backward, setup_context=_setup_rope_qk)


# --------------------------------------------------------------------------------------------------- routes

def rope_traced(xs, cos, sin, *, layout: str, rotary_dim: int, inplace: bool = False, out=None,
                index: Optional[Tensor] = None, names=None) -> tuple[Tensor, ...]:
    """posenc.kernels.rope_dispatch.rope under a trace: the same rules, through the custom ops.

    xs: (x,) or (q, k); cos, sin: a table (or cos an ``Angles`` and sin None: its table is built in the graph).
    Autograd: fresh outputs are differentiable; in place on tensors that require grad rotates out of place and
    ``copy_``s back (torch records the write, as in eager); out= refuses tensors that require grad."""
    if isinstance(cos, Angles):
        cos, sin = cos.table(torch.float64 if xs[0].dtype == torch.float64 else torch.float32)
    if len(xs) > 2:     # (the public calls rotate one tensor or two; the dispatcher takes more: one at a time)
        return tuple(rope_traced((x,), cos, sin, layout=layout, rotary_dim=rotary_dim, inplace=inplace,
                                 out=None if out is None else (out[i],), index=index)[0] for i, x in enumerate(xs))
    grad_mode = torch.is_grad_enabled()
    if grad_mode and (cos.requires_grad or sin.requires_grad):
        raise PosencError("posenc's RoPE ops take cos/sin as constants; differentiable frequencies go through "
                          "posenc.apply_rope with inv_freq (its eager formula)")
    needs_grad = grad_mode and any(x.requires_grad for x in xs)
    names = tuple(names or (("x",) if len(xs) == 1 else ("q", "k")))
    if not inplace and out is None:
        return (rope(xs[0], cos, sin, index, layout, rotary_dim, False),) if len(xs) == 1 else \
            rope_qk(xs[0], xs[1], cos, sin, index, layout, rotary_dim, False)
    if inplace:
        if needs_grad:
            for x, name in zip(xs, names):
                if x.requires_grad and x.is_leaf:
                    raise rope_checks.RopeAliasError(
                        f"a leaf Variable that requires grad ({name}) is being used in an in-place operation: call "
                        "without inplace=True, or under torch.no_grad()")
            rotated = rope_traced(xs, cos, sin, layout=layout, rotary_dim=rotary_dim, index=index)
            for x, r in zip(xs, rotated):
                x.copy_(r)
        elif len(xs) == 1:
            rope_(xs[0], cos, sin, index, layout, rotary_dim, False)
        else:
            rope_qk_(xs[0], xs[1], cos, sin, index, layout, rotary_dim, False)
        return tuple(xs)
    if grad_mode and (needs_grad or any(o.requires_grad for o in out)):
        raise rope_checks.RopeAliasError("out= does not support automatic differentiation, but one of the "
                                         "arguments requires grad (as for torch's out= ops): call without out=, or "
                                         "under torch.no_grad()")
    if len(xs) == 1:
        rope_out(xs[0], cos, sin, index, layout, rotary_dim, False, out[0])
    else:
        rope_qk_out(xs[0], xs[1], cos, sin, index, layout, rotary_dim, False, out[0], out[1])
    return tuple(out)


def apply_traced(xs, positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out, names):
    """``posenc.apply_rope`` / ``apply_rope_qk`` under a trace: cos/sin of the positions computed in the graph
    (float64 angles, rounded once to the math dtype, as posenc's tables are), then the ops. Arguments as there."""
    from posenc._validate import check_bool, check_float, even_int
    from posenc.rope import apply as A

    x = xs[0]
    A._check_layout(layout)
    check_bool(inplace, "inplace")
    p = positions if isinstance(positions, Tensor) else torch.as_tensor(positions)
    p = A.check_position_dtype(p).to(x.device)
    if p.dim() == 0:
        p = p.reshape(1)
    for t in xs:
        A._check_broadcast(p.shape, t, "positions")
    outs = None if out is None else A._check_out(out, xs, inplace, "out")
    dim = x.shape[-1]
    dtype = A.math_dtype(x.dtype)
    scaling = check_float(attention_scaling, "attention_scaling", positive=True)
    if inv_freq is None:
        rdim = even_int(dim if rotary_dim is None else rotary_dim, "rotary_dim")
        inv = A.default_inv_freq(rdim, base).to(x.device)
    else:
        inv = torch.as_tensor(inv_freq, device=x.device)
        rdim = 2 * inv.shape[0] if rotary_dim is None else even_int(rotary_dim, "rotary_dim")
        if inv.dim() != 1 or inv.shape[0] != rdim // 2:
            raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rdim // 2}], got {tuple(inv.shape)}")
    A._check_rotary_dim(rdim, dim)
    if inv.requires_grad and torch.is_grad_enabled():      # learned frequencies: the readable formula
        if inplace or outs is not None:
            raise PosencError("inplace=True and out= cannot be used while autograd tracks the frequencies "
                              "(inv_freq requires grad); call without them or under torch.no_grad()")
        angle = p.to(torch.float64).unsqueeze(-1) * inv.to(torch.float64)
        cos, sin = (angle.cos() * scaling).to(dtype), (angle.sin() * scaling).to(dtype)
        return tuple(A._rotate(t, cos, sin, layout, rdim) for t in xs)
    cos, sin = angles_cos_sin(p, inv.to(torch.float64), scaling, dtype)
    return rope_traced(xs, cos, sin, layout=layout, rotary_dim=rdim, inplace=inplace, out=outs, names=names)


def rotary_traced(module, q: Tensor, k: Tensor, positions) -> tuple[Tensor, Tensor] | None:
    """``Rotary.forward`` under a trace, or None where the eager route must run (length rules, multi-axis).

    Same checks of shapes as the eager route; cos/sin of the positions from the module's frequencies, in float32
    as its table holds them (then the math dtype)."""
    if module.seq_len_rule is not None or module.n_axes != 1:
        return None
    from posenc.rope.apply import check_position_dtype, math_dtype

    qs, ks, head_dim = q.shape, k.shape, module.config.head_dim
    if not (q.is_floating_point() and k.is_floating_point()) or q.dtype != k.dtype:
        raise PosencError(f"q and k must be floating-point tensors of one dtype, got {q.dtype} and {k.dtype}")
    if len(qs) != 4 or len(ks) != 4 or qs[3] != head_dim or ks[3] != head_dim or qs[0] != ks[0] or qs[2] != ks[2]:
        raise PosencError(f"q and k must be [batch, heads, seq, head_dim={head_dim}] with one batch and seq; got "
                          f"q {list(qs)}, k {list(ks)}")
    p = positions if isinstance(positions, Tensor) else torch.as_tensor(positions)
    p = check_position_dtype(p).to(q.device)
    batch, seq = qs[0], qs[2]
    if not (p.shape == (seq,) or p.shape == (batch, seq) or p.shape == (1, seq)):
        raise PosencError(f"positions must have shape [seq] = [{seq}] or [batch, seq] = [{batch}, {seq}], "
                          f"got {list(p.shape)}")
    inv64 = module.inv_freq.detach().to(torch.float64)
    cos, sin = angles_cos_sin(p, inv64, module.attention_scaling, torch.float32)
    if cos.dim() == 3:   # [B, T, R/2] -> [B, 1, T, R/2]: broadcast over heads
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    dtype = math_dtype(q.dtype)
    return rope_traced((q, k), cos.to(dtype), sin.to(dtype), layout=module.layout, rotary_dim=module.rotary_dim)


# --------------------------------------------------------------------------------------------------- ALiBi ops

def _alibi_eager(q, k, v, slopes, causal, q_offset, scale, block_size, backend):
    from posenc.kernels import alibi_attention as A
    if backend == "flex" or (backend == "auto" and A._auto_backend(q) == "flex"):
        try:
            return A._flex(q, k, v, slopes, causal, q_offset, scale)
        except Exception as err:  # noqa: BLE001 - as alibi_attention: auto falls back whatever broke
            if backend == "flex":
                raise
            A._warn_fallback(err)
    return A._chunked(q, k, v, slopes, causal, q_offset, scale, block_size)


@torch.library.custom_op("posenc::alibi_attention", mutates_args=())
def alibi_attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, causal: bool, q_offset: int,
                    scale: Optional[float], block_size: Optional[int], backend: str) -> Tensor:
    """posenc.alibi_attention on checked arguments: [B, H, Tq, Dv], contiguous."""
    return _alibi_eager(q, k, v, slopes, causal, q_offset, scale, block_size, backend).contiguous()


_recompute_pool: list = []


def _in_fresh_thread(fn):
    """fn() on a worker thread, whose thread-local state is torch's default: the dispatcher runs an op's
    implementation below the autograd keys, so autograd cannot record inside it on this thread."""
    if not _recompute_pool:
        import concurrent.futures
        _recompute_pool.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="posenc-alibi-bwd"))
    return _recompute_pool[0].submit(fn).result()


@torch.library.custom_op("posenc::alibi_attention_backward", mutates_args=())
def alibi_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, causal: bool,
                             q_offset: int, scale: Optional[float], block_size: Optional[int], backend: str,
                             needs: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``alibi_attention`` for q, k, v and slopes (zeros where ``needs`` is False): the forward
    recomputed under autograd (SDPA's own backward), so no activations are kept between the passes."""
    leaves = [t.detach().requires_grad_(bool(n)) for t, n in zip((q, k, v, slopes), needs)]
    wanted = [t for t in leaves if t.requires_grad]

    def recompute():
        with torch.enable_grad():
            out = _alibi_eager(*leaves, causal, q_offset, scale, block_size, backend)
            return torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ()
    got = iter(_in_fresh_thread(recompute))
    grads = []
    for t in leaves:
        g = next(got) if t.requires_grad else None
        grads.append(torch.zeros_like(t, memory_format=torch.contiguous_format) if g is None else g.contiguous())
    return tuple(grads)


@alibi_attention.register_fake
def _(q, k, v, slopes, causal, q_offset, scale, block_size, backend):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3])


@alibi_attention_backward.register_fake
def _(grad, q, k, v, slopes, causal, q_offset, scale, block_size, backend, needs):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, slopes))


for _device in ("cpu", "cuda"):    # the chunked SDPA schedule on the CPU; FlexAttention (or chunked) on CUDA
    alibi_attention.register_kernel(_device)(
        lambda q, k, v, s, c, o, sc, b, be: _alibi_eager(q, k, v, s, c, o, sc, b, be).contiguous())


def _setup_alibi(ctx, inputs, output):
    q, k, v, slopes, causal, q_offset, scale, block_size, backend = inputs
    ctx.save_for_backward(q, k, v, slopes)
    ctx.spec = (causal, q_offset, scale, block_size, backend)


def _alibi_backward(ctx, grad):
    q, k, v, slopes = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    dq, dk, dv, ds = alibi_attention_backward(grad.contiguous(), q, k, v, slopes, *ctx.spec, needs)
    return (*(g if n else None for g, n in zip((dq, dk, dv, ds), needs)), None, None, None, None, None)


alibi_attention.register_autograd(_alibi_backward, setup_context=_setup_alibi)
