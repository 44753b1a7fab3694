"""The rope-type registry: rope_type -> fn(cfg, seq_len) -> (inv_freq, attention_scaling), plus each type's metadata.

This module holds only the table and the decorator that fills it. The built-in types are registered by
``posenc.rope.scaling`` (imported by the ``posenc.rope`` package, so they exist whenever any rope module is used);
``posenc.rope.config`` reads the metadata here to validate configs. Keeping the table apart from both is what lets
config.py and scaling.py import in one direction only (scaling -> config -> registry).

    >>> from posenc.rope.registry import rope_type_function
    >>> rope_type_function("yarn").required_keys
    frozenset({'factor', 'original_max_position_embeddings'})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from posenc.errors import ConfigError

if TYPE_CHECKING:  # type names only: config imports this module
    import torch

    from posenc.rope.config import RopeConfig

ScalingFn = Callable[["RopeConfig", "int | None"], "tuple[torch.Tensor, float]"]

# rope_type -> function(cfg: RopeConfig, seq_len: int | None) -> (inv_freq float32 [pairs], attention_scaling)
ROPE_SCALING_FUNCTIONS: dict[str, ScalingFn] = {}

SEQ_LEN_RULES = (None, "dynamic", "longrope")
# keys every rope type accepts: how positions are split over the pairs (multimodal RoPE), not how frequencies scale
MULTI_AXIS_KEYS = frozenset({"mrope_section", "mrope_interleaved"})


def register_rope_type(name: str, *, required: Iterable[str] = (), optional: Iterable[str] = (),
                       seq_len_rule: str | None = None, check: Callable[[RopeConfig], list] | None = None,
                       bands: Callable[[RopeConfig, "int | None"], list] | None = None,
                       axes: Callable[[RopeConfig], list] | None = None):
    """Decorator adding ``fn(cfg, seq_len) -> (inv_freq, attention_scaling)`` to ``ROPE_SCALING_FUNCTIONS``.

    Args:
        name: the rope_type string configs use. Registering an existing name replaces it.
        required: keys the config must give: scaling keys (e.g. "factor") or "max_position_embeddings" /
            "original_max_position_embeddings". Missing ones raise ConfigError when the config is loaded.
        optional: further accepted scaling keys (others warn as unrecognised; ``MULTI_AXIS_KEYS`` always pass).
        seq_len_rule: how ``posenc.Rotary`` refreshes frequencies as sequences grow: None (fixed), "dynamic"
            (transformers' dynamic NTK rule) or "longrope" (short/long switch at L0).
        check: cfg -> list of reasons to warn about (suspicious but usable values).
        bands: (cfg, seq_len) -> per-pair labels for ``frequency_bands`` when the method defines its own bands.
        axes: cfg -> per-pair position axis (0, 1, ...) for types whose positions have several coordinates
            (2-D "axial" vision RoPE: row, column); None for 1-D positions.
    """
    if seq_len_rule not in SEQ_LEN_RULES:
        raise ConfigError(f"seq_len_rule must be one of {SEQ_LEN_RULES}, got {seq_len_rule!r}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name must be a non-empty string, got {name!r}")

    def decorator(fn):
        fn.rope_type = name
        fn.required_keys = frozenset(required)
        fn.optional_keys = frozenset(optional)
        fn.seq_len_rule = seq_len_rule
        fn.check = check
        fn.bands = bands
        fn.axes = axes
        ROPE_SCALING_FUNCTIONS[name] = fn
        return fn

    return decorator


def rope_type_function(rope_type: str) -> ScalingFn:
    """The registered function for ``rope_type`` (with its metadata attributes), or a ConfigError listing the known
    types."""
    fn = ROPE_SCALING_FUNCTIONS.get(rope_type) if isinstance(rope_type, str) else None
    if fn is None:
        raise ConfigError(f"unknown rope_type {rope_type!r}; known types: {sorted(ROPE_SCALING_FUNCTIONS)} "
                          "(add one with posenc.register_rope_type)")
    return fn
