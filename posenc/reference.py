"""The lesson's reference loops, in plain Python: the oracle every fast path is tested against.

Deliberately simple (lists, ``math``, one scalar at a time) and as close to the lesson's text as possible.
Nothing here is fast; nothing here uses torch. Angles are Python floats (float64).
"""

from __future__ import annotations

import math


def sinusoidal(n_positions: int, dim: int, base: float = 10000.0) -> list[list[float]]:
    """The lesson's step 1: ``PE[pos][2i] = sin(pos / base^(2i/dim))``, ``PE[pos][2i+1] = cos(same)``.

    Returns an ``n_positions x dim`` list of lists. For odd ``dim`` the last column has no partner and stays 0
    (the lesson's loop runs over ``dim // 2`` pairs); the fast version rejects odd dims instead.
    """
    pe = [[0.0] * dim for _ in range(n_positions)]
    for pos in range(n_positions):
        for i in range(dim // 2):
            theta = pos / (base ** (2 * i / dim))
            pe[pos][2 * i] = math.sin(theta)
            pe[pos][2 * i + 1] = math.cos(theta)
    return pe


def apply_rope(x: list[float], pos: float, base: float = 10000.0, inv_freq: list[float] | None = None,
               attention_scaling: float = 1.0) -> list[float]:
    """The lesson's step 2: rotate each pair (2i, 2i+1) of one vector by pos * theta_i (interleaved layout).

    ``inv_freq`` (length len(x)//2) overrides theta_i = base^(-2i/d), as scaled RoPE variants do;
    ``attention_scaling`` multiplies cos and sin as transformers does.
    """
    d = len(x)
    out = list(x)
    for i in range(d // 2):
        theta_i = inv_freq[i] if inv_freq is not None else 1.0 / (base ** (2 * i / d))
        angle = pos * theta_i
        c, s = math.cos(angle) * attention_scaling, math.sin(angle) * attention_scaling
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i] = a * c - b * s
        out[2 * i + 1] = a * s + b * c
    return out


def apply_rope_half(x: list[float], pos: float, base: float = 10000.0, inv_freq: list[float] | None = None,
                    attention_scaling: float = 1.0) -> list[float]:
    """RoPE in the half-split layout (GPT-NeoX, Hugging Face): pair i is (x[i], x[i + d/2])."""
    d = len(x)
    h = d // 2
    out = list(x)
    for i in range(h):
        theta_i = inv_freq[i] if inv_freq is not None else 1.0 / (base ** (2 * i / d))
        angle = pos * theta_i
        c, s = math.cos(angle) * attention_scaling, math.sin(angle) * attention_scaling
        a, b = x[i], x[i + h]
        out[i] = a * c - b * s
        out[i + h] = a * s + b * c
    return out


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes as in the paper's reference code (also BLOOM, MPT with alibi_bias_max=8).

    Power of two n: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8) — the lesson's 2^(-8(h+1)/H).
    Otherwise, with c the largest power of two below n: slopes(c), then every other entry of slopes(2c),
    the first n - c of them.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return power_of_two(n_heads)
    c = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(c) + power_of_two(2 * c)[0::2][: n_heads - c]


def alibi_bias(n_heads: int, seq_len: int) -> list[list[list[float]]]:
    """The lesson's step 3: ``bias[h][i][j] = -slope_h * |i - j|`` (square, symmetric)."""
    slopes = alibi_slopes(n_heads)
    return [[[-m * abs(i - j) for j in range(seq_len)] for i in range(seq_len)] for m in slopes]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))
