"""The plain-loop oracle of the attention-changing methods: one query-key pair at a time, Python floats (float64),
each paper's per-pair rule written out on its own (independently of the modes in rules.py that the kernel reads).

    pair_positions(rule, i, j) -> (query position, key position) for the pair, or None when the key is not attended
    attention(q, k, v, rule, ...)  -> the causal attention output, via posenc.reference.apply_rope_half / dot

Nothing here uses torch or is fast; the tests compare the blocked kernel against it.
"""

from __future__ import annotations

import math

from posenc import reference as ref
from posenc.attention.methods import DualChunk, LeakyReRoPE, LMInfinite, ReRoPE, SelfExtend, Sinks, STRING


def self_extend_pair(i: int, j: int, group_size: int, window: int):
    """Jin et al. 2024: neighbours (i - j < W) keep (i, j); others get (i // G + W - W // G, j // G)."""
    if i - j < window:
        return float(i), float(j)
    return float(i // group_size + window - window // group_size), float(j // group_size)


def rerope_pair(i: int, j: int, window: int):
    """Su 2023: relative position min(i - j, w); past the window the query sits at w and the key at 0."""
    if i - j < window:
        return float(i), float(j)
    return float(window), 0.0


def leaky_rerope_pair(i: int, j: int, window: int, leak: float):
    """Leaky ReRoPE: relative position w + (i - j - w) / k past the window (written as query and key positions)."""
    if i - j < window:
        return float(i), float(j)
    return window + (i - window) / leak, j / leak


def dual_chunk_pair(i: int, j: int, chunk_size: int, local_window: int):
    """An et al. 2024 as ChunkLlama writes it: chunks of c = s - w; keys at j mod c; same chunk: query i mod c;
    previous chunk: min(i mod c + c, s); older chunks: min(2c - 1, s)."""
    c = chunk_size - local_window
    qc, kc = i // c, j // c
    if qc == kc:
        return float(i % c), float(j % c)
    if kc == qc - 1:
        return float(min(i % c + c, chunk_size)), float(j % c)
    return float(min(2 * c - 1, chunk_size)), float(j % c)


def sinks_pair(i: int, j: int, n_sink: int, window: int):
    """Xiao et al. 2023, one decoding step at a time: the cache before query i holds the first n_sink tokens and the
    last window - 1 ones; positions are places in that cache."""
    kept = list(range(i + 1))
    if len(kept) > n_sink + window:
        kept = kept[:n_sink] + kept[len(kept) - window:]
    if j not in kept:
        return None
    return float(kept.index(i)), float(kept.index(j))


def string_pair(i: int, j: int, shift: int, local_window: int):
    """An et al. 2024 (the decoding path of HKUNLP/STRING's string_for_llama.py): a distance d = i - j below S is
    kept, a farther one is d - S + W. Written as (relative position, 0): RoPE reads only the difference."""
    d = i - j
    return float(d if d < shift else d - shift + local_window), 0.0


def lm_infinite_pair(i: int, j: int, n_global: int, n_local: int, ceiling: int):
    """Han et al. 2024: the Lambda-shaped mask keeps the first n_global keys and the last n_local; every kept pair is
    at min(i - j, ceiling)."""
    if j >= n_global and i - j >= n_local:
        return None
    return float(min(i - j, ceiling)), 0.0


def pair_positions(rule, i: int, j: int):
    if isinstance(rule, SelfExtend):
        return self_extend_pair(i, j, rule.group_size, rule.window)
    if isinstance(rule, LeakyReRoPE):
        return leaky_rerope_pair(i, j, rule.window, rule.leak)
    if isinstance(rule, ReRoPE):
        return rerope_pair(i, j, rule.window)
    if isinstance(rule, DualChunk):
        return dual_chunk_pair(i, j, rule.chunk_size, rule.local_window)
    if isinstance(rule, Sinks):
        return sinks_pair(i, j, rule.n_sink, rule.window)
    if isinstance(rule, STRING):
        return string_pair(i, j, rule.shift, rule.local_window)
    if isinstance(rule, LMInfinite):
        return lm_infinite_pair(i, j, rule.n_global, rule.n_local, rule.ceiling)
    raise TypeError(f"no reference rule for {type(rule).__name__}")


def attention(q, k, v, rule, inv_freq, *, attention_scaling: float = 1.0, scale: float | None = None,
              q_offset: int | None = None):
    """Causal attention for ONE head: q `[Tq][D]`, k `[Tk][D]`, v `[Tk][Dv]` (lists of floats, unrotated), half
    layout, rotary dim 2 * len(inv_freq). Queries at q_offset + n (default Tk - Tq). Returns `[Tq][Dv]`."""
    tq, tk = len(q), len(k)
    d = len(q[0])
    r = 2 * len(inv_freq)
    q_offset = tk - tq if q_offset is None else q_offset
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    def rot(x, pos):
        head = ref.apply_rope_half(list(x[:r]), pos, inv_freq=list(inv_freq), attention_scaling=attention_scaling)
        return head + list(x[r:])

    out = []
    for n in range(tq):
        i = q_offset + n
        scores, values = [], []
        for j in range(i + 1):
            pos = pair_positions(rule, i, j)
            if pos is None:
                continue
            scores.append(ref.dot(rot(q[n], pos[0]), rot(k[j], pos[1])) * scale)
            values.append(v[j])
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out.append([sum(w * val[c] for w, val in zip(weights, values)) / total for c in range(len(v[0]))])
    return out
