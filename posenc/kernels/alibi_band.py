"""ALiBi's bands: the keys far beyond a row's nearest key carry less weight than the arithmetic can resolve, so
steep heads attend to a band of keys instead of all of them (CPU, ``posenc.alibi_attention``'s chunked backend).

Why a band is exact. Row i's weights are p_j proportional to exp(s_j - m_h * d_j), with s_j = q_i . k_j * scale and
d_j the distance from query i to key j. Let r be the visible key nearest to i, at distance d_0. For every key j,
s_j - s_r <= |q_i| (|k_j| + |k_r|) scale <= delta = 2 max|q| max|k| scale (Cauchy-Schwarz; maxima over the
head's queries and its key head's keys), so
p_j / p_r <= exp(delta - m_h (d_j - d_0)). The keys with d_j - d_0 > w therefore weigh at most
exp(delta - m_h (w + 1)) / (1 - exp(-m_h)) times p_r together. ``band_windows`` picks, per head, the smallest w with
m_h (w + 1) >= delta + L + log(1 / (1 - exp(-m_h))): what is left out is at most e^-L of the row's weight and the
output moves by at most 2 e^-L max|v|. L (``dropped``) makes that 1e-4 of the unit roundoff of the arithmetic:
e^-25.2 (1.2e-11) for fp32, bf16 and fp16 inputs (SDPA computes in fp32), e^-45.2 for fp64. Rows keep every key
within d_0 + w of their position, so nothing is masked by index that the full softmax would have kept.

How much it saves depends on delta, so on the data: with N(0, 1) fp32 inputs (D=64, scale 1/8, delta ~31) the 16
ALiBi heads get windows of about 80 ... 15000 keys (docs/performance-alibi.md has the timings).
Heads whose window covers all keys (slopes <= 0, non-finite inputs, large norms) go through the usual schedules.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posenc.kernels.alibi_view import hankel_view

# What a band may leave out, relative to the nearest key's weight, as a share of the unit roundoff of the dtype the
# attention is computed in (see ``dropped``).
ROUNDOFF_SHARE = 1e-4
# Relative slack on delta for the rounding of the norms it is computed from (fp32 norms: ~1e-7 relative).
NORM_SLACK = 1e-3
# Bands are tried from this many queries on. At 1024 (16 heads, fp32) they measured no slower than none (1.35-1.41x
# SDPA without a bias against 1.35-1.61x, benchmarks/results/alibi-cpu-intel-1024.json); shorter inputs were not
# measured, and decoding steps (one query) keep the one multi-head call.
BAND_MIN_QUERIES = 1024
# A head is banded when its band and a block take less than this share of the keys: a wider band skips little, and
# one-head calls use two cores worse than one call for all wide heads. Measured at S=2048 (16 heads, fp32, 1 and 2
# threads, causal and bidirectional): shares 0.35 to 1.0 came within 6% of each other, 0.5 never the slowest.
BAND_MAX_SHARE = 0.5
# Queries per SDPA call of a banded head. Each call also computes the triangle above its diagonal (masked, -inf),
# a share block / (2 (block + w)) of its work: small blocks waste less on narrow bands and cost more calls.
BAND_BLOCK = 256


def dropped(dtype: torch.dtype) -> float:
    """-log of the weight a band may leave out, relative to the nearest key's: 1e-4 of the unit roundoff of the
    dtype SDPA computes in (float64 for float64 inputs: e^-45.2; float32 for the rest: e^-25.2)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    return -math.log(torch.finfo(acc).eps * ROUNDOFF_SHARE)


def band_windows(q: torch.Tensor, k: torch.Tensor, slopes: torch.Tensor, scale: float) -> list[int | None]:
    """Per query head, the band half-width w (keys beyond the nearest one that a row keeps), or None: no bound.

    q: [B, H, Tq, D]; k: [B, Hkv, Tk, D]; slopes: [H]; scale: the softmax scale. delta is taken per head, from the
    largest norms of its queries and of its key head. None where the slope is not positive or those norms are not
    finite (a NaN or inf then reaches every row it reached without bands).
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        q_norms = torch.linalg.vector_norm(q.detach(), dim=-1, dtype=acc).amax(dim=(0, 2)).tolist()   # [H]
        k_norms = torch.linalg.vector_norm(k.detach(), dim=-1, dtype=acc).amax(dim=(0, 2)).tolist()   # [Hkv]
        slope_values = slopes.detach().double().tolist()
    group = len(q_norms) // len(k_norms)
    left_out = dropped(q.dtype)
    windows: list[int | None] = []
    for h, m in enumerate(slope_values):
        delta = 2.0 * q_norms[h] * k_norms[h // group] * scale
        if not (m > 0 and math.isfinite(delta)):
            windows.append(None)
            continue
        delta = delta * (1 + NORM_SLACK) + NORM_SLACK
        # m (w + 1) >= delta + dropped + log(1 / (1 - e^-m)); -expm1(-m) = 1 - e^-m without cancellation
        need = delta + left_out - math.log(-math.expm1(-m))
        windows.append(max(0, math.ceil(need / m) - 1))
    return windows


def banded_heads(windows: list[int | None], k_len: int) -> list[int]:
    """The heads worth banding: a window under BAND_MAX_SHARE of the ``k_len`` keys, with a block of queries."""
    return [h for h, w in enumerate(windows) if w is not None and w + BAND_BLOCK < BAND_MAX_SHARE * k_len]


def key_span(first: int, last: int, k_len: int, window: int, causal: bool) -> tuple[int, int]:
    """Keys [lo, hi) that queries at positions first..last keep under a band of half-width ``window``.

    Each row keeps the keys within ``window`` of its nearest visible key: min(pos, k_len - 1) (positions are >= 0).
    Causal rows see no key past their own position.
    """
    lo = max(0, min(first, k_len - 1) - window)
    hi = min(k_len, last + 1) if causal else min(k_len, min(last, k_len - 1) + window + 1)
    return lo, hi


def banded_head(out: torch.Tensor, q: torch.Tensor, k_rev: torch.Tensor, v_rev: torch.Tensor,
                template: torch.Tensor, head: int, kv_head: int, window: int, *, causal: bool, offset: int,
                scale: float | None, block: int = BAND_BLOCK) -> None:
    """Writes query head ``head`` of the attention into ``out`` [B, H, Tq, Dv], block by block over its band.

    q: [B, H, Tq, D]; k_rev, v_rev: [B, Hkv, Tk, *], keys in reverse order; template: [H, Tq + Tk - 1], the bias
    template of ``alibi_attention.bias_template`` (entry t: distance t - (Tk - 1 - offset)). Differentiable.
    """
    Tq, Tk = q.shape[2], k_rev.shape[2]
    row = template[head:head + 1]
    for s in range(0, Tq, block):
        e = min(s + block, Tq)
        lo, hi = key_span(s + offset, e - 1 + offset, Tk, window, causal)
        # reversed keys Tk-hi .. Tk-lo-1 are keys hi-1 .. lo: (row r, column c) sits at distance
        # (s + r + offset) - (hi - 1 - c), template entry r + c + s + Tk - hi
        out[:, head:head + 1, s:e] = F.scaled_dot_product_attention(
            q[:, head:head + 1, s:e], k_rev[:, kv_head:kv_head + 1, Tk - hi:Tk - lo],
            v_rev[:, kv_head:kv_head + 1, Tk - hi:Tk - lo], attn_mask=hankel_view(row, s + Tk - hi, e - s, hi - lo),
            scale=scale)
