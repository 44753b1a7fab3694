"""``t5``: T5's learned relative bias over log-spaced buckets (Raffel et al. 2020), a thin adapter over
``posenc.bias.t5.T5RelativeBias``.

    logits[h, i, j] += table[bucket(j - i), h]        causal (unidirectional) buckets, one table for all layers

As in T5, the table is shared by every layer. ``num_buckets`` (32) and ``max_distance`` (128) are T5's defaults;
every distance beyond max_distance shares the last bucket, which is why the bias stays finite (and flat) past any
training length. Scheme options: ``t5_buckets``, ``t5_max_distance``.
"""

from __future__ import annotations

from posenc._internal.validate import check_int, positive_int
from posenc.bias.t5 import T5RelativeBias
from posenc._internal.errors import ConfigError
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


@register_scheme("t5")
class T5Scheme(Scheme):
    """T5's learned bias per (bucket of j - i, head), added to the logits (Raffel et al. 2020)."""

    biases = True
    learned_bias = True

    def __init__(self, n_heads: int, *, t5_buckets: int = 32, t5_max_distance: int = 128):
        super().__init__()
        # far above the paper's 32: each bucket is a learned logit per head, and a bucket table past this only
        # exhausts memory
        buckets = check_int(t5_buckets, "t5_buckets", min=1, max=2**16, error=ConfigError)
        distance = positive_int(t5_max_distance, "t5_max_distance", error=ConfigError)
        # causal bucketing: half the buckets are exact distances, the rest log-spaced up to max_distance
        if buckets < 2:
            raise ConfigError(f"t5_buckets must be >= 2 (causal bucketing), got {buckets}")
        if distance <= buckets // 2:
            raise ConfigError(f"t5_max_distance must exceed the {buckets // 2} exact buckets (t5_buckets // 2), "
                              f"got {distance}")
        self.table = T5RelativeBias(n_heads, num_buckets=buckets, max_distance=distance)

    def bias(self, q, k, ctx: AttentionContext):  # [H, Tq, Tk] (or [B, H, Tq, Tk] for per-row positions)
        return self.table(ctx.q_positions, ctx.k_positions)
