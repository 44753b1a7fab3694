"""``xpos``: xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554), a thin adapter over
``posenc.rope.xpos.apply_xpos``.

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

from posenc._validate import check_choice, check_float, even_int
from posenc.errors import ConfigError
from posenc.rope.apply import LAYOUTS, default_inv_freq
from posenc.rope.xpos import apply_xpos, xpos_zeta
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


def _heads(positions: torch.Tensor) -> torch.Tensor:
    """[T] stays; per-row [B, T] -> [B, 1, T] so that it broadcasts over the heads of [B, H, T, Dh]."""
    return positions.unsqueeze(-2) if positions.dim() == 2 else positions


@register_scheme("xpos")
class XPosScheme(Scheme):
    """RoPE with xPos's per-pair exponential scale: a query at n scaled by zeta^(n/B) <= 1, a key at m by
    zeta^(-m/B) >= 1 (Sun et al. 2022)."""

    rotates = True
    float32_buffers = ("inv_freq",)

    def __init__(self, head_dim: int, *, rope_base: float = 10000.0, rope_layout: str = "half",
                 xpos_gamma: float = 0.4, xpos_scale_base: float = 512.0):
        super().__init__()
        even_int(head_dim, "head_dim", error=ConfigError)
        self.layout = check_choice(rope_layout, "rope_layout", LAYOUTS, error=ConfigError)
        self.gamma = check_float(xpos_gamma, "xpos_gamma", positive=True, error=ConfigError)
        self.scale_base = check_float(xpos_scale_base, "xpos_scale_base", positive=True, finite=False,
                                      error=ConfigError)
        xpos_zeta(head_dim, self.gamma)
        self.register_buffer("inv_freq", default_inv_freq(head_dim, rope_base), persistent=False)

    def rotate_qk(self, q, k, ctx: AttentionContext):
        kw = dict(inv_freq=self.inv_freq, gamma=self.gamma, scale_base=self.scale_base, layout=self.layout)
        return (apply_xpos(q, _heads(ctx.q_positions), **kw),
                apply_xpos(k, _heads(ctx.k_positions), key=True, **kw))
