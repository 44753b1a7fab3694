"""Positions as tensors: the one check every position-taking function runs (integers or float32/64, finite), below
every encoding (absolute, bias, rope, temperature) so that none of them imports another to get it."""

from __future__ import annotations

import torch

from posenc._internal.errors import PosencError

INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
FLOAT_POSITIONS = frozenset({torch.float32, torch.float64})
_WIDE_UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})   # converted to int64 (few ops take them)


def check_position_dtype(positions: torch.Tensor, name: str = "positions") -> torch.Tensor:
    """Reject position dtypes that cannot hold positions exactly (bf16 rounds 257 to 256; fp16 stops at 65504).

    uint16 / uint32 / uint64 positions (which most torch ops do not implement) come back as int64; a uint64 value
    past int64's range is refused rather than wrapped to a negative position.
    """
    if positions.is_complex() or positions.dtype == torch.bool:
        raise PosencError(f"{name} must be integers or real numbers, got dtype {positions.dtype}")
    if positions.dtype in (torch.float16, torch.bfloat16):
        raise PosencError(f"{name} must be integers, float32 or float64, got {positions.dtype}: half precision "
                          "cannot represent positions exactly (bf16 rounds 257 to 256)")
    if positions.dtype in _WIDE_UNSIGNED:
        wide = positions.dtype == torch.uint64
        positions = positions.to(torch.int64)
        if wide and positions.device.type != "meta" and bool((positions < 0).any()):
            raise PosencError(f"{name} must fit in int64, got a uint64 value of 2**63 or more")
    return positions


def as_positions(positions, device=None, name: str = "positions") -> torch.Tensor:
    """positions as a tensor on ``device`` (None: where it is); a PosencError for non-numbers, half precision, NaN/inf.

    Integer positions cost no scan; float positions are checked to be finite (NaN/inf would rotate by NaN).
    ``name``: the argument the messages name."""
    if isinstance(positions, torch.Tensor):
        p = positions
    else:
        if isinstance(positions, (str, bytes)):
            raise PosencError(f"{name} must be integers (a tensor, an int or a sequence of ints), "
                              f"got the string {positions!r}")
        try:
            p = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise PosencError(f"{name} must be integers (a tensor, an int or a sequence of ints), got "
                              f"{type(positions).__name__} {str(positions)[:60]!r} ({exc})") from None
    if p.is_neg():          # a negated view: kernels read raw memory, which holds minus its values
        p = p.resolve_neg()
    if p.dtype not in INT_DTYPES:
        p = check_position_dtype(p, name)
        if p.dtype in FLOAT_POSITIONS and p.device.type != "meta" and not bool(torch.isfinite(p).all()):
            raise PosencError(f"{name} must be finite numbers, got NaN or inf")
    if device is not None and p.device != device:
        if p.device.type == "meta":
            raise PosencError(f"{name} are on the meta device (shapes only, no values); expected them on {device}")
        p = p.to(device)
    return p
