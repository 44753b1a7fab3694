"""iRoPE pieces (Llama 4): interleaved RoPE and NoPE layers, and the attention temperature of the NoPE layers.

Llama 4 (Meta 2025; transformers ``models/llama4``) rotates q and k in most layers and leaves every k-th layer
without any position encoding (NoPE, which relies on the causal mask alone; Kazemnejad et al. 2023). On those
NoPE layers, queries are scaled by a temperature that grows with the log of the position ("attention
temperature tuning"; transformers' code cites arXiv 2501.19399, Nakanishi 2025, "Scalable-Softmax Is Superior
for Attention"), which keeps attention from flattening over very long contexts:

    rope layers:  layer l rotates iff (l + 1) % k != 0            (k = 4: layers 3, 7, 11, ... are NoPE)
    temperature:  tau(n) = 1 + attn_scale * log(1 + floor((n + 1) / floor_scale))     n = the query's position
                  q_n <- tau(n) * q_n     on NoPE layers only (defaults: floor_scale 8192, attn_scale 0.1)

tau is 1 for every position below floor_scale - 1, so short contexts are unaffected. It depends on the query's
own position only, so a KV-cache step (queries at past..past+T-1) equals the same rows of a full forward.
These are the math functions a model uses; ``posenc inspect`` reads the same settings from Hugging Face configs.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._internal.validate import check_float, positive_int
from posenc._internal.errors import PosencError
from posenc.positions import as_positions
from posenc.temperature import attention_temperature  # noqa: F401 (re-exported; the formula's owner)


def irope_rope_layers(n_layers: int, nope_interval: int = 4) -> list[int]:
    """Per layer 1 (rotates: a RoPE layer) or 0 (NoPE layer): transformers' ``no_rope_layers`` convention.

    Layer l is NoPE iff (l + 1) % nope_interval == 0 (Llama4TextConfig's default schedule); nope_interval 1
    makes every layer NoPE, and nope_interval > n_layers none.
    """
    n_layers = positive_int(n_layers, "n_layers")
    nope_interval = positive_int(nope_interval, "nope_interval")
    return [int((layer + 1) % nope_interval != 0) for layer in range(n_layers)]


def apply_attention_temperature(q: torch.Tensor, positions, *, floor_scale: float = 8192,
                                attn_scale: float = 0.1) -> torch.Tensor:
    """q [..., T, head_dim] scaled per query by tau(position); positions [T] or broadcastable to q.shape[:-1]
    (e.g. [B, 1, T] for q [B, H, T, D]). Returns q's dtype (the product is formed in float32)."""
    if not isinstance(q, torch.Tensor) or q.dim() < 2 or not q.is_floating_point():
        raise PosencError(f"q must be a floating-point tensor [..., seq, head_dim], got "
                          f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    positions = as_positions(positions, q.device)
    lead = tuple(q.shape[:-1])
    # [seq], or q's own rank ([B, 1, T] for q [B, H, T, D]): a [B, T] tensor would broadcast B against the heads
    fits = positions.dim() in (1, len(lead)) and positions.shape[-1] in (1, lead[-1])
    if fits:
        try:
            fits = torch.broadcast_shapes(positions.shape, lead) == lead
        except RuntimeError:
            fits = False
    if not fits:
        raise PosencError(f"positions must have shape [seq] = [{lead[-1]}] or q's leading rank, broadcastable to "
                          f"{list(lead)} (e.g. [batch, 1, seq] for q [batch, heads, seq, head_dim]); "
                          f"got {list(positions.shape)}")
    tau = attention_temperature(positions, floor_scale=floor_scale, attn_scale=attn_scale)
    return (q * tau.unsqueeze(-1)).to(q.dtype)


class AttentionTemperature(nn.Module):
    """Llama 4's query temperature for NoPE layers: forward(q, positions) -> q * tau(positions)."""

    def __init__(self, *, floor_scale: float = 8192, attn_scale: float = 0.1):
        super().__init__()
        self.floor_scale = check_float(floor_scale, "floor_scale", positive=True)
        self.attn_scale = check_float(attn_scale, "attn_scale", min=0.0)

    def forward(self, q: torch.Tensor, positions) -> torch.Tensor:
        return apply_attention_temperature(q, positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale:g}, attn_scale={self.attn_scale:g}"
