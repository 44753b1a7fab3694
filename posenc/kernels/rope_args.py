"""The argument rules of RoPE's rotation, one owner for the public functions and the custom ops.

``posenc.apply_rope*`` (posenc.rope.apply) and the ops torch.compile / torch.export call (``torch.ops.posenc.rope``
and its forms, posenc.kernels.ops) refuse a bad call with the same one-line PosencError, before any kernel runs: the
C kernel and Triton read raw memory, so a table of the wrong shape or an index of the wrong shape would otherwise
read or write outside the tensors. The rules here look at shapes, dtypes, devices and names only (a trace can apply
them to fake tensors); the one value rule, table rows in range, is checked by the kernels before anything is
written, and ``index_error`` words it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc._internal.validate import even_int
from posenc._internal.errors import PosencError
from posenc.kernels.rope_checks import TableIndexError
from posenc.positions import INT_DTYPES, as_positions

LAYOUTS = ("interleaved", "half")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise PosencError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_x(x, name: str) -> None:
    """A tensor to rotate: dense, floating point, [..., seq, dim]."""
    if not isinstance(x, torch.Tensor):
        raise PosencError(f"{name} must be a tensor [..., seq, dim], got {type(x).__name__}")
    if x.dim() < 2:
        raise PosencError(f"{name} must have shape [..., seq, dim], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise PosencError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.layout != torch.strided:
        raise PosencError(f"{name} must be a dense (strided) tensor, got layout {x.layout}: call .to_dense() first")


def check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    """q and k rotated with one table: one seq length, head dim, dtype and device (head counts may differ)."""
    if q.shape[-1] != k.shape[-1] or q.shape[-2] != k.shape[-2] or q.dtype != k.dtype or q.device != k.device:
        raise PosencError(f"q and k must share seq, dim, dtype and device; got q {list(q.shape)} {q.dtype}, "
                          f"k {list(k.shape)} {k.dtype}")


def check_broadcast(shape, x: torch.Tensor, what: str) -> None:
    """``shape`` (positions or a table's leading dims) must broadcast to x.shape[:-1]: aligned from the right, each
    of its dims 1 or equal (plain Python: torch.broadcast_shapes costs more than rotating a decode step)."""
    xs = x.shape
    n = len(shape)
    ok = n < len(xs)
    i = 1
    while ok and i <= n:
        ok = shape[-i] == 1 or shape[-i] == xs[-i - 1]
        i += 1
    if ok:
        return
    raise PosencError(
        f"{what} must have shape [seq] = [{xs[-2]}] or be broadcastable to x.shape[:-1] = {list(xs[:-1])} "
        f"(e.g. [batch, 1, seq] for x [batch, heads, seq, dim]); got {list(shape)}")


def check_out(out, xs: Sequence[torch.Tensor], inplace: bool, name: str) -> list[torch.Tensor] | None:
    """Validate ``out`` (one tensor per rotated input) against the inputs; return it as a list or None."""
    if out is None:
        return None
    if inplace:
        raise PosencError("give either inplace=True or out=, not both")
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    ok = outs is not None and len(outs) == len(xs)
    for o in outs or ():
        ok = ok and isinstance(o, torch.Tensor)
    if not ok:
        raise PosencError(f"{name} must be {'a tensor' if len(xs) == 1 else f'a tuple of {len(xs)} tensors'} "
                          f"like the input(s), got {type(out).__name__}")
    for o, x in zip(outs, xs):
        if o.layout != torch.strided:
            raise PosencError(f"{name} must be dense (strided) tensors, got layout {o.layout}")
        if o.shape != x.shape or o.dtype != x.dtype or (o.is_cpu != x.is_cpu or not o.is_cpu and
                                                          o.device != x.device):
            raise PosencError(f"{name} must match the input's shape, dtype and device {list(x.shape)} {x.dtype} "
                              f"{x.device}; got {list(o.shape)} {o.dtype} {o.device}")
    return outs


def check_rotary_dim(rotary_dim, dim: int) -> int:
    if type(rotary_dim) is not int or rotary_dim <= 0 or rotary_dim % 2:     # (the fast test first: hot path)
        even_int(rotary_dim, "rotary_dim")
    if rotary_dim > dim:
        raise PosencError(f"rotary_dim must be <= the head dim {dim}, got {rotary_dim}")
    return rotary_dim


def _check_cos_sin(x: torch.Tensor, cos, sin) -> None:
    """cos and sin: tensors of one shape, in x's math dtype, on x's device."""
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor):
        raise PosencError(f"cos and sin must be tensors [..., seq, rotary_dim // 2], got {type(cos).__name__} and "
                          f"{type(sin).__name__}")
    if cos.shape != sin.shape:
        raise PosencError(f"cos and sin must have one shape, got {list(cos.shape)} and {list(sin.shape)}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if cos.dtype != dtype or sin.dtype != dtype:
        raise PosencError(f"cos/sin must be {dtype} for x of dtype {x.dtype}, got {cos.dtype} and {sin.dtype}")
    if cos.device != x.device or sin.device != x.device:
        raise PosencError(f"cos/sin must be on x's device {x.device}, got {cos.device} and {sin.device}")


def check_table(xs: Sequence[torch.Tensor], cos, sin, index, rotary_dim):
    """A cos/sin table (and ``index`` into it) for rotating each of xs (checked tensors of one dtype and device).

    Without index: cos, sin [..., rotary_dim // 2] whose leading dims broadcast to each x.shape[:-1]; with index
    (integers broadcastable to each x.shape[:-1]): cos, sin a table [rows, rotary_dim // 2]. rotary_dim None means
    2 * cos.shape[-1]. Returns (rotary_dim, cos, sin, index) as the kernels take them: index int64 and contiguous,
    and then the table contiguous too."""
    x = xs[0]
    _check_cos_sin(x, cos, sin)
    cshape = cos.shape
    half = cshape[-1] if cshape else 0
    if rotary_dim is not None and rotary_dim != 2 * half:
        check_rotary_dim(rotary_dim, x.shape[-1])
        raise PosencError(f"cos/sin last dim must be rotary_dim // 2 = {rotary_dim // 2}, got {half}")
    rdim = 2 * half
    if not 0 < rdim <= x.shape[-1]:
        raise PosencError(f"cos/sin last dim must be rotary_dim // 2 with 0 < rotary_dim <= the head dim "
                          f"{x.shape[-1]}, got {half}")
    if index is None:
        for t in xs:
            check_broadcast(cshape[:-1], t, "cos/sin leading dims")
        return rdim, cos, sin, None
    if len(cshape) != 2:
        raise PosencError(f"with index=, cos and sin must be tables [rows, rotary_dim // 2], got {list(cshape)}")
    idx = as_positions(index, x.device, "index")
    if idx.dtype not in INT_DTYPES:
        raise PosencError(f"index must hold integer row numbers of the table, got dtype {idx.dtype}")
    if idx.dim() == 0:
        idx = idx.reshape(1)
    for t in xs:
        check_broadcast(idx.shape, t, "index")
    if idx.dtype != torch.int64 or not idx.is_contiguous():
        idx = idx.to(torch.int64).contiguous()
    if not (cos.is_contiguous() and sin.is_contiguous()):
        cos, sin = cos.contiguous(), sin.contiguous()
    return rdim, cos, sin, idx


def index_error(rows: int) -> TableIndexError:
    """The error for an index outside a table of ``rows`` rows (the kernels detect it before writing)."""
    return TableIndexError(f"index must hold row numbers in [0, {rows}) of the cos/sin table, got values outside it")
