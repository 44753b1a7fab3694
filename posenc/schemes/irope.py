"""``irope``: Llama 4's NoPE/RoPE layer hybrid ("iRoPE"; Meta 2025, transformers ``models/llama4``): RoPE in most
layers, a NoPE layer every ``nope_every``-th layer (layer l is NoPE iff (l + 1) % nope_every == 0), and on the
NoPE layers Llama 4's attention temperature on the queries:

    q_n <- q_n * (1 + attn_scale * log(1 + floor((n + 1) / floor_scale)))       (``posenc.irope``)

Llama 4's floor_scale is 8192, which leaves the temperature at exactly 1 for every position a lab model sees; the
scheme's default is the training length instead (option ``floor_scale``), so the temperature is 1 up to the
training length and grows past it (1.22 at 8x with attn_scale 0.1). Llama 4's chunked attention on its RoPE
layers (8192-token chunks) is not modelled: every layer attends to the whole causal prefix.

The RoPE layers are the RoPE scheme (extendable: extension methods rescale them); ``for_layer`` hands NoPE layers
a view that only applies the temperature. Options: ``nope_every`` (4), ``floor_scale`` (max_len), ``attn_scale``
(0.1). A model with fewer than ``nope_every`` layers has no NoPE layer at all (it is plain RoPE).
"""

from __future__ import annotations

from typing import Mapping

from posenc._internal.validate import check_float, check_int, positive_int
from posenc._internal.errors import ConfigError
from posenc.irope import apply_attention_temperature, irope_rope_layers
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.builtin import RoPEScheme
from posenc.schemes.registry import register_scheme


class TemperatureNoPE(Scheme):
    """A NoPE layer with Llama 4's query temperature: rotate_qk scales q by tau(position), leaves k alone."""

    name = "nope (temperature)"
    rotates = True

    def __init__(self, floor_scale: float, attn_scale: float):
        super().__init__()
        self.floor_scale, self.attn_scale = floor_scale, attn_scale

    def rotate_qk(self, q, k, ctx: AttentionContext):
        positions = ctx.q_positions.unsqueeze(-2) if ctx.q_positions.dim() == 2 else ctx.q_positions  # [B, 1, T]
        return apply_attention_temperature(q, positions, floor_scale=self.floor_scale,
                                           attn_scale=self.attn_scale), k


@register_scheme("irope")
class IRoPEScheme(RoPEScheme):
    """RoPE layers with a NoPE layer (with Llama 4's attention temperature) every nope_every-th layer."""

    def __init__(self, head_dim: int, n_heads: int, n_layers: int, *, rope_base: float = 10000.0,
                 max_len: int = 2048, rope_scaling: Mapping | None = None, rope_layout: str = "half",
                 nope_every: int = 4, floor_scale: float | None = None, attn_scale: float = 0.1):
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_scaling=rope_scaling,
                         rope_layout=rope_layout)
        self.nope_every = positive_int(nope_every, "nope_every", error=ConfigError)
        self.rope_layers = irope_rope_layers(n_layers, self.nope_every)
        floor_scale = check_float(max_len if floor_scale is None else floor_scale, "floor_scale", positive=True,
                                  error=ConfigError)
        # a negative scale shrinks the temperature below 1, through 0 and past it (flipping which keys attention
        # prefers) as positions grow; Llama 4 uses 0.1, and 0 turns the temperature off
        self.nope = TemperatureNoPE(floor_scale, check_float(attn_scale, "attn_scale", min=0.0, error=ConfigError))

    def for_layer(self, layer: int) -> Scheme:
        check_int(layer, "layer", min=0, max=len(self.rope_layers) - 1, error=ConfigError)
        return self if self.rope_layers[layer] else self.nope

    def describe(self) -> str:
        return f"{super().describe()} (NoPE every {self.nope_every})"
