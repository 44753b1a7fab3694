"""Intervals of the lab's scores.

    wilson_interval  Wilson's score interval of a proportion (95% by default): retrieval and exact-match rates over a
                     few samples, where the normal approximation's interval leaves [0, 1] and is empty at 0% and 100%
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval (Wilson 1927, "Probable inference, the law of succession, and statistical inference")
    of a proportion ``successes / n`` -> (low, high), both in [0, 1]:

        centre = (p + z^2 / 2n) / (1 + z^2 / n),  half = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    ``successes`` may be fractional (a mean of partial scores times ``n``); ``n`` = 0 gives (0, 1): nothing known."""
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, successes / n))
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n))
    # at p = 0 (p = 1) the low (high) end is exactly 0 (1): no rounding error of the square root leaves it
    return (0.0 if p == 0.0 else max(0.0, centre - half)), (1.0 if p == 1.0 else min(1.0, centre + half))
