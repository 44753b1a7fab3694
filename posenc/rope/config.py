"""Read the RoPE settings of any Hugging Face config into one normalised, validated object.

Forms accepted (all seen in real config.json files):

    transformers 4.x   {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, ...}}
    transformers 5.x   {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, ...}}
    legacy key         {"rope_scaling": {"type": "linear", "factor": 4.0}}
    per layer type     {"rope_parameters": {"full_attention": {...}, "sliding_attention": {...}}}   (Gemma 3)
    Phi-3              {"original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope", ...}}
    Gemma 3 on 4.x     {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {...}}
    GPT-J / CodeGen    {"n_embd": 4096, "n_head": 16, "n_positions": 2048, "rotary_dim": 64}
    GPT-NeoX           {"rotary_pct": 0.25, "rotary_emb_base": 10000}
    DeepSeek-V2/V3 MLA {"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "rope_scaling": {"type": "yarn", ...}}

    >>> cfg = load_rope_config({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 5e5,
    ...                         "max_position_embeddings": 131072,
    ...                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    ...                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    >>> cfg.rope_type, cfg.rotary_dim, cfg.params["factor"]
    ('llama3', 128, 8.0)

Validation uses the metadata each rope type registers in ``posenc.rope.scaling`` (required and optional keys,
value checks): missing keys raise ``ConfigError`` naming them and the type; suspicious values warn with the reason.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc.errors import ConfigError

# keys of the scaling dict that become RopeConfig fields rather than entries of ``params``
_FIELD_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings"}
# legacy rope_type names -> current ones: transformers renamed Phi-3's "su" to "longrope"; Qwen2-VL's "mrope"
# is default frequencies split into sections by the model (mrope_section), which transformers also reads as default
_ALIASES = {"su": "longrope", "mrope": "default"}
# GPT-J / CodeGen spell three config keys the GPT-2 way (transformers' attribute_map); the usual name wins if both
KEY_ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"}
DEFAULT_THETA = 10000.0


@dataclass(frozen=True)
class RopeConfig:
    """Everything a RoPE scaling function needs, normalised from any config form.

    Attributes:
        rope_type: a key of ``posenc.ROPE_SCALING_FUNCTIONS`` ("default", "linear", "dynamic", "yarn", ...).
        theta: the RoPE base (rope_theta).
        head_dim: per-head dimension (head_dim, or hidden_size // num_attention_heads).
        rotary_dim: dimensions rotated = int(head_dim * partial_rotary_factor) (computed when not given); even.
        partial_rotary_factor: fraction of head_dim that is rotated.
        max_position_embeddings: Lmax, the context length the config declares (None if absent).
        original_max_position_embeddings: L0, the pre-extension length (yarn, longrope, llama3; None if absent).
        params: the remaining scaling keys (factor, beta_fast, short_factor, ...), unchanged.

    Constructing one validates it against the registered rope type (errors for missing keys, warnings for
    suspicious values), so ``RopeConfig(rope_type="linear", head_dim=64, params={"factor": 4.0})`` also works.
    """

    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    head_dim: int = 64
    rotary_dim: int | None = None
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int | None = None
    original_max_position_embeddings: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        _check_fields(self)
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", int(self.head_dim * self.partial_rotary_factor))
        if self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ConfigError(
                f"rotary dim must be a positive even number (RoPE rotates pairs), got int(head_dim * "
                f"partial_rotary_factor) = int({self.head_dim} * {self.partial_rotary_factor}) = {self.rotary_dim}")
        if self.rotary_dim > self.head_dim:
            raise ConfigError(f"rotary_dim must be <= head_dim={self.head_dim}, got {self.rotary_dim}")
        object.__setattr__(self, "params", dict(self.params))
        _validate_against_registry(self)

    @property
    def factor(self) -> float | None:
        """The scaling factor s (params["factor"]), or None when the type has none."""
        return self.params.get("factor")


def _check_fields(cfg: RopeConfig) -> None:
    if not isinstance(cfg.rope_type, str) or not cfg.rope_type:
        raise ConfigError(f"rope_type must be a non-empty string, got {cfg.rope_type!r}")
    if isinstance(cfg.head_dim, bool) or not isinstance(cfg.head_dim, int) or cfg.head_dim <= 0:
        raise ConfigError(f"head_dim must be a positive integer, got {cfg.head_dim!r}")
    if not _is_number(cfg.theta) or not cfg.theta > 0 or math.isinf(cfg.theta):
        raise ConfigError(f"rope_theta must be a positive finite number, got {cfg.theta!r}")
    if not _is_number(cfg.partial_rotary_factor) or not 0 < cfg.partial_rotary_factor <= 1:
        raise ConfigError(f"partial_rotary_factor must be a number in (0, 1], got {cfg.partial_rotary_factor!r}")
    if cfg.rotary_dim is not None and (isinstance(cfg.rotary_dim, bool) or not isinstance(cfg.rotary_dim, int)):
        raise ConfigError(f"rotary_dim must be an integer, got {cfg.rotary_dim!r}")
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(cfg.params, Mapping):
        raise ConfigError(f"params must be a mapping of scaling keys, got {type(cfg.params).__name__}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _validate_against_registry(cfg: RopeConfig) -> None:
    """Missing keys -> ConfigError; unknown keys and suspicious values -> warnings (transformers' policy)."""
    from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS  # late import: scaling imports this module

    fn = ROPE_SCALING_FUNCTIONS.get(cfg.rope_type)
    if fn is None:
        raise ConfigError(f"unknown rope_type {cfg.rope_type!r}; known types: {sorted(ROPE_SCALING_FUNCTIONS)} "
                          "(add one with posenc.register_rope_type)")
    required = set(getattr(fn, "required_keys", ()))
    optional = set(getattr(fn, "optional_keys", ()))
    present = set(cfg.params)
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        if getattr(cfg, name) is not None:
            present.add(name)
    missing = sorted(required - present)
    if missing:
        raise ConfigError(f"rope_type {cfg.rope_type!r} is missing required keys {missing}")
    unknown = sorted(set(cfg.params) - required - optional)
    if unknown:
        _warn(cfg, f"unrecognised keys {unknown} (expected some of {sorted((required | optional) - _FIELD_KEYS)})")
    factor = cfg.params.get("factor")
    if _is_number(factor) and factor < 1:
        _warn(cfg, f"factor should be >= 1, got {factor!r} (a factor below 1 shrinks the context)")
    check = getattr(fn, "check", None)
    if check is not None:
        for reason in check(cfg):
            _warn(cfg, reason)


def _warn(cfg: RopeConfig, reason: str) -> None:
    warnings.warn(f"rope_type {cfg.rope_type!r}: {reason}", UserWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """stacklevel pointing at the first caller outside posenc, so the warning names the user's line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2
    while frame is not None and (frame.f_code.co_filename.startswith(package)  # dataclass __init__ too:
                                 or (frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__")):
        frame, level = frame.f_back, level + 1
    return level


# --------------------------------------------------------------------------------------------------- loading

def read_config_file(path: str | os.PathLike) -> dict:
    """Parse a config.json (or a model folder holding one) into a dict; errors name the path."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def _as_mapping(config) -> Mapping:
    if isinstance(config, (str, os.PathLike)):
        return read_config_file(config)
    if isinstance(config, Mapping):
        return config
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        return config.to_dict()
    raise ConfigError("config must be a mapping in config.json form, a path to a config.json, a RopeConfig or a "
                      f"transformers config; got {type(config).__name__}")


def rope_section(config: Mapping) -> Mapping:
    """The part of a config mapping holding its RoPE keys: the config itself, or its "text_config" (multimodal
    configs such as Gemma 3 or Qwen2-VL) when the top level has none."""
    if not any(k in config for k in ("rope_parameters", "rope_scaling", "rope_theta", "head_dim", "hidden_size",
                                     "n_embd")) and isinstance(config.get("text_config"), Mapping):
        return config["text_config"]
    return config


def _scaling_of(cfg: Mapping) -> Mapping:
    """rope_parameters (5.x), else rope_scaling (4.x), else {}."""
    scaling = cfg.get("rope_parameters")
    if scaling is None:
        scaling = cfg.get("rope_scaling")
    if scaling is None:
        scaling = {}
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"rope_parameters / rope_scaling must be a JSON object or null, got {scaling!r}")
    return scaling


def _is_nested(scaling: Mapping) -> bool:
    """Per-layer-type form: every value is a dict (or None for a NoPE layer type) and no rope_type key."""
    return (bool(scaling) and "rope_type" not in scaling and "type" not in scaling
            and all(v is None or isinstance(v, Mapping) for v in scaling.values()))


def rope_layer_types(config) -> list[str] | None:
    """The layer types of a per-layer-type config that use RoPE, in file order (Gemma 3: ["full_attention",
    "sliding_attention"]; null entries, NoPE layers, left out); None for a config with one set of RoPE parameters.

    Each is a valid ``layer_type`` for ``load_rope_config``. ``config``: any form ``load_rope_config`` accepts.
    """
    if isinstance(config, RopeConfig):
        return None
    scaling = _scaling_of(rope_section(_as_mapping(config)))
    return [k for k, v in scaling.items() if v is not None] if _is_nested(scaling) else None


def _select_entry(cfg: Mapping, layer_type: str | None) -> tuple[dict, bool]:
    """The flat scaling dict for ``layer_type`` and whether it came from a per-layer-type (nested) form."""
    scaling = _scaling_of(cfg)
    if _is_nested(scaling):
        if layer_type is None:
            raise ConfigError(f"this config has per-layer-type RoPE parameters for {sorted(scaling)}; "
                              "pass layer_type= one of them")
        if layer_type not in scaling:
            raise ConfigError(f"layer_type {layer_type!r} not in the config's RoPE parameters; "
                              f"available: {sorted(scaling)}")
        if scaling[layer_type] is None:
            raise ConfigError(f"layer_type {layer_type!r} has no RoPE (its rope parameters are null: a NoPE layer)")
        return dict(scaling[layer_type]), True
    if layer_type is not None:
        layer_types = cfg.get("layer_types")
        if isinstance(layer_types, list) and layer_types and layer_type not in layer_types:
            raise ConfigError(f"layer_type {layer_type!r} not among the config's layer_types "
                              f"{sorted({str(t) for t in layer_types})}")
        # Gemma 3 saved by transformers 4.x: sliding layers use rope_local_base_freq and no scaling
        if layer_type == "sliding_attention" and "rope_local_base_freq" in cfg:
            return {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}, False
    return dict(scaling), False


def _get(cfg: Mapping, key: str):
    """cfg[key], or its GPT-J alias (n_embd, n_head, n_positions) when the usual key is absent or null."""
    value = cfg.get(key)
    return cfg.get(KEY_ALIASES[key]) if value is None and key in KEY_ALIASES else value


def _pos_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _head_dim(cfg: Mapping) -> int:
    head_dim = cfg.get("head_dim")
    if head_dim:  # 0 / null fall back to the ratio, as in transformers (`head_dim or hidden // heads`)
        if not _pos_int(head_dim):
            raise ConfigError(f"head_dim must be a positive integer, got {head_dim!r}")
        return head_dim
    hidden, heads = _get(cfg, "hidden_size"), _get(cfg, "num_attention_heads")
    if hidden is None or heads is None:
        raise ConfigError("config must give head_dim, or hidden_size and num_attention_heads; missing "
                          f"{[k for k in ('hidden_size', 'num_attention_heads') if _get(cfg, k) is None]}")
    if not _pos_int(hidden) or not _pos_int(heads):
        raise ConfigError(f"hidden_size and num_attention_heads must be positive integers, got {hidden!r}, {heads!r}")
    return hidden // heads


def _rotary_geometry(cfg: Mapping, prf: float, prf_given: bool) -> tuple[int, int | None, float]:
    """(head_dim, rotary_dim or None to derive it, partial_rotary_factor) from the config's own keys.

    qk_rope_head_dim (DeepSeek-V2/V3 MLA): q and k carry a separate qk_rope_head_dim-wide RoPE part, and
    transformers' configs set head_dim = qk_rope_head_dim for the rope init, so the whole (RoPE) head rotates.
    rotary_dim (GPT-J, CodeGen): the first rotary_dim dims of each head rotate; partial = rotary_dim / head_dim.
    Either wins over head_dim x partial_rotary_factor, with a warning when those say otherwise (Mistral 4 and
    DeepSeek-V4 write head_dim = nope + rope with partial_rotary_factor = rope / head_dim: consistent, silent).
    """
    for key in ("qk_rope_head_dim", "rotary_dim"):
        dim = cfg.get(key)
        if dim is None:
            continue
        if not _pos_int(dim):
            raise ConfigError(f"{key} must be a positive integer (dims rotated per head), got {dim!r}")
        if key == "qk_rope_head_dim":
            head_dim, full = dim, cfg.get("head_dim") if _pos_int(cfg.get("head_dim")) else None
        else:
            head_dim = _head_dim(cfg)
            full = head_dim if prf_given else None  # GPT-J has no partial_rotary_factor: only check a given one
        if dim > head_dim:
            raise ConfigError(f"rotary_dim must be <= head_dim={head_dim}, got {dim}")
        if full is not None and int(full * prf) != dim:
            warnings.warn(f"{key} {dim} disagrees with partial_rotary_factor {prf:g} x head_dim {full} = "
                          f"{int(full * prf)}; using {key}", UserWarning, stacklevel=_user_stacklevel())
        return head_dim, dim, dim / head_dim
    return _head_dim(cfg), None, prf


def load_rope_config(config, layer_type: str | None = None) -> RopeConfig:
    """Normalise any Hugging Face config form into a validated ``RopeConfig``.

    Args:
        config: a mapping in config.json form, a path to a config.json (or a folder holding one), a transformers
            ``PretrainedConfig``, or a ``RopeConfig`` (returned unchanged). Multimodal configs whose RoPE lives
            under "text_config" are read from there.
        layer_type: for per-layer-type configs (Gemma 3: "full_attention" / "sliding_attention"), which one
            (``rope_layer_types`` lists them).
    Geometry: head_dim, else hidden_size // num_attention_heads (GPT-J's n_embd / n_head also read, as is
    n_positions for max_position_embeddings); rotary dim = qk_rope_head_dim (MLA), else rotary_dim (GPT-J),
    else int(head_dim * partial_rotary_factor) (or rotary_pct, GPT-NeoX).
    Raises:
        ConfigError: unreadable file, missing keys (named, with the rope type), unknown rope_type (lists the
            known ones), a rope_type that is not a string, odd rotary dim, malformed values (named).
    Warns:
        UserWarning for unknown keys and suspicious values (factor < 1, beta_fast < beta_slow, wrong longrope
        list length, llama3 high_freq_factor <= low_freq_factor, yarn factor != Lmax / L0, rotary_dim or
        qk_rope_head_dim disagreeing with head_dim x partial_rotary_factor).
    """
    if isinstance(config, RopeConfig):
        return config
    cfg = rope_section(_as_mapping(config))
    entry, nested = _select_entry(cfg, layer_type)

    key = "rope_type" if entry.get("rope_type") is not None else "type"
    rope_type = entry.get(key)
    if rope_type is None:
        rope_type = "default"
    if not isinstance(rope_type, str):
        raise ConfigError(f"{key} must be a string naming a rope type such as 'yarn', got {rope_type!r}")
    rope_type = _ALIASES.get(rope_type, rope_type)
    if rope_type == "yarn" and cfg.get("model_type") == "phi3" and "short_factor" in entry:
        rope_type = "longrope"  # Phi-3 configs once called LongRoPE "yarn"; transformers' Phi3Config remaps it

    theta = entry.get("rope_theta")
    if theta is None:
        theta = cfg.get("rope_theta", cfg.get("rotary_emb_base", DEFAULT_THETA))
    prf = entry.get("partial_rotary_factor")
    if prf is None:
        prf = cfg.get("partial_rotary_factor", cfg.get("rotary_pct"))
    prf_given = prf is not None
    head_dim, rotary_dim, prf = _rotary_geometry(cfg, _to_float(1.0 if prf is None else prf,
                                                                 "partial_rotary_factor"), prf_given)

    max_len = _get(cfg, "max_position_embeddings")
    orig = entry.get("original_max_position_embeddings")
    top = cfg.get("original_max_position_embeddings")
    if top is not None and not nested:
        # Phi-3 style: the pre-extension length lives next to rope_scaling; it wins, as in transformers' Phi3Config
        if orig is not None and orig != top:
            warnings.warn(f"original_max_position_embeddings is {top} at the top level but {orig} inside the RoPE "
                          f"parameters; using the top-level {top}", UserWarning, stacklevel=2)
        orig = top

    from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS  # late import: scaling imports this module
    fn = ROPE_SCALING_FUNCTIONS.get(rope_type)
    if orig is None and fn is not None and "original_max_position_embeddings" in getattr(fn, "required_keys", ()):
        orig = max_len  # transformers' standardisation: L0 defaults to max_position_embeddings

    params = {k: v for k, v in entry.items() if k not in _FIELD_KEYS}
    return RopeConfig(rope_type=rope_type, theta=_to_float(theta, "rope_theta"), head_dim=head_dim,
                      rotary_dim=rotary_dim, partial_rotary_factor=prf,
                      max_position_embeddings=max_len, original_max_position_embeddings=orig, params=params)


def _to_float(value, name: str) -> float:
    if not _is_number(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    return float(value)
