"""T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", section 2.1): a learned scalar per (bucket, head) added to the attention logits.

The relative position r = key - query is mapped to one of ``num_buckets`` buckets:
    bidirectional: half the buckets per sign (keys after the query use the upper half), n = |r|
    causal:        n = max(-r, 0) (keys after the query all share bucket 0; the causal mask hides them)
    with m = (buckets left) / 2:  n < m  ->  bucket n  (exact small distances)
                                  n >= m ->  m + floor(log(n / m) / log(max_distance / m) * (buckets left - m)),
                                             capped at buckets left - 1 (every n >= max_distance shares the last)
T5 computes the bias once and shares it across layers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc._internal.validate import check_bool, check_int, positive_int
from posenc.bias.positions import check_positions, relative_positions
from posenc._internal.errors import PosencError


def t5_relative_bucket(relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int = 32,
                       max_distance: int = 128) -> torch.Tensor:
    """Bucket index (int64, same shape) of each relative position r = key - query.

    Returns exactly what transformers' ``T5Attention._relative_position_bucket`` returns (same float32 log
    arithmetic and truncation), so a T5 checkpoint's table can be used as is.
    """
    check_bool(bidirectional, "bidirectional")
    num_buckets = positive_int(num_buckets, "num_buckets")
    max_distance = positive_int(max_distance, "max_distance")
    r = torch.as_tensor(relative_position)
    if r.is_floating_point() or r.is_complex() or r.dtype == torch.bool:
        raise PosencError(f"relative_position must be an integer tensor, got dtype {r.dtype}")
    buckets = num_buckets // 2 if bidirectional else num_buckets
    max_exact = buckets // 2
    if max_exact < 1:
        raise PosencError(f"num_buckets must be >= {4 if bidirectional else 2} "
                          f"({'bidirectional' if bidirectional else 'causal'}), got {num_buckets}")
    if max_distance <= max_exact:
        raise PosencError(f"max_distance must exceed the {max_exact} exact buckets, got {max_distance}")
    r = r.long()
    if bidirectional:
        base = (r > 0).long() * buckets
        n = r.abs()
    else:
        base = torch.zeros_like(r)
        n = (-r).clamp(min=0)
    # log-spaced buckets; n below max_exact is replaced by max_exact only to keep log() finite where the
    # exact bucket is chosen anyway (for n >= max_exact the arithmetic is transformers' float32 one)
    big = n.clamp(min=max_exact).float()
    log_bucket = max_exact + (torch.log(big / max_exact) / math.log(max_distance / max_exact)
                              * (buckets - max_exact)).long()
    log_bucket = log_bucket.clamp(max=buckets - 1)
    return base + torch.where(n < max_exact, n, log_bucket)


def t5_bias(table: torch.Tensor, query_positions, key_positions, *, bidirectional: bool = False,
            max_distance: int = 128) -> torch.Tensor:
    """The T5 bias [..., H, Tq, Tk] = table[bucket(key - query)] for positions [..., Tq] and [..., Tk].

    ``table``: [num_buckets, H] (transformers' ``relative_attention_bias.weight``). Output in table's dtype.
    """
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        raise PosencError(f"table must be a tensor [num_buckets, n_heads], got "
                          f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}")
    check_positions(query_positions, key_positions, integer=True)
    rel = relative_positions(query_positions, key_positions, device=table.device)        # [..., Tq, Tk]
    buckets = t5_relative_bucket(rel, bidirectional=bidirectional, num_buckets=table.shape[0],
                                 max_distance=max_distance)
    return table[buckets].movedim(-1, -3)                                               # [..., H, Tq, Tk]


class T5RelativeBias(nn.Module):
    """T5's learned bias table [num_buckets, n_heads]: forward(query_positions, key_positions) -> [..., H, Tq, Tk].

    ``bidirectional=False`` is T5's decoder (causal) bucketing, the one a decoder-only model uses.
    The table starts as N(0, init_std^2); T5 itself uses std d_model^-0.5.
    """

    def __init__(self, n_heads: int, *, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = False, init_std: float = 0.02):
        super().__init__()
        self.n_heads = positive_int(n_heads, "n_heads")
        self.num_buckets = positive_int(num_buckets, "num_buckets")
        self.max_distance = check_int(max_distance, "max_distance", min=1)
        self.bidirectional = bidirectional
        t5_relative_bucket(torch.zeros(1, dtype=torch.long), bidirectional=bidirectional,
                           num_buckets=num_buckets, max_distance=max_distance)  # validate now, not mid-run
        self.weight = nn.Parameter(torch.randn(num_buckets, n_heads) * init_std)

    def forward(self, query_positions, key_positions) -> torch.Tensor:
        return t5_bias(self.weight, query_positions, key_positions, bidirectional=self.bidirectional,
                       max_distance=self.max_distance)

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")
