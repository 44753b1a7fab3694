"""posenc's RoPE kernels as torch custom ops (``torch.library``): what torch.compile and torch.export see of them.

Dynamo cannot trace the eager routes: they call the C kernel through ctypes and Triton from Python helpers that
keep plan caches, compare ``data_ptr()``s and read positions on the host. Under a trace (``under_trace``) posenc
calls these ops instead; eager calls never do (the decode fast paths stay direct: no dispatcher round trip).

    posenc::rope(x, cos, sin, index, layout, rotary_dim, inverse) -> Tensor            one tensor, fresh output
    posenc::rope_qk(q, k, cos, sin, index, ...) -> (Tensor, Tensor)                    q and k in one kernel call
    posenc::rope_(Tensor(a!) x, ...) / rope_qk_(Tensor(a!) q, Tensor(b!) k, ...)      in place
    posenc::rope_out(x, ..., Tensor(a!) out) / rope_qk_out(q, k, ..., Tensor(a!) q_out, Tensor(b!) k_out)

(ALiBi attention's op, ``posenc::alibi_attention``, is defined beside it in posenc.kernels.alibi_attention.)

cos, sin: a table in the math dtype (float32; float64 for float64 inputs), broadcastable to x.shape[:-1] + [R/2],
or with ``index`` (int64, broadcastable to x.shape[:-1]) a [rows, R/2] table whose row index[...] rotates each
vector. Each op has a fake implementation (outputs ``empty_like`` the inputs, as the kernels allocate them),
device implementations (posenc.kernels.rope_backends: on the CPU the C kernel, or its eager fallback; on CUDA the
Triton kernel; on any other device the eager fallback) and, for the functional forms, autograd: the backward is the
same op with the angle negated (a rotation's inverse is its transpose), so double backward works too. The in-place
and out= forms declare what they write in their schema (torch bumps those tensors' version counters) and apply
posenc.kernels.rope_checks' memory rules when they run.

The callers under a trace (posenc.rope.apply, posenc.Rotary, posenc.patch) compute the cos/sin of the positions in
the graph (``angles_cos_sin``: float64 angles, as the tables are built) instead of reading posenc's cached tables,
whose growth depends on the positions' values. docs/compile.md has the whole picture and its limits.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from posenc._internal.errors import PosencError
from posenc.kernels import rope_args, rope_backends, rope_checks
from posenc.angles import Angles

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
    backend = rope_backends.triton_backend if triton_rope.available() else rope_backends.eager_backend
    backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse)


_DEVICE_BACKENDS = {"cpu": rope_backends.cpu_backend, "cuda": _cuda_backend}


def _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse) -> None:
    if xs[0].numel():
        try:
            backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse)
        except rope_checks.TableIndexError as exc:
            raise rope_args.index_error(cos.shape[0]) from exc


def _checked(xs, cos, sin, index, layout: str, rotary_dim: int, names):
    """(cos, sin, index) as the kernels take them, after the public functions' argument rules
    (posenc.kernels.rope_args, in ``apply_rope_table``'s words): an op called directly (``torch.ops.posenc.rope``)
    gets the same checks, since the kernels read raw memory where a mis-shaped table or index would send them
    outside the tensors."""
    for x, name in zip(xs, names):
        rope_args.check_x(x, name)
    if len(xs) == 2:
        rope_args.check_qk(*xs)
    rope_args.check_layout(layout)
    _, cos, sin, index = rope_args.check_table(xs, cos, sin, index, rotary_dim)
    return cos, sin, index


# --------------------------------------------------------------------------------------------------- RoPE ops
# One body per form; each op registers it with the eager fallback as its default and the CPU / CUDA backends as
# its device implementations.

def _fresh(backend, xs, cos, sin, index, layout, rotary_dim, inverse):
    cos, sin, index = _checked(xs, cos, sin, index, layout, rotary_dim, ("x",) if len(xs) == 1 else ("q", "k"))
    outs = [torch.empty_like(x) for x in xs]
    _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse)
    return outs


def _inplace(backend, xs, cos, sin, index, layout, rotary_dim, inverse, names):
    cos, sin, index = _checked(xs, cos, sin, index, layout, rotary_dim, names)
    rope_checks.check_writes(xs, xs, names, names)
    _rotate_into(backend, xs, xs, cos, sin, index, layout, rotary_dim, inverse)


def _into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse, names, out_names):
    cos, sin, index = _checked(xs, cos, sin, index, layout, rotary_dim, names)
    rope_args.check_out(list(outs), xs, False, "out")
    rope_checks.check_writes(xs, outs, names, out_names)
    _rotate_into(backend, xs, outs, cos, sin, index, layout, rotary_dim, inverse)


# The functional forms (the ones compiled training and decoding call) are defined through torch.library.Library:
# a call then costs about 3 us over the kernel, against 12-35 us through torch.library.custom_op's Python wrapper
# (measured at decode size on the 2-core CPU; docs/compile.md). The mutating forms keep custom_op, which also
# installs the version-counter bump of what they write.
_LIB = torch.library.Library("posenc", "FRAGMENT")
_TABLE_ARGS = "Tensor cos, Tensor sin, Tensor? index, str layout, int rotary_dim, bool inverse"
_LIB.define(f"rope(Tensor x, {_TABLE_ARGS}) -> Tensor")
_LIB.define(f"rope_qk(Tensor q, Tensor k, {_TABLE_ARGS}) -> (Tensor, Tensor)")
rope = torch.ops.posenc.rope.default
"""posenc::rope: RoPE(x) (RoPE^-1 when ``inverse``) as a new tensor like x."""
rope_qk = torch.ops.posenc.rope_qk.default
"""posenc::rope_qk: (RoPE(q), RoPE(k)) with one table, in one kernel call."""


def _functional_kernels(backend):
    def one(x, cos, sin, index, layout, rotary_dim, inverse):
        return _fresh(backend, (x,), cos, sin, index, layout, rotary_dim, inverse)[0]

    def pair(q, k, cos, sin, index, layout, rotary_dim, inverse):
        return tuple(_fresh(backend, (q, k), cos, sin, index, layout, rotary_dim, inverse))
    return one, pair


for _key, _backend in (("CompositeExplicitAutograd", rope_backends.eager_backend),     # any other device
                       ("CPU", _DEVICE_BACKENDS["cpu"]), ("CUDA", _DEVICE_BACKENDS["cuda"])):
    _one, _pair = _functional_kernels(_backend)
    _LIB.impl("rope", _one, _key)
    _LIB.impl("rope_qk", _pair, _key)


@torch.library.custom_op("posenc::rope_", mutates_args=("x",))
def rope_(x: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
          inverse: bool) -> None:
    """x = RoPE(x), in place."""
    _inplace(rope_backends.eager_backend, (x,), cos, sin, index, layout, rotary_dim, inverse, ("x",))


@torch.library.custom_op("posenc::rope_qk_", mutates_args=("q", "k"))
def rope_qk_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
             inverse: bool) -> None:
    """q, k = RoPE(q), RoPE(k), in place (q and k must not share memory)."""
    _inplace(rope_backends.eager_backend, (q, k), cos, sin, index, layout, rotary_dim, inverse, ("q", "k"))


@torch.library.custom_op("posenc::rope_out", mutates_args=("out",))
def rope_out(x: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str, rotary_dim: int,
             inverse: bool, out: Tensor) -> None:
    """out = RoPE(x) (out like x, not overlapping it)."""
    _into(rope_backends.eager_backend, (x,), (out,), cos, sin, index, layout, rotary_dim, inverse, ("x",),
          ("out",))


@torch.library.custom_op("posenc::rope_qk_out", mutates_args=("q_out", "k_out"))
def rope_qk_out(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, index: Optional[Tensor], layout: str,
                rotary_dim: int, inverse: bool, q_out: Tensor, k_out: Tensor) -> None:
    """q_out, k_out = RoPE(q), RoPE(k)."""
    _into(rope_backends.eager_backend, (q, k), (q_out, k_out), cos, sin, index, layout, rotary_dim, inverse,
          ("q", "k"), ("out[0]", "out[1]"))


def _register_devices() -> None:
    for device, backend in _DEVICE_BACKENDS.items():
        def kernels(b=backend):
            return {
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


# The fake implementations apply the same argument checks (shapes, dtypes, devices: what fake tensors have), so a
# trace of a bad direct call fails there, in the same words.

@torch.library.register_fake("posenc::rope", lib=_LIB)
def _(x, cos, sin, index, layout, rotary_dim, inverse):
    _checked((x,), cos, sin, index, layout, rotary_dim, ("x",))
    return torch.empty_like(x)


@torch.library.register_fake("posenc::rope_qk", lib=_LIB)
def _(q, k, cos, sin, index, layout, rotary_dim, inverse):
    _checked((q, k), cos, sin, index, layout, rotary_dim, ("q", "k"))
    return torch.empty_like(q), torch.empty_like(k)


@rope_.register_fake
def _(x, cos, sin, index, layout, rotary_dim, inverse):
    _checked((x,), cos, sin, index, layout, rotary_dim, ("x",))


@rope_qk_.register_fake
def _(q, k, cos, sin, index, layout, rotary_dim, inverse):
    _checked((q, k), cos, sin, index, layout, rotary_dim, ("q", "k"))


@rope_out.register_fake
def _(x, cos, sin, index, layout, rotary_dim, inverse, out):
    _checked((x,), cos, sin, index, layout, rotary_dim, ("x",))
    rope_args.check_out([out], (x,), False, "out")


@rope_qk_out.register_fake
def _(q, k, cos, sin, index, layout, rotary_dim, inverse, q_out, k_out):
    _checked((q, k), cos, sin, index, layout, rotary_dim, ("q", "k"))
    rope_args.check_out([q_out, k_out], (q, k), False, "out")


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


torch.library.register_autograd("posenc::rope", _rope_backward,
                                setup_context=lambda ctx, inputs, output: _save_table(ctx, inputs, 1), lib=_LIB)
torch.library.register_autograd("posenc::rope_qk", _rope_qk_backward, setup_context=_setup_rope_qk, lib=_LIB)


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
