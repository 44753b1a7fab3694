"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554): RoPE whose rotated pairs are
also scaled, a query at n by zeta^(n/B) <= 1 and a key at m by zeta^(-m/B) >= 1, so that q.k decays with the
distance n - m yet stays a function of it.

For pair j of a d-dim rotary head (j = 0 .. d/2 - 1), scale base B (512) and gamma (0.4):

    zeta_j = (2j/d + gamma) / (1 + gamma)                   in (0, 1]: low-index (fast) pairs decay most
    q at position n:  rotate by n * theta_j, scale pair j by zeta_j ^ ( n / B)
    k at position m:  rotate by m * theta_j, scale pair j by zeta_j ^ (-m / B)
    => q_n . k_m = sum_j zeta_j^((n - m)/B) * (RoPE's pair-j term): a function of n - m only.

The scale multiplies RoPE's cos/sin table, so the rotation is RoPE's own kernel (``apply_rope_table``).
Numerics: the scale is exp((n / B) * log(zeta_j)) formed in float64, then stored in the table's dtype. The
factors for queries and keys separately grow like zeta_0^(-|n|/B) (e^1.25 per B positions at gamma 0.4), so
absolute positions must stay within ``xpos_max_position`` (half the activation dtype's exponent range: about
18k positions for float32 at the defaults, 2.3k for float16). Only offsets matter, so shifting query and key
positions by the same ``center`` changes nothing but the range (the torchscale code centres each sequence).
"""

from __future__ import annotations

import math

import torch

from posenc._internal.fp32 import Float32Buffers
from posenc._internal.validate import check_choice, check_float, even_int
from posenc._internal.errors import PosencError
from posenc.rope.apply import (
    LAYOUTS,
    apply_rope_table,
    as_positions,
    default_inv_freq,
    math_dtype,
    rope_cos_sin,
)


def xpos_zeta(dim: int, gamma: float = 0.4) -> torch.Tensor:
    """zeta_j = (2j/dim + gamma) / (1 + gamma) for j < dim/2, float64 [dim // 2]."""
    even_int(dim, "dim")
    gamma = check_float(gamma, "gamma", min=0.0)
    if gamma == 0.0:
        raise PosencError("gamma must be > 0 (zeta_0 = gamma / (1 + gamma) would be 0)")
    return (torch.arange(0, dim, 2, dtype=torch.float64) / dim + gamma) / (1 + gamma)


def xpos_max_position(dim: int, *, gamma: float = 0.4, scale_base: float = 512.0,
                      dtype: torch.dtype = torch.float32) -> float:
    """Largest |position - center| whose scale factors stay within half of ``dtype``'s exponent range."""
    scale_base = check_float(scale_base, "scale_base", positive=True, finite=False)
    worst = -math.log(float(xpos_zeta(dim, gamma)[0]))
    return math.inf if worst == 0 or math.isinf(scale_base) else \
        math.log(torch.finfo(dtype).max) / 2 * scale_base / worst


def xpos_scale(positions, dim: int, *, gamma: float = 0.4, scale_base: float = 512.0, key: bool = False,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """zeta_j ^ (+-position / scale_base), [*positions.shape, dim // 2] in ``dtype`` (minus sign for keys).

    ``scale_base`` = inf gives all ones (plain RoPE).
    """
    positions = as_positions(positions)
    scale_base = check_float(scale_base, "scale_base", positive=True, finite=False)
    log_zeta = xpos_zeta(dim, gamma).log().to(positions.device)
    exponent = positions.to(torch.float64).unsqueeze(-1) / scale_base * log_zeta
    return torch.exp(-exponent if key else exponent).to(dtype)


def _check_range(positions: torch.Tensor, dim: int, gamma: float, scale_base: float, dtype: torch.dtype) -> None:
    # only where it costs no device sync: positions on the CPU (the docstring states the bound for the rest)
    if positions.device.type != "cpu" or positions.numel() == 0:
        return
    limit = xpos_max_position(dim, gamma=gamma, scale_base=scale_base, dtype=dtype)
    worst = float(positions.abs().max())
    if worst > limit:
        raise PosencError(f"positions: xPos scale factors overflow {dtype} beyond |position| = {limit:.0f} "
                          f"(gamma={gamma}, scale_base={scale_base}); got {worst:.0f}. Shift query and key "
                          "positions by one common center (q.k depends only on their offset), or use a wider dtype")


def apply_xpos(x: torch.Tensor, positions, *, key: bool = False, base: float = 10000.0,
               inv_freq: torch.Tensor | None = None, gamma: float = 0.4, scale_base: float = 512.0,
               layout: str = "interleaved") -> torch.Tensor:
    """xPos on queries (``key=False``) or keys (``key=True``).

    Args:
        x: [..., seq, dim] (any float dtype; the table is float32, float64 for float64 x; output in x.dtype).
        positions: [seq] or broadcastable to x.shape[:-1] (e.g. [batch, 1, seq]); with a KV cache, the new
            tokens' absolute positions.
        base, inv_freq: RoPE's frequencies (inv_freq [rotary_dim // 2] overrides base; dims past the rotary
            dim pass through unscaled).
        gamma, scale_base: the xPos scale (``scale_base`` = inf: plain RoPE).
        layout: "interleaved" (pairs 2j, 2j+1; the paper's code) or "half" (pairs j, j + d/2).
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise PosencError(f"x must be a tensor [..., seq, dim], got {getattr(x, 'shape', type(x).__name__)}")
    positions = as_positions(positions, x.device)
    if inv_freq is None:
        inv_freq = default_inv_freq(x.shape[-1], base, device=x.device)
    inv_freq = torch.as_tensor(inv_freq, device=x.device)
    rotary_dim = 2 * inv_freq.shape[-1]
    table_dtype = math_dtype(x.dtype)
    _check_range(positions, rotary_dim, gamma, scale_base, x.dtype)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype=table_dtype)
    scale = xpos_scale(positions, rotary_dim, gamma=gamma, scale_base=scale_base, key=key, dtype=table_dtype)
    return apply_rope_table(x, cos * scale, sin * scale, layout=layout)


def apply_xpos_qk(q: torch.Tensor, k: torch.Tensor, positions, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(apply_xpos(q, positions), apply_xpos(k, positions, key=True)): q and k at the same positions."""
    return apply_xpos(q, positions, **kwargs), apply_xpos(k, positions, key=True, **kwargs)


class XPos(Float32Buffers):
    """xPos for q and k: forward(q, k, positions, key_positions=None) -> (q', k').

    q [..., Tq, head_dim], k [..., Tk, head_dim]; ``key_positions`` defaults to ``positions`` (Tq == Tk).
    Keys carry their own scale, so cached keys stay valid: rotate new keys once and cache them.
    """

    float32_buffers = ("inv_freq",)        # kept float32 through .half() / .to(dtype)

    def __init__(self, head_dim: int, *, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0,
                 layout: str = "interleaved"):
        super().__init__()
        self.head_dim = even_int(head_dim, "head_dim")
        xpos_zeta(head_dim, gamma)  # validate now
        self.gamma, self.layout = float(gamma), check_choice(layout, "layout", LAYOUTS)
        self.scale_base = check_float(scale_base, "scale_base", positive=True, finite=False)
        self.register_buffer("inv_freq", default_inv_freq(head_dim, base), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions,
                key_positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        kw = dict(inv_freq=self.inv_freq, gamma=self.gamma, scale_base=self.scale_base, layout=self.layout)
        key_positions = positions if key_positions is None else key_positions
        return apply_xpos(q, positions, **kw), apply_xpos(k, key_positions, key=True, **kw)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, gamma={self.gamma}, scale_base={self.scale_base}, layout={self.layout!r}"
