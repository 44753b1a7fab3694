"""Kernel dispatch for RoPE: picks the fastest exact path for the device and applies torch's rules to every write.

    CUDA tensor + triton importable  -> posenc.kernels.triton_rope (q and k in one launch)
    CPU tensor                       -> posenc.kernels.cpu_rope (C kernel, q and k in one call; or its eager fallback)
    anything else (mps, ...)         -> cpu_rope's eager fallback (plain torch ops, device-agnostic)

The rules, identical whichever backend runs (a kernel writing through raw pointers must restate them):
- gradients flow through one autograd.Function whose backward is the inverse rotation, itself that same Function
  with the angle negated, so double backward (``create_graph=True``, ``gradgradcheck``) works;
- ``inplace=True`` on tensors that require grad rotates out of place and then ``copy_``s back, so torch itself
  records the in-place write (views, version counters, its refusal of leaves); a leaf that requires grad is refused
  before anything is written;
- ``out=`` while autograd is recording and any argument requires grad is refused, as torch's ``out=`` ops do;
- every tensor written in place or through ``out=`` gets its version counter bumped, so a backward that saved it
  raises instead of silently using rotated values;
- overlapping memory (expanded outputs, out= overlapping an input, q and k sharing memory in place) is refused by
  posenc.kernels.rope_checks.

cos/sin are constants here (never differentiated): posenc.rope.apply routes differentiable frequencies to its
readable eager formula instead. In place of a cos/sin table, ``cos`` may be a posenc.angles.Angles
(positions and frequencies, ``sin`` None): the Triton kernel computes cos/sin itself from a float64 angle (no table,
one launch); the other backends build the table first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc.kernels import ops as _ops
from posenc.kernels import rope_backends
from posenc.kernels.rope_checks import RopeAliasError, check_writes
from posenc.angles import Angles


# the backends live in posenc.kernels.rope_backends (the custom ops of posenc.kernels.ops run them too)
Backend = rope_backends.Backend
backend_for = rope_backends.backend_for
_cpu_backend = rope_backends.cpu_backend
_eager_backend = rope_backends.eager_backend
_triton_backend = rope_backends.triton_backend


class _Rope(torch.autograd.Function):
    """outs = RoPE(xs) (or RoPE^-1 when inverse); d xs = RoPE^-1(d outs) through this same Function, so the
    backward is differentiable too (a rotation's inverse is its transpose)."""

    @staticmethod
    def forward(ctx, spec, cos, sin, index, *xs):
        layout, rotary_dim, inverse, backend = spec
        outs = [torch.empty_like(x) for x in xs]
        backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse)
        if isinstance(cos, Angles):   # tensors through save_for_backward: an in-place change is caught
            ctx.save_for_backward(cos.positions, cos.inv_freq, cos.packed, index)
            ctx.scaling = cos.scaling
        else:
            ctx.save_for_backward(cos, sin, index)
            ctx.scaling = None
        ctx.spec = spec
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.scaling is None:
            cos, sin, index = ctx.saved_tensors
        else:
            positions, inv_freq, packed, index = ctx.saved_tensors
            cos, sin = Angles(positions, inv_freq, ctx.scaling, packed), None
        layout, rotary_dim, inverse, backend = ctx.spec
        grads = [g if g.stride(-1) == 1 and not g.is_neg() else g.resolve_neg().contiguous() for g in grads]
        outs = _Rope.apply((layout, rotary_dim, not inverse, backend), cos, sin, index, *grads)
        return (None, None, None, None, *outs)


def _check_write_rules(xs, writes, inplace, out, names, out_names, grad_mode, needs_grad) -> None:
    """torch's rules for an in-place or out= write, before anything is written (see the module docstring)."""
    check_writes(xs, writes, names, names if inplace else (out_names or _names(len(xs), "out", "out")))
    if out is not None and grad_mode and (needs_grad or any(o.requires_grad for o in out)):
        raise RopeAliasError("out= does not support automatic differentiation, but one of the arguments requires "
                             "grad (as for torch's out= ops): call without out=, or under torch.no_grad()")
    if inplace and needs_grad:
        for x, name in zip(xs, names):
            if x.requires_grad and x.is_leaf:
                raise RopeAliasError(f"a leaf Variable that requires grad ({name}) is being used in an in-place "
                                     "operation: call without inplace=True, or under torch.no_grad()")


def _negated(xs, cos, sin, index, out) -> bool:
    """Whether a tensor is a negated view (``is_neg()``: torch's lazy negation, e.g. the imaginary part of a
    conjugate), whose memory holds minus its values: the kernels read and write raw memory and would miss the sign."""
    for t in (*xs, *(out or ()), cos, sin, index):
        if isinstance(t, torch.Tensor) and t.is_neg():
            return True
    return False


