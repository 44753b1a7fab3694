"""Kernel dispatch for RoPE: picks the fastest exact path for the device and wires autograd.

    CUDA tensor + triton importable  -> posenc.kernels.triton_rope (q and k in one launch)
    CPU tensor                       -> posenc.kernels.cpu_rope (C kernel, or its chunked eager fallback)
    anything else (mps, ...)         -> cpu_rope's eager fallback (plain torch ops, device-agnostic)

Gradients flow to the rotated tensors through one autograd.Function whose backward is the inverse rotation
(the same kernel with the angle negated); cos/sin are treated as constants here — posenc.rope.apply routes
differentiable frequencies (cos/sin requiring grad) to its readable eager formula instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from posenc.errors import PosencError
from posenc.kernels import cpu_rope

# backend(xs, outs, cos, sin, layout, rotary_dim, inverse): write RoPE(xs[i]) into outs[i]
Backend = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor], torch.Tensor, torch.Tensor, str, int, bool],
                   None]


def _cpu_backend(xs, outs, cos, sin, layout, rotary_dim, inverse):
    for x, o in zip(xs, outs):
        cpu_rope.rope_into(x, cos, sin, o, layout=layout, rotary_dim=rotary_dim, inverse=inverse)


def _triton_backend(xs, outs, cos, sin, layout, rotary_dim, inverse):
    from posenc.kernels import triton_rope
    triton_rope.rope_into(xs, outs, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=inverse)


def backend_for(x: torch.Tensor) -> Backend:
    """The backend apply_rope uses for tensors on x's device."""
    if x.device.type == "cuda":
        from posenc.kernels import triton_rope
        if triton_rope.available():
            return _triton_backend
    return _cpu_backend


class _Rope(torch.autograd.Function):
    """outs = RoPE(xs) with gradient d xs = RoPE^-1(d outs) (a rotation's inverse is its transpose)."""

    @staticmethod
    def forward(ctx, cos, sin, layout, rotary_dim, backend, *xs):
        outs = [torch.empty_like(x) for x in xs]
        backend(xs, outs, cos, sin, layout, rotary_dim, False)
        ctx.save_for_backward(cos, sin)
        ctx.args = (layout, rotary_dim, backend)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        cos, sin = ctx.saved_tensors
        layout, rotary_dim, backend = ctx.args
        grads = [g if g.stride(-1) == 1 else g.contiguous() for g in grads]
        outs = [torch.empty_like(g) for g in grads]
        backend(grads, outs, cos, sin, layout, rotary_dim, True)
        return (None, None, None, None, None, *outs)


def rope(xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, *, layout: str, rotary_dim: int,
         inplace: bool = False, out: Sequence[torch.Tensor] | None = None,
         backend: Backend | None = None) -> tuple[torch.Tensor, ...]:
    """RoPE on each tensor of ``xs`` (e.g. (q,) or (q, k)) with one shared cos/sin table.

    xs[i]: [..., dim], all on one device and dtype; cos, sin: broadcastable to [..., rotary_dim // 2] in the math
    dtype (float32, float64 for float64 inputs). ``inplace`` overwrites xs; ``out`` gives preallocated outputs
    (same shapes/dtypes). Returns the rotated tensors. Arguments are assumed validated (posenc.rope.apply).
    """
    backend = backend or backend_for(xs[0])
    math = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    cos, sin = cos.to(math), sin.to(math)          # the kernels read the table in the math dtype
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in xs)
    if needs_grad:
        if inplace or out is not None:
            raise PosencError("inplace=True and out= cannot be used on tensors that require grad "
                              "(autograd needs the input); call without them or under torch.no_grad()")
        return _Rope.apply(cos, sin, layout, rotary_dim, backend, *xs)
    if inplace:
        outs = list(xs)
    elif out is not None:
        outs = list(out)
    else:
        outs = [torch.empty_like(x) for x in xs]
    backend(xs, outs, cos, sin, layout, rotary_dim, False)
    return tuple(outs)
