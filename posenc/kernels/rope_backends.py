"""RoPE's kernel backends: one signature for the C kernel, the eager fallback and Triton, and the choice per device.

    backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse): write RoPE(xs[i]) (RoPE^-1 when inverse) into
    outs[i]; outs[i] may be xs[i] (in place). cos, sin: a table in the math dtype broadcastable to [..., R/2], or
    with index (int64) a [rows, R/2] table read at row index[...]; or cos an Angles and sin None.

No checks here: posenc.kernels.rope_dispatch (eager) and posenc.kernels.ops (the custom ops) apply torch's rules
around these calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from posenc.kernels import cpu_rope
from posenc.angles import Angles


def as_table(cos, sin, xs):
    """(cos, sin) as tables in the math dtype of xs: an Angles is built into one, a table passes through."""
    if isinstance(cos, Angles):
        return cos.table(torch.float64 if xs[0].dtype == torch.float64 else torch.float32)
    return cos, sin


# backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse): write RoPE(xs[i]) into outs[i]
Backend = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor], torch.Tensor, torch.Tensor,
                    torch.Tensor | None, str, int, bool], None]


def cpu_backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
    cos, sin = as_table(cos, sin, xs)
    if len(xs) > 2 or not cpu_rope.native_rope(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
        cpu_rope.rope_many(xs, outs, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=inverse, index=index)


def eager_backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
    cos, sin = as_table(cos, sin, xs)
    cpu_rope.rope_many(xs, outs, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=inverse, index=index)


def triton_backend(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
    from posenc.kernels import triton_rope
    if index is not None:
        cos, sin = cpu_rope.gather_table(*as_table(cos, sin, xs), index)
    triton_rope.rope_into(xs, outs, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=inverse)


def backend_for(x: torch.Tensor) -> Backend:
    """The backend apply_rope uses for tensors on x's device. Under torch.jit.trace, the eager one: the tracer
    records torch ops only, so a kernel's writes would be missing from the trace (its outputs left unwritten)."""
    if torch._C._get_tracing_state():
        return eager_backend
    if x.is_cpu:
        return cpu_backend
    if x.device.type == "cuda":
        from posenc.kernels import triton_rope
        if triton_rope.available():
            return triton_backend
    return eager_backend
