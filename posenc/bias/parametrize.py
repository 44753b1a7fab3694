"""Positive learned parameters: stored raw, used through softplus (smooth, strictly positive, gradient everywhere)."""

from __future__ import annotations

import torch


def inverse_softplus(y) -> torch.Tensor:
    """raw with softplus(raw) == y for y > 0: log(exp(y) - 1), computed without overflow for large y."""
    y = torch.as_tensor(y, dtype=torch.float64)
    return (y + torch.log(-torch.expm1(-y))).to(torch.float32)
