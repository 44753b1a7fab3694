"""``xpos``: xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554), a thin adapter over
the ``posenc.XPos`` module (``posenc.rope.xpos``).

    q at position n: RoPE rotation, pair j scaled by zeta_j^( n / scale_base)
    k at position m: RoPE rotation, pair j scaled by zeta_j^(-m / scale_base)     zeta_j = (2j/d + gamma)/(1 + gamma)
    => q_n . k_m decays with n - m and stays a function of n - m only

Keys carry their own scale, so rotated keys are cached as they are (not length dependent). Not extendable: the
extension methods rescale plain RoPE only. Scheme options: ``xpos_gamma`` (0.4), ``xpos_scale_base`` (512, the
paper's); the pair layout is the model's ``rope_layout``. Positions must stay below ``xpos_max_position``
(about 18k in float32 at the defaults).
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_choice, check_float, even_int
from posenc._internal.errors import ConfigError
from posenc.rope.apply import LAYOUTS
from posenc.rope.xpos import XPos, xpos_zeta
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


def _heads(positions: torch.Tensor) -> torch.Tensor:
    """[T] stays; per-row [B, T] -> [B, 1, T] so that it broadcasts over the heads of [B, H, T, Dh]."""
    return positions.unsqueeze(-2) if positions.dim() == 2 else positions


@register_scheme("xpos")
class XPosScheme(Scheme):
    """RoPE with xPos's per-pair exponential scale: a query at n scaled by zeta^(n/B) <= 1, a key at m by
    zeta^(-m/B) >= 1 (Sun et al. 2022). ``self.xpos`` is the ``XPos`` module doing the work."""

    rotates = True

    def __init__(self, head_dim: int, *, rope_base: float = 10000.0, rope_layout: str = "half",
                 xpos_gamma: float = 0.4, xpos_scale_base: float = 512.0):
        super().__init__()
        # the scheme options checked under their own names (the lab's --scheme-options), then handed to XPos
        even_int(head_dim, "head_dim", error=ConfigError)
        layout = check_choice(rope_layout, "rope_layout", LAYOUTS, error=ConfigError)
        gamma = check_float(xpos_gamma, "xpos_gamma", positive=True, error=ConfigError)
        scale_base = check_float(xpos_scale_base, "xpos_scale_base", positive=True, finite=False, error=ConfigError)
        xpos_zeta(head_dim, gamma)
        self.xpos = XPos(head_dim, base=rope_base, gamma=gamma, scale_base=scale_base, layout=layout)

    def rotate_qk(self, q, k, ctx: AttentionContext):
        return self.xpos(q, k, _heads(ctx.q_positions), _heads(ctx.k_positions))