def _rope_negated(xs, cos, sin, *, layout, rotary_dim, inplace, out, index, backend, names, out_names):
    """``rope`` when a tensor is a negated view: rotate resolved copies, then write through torch's ``copy_``,
    which knows the sign bit (the write rules are checked on the tensors as given, first)."""
    grad_mode = torch.is_grad_enabled()
    needs_grad = grad_mode and any(x.requires_grad for x in xs)
    if inplace or out is not None:
        names = names or _names(len(xs), "x", "x")
        _check_write_rules(xs, xs if inplace else out, inplace, out, names, out_names, grad_mode, needs_grad)
    resolve = [t.resolve_neg() if isinstance(t, torch.Tensor) else t for t in (cos, sin, index)]
    rotated = rope([x.resolve_neg() for x in xs], *resolve[:2], layout=layout, rotary_dim=rotary_dim,
                   index=resolve[2], backend=backend)
    if not inplace and out is None:
        return rotated
    writes = xs if inplace else out
    for w, r in zip(writes, rotated):
        w.copy_(r)        # (in place with autograd: torch records the write, as on the ordinary path)
    return tuple(writes)


def _names(n: int, prefix: str, single: str) -> tuple[str, ...]:
    return (single,) if n == 1 else tuple(f"{prefix}[{i}]" for i in range(n))


def rope(xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, *, layout: str, rotary_dim: int,
         inplace: bool = False, out: Sequence[torch.Tensor] | None = None, index: torch.Tensor | None = None,
         backend: Backend | None = None, names: Sequence[str] | None = None,
         out_names: Sequence[str] | None = None) -> tuple[torch.Tensor, ...]:
    """RoPE on each tensor of ``xs`` (e.g. (q,) or (q, k)) with one shared table, in one kernel call.

    xs[i]: [..., dim], all on one device and dtype. Without ``index``: cos, sin broadcastable to
    [..., rotary_dim // 2]. With ``index`` (int64, contiguous, broadcastable to the leading dims): cos, sin are a
    contiguous [rows, rotary_dim // 2] table and each vector takes row index[...]; a position outside the table
    raises TableIndexError before anything is written. The table is in the math dtype (float32; float64 for float64
    inputs). ``inplace`` overwrites xs; ``out`` gives preallocated outputs (same shapes/dtypes). ``names`` /
    ``out_names`` name the tensors in error messages. Returns the rotated tensors. Shapes and dtypes are assumed
    validated (posenc.rope.apply); the memory and autograd rules (module docstring) are checked here.
    Under torch.compile / torch.export the same call goes through posenc's custom ops (posenc.kernels.ops).
    """
    if backend is None and _ops.under_trace(xs[0]):
        return _ops.rope_traced(xs, cos, sin, layout=layout, rotary_dim=rotary_dim, inplace=inplace, out=out,
                                index=index, names=names)
    backend = backend or backend_for(xs[0])
    if _negated(xs, cos, sin, index, out):
        return _rope_negated(xs, cos, sin, layout=layout, rotary_dim=rotary_dim, inplace=inplace, out=out,
                             index=index, backend=backend, names=names, out_names=out_names)
    grad_mode = torch.is_grad_enabled()
    needs_grad = False
    if grad_mode:
        for x in xs:
            needs_grad = needs_grad or x.requires_grad
    if not inplace and out is None:
        if needs_grad:
            return _Rope.apply((layout, rotary_dim, False, backend), cos, sin, index, *xs)
        outs = [torch.empty_like(x) for x in xs]
        backend(xs, outs, cos, sin, index, layout, rotary_dim, False)
        return tuple(outs)

    names = names or _names(len(xs), "x", "x")
    writes = xs if inplace else out
    _check_write_rules(xs, writes, inplace, out, names, out_names, grad_mode, needs_grad)
    if inplace and needs_grad:
        tracked = [x for x in xs if x.requires_grad]
        rotated = _Rope.apply((layout, rotary_dim, False, backend), cos, sin, index, *tracked)
        rest = [x for x in xs if not x.requires_grad]
        if rest:
            backend(rest, rest, cos, sin, index, layout, rotary_dim, False)
            torch.autograd.graph.increment_version(rest)
        for x, r in zip(tracked, rotated):
            x.copy_(r)      # torch records the in-place write (view bookkeeping, version counter, CopyBackwards)
        return tuple(xs)
    backend(xs, writes, cos, sin, index, layout, rotary_dim, False)
    torch.autograd.graph.increment_version(writes)
    return tuple(writes)
