"""``rnope-swa``: the NoPE/RoPE hybrid of RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid
Attention Strategy", arXiv 2501.18795) and SWAN-GPT (Puvvada et al. 2025, arXiv 2504.08719): RoPE with a sliding
window on most layers, NoPE with full attention on every k-th layer, and on those global layers a query scale that
grows with the log of the position past the training length:

    RoPE layers (l + 1) % k != 0:  RoPE, and keys j with i - j >= window masked                (local, positional)
    NoPE layers (l + 1) % k == 0:  no rotation, every key; q_n <- q_n * max(1, ln(n + 1) / ln(L))     (global)

The layer rule is Llama 4's (``posenc.irope.irope_rope_layers``); the scale is ``posenc.temperature``'s
log-length rule (Qwen's logn, applied to the NoPE layers only; SWAN-GPT's exact inference scaling is not
reproduced here). The RoPE layers see at most ``window`` keys, so their angles never leave the trained range at any
length: that is the point of the design. Options: ``nope_every`` (4: the papers' 3 local layers per global one),
``swa_window`` (half the training length), ``log_scaling`` (True). Extendable: a method rescales the RoPE layers.
"""

from __future__ import annotations

from typing import Mapping

import torch

from posenc._internal.validate import check_bool, check_int, positive_int
from posenc._internal.errors import ConfigError
from posenc.irope import irope_rope_layers
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.builtin import RoPEScheme
from posenc.schemes.registry import register_scheme
from posenc.temperature import log_length_temperature


class LogLengthNoPE(Scheme):
    """A global NoPE layer: q scaled by max(1, ln(n + 1) / ln(L)) (1 everywhere inside the training length)."""

    name = "nope (log-length scale)"
    rotates = True

    def __init__(self, trained: int, enabled: bool):
        super().__init__()
        self.trained, self.enabled = trained, enabled

    def rotate_qk(self, q, k, ctx: AttentionContext):
        if not self.enabled:
            return q, k
        positions = ctx.q_positions.unsqueeze(-2) if ctx.q_positions.dim() == 2 else ctx.q_positions  # [B, 1, T]
        tau = log_length_temperature(positions.to(q.device), trained=self.trained)
        return (q * tau.unsqueeze(-1)).to(q.dtype), k


@register_scheme("rnope-swa")
class RNoPESWAScheme(RoPEScheme):
    """Sliding-window RoPE layers with a full-attention NoPE layer every nope_every-th layer (RNoPE-SWA, SWAN)."""

    biases = True   # the RoPE layers' band: keys farther than the window are masked

    def __init__(self, head_dim: int, n_heads: int, n_layers: int, *, rope_base: float = 10000.0,
                 max_len: int = 2048, rope_scaling: Mapping | None = None, rope_layout: str = "half",
                 nope_every: int = 4, swa_window: int | None = None, log_scaling: bool = True):
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_scaling=rope_scaling,
                         rope_layout=rope_layout)
        self.nope_every = positive_int(nope_every, "nope_every", error=ConfigError)
        self.rope_layers = irope_rope_layers(n_layers, self.nope_every)
        self.window = check_int(max(1, max_len // 2) if swa_window is None else swa_window, "swa_window", min=1,
                                error=ConfigError)
        self.nope = LogLengthNoPE(max(2, max_len), check_bool(log_scaling, "log_scaling", error=ConfigError))

    def for_layer(self, layer: int) -> Scheme:
        check_int(layer, "layer", min=0, max=len(self.rope_layers) - 1, error=ConfigError)
        return self if self.rope_layers[layer] else self.nope

    def bias(self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """0 where i - j < window, -inf beyond: [Tq, Tk] (or [B, 1, Tq, Tk] for per-row positions); the causal
        mask handles j > i."""
        distance = ctx.distance().to(q.device)
        band = torch.zeros_like(distance).masked_fill(distance >= self.window, float("-inf"))
        return band.unsqueeze(-3) if band.dim() == 3 else band

    def describe(self) -> str:
        return f"{super().describe()} (window {self.window}, NoPE every {self.nope_every})"
