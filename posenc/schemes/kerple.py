"""``kerple``: KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv 2205.09921), a thin adapter over ``posenc.bias.kerple.KerpleBias``.

    log variant:    logits[h, i, j] += -r1_h * log(1 + r2_h * |i - j|)        r1, r2 > 0 learned per head
    power variant:  logits[h, i, j] += -r1_h * |i - j| ** r2_h                0 < r2 < 2

One set of (r1, r2) per layer and head, as in the paper's code (each attention layer owns its kernel); the
layer's parameters are picked by ``ctx.layer``. Scheme option: ``kerple_variant`` ("log" or "power").
"""

from __future__ import annotations

from torch import nn

from posenc._internal.validate import check_choice
from posenc.bias.kerple import VARIANTS, KerpleBias
from posenc._internal.errors import ConfigError
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


@register_scheme("kerple")
class KerpleScheme(Scheme):
    """KERPLE's learned log (or power) distance kernel per layer and head, added to the logits."""

    biases = True
    learned_bias = True

    def __init__(self, n_heads: int, n_layers: int, *, kerple_variant: str = "log"):
        super().__init__()
        variant = check_choice(kerple_variant, "kerple_variant", VARIANTS, error=ConfigError)
        self.layers = nn.ModuleList(KerpleBias(n_heads, variant=variant) for _ in range(n_layers))

    def bias(self, q, k, ctx: AttentionContext):
        return self.layers[ctx.layer](ctx.q_positions, ctx.k_positions)
