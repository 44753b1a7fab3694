"""The context lengths a RoPE config states: the trained (pre-extension) context and the longest it claims.

``trained_length`` is the one answer to "how long was this model trained for", from a RoPE config, a config (any
form ``load_rope_config`` reads) or a loaded model: read by ``posenc inspect``, ``extend``, ``plot``, ``search``,
``eval`` and ``posenc.patch``'s attention methods. Elsewhere ``rc`` is a ``posenc.rope.config.RopeConfig``.
"""

from __future__ import annotations

import warnings

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError
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


def trained_length(source) -> int | None:
    """The pre-extension context L0 a model was trained for: original_max_position_embeddings, else
    max_position_embeddings (divided by the factor for linear scaling, whose convention puts the extended length
    there); None when the config states neither.

    ``source``: a ``RopeConfig``, a config (mapping, config.json path, transformers config) or a loaded model (its
    ``.config``). A config with RoPE parameters per layer type (Gemma 3) is read at its full-attention (global)
    entry, the one a context extension rescales (posenc.rope.layers); without one, at the first layer type that
    states an original length, else the first one.
    """
    from posenc.rope.config import RopeConfig
    from posenc.rope.layers import global_rope_config

    if isinstance(source, RopeConfig):
        return _trained_length(source)
    config = getattr(source, "config", source)   # a model: its config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # loading the model or the config warns; this only reads lengths
        try:
            # (transformers 5 may list Gemma 3's sliding entry first: Gemma 3 4B's would claim 131072, not 16384)
            return _trained_length(global_rope_config(config))
        except ConfigError:
            pass
        configs = _rope_configs(config)
    lengths = [(_trained_length(rc), rc.original_max_position_embeddings) for rc in configs]
    return next((length for length, stated in lengths if stated), lengths[0][0])


def _rope_configs(config) -> list:
    """The config's RopeConfig, one per RoPE layer type (one for a config with a single set of parameters)."""
    from posenc.rope.config import load_rope_config, rope_layer_types

    return [load_rope_config(config, layer_type) for layer_type in rope_layer_types(config) or [None]]


def _trained_length(rc) -> int | None:
    check_rope_values(rc)
    if rc.original_max_position_embeddings:
        return rc.original_max_position_embeddings
    lmax, s = rc.max_position_embeddings, rc.params.get("factor")
    if rc.rope_type == "linear" and lmax and s:
        return int(round(lmax / s))  # convention: max_position_embeddings holds the extended length
    return lmax
