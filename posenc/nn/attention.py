"""Multi-head causal self-attention that takes any position scheme, with a KV cache for incremental decoding.

Shapes: x [B, T, D] -> [B, T, D]; heads H, head dim Dh = D / H; q, k, v [B, H, T, Dh].

KV cache and positions: new tokens sit after the cached ones (positions past .. past + T - 1 by default). Schemes
that are not length dependent rotate new keys once and the rotated keys are cached. Length-dependent ones
(dynamic NTK, LongRoPE) cache keys *before* rotation and re-rotate all of them with the frequencies for the
current total length, so each step's attention equals a full forward's at that length. (In a multi-layer model,
dynamic NTK under a cache is still not identical to a full forward over the final length: lower layers computed
earlier tokens' states with the frequencies of their own step. The same holds for Hugging Face's implementation;
the lab scores dynamic NTK with full forwards.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc._internal.validate import check_int, heads_divide
from posenc._internal.errors import ConfigError
from posenc.schemes.base import AttentionContext, Scheme


class KVCache:
    """Per-layer keys, values and key positions for incremental decoding. ``len(cache)`` = tokens cached so far."""

    def __init__(self, n_layers: int):
        n_layers = check_int(n_layers, "n_layers", min=1, error=ConfigError)
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.positions: list[torch.Tensor | None] = [None] * n_layers

    def __len__(self) -> int:
        return self.layer_len(0)

    def layer_len(self, layer: int) -> int:
        """Tokens cached for ``layer`` (differs from len() while a forward pass is between layers)."""
        return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [B, H, T, Dh] (at ``positions`` [T] or [B, T]) for ``layer``; return all its keys and values."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=-2)
            v = torch.cat([self.values[layer], v], dim=-2)
            old = self.positions[layer]
            if positions is not None and old is not None:
                if old.dim() != positions.dim():  # shared [T] rows next to per-row [B, T] ones: make both [B, .]
                    rows = max(old.shape[0] if old.dim() == 2 else 1, positions.shape[0] if positions.dim() == 2 else 1)
                    old, positions = old.expand(rows, -1), positions.expand(rows, -1)
                positions = torch.cat([old, positions], dim=-1)
            else:
                positions = None
        self.keys[layer], self.values[layer], self.positions[layer] = k, v, positions
        return k, v

    def key_positions(self, layer: int) -> torch.Tensor | None:
        """Positions of every cached key of ``layer`` ([Tk] or [B, Tk]), or None if not recorded."""
        return self.positions[layer]


def attention_mask(bias: torch.Tensor | None, q_len: int, k_len: int, device) -> torch.Tensor | None:
    """Float mask [1 or B, 1 or H, q_len, k_len] = bias + causal -inf, or None when SDPA's own causal path fits.

    Queries are aligned to the end of the keys (query i sits at index k_len - q_len + i). Always 4-D: torch
    2.13's CPU SDPA took a slow path for a 3-D [H, q, k] mask (2.1x the time of a 4-D one, forward + backward at
    T=128 and 512, 5-11x in a forward at T=1024; docs/lab.md "Throughput").
    """
    if bias is None and (q_len == k_len or q_len == 1):
        return None
    offset = k_len - q_len
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    mask = torch.zeros(q_len, k_len, device=device).masked_fill(j > i + offset, float("-inf"))
    if bias is not None:
        mask = bias + mask
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


# Under bf16 autocast on the CPU, run RoPE, the bias and SDPA in float32 (q, k, v upcast; the projections stay
# bf16): torch 2.13's bf16 CPU attention was 3.6x slower than fp32 at T=128, head dim 16 (fwd + bwd), and no
# faster at T=512, head dim 32 (docs/lab.md "Throughput"). On a GPU the attention follows autocast.
CPU_FP32_ATTENTION = True


def _fp32_attention(x: torch.Tensor) -> bool:
    return CPU_FP32_ATTENTION and x.device.type == "cpu" and torch.is_autocast_enabled("cpu")


def _bias_fits(bias, B: int, H: int, Tq: int, Tk: int) -> bool:
    """A bias() result attention can add to the logits: a float tensor [.., Tq, Tk] of 2 to 4 dims whose leading
    dims broadcast to [B, H]."""
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point or not 2 <= bias.dim() <= 4:
        return False
    if tuple(bias.shape[-2:]) != (Tq, Tk):
        return False
    lead = bias.shape[:-2]
    return all(n in (1, want) for n, want in zip(reversed(lead), (H, B)))


def scheme_fault(scheme, hook: str, got, want: list[int]):
    """The error for a scheme hook that returned what attention cannot use, naming the scheme and its file."""
    from posenc.schemes.registry import SchemeError, scheme_label

    shown = (f"a {got.dtype} tensor of shape {list(got.shape)}" if isinstance(got, torch.Tensor)
             else type(got).__name__)
    return SchemeError(f"{scheme_label(scheme)}: {hook} returned {shown}; expected a float tensor of shape {want} "
                       "(leading dims may be 1)" if hook == "bias()" else
                       f"{scheme_label(scheme)}: {hook} returned {shown}; expected a tensor of shape {want}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention via torch scaled_dot_product_attention; the scheme supplies position."""

    def __init__(self, d_model: int, n_heads: int, layer_idx: int = 0):
        super().__init__()
        self.head_dim = heads_divide(d_model, n_heads, error=ConfigError)
        self.n_heads, self.layer_idx = n_heads, layer_idx
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, scheme: Scheme, positions: torch.Tensor, cache: KVCache | None = None, *,
                contiguous: bool = True) -> torch.Tensor:
        """x [B, T, D]; positions [T] or [B, T] of the new tokens; ``scheme`` is this layer's view -> [B, T, D].

        contiguous: positions are past .. past + T - 1 (the default positions).
        """
        B, T, D = x.shape
        qkv = self.qkv(x)
        if _fp32_attention(x):
            with torch.autocast("cpu", enabled=False):
                y = self._attend(qkv.float(), scheme, positions, cache, contiguous)
        else:
            y = self._attend(qkv, scheme, positions, cache, contiguous)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))

    def _attend(self, qkv: torch.Tensor, scheme: Scheme, positions: torch.Tensor, cache: KVCache | None,
                contiguous: bool) -> torch.Tensor:
        """qkv [B, T, 3 D] -> the attention output per head [B, H, T, Dh] (position by ``scheme``)."""
        B, T, D3 = qkv.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in qkv.split(D3 // 3, dim=-1))
        past = cache.layer_len(self.layer_idx) if cache is not None else 0
        ctx = AttentionContext(positions, positions, layer=self.layer_idx, past=past,
                               scale=1.0 / math.sqrt(self.head_dim), training=self.training, contiguous=contiguous)
        late = scheme.length_dependent  # rotation depends on the total length: cache keys unrotated
        if not late:
            q, k = scheme.rotate_qk(q, k, ctx)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v, positions)
            k_positions = cache.key_positions(self.layer_idx)
            if k_positions is None or k_positions.shape[-1] != k.shape[-2]:
                k_positions = torch.arange(k.shape[-2], device=qkv.device)
            ctx = AttentionContext(positions, k_positions, layer=self.layer_idx, past=past, scale=ctx.scale,
                                   training=self.training, contiguous=contiguous)
        if late:
            q, k = scheme.rotate_qk(q, k, ctx)
        fused = scheme.attend(q, k, v, ctx)
        if fused is not None:
            if not isinstance(fused, torch.Tensor) or fused.shape != q.shape[:-1] + v.shape[-1:]:
                raise scheme_fault(scheme, "attend()", fused, [B, self.n_heads, T, v.shape[-1]])
            return fused
        total = k.shape[-2]
        bias = scheme.bias(q, k, ctx)
        if bias is not None and not _bias_fits(bias, B, self.n_heads, T, total):
            raise scheme_fault(scheme, "bias()", bias, [B, self.n_heads, T, total])
        mask = attention_mask(bias, T, total, qkv.device)
        if mask is not None:
            mask = mask.to(q.dtype)
        # (a branch, not the expression: under torch.compile with dynamic shapes the comparison is symbolic, and SDPA
        # takes a Python bool; the branch makes dynamo decide it and guard on it)
        causal = False
        if mask is None and T == total and T > 1:
            causal = True
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
