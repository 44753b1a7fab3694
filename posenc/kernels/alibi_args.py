"""The arguments of ALiBi attention, checked in one place: ``posenc.alibi_attention`` and its custom ops
(``torch.ops.posenc.alibi_attention`` and its backward, posenc.kernels.alibi_attention) refuse a bad call with the
same one-line PosencError naming the argument. A direct op call with a bad shape would otherwise fail deep inside
SDPA, or not at all (a q_offset or slopes of the wrong length, NaN slopes).
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_bool, check_choice, check_float, check_int
from posenc.alibi import alibi_slopes, check_slopes
from posenc._internal.errors import PosencError

BACKENDS = ("auto", "chunked", "flex")

# Positions enter the float64 bias template: exact up to 2^53, so q_offset is bounded well inside that.
MAX_POSITION = 2**52


def checked_args(q, k, v, slopes, causal, q_offset, scale, block_size, backend, *, values: bool = True) -> tuple:
    """(slopes, causal, q_offset, scale, block_size, backend) as the schedules take them, or a PosencError naming
    the argument. ``values=False`` (the ops' fake implementations): shapes only, the slopes' values are not read."""
    check_choice(backend, "backend", BACKENDS)
    check_bool(causal, "causal")
    offset = _check_inputs(q, k, v, q_offset)
    H = q.shape[1]
    slopes = alibi_slopes(H).to(q.device) if slopes is None else \
        check_slopes(slopes, H, q.device, what="H", values=values)
    if scale is not None:
        scale = check_float(scale, "scale", positive=True)
    if block_size is not None:
        block_size = check_int(block_size, "block_size", min=1)
    return slopes, causal, offset, scale, block_size, backend


def checked_backward_args(grad, q, k, v, slopes, causal, q_offset, scale, block_size, backend, needs, *,
                          values: bool = True) -> tuple:
    """The forward's checks (``checked_args``), then grad [B, H, Tq, Dv] like the output and four ``needs``."""
    args = checked_args(q, k, v, slopes, causal, q_offset, scale, block_size, backend, values=values)
    want = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != want or grad.dtype != q.dtype \
            or grad.device != q.device:
        got = f"{tuple(grad.shape)} {grad.dtype} {grad.device}" if isinstance(grad, torch.Tensor) else \
            type(grad).__name__
        raise PosencError(f"grad must be the output's gradient {want} {q.dtype} {q.device}, got {got}")
    if len(needs) != 4:
        raise PosencError(f"needs must be 4 flags (q, k, v, slopes), got {len(needs)}")
    return args


def _check_inputs(q, k, v, q_offset) -> int:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PosencError(f"{name} must be a 4-D tensor [batch, heads, seq, head_dim], got {shape}")
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise PosencError(f"k must have shape [B={B}, Hkv, Tk, D={D}] to match q {tuple(q.shape)}, "
                          f"got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise PosencError(f"v must have shape [B, Hkv, Tk, Dv] = {tuple(k.shape[:3])} + [Dv] like k, "
                          f"got {tuple(v.shape)}")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise PosencError(f"q's head count ({H}) must be a multiple of k's ({k.shape[1]}) for grouped-query "
                          f"attention")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise PosencError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise PosencError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    Tk = k.shape[2]
    if Tq == 0 or Tk == 0:
        raise PosencError(f"q and k need at least one position, got Tq={Tq}, Tk={Tk}")
    if q_offset is None:
        if Tq > Tk:
            raise PosencError(f"q has more positions ({Tq}) than k ({Tk}): pass q_offset to place the queries "
                              f"(queries default to the last Tq of the Tk key positions)")
        return Tk - Tq
    if isinstance(q_offset, torch.SymInt):      # a trace with dynamic shapes: Tk - Tq, no value to check
        return q_offset
    return check_int(q_offset, "q_offset", min=0, max=MAX_POSITION)
