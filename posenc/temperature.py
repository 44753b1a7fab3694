"""Llama 4's attention temperature for NoPE layers (the formula's one owner, below posenc.rope and posenc.irope,
which both read it):

    tau(n) = 1 + attn_scale * log1p(floor((n + 1) / floor_scale))     n = the query's absolute position

(transformers ``models/llama4``; arXiv 2501.19399). tau is 1 below floor_scale - 1.
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_float
from posenc._internal.errors import PosencError
from posenc.positions import as_positions


def attention_temperature(positions, *, floor_scale: float = 8192, attn_scale: float = 0.1) -> torch.Tensor:
    """tau(n) = 1 + attn_scale * log1p(floor((n + 1) / floor_scale)), float32 with positions' shape.

    Float32 arithmetic in transformers' order (positions are exact in float32 up to 2^24 = 16.7M), so the
    values equal Llama 4's bit for bit.
    """
    floor_scale = check_float(floor_scale, "floor_scale", positive=True)
    attn_scale = check_float(attn_scale, "attn_scale", min=0.0)  # below 0 the temperature falls through 0
    positions = as_positions(positions)
    if positions.numel() and positions.device.type != "meta" and bool((positions < 0).any()):
        # log1p(floor((n + 1) / floor_scale)) is NaN or -inf below -1: absolute positions start at 0
        raise PosencError(f"positions must be >= 0 (absolute positions), got {positions.min().item()}")
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
