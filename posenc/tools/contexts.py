"""The context lengths a RoPE config states: the original (pre-extension) context and the longest it claims.

Shared by ``posenc inspect``, ``extend`` and ``plot``; ``rc`` is a ``posenc.rope.config.RopeConfig``.
"""

from __future__ import annotations

import warnings

from posenc._validate import check_int
from posenc.errors import ConfigError
from posenc.rope.scaling import rope_parameters

# The longest context the tools accept (2^30 tokens, ~100x the longest published context windows): past it, a
# "target length" is a typo, and the configs it implies (an NTK base of 1e30) are nonsense.
MAX_CONTEXT = 2**30


def context_length(value, name: str) -> int:
    """``value`` as a context length the tools accept (an int in [1, MAX_CONTEXT]), or ConfigError naming ``name``
    (a config key such as "n_positions", or an argument such as "seq_len"). Strings and floats are refused."""
    return check_int(value, name, min=1, max=MAX_CONTEXT, error=ConfigError)


def check_rope_values(rc) -> None:
    """Raise ConfigError (naming the key) for malformed parameters, e.g. a non-numeric factor, or a context length
    past MAX_CONTEXT, before any arithmetic here touches them; the registry's own validation runs, its warnings are
    left to the real call."""
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        if getattr(rc, name) is not None:
            context_length(getattr(rc, name), name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rope_parameters(rc, None)


def claimed_context(rc) -> tuple[int | None, str]:
    """The longest context this RoPE config claims, and where that number comes from."""
    check_rope_values(rc)
    lmax, l0, s = rc.max_position_embeddings, rc.original_max_position_embeddings, rc.params.get("factor")
    if rc.rope_type == "dynamic":
        return None, "dynamic NTK has no fixed limit: frequencies are rescaled for any length past " \
                     f"max_position_embeddings={lmax}"
    if rc.rope_type == "yarn" and s and l0:
        implied = int(round(s * l0))
        if lmax is None or implied > lmax:
            return implied, f"yarn factor x original context = {s:g} x {l0} (max_position_embeddings={lmax})"
    if lmax is None:
        return None, "max_position_embeddings is absent"
    return lmax, "max_position_embeddings"


def original_context(rc) -> int | None:
    """The pre-extension context L0: original_max_position_embeddings, else max_position_embeddings (divided by
    the factor for linear scaling, whose convention puts the extended length there)."""
    check_rope_values(rc)
    if rc.original_max_position_embeddings:
        return rc.original_max_position_embeddings
    lmax, s = rc.max_position_embeddings, rc.params.get("factor")
    if rc.rope_type == "linear" and lmax and s:
        return int(round(lmax / s))  # convention: max_position_embeddings holds the extended length
    return lmax
