"""The strided bias view shared by ALiBi's CPU schedules (``alibi_attention``) and bands (``alibi_band``)."""

from __future__ import annotations

import torch


def hankel_view(template: torch.Tensor, first: int, rows: int, cols: int) -> torch.Tensor:
    """View [1, H, rows, cols] of ``template`` [H, L] with entry (r, c) = template[:, first + r + c]. No copy."""
    H, L = template.shape
    return template.as_strided((1, H, rows, cols), (0, L, 1, 1), template.storage_offset() + first)
