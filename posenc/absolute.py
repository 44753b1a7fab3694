"""Absolute position encodings: sinusoidal (fixed), learned (a table), and NoPE (none at all).

Each module takes token embeddings x of shape [batch, seq, dim] and returns the same shape.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._internal.validate import check_base, positive_int
from posenc._internal.errors import PosencError
from posenc.positions import as_positions


def sinusoidal_at(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Sinusoidal encodings at arbitrary (integer or fractional) positions.

    Args:
        positions: [...] positions; converted to float64 so large positions keep their exact value.
        dim: even model dimension.
    Returns:
        float32 tensor [..., dim] with [..., 2i] = sin(pos / base^(2i/dim)) and [..., 2i+1] = cos(same).
    """
    positive_int(dim, "dim")
    if dim % 2:
        raise PosencError(f"dim must be even for sinusoidal encodings (sin/cos pairs), got {dim}")
    base = check_base(base, "base")  # <= 1 warns: the wavelengths base^(2i/dim) then stop growing with i
    positions = as_positions(positions)                 # integers or float32/64 only: bf16 would round 257 to 256
    pos = positions.to(torch.float64).unsqueeze(-1)                         # [..., 1]
    i = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
    angle = pos / base ** (i / dim)                                          # [..., dim/2]
    # interleave: column 2i <- sin, column 2i+1 <- cos
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2).to(torch.float32)


def sinusoidal(n_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The lesson's table PE of shape [n_positions, dim] (float32), computed in float64.

    PE[pos, 2i] = sin(pos / base^(2i/dim)), PE[pos, 2i+1] = cos(pos / base^(2i/dim)). ``dim`` must be even.
    """
    positive_int(n_positions, "n_positions")
    return sinusoidal_at(torch.arange(n_positions), dim, base)


def _positions_for(x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    if x.dim() < 2:
        raise PosencError(f"x must have shape [..., seq, dim], got {tuple(x.shape)}")
    seq = x.shape[-2]
    if positions is None:
        return torch.arange(seq, device=x.device)
    positions = as_positions(positions, x.device)
    if positions.shape[-1:] != (seq,):
        raise PosencError(f"positions must have shape [seq] or [batch, seq] with seq={seq}, "
                          f"got {tuple(positions.shape)}")
    return positions


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to embeddings: x [batch, seq, dim] -> x + PE[positions].

    The table is a formula, so any position works (no max_len); extrapolation is still poor because the model
    never saw those phases in training. ``positions`` ([seq] or [batch, seq]) defaults to 0..seq-1.
    """

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        positive_int(dim, "dim")
        if dim % 2:
            raise PosencError(f"dim must be even for sinusoidal encodings, got {dim}")
        self.dim, self.base = dim, check_base(base, "base")

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise PosencError(f"x's last dimension must be dim={self.dim}, got {x.shape[-1]}")
        pe = sinusoidal_at(_positions_for(x, positions), self.dim, self.base)
        return x + pe.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


class LearnedPositionalEmbedding(nn.Module):
    """A trained table of ``max_len`` position vectors (GPT-2 style): x [batch, seq, dim] -> x + table[positions].

    Positions at or past ``max_len`` have no row, and fractional positions none either: both raise instead of
    silently wrapping, clamping or truncating.
    """

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02):
        super().__init__()
        self.max_len = positive_int(max_len, "max_len")
        self.dim = positive_int(dim, "dim")
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise PosencError(f"x's last dimension must be dim={self.dim}, got {x.shape[-1]}")
        positions = _positions_for(x, positions)
        if positions.is_floating_point() and positions.numel():
            bad = ~torch.isfinite(positions) | (positions != positions.round())
            if bool(bad.any()):  # a table row has no fraction: 1.7 would silently become row 1
                raise PosencError(f"positions must be integers for a learned position table (one row per "
                                  f"position), got {positions[bad].flatten()[0].item()!r}")
        if positions.numel() and (int(positions.max()) >= self.max_len or int(positions.min()) < 0):
            raise PosencError(
                f"positions must lie in [0, max_len={self.max_len}) for a learned position table; got range "
                f"[{int(positions.min())}, {int(positions.max())}] — a learned table cannot extrapolate")
        return x + self.weight[positions.long()].to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"


class NoPE(nn.Module):
    """No positional encoding: causal masking alone carries order (Kazemnejad et al. 2023). Identity on x."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return x
