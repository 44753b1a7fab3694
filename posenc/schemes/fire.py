"""``fire``: FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv 2310.04418), a thin adapter over ``posenc.bias.fire.FIREBias``.

    logits[h, i, j] += MLP( psi(i - j) / psi(max(L, i)) )[h]        psi(x) = log(c x + 1), c and L learned

One MLP (width ``fire_width``, 32 as in the paper) and one (c, L) per layer, picked by ``ctx.layer``. The
threshold L starts at the training length (``fire_threshold``, default max_len): below L the normaliser is fixed,
so with the library's default of 512 a model trained at 128 would never see the interpolating regime it relies on
past the training length. Memory: the MLP's hidden layer holds Tq * Tk * width floats per layer and call.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._internal.validate import check_int, positive_float
from posenc.bias.fire import FIREBias
from posenc._internal.errors import ConfigError
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


@register_scheme("fire")
class FIREScheme(Scheme):
    """FIRE's learned MLP of the progressively normalised log distance, per layer, added to the logits."""

    biases = True
    learned_bias = True

    def __init__(self, n_heads: int, n_layers: int, max_len: int, *, fire_width: int = 32, fire_c: float = 0.1,
                 fire_threshold: float | None = None):
        super().__init__()
        width = check_int(fire_width, "fire_width", min=1, max=2**14, error=ConfigError)  # the paper's MLP: 32
        c = positive_float(fire_c, "fire_c", error=ConfigError)
        threshold = positive_float(max_len if fire_threshold is None else fire_threshold, "fire_threshold",
                                   error=ConfigError)
        self.layers = nn.ModuleList(FIREBias(n_heads, width=width, init_c=c, init_threshold=threshold)
                                    for _ in range(n_layers))

    def bias(self, q, k, ctx: AttentionContext):
        layer = self.layers[ctx.layer]
        if ctx.contiguous and _default_positions(ctx):  # the MLP on distances on the rows below L
            return layer.contiguous(ctx.q_positions.shape[-1], ctx.k_positions.shape[-1])
        return layer(ctx.q_positions, ctx.k_positions)


def _default_positions(ctx: AttentionContext) -> bool:
    """Keys at 0..Tk-1 and queries at the last Tq of them (checked, not only trusted from ``ctx.contiguous``)."""
    q, k = ctx.q_positions, ctx.k_positions
    if q.dim() != 1 or k.dim() != 1 or q.shape[0] > k.shape[0]:
        return False
    keys = torch.arange(k.shape[0], device=k.device)
    return torch.equal(k, keys) and torch.equal(q, keys[k.shape[0] - q.shape[0]:])
