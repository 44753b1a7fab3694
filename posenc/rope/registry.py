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

from posenc._internal.registry import check_new_name, origin_of
from posenc._internal.errors import ConfigError

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
                       axes: Callable[[RopeConfig], list] | None = None, runtime: ScalingFn | None = None,
                       whole_head: bool = False, replace: bool = False):
    """Decorator adding ``fn(cfg, seq_len) -> (inv_freq, attention_scaling)`` to ``ROPE_SCALING_FUNCTIONS``.

    Args:
        name: the rope_type string configs use. A taken name is a ConfigError unless ``replace=True``.
        required: keys the config must give: scaling keys (e.g. "factor") or "max_position_embeddings" /
            "original_max_position_embeddings". Missing ones raise ConfigError when the config is loaded.
        optional: further accepted scaling keys (others warn as unrecognised; ``MULTI_AXIS_KEYS`` always pass).
        seq_len_rule: how ``posenc.Rotary`` refreshes frequencies as sequences grow: None (fixed), "dynamic"
            (transformers' dynamic NTK rule) or "longrope" (short/long switch at L0).
        check: cfg -> list of reasons to warn about (suspicious but usable values).
        bands: (cfg, seq_len) -> per-pair labels for ``frequency_bands`` when the method defines its own bands.
        axes: cfg -> per-pair position axis (0, 1, ...) for types whose positions have several coordinates
            (2-D "axial" vision RoPE: row, column); None for 1-D positions.
        runtime: (cfg, seq_len) -> (inv_freq, attention_scaling) as the type is re-evaluated during a forward, when
            that differs from ``fn`` (transformers' dynamic NTK forms its base from a tensor length in float32 at
            run time, in Python floats at init); ``posenc.Rotary``'s length rule calls it. None: ``fn``.
        whole_head: the type returns head_dim // 2 frequencies whatever partial_rotary_factor, zero past the
            int(partial_rotary_factor * head_dim // 2) rotated pairs (Gemma 4's proportional RoPE); the config's
            rotary_dim is then twice the rotated pairs, and an odd int(head_dim * factor) is not an error.
        replace: allow replacing a registered type (as the scheme, method and task registries do).
    """
    if seq_len_rule not in SEQ_LEN_RULES:
        raise ConfigError(f"seq_len_rule must be one of {SEQ_LEN_RULES}, got {seq_len_rule!r}")
    check_new_name("rope type", name, ROPE_SCALING_FUNCTIONS, replace)

    def decorator(fn):
        fn.origin = origin_of(fn)
        fn.rope_type = name
        fn.required_keys = frozenset(required)
        fn.optional_keys = frozenset(optional)
        fn.seq_len_rule = seq_len_rule
        fn.check = check
        fn.bands = bands
        fn.axes = axes
        fn.runtime = runtime
        fn.whole_head = bool(whole_head)
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
