"""Multi-head causal self-attention that takes any position scheme, with a KV cache for incremental decoding.

Shapes: x [B, T, D] -> [B, T, D]; heads H, head dim Dh = D / H; q, k, v [B, H, T, Dh].

KV cache and positions: new tokens sit at positions cache_len .. cache_len + T - 1. Static rotations (plain RoPE
and every scaling whose frequencies do not depend on length) are applied to new keys once and the rotated keys
are cached. Length-dependent scalings (dynamic NTK, LongRoPE) cache keys *before* rotation and re-rotate all of
them with the frequencies for the current total length, so each step's attention equals a full forward's at
that length. (In a multi-layer model, dynamic NTK under a cache is still not identical to a full forward over
the final length: lower layers computed earlier tokens' states with the frequencies of their own step. The same
holds for Hugging Face's implementation; the lab scores dynamic NTK with full forwards.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc.schemes import Scheme


class KVCache:
    """Per-layer keys and values for incremental decoding. ``len(cache)`` = tokens cached so far."""

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def __len__(self) -> int:
        return self.layer_len(0)

    def layer_len(self, layer: int) -> int:
        """Tokens cached for ``layer`` (differs from len() while a forward pass is between layers)."""
        return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [B, H, T, Dh] for ``layer``; return all cached keys and values for it."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=-2)
            v = torch.cat([self.values[layer], v], dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def attention_mask(scheme: Scheme, q_len: int, k_len: int, device) -> torch.Tensor | None:
    """Float mask [H or 1, q_len, k_len] = scheme bias + causal -inf, or None when SDPA's own causal path fits.

    Queries are aligned to the end of the keys (query i sits at position k_len - q_len + i).
    """
    bias = scheme.bias(q_len, k_len, device)
    if bias is None and (q_len == k_len or q_len == 1):
        return None
    offset = k_len - q_len
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    mask = torch.zeros(q_len, k_len, device=device).masked_fill(j > i + offset, float("-inf"))
    return mask[None] if bias is None else bias + mask


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention via torch scaled_dot_product_attention; the scheme supplies position."""

    def __init__(self, d_model: int, n_heads: int, layer_idx: int = 0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model: must be divisible by n_heads ({n_heads}), got {d_model}")
        self.n_heads, self.head_dim, self.layer_idx = n_heads, d_model // n_heads, layer_idx
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, scheme: Scheme, positions: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        """x [B, T, D]; positions LongTensor [T] (absolute, starting at len(cache)) -> [B, T, D]."""
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        total = T + (cache.layer_len(self.layer_idx) if cache is not None else 0)
        late_rotation = scheme.rotates and scheme.length_dependent
        if scheme.rotates and not late_rotation:
            q, k = scheme.rotate_qk(q, k, positions, total)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        if late_rotation:  # cached keys are unrotated: rotate them all with this length's frequencies
            q = scheme.rotate(q, positions, total)
            k = scheme.rotate(k, torch.arange(total, device=x.device), total)
        mask = attention_mask(scheme, T, total, x.device)
        if mask is not None:
            mask = mask.to(q.dtype)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T == total and T > 1)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))
