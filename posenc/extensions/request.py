"""Request-sized YaRN's rule: the smallest factor of a set that covers a request (its prompt plus the tokens it may
generate), so a request that fits the trained length runs unscaled.

Static YaRN changes the frequencies of every request, short ones included; Qwen's model cards advise adding it only
when long inputs are expected for that reason. Choosing the factor per request keeps short requests exact.
``posenc.hf.request_yarn`` applies the rule to a transformers model (``generate``) and ``posenc eval``'s method
``yarn-request`` to each scored length.
"""

from __future__ import annotations

from posenc._internal.errors import ConfigError
from posenc._internal.validate import check_float, check_int

# the factors a request may take by default: 1 (unscaled) and the powers of two up to 32x the trained length
DEFAULT_FACTORS = (1, 2, 4, 8, 16, 32)


def check_factors(factors, name: str = "factors") -> tuple[float, ...]:
    """``factors`` as a sorted tuple of distinct numbers >= 1; ConfigError naming ``name`` otherwise."""
    if isinstance(factors, (str, bytes)) or not hasattr(factors, "__iter__"):
        raise ConfigError(f"{name}: expected a list of numbers >= 1, got {factors!r}")
    values = [check_float(f, name, min=1.0, error=ConfigError) for f in factors]
    if not values:
        raise ConfigError(f"{name}: expected at least one factor >= 1, got none")
    return tuple(sorted(set(values)))


def request_factor(needed_tokens: int, trained_length: int, factors=DEFAULT_FACTORS) -> float:
    """The smallest factor f of ``factors`` with f * ``trained_length`` >= ``needed_tokens`` (1: unscaled).

    ``needed_tokens``: the request's prompt plus its new tokens. ConfigError (one line) when no factor of the set
    covers it.
    """
    needed = check_int(needed_tokens, "needed_tokens", min=1, error=ConfigError)
    trained = check_int(trained_length, "trained_length", min=1, error=ConfigError)
    ordered = check_factors(factors)
    for factor in ordered:
        if factor * trained >= needed:
            return factor
    raise ConfigError(f"needed_tokens: {needed} tokens (prompt + new tokens) exceed the largest factor of factors "
                      f"({ordered[-1]:g} x trained length {trained} = {ordered[-1] * trained:g}); add a larger factor "
                      "or shorten the request")
