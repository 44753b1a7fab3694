"""Read the RoPE settings of any Hugging Face config into one normalised, validated object.

Forms accepted (all seen in real config.json files):

    transformers 4.x   {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, ...}}
    transformers 5.x   {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, ...}}
    legacy key         {"rope_scaling": {"type": "linear", "factor": 4.0}}
    per layer type     {"rope_parameters": {"full_attention": {...}, "sliding_attention": {...}}}   (Gemma 3, 5.x)
    local / global     {"rope_theta": 1e6, "rope_local_base_freq": 1e4}                             (Gemma 3, 4.x)
                       {"global_rope_theta": 160000, "local_rope_theta": 10000}                     (ModernBERT)
    Phi-3              {"original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope", ...}}
    Hunyuan            {"rope_scaling": {"type": "dynamic", "alpha": 1000.0, ...}}   -> rope_type "ntk_alpha"
    M-RoPE             {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}   (Qwen2-VL; Qwen3-VL adds
                       "mrope_interleaved": true): default frequencies, positions with 3 rows (posenc.rope.multiaxis);
                       Qwen-VL / GLM-4V families: the section order and default their rotary hard-codes
    vision towers      {"model_type": "pixtral", "head_dim": 64, "rope_theta": 1e4}  -> rope_type "axial_pixtral";
                       Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V vision configs -> "axial" (``vision_rope_config``)
    GPT-J / CodeGen    {"n_embd": 4096, "n_head": 16, "n_positions": 2048, "rotary_dim": 64}
    GPT-NeoX           {"rotary_pct": 0.25, "rotary_emb_base": 10000}   (absent: the family's default, 0.25)
    DeepSeek-V2/V3 MLA {"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "rope_scaling": {"type": "yarn", ...}}

    >>> cfg = load_rope_config({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 5e5,
    ...                         "max_position_embeddings": 131072,
    ...                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    ...                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    >>> cfg.rope_type, cfg.rotary_dim, cfg.params["factor"]
    ('llama3', 128, 8.0)

Each family-specific rule above is read the way that family's transformers config class reads it (the tests build
the transformers config or model and compare); the per-family facts (default bases, partial rotary factors, local /
global keys, M-RoPE sections, vision towers) are tables in ``posenc.rope.families``. Validation uses the metadata each rope type registers in
``posenc.rope.registry``: missing keys raise ``ConfigError`` naming them and the type; suspicious values warn with
the reason.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc._internal.validate import check_float, check_int, heads_divide, is_int, is_number
from posenc._internal.errors import ConfigError
from posenc.rope.registry import MULTI_AXIS_KEYS, ROPE_SCALING_FUNCTIONS, rope_type_function
# the per-family facts are re-exported here, where users and posenc.tools import them
from posenc.rope.families import (AXIAL_VISION_TYPES, BASE_KEY_TYPES, CONFIG_DEFAULTS,  # noqa: F401 (re-exported)
                                  DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE, DEFAULT_THETA_BY_MODEL_TYPE, EMBED_DIM_HEADS,
                                  KEY_ALIASES, LOCAL_GLOBAL_THETA, MROPE_FAMILIES, TEXT_MODEL_TYPE, VISION_TOWER_OF,
                                  config_value, model_type_of)
from posenc.rope.families import ATTENTION_ROPE_KEYS

# keys of the scaling dict that become RopeConfig fields rather than entries of ``params``
_FIELD_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings"}
# legacy rope_type names -> current ones: transformers renamed Phi-3's "su" to "longrope"; Qwen2-VL's "mrope"
# is default frequencies split into sections by the model (mrope_section), which transformers also reads as default
_ALIASES = {"su": "longrope", "mrope": "default"}
DEFAULT_THETA = 10000.0
# per-head widths past this are no model's (the largest published is 512): refused before arange(head_dim) overflows
MAX_HEAD_DIM = 1 << 16
# the largest base float32 holds: transformers (and posenc) raise theta to a power in float32
MAX_THETA = 3.4028234663852886e38

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
        params: the remaining scaling keys (factor, beta_fast, short_factor, mrope_section, ...), unchanged.

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
            rotary_dim = int(self.head_dim * self.partial_rotary_factor)
            if getattr(ROPE_SCALING_FUNCTIONS.get(self.rope_type), "whole_head", False):
                rotary_dim = 2 * int(self.partial_rotary_factor * self.head_dim // 2)    # the rotated pairs, as HF
            object.__setattr__(self, "rotary_dim", rotary_dim)
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
    check_int(cfg.head_dim, "head_dim", min=1, max=MAX_HEAD_DIM, error=ConfigError)
    object.__setattr__(cfg, "theta", check_theta(cfg.theta))
    check_float(cfg.partial_rotary_factor, "partial_rotary_factor", positive=True, max=1.0, error=ConfigError)
    if cfg.rotary_dim is not None:
        check_int(cfg.rotary_dim, "rotary_dim", error=ConfigError)
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        if getattr(cfg, name) is not None:
            check_int(getattr(cfg, name), name, min=1, error=ConfigError)
    if not isinstance(cfg.params, Mapping):
        raise ConfigError(f"params must be a mapping of scaling keys, got {type(cfg.params).__name__}")


def check_theta(theta, name: str = "rope_theta") -> float:
    """A RoPE base as a float: a positive number float32 can hold (strings are refused, not parsed), or ConfigError.

    A base <= 1 only warns: the frequencies theta^(-2j/d) then stop decreasing with j (they grow for theta < 1),
    so no pair keeps long-range position; published models use 1e4 and above.
    """
    from posenc._internal.validate import check_base

    return check_base(theta, name, error=ConfigError)   # the one rule for a base (posenc.absolute's too)


def _is_number(x) -> bool:
    return is_number(x) and x == x


def _validate_against_registry(cfg: RopeConfig) -> None:
    """Missing keys -> ConfigError; unknown keys and suspicious values -> warnings (transformers' policy)."""
    fn = rope_type_function(cfg.rope_type)
    required = set(fn.required_keys)
    optional = set(fn.optional_keys) | MULTI_AXIS_KEYS
    present = set(cfg.params)
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        if getattr(cfg, name) is not None:
            present.add(name)
    missing = sorted(required - present)
    if missing:
        raise ConfigError(f"rope_type {cfg.rope_type!r} is missing required keys {missing}")
    unknown = sorted(set(cfg.params) - required - optional)
    if unknown:
        _warn(cfg, f"unrecognised keys {unknown} (expected some of "
                   f"{sorted((required | set(fn.optional_keys)) - _FIELD_KEYS)})")
    factor = cfg.params.get("factor")
    if _is_number(factor) and factor < 1:
        _warn(cfg, f"factor should be >= 1, got {factor!r} (a factor below 1 shrinks the context)")
    if fn.check is not None:
        for reason in fn.check(cfg):
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
    """Parse a config.json (or a model folder holding one) into a dict; errors name the path. A ``.gguf`` file gives
    the config transformers builds from its metadata (posenc.gguf)."""
    from posenc.gguf import gguf_config, is_gguf

    if is_gguf(path):
        return gguf_config(path)
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e}") from None
    from posenc._internal.json_io import loads

    data = loads(text, f"config file {str(path)!r}")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def as_mapping(config) -> Mapping:
    """A config (mapping, path to config.json or a folder, transformers config) as a mapping; ConfigError otherwise."""
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
        text = config["text_config"]
        parent = model_type_of(config)
        if text.get("model_type") is None and parent is not None:
            # transformers builds the text config class of the parent model: take its family rules along
            text = {**text, "model_type": TEXT_MODEL_TYPE.get(parent, parent)}
        return text
    return config


def _normalised_scaling(scaling: Mapping, cfg: Mapping) -> dict:
    """A flat scaling dict in one spelling (rope_type key, aliases resolved, rope_theta filled), for comparisons."""
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_type")}
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    out["rope_type"] = _ALIASES.get(rope_type, rope_type) if isinstance(rope_type, str) else rope_type
    out.setdefault("rope_theta", cfg.get("rope_theta"))
    return out


def _scaling_of(cfg: Mapping) -> Mapping:
    """rope_parameters (5.x), else rope_scaling (4.x), else {}; both present and disagreeing -> ConfigError.

    transformers 5 takes rope_scaling when both are given (and drops rope_parameters), transformers 4 never reads
    rope_parameters: a file holding two different RoPE settings has no single meaning, so posenc refuses it.
    """
    params, scaling = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    for name, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"rope_parameters / rope_scaling must be a JSON object or null, got {name}={value!r}")
    if params and scaling:
        same = (dict(params) == dict(scaling) if _is_nested(params) or _is_nested(scaling)
                else _normalised_scaling(params, cfg) == _normalised_scaling(scaling, cfg))
        if not same:
            raise ConfigError(f"the config gives both rope_parameters {_short(params)} and rope_scaling "
                              f"{_short(scaling)} and they disagree: transformers 5 would use rope_scaling, "
                              "transformers 4 ignores rope_parameters; delete the stale one")
    return params or scaling or {}


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_nested(scaling: Mapping) -> bool:
    """Per-layer-type form: no rope_type / type key and at least one value a dict (Gemma 3: {"full_attention":
    {...}, "sliding_attention": {...}}). Other values must be null (NoPE layer types): see ``_nested_entries``."""
    return (bool(scaling) and "rope_type" not in scaling and "type" not in scaling
            and any(isinstance(v, Mapping) for v in scaling.values()))


def _nested_entries(scaling: Mapping) -> dict[str, dict | None]:
    """The per-layer-type dict with every entry checked: a dict of RoPE parameters, or null for a NoPE type."""
    for key, value in scaling.items():
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"per-layer-type RoPE parameters: entry {key!r} must be a JSON object of RoPE "
                              f"parameters or null (a layer type without RoPE), got {_short(value)}")
    return {k: (None if v is None else dict(v)) for k, v in scaling.items()}


def _family(cfg: Mapping) -> str | None:
    """The local/global family of a flat config: its model_type when listed, else by which keys it holds."""
    model_type = model_type_of(cfg)
    if model_type in LOCAL_GLOBAL_THETA:
        return model_type
    if "rope_local_base_freq" in cfg:
        return "gemma3_text"
    if "global_rope_theta" in cfg or "local_rope_theta" in cfg:
        return "modernbert"
    return None


def _default_theta(cfg: Mapping, local: bool = False) -> float:
    """The base transformers assumes when the config gives none (the config class's default_theta)."""
    value = DEFAULT_THETA_BY_MODEL_TYPE.get(model_type_of(cfg), DEFAULT_THETA)
    if isinstance(value, tuple):
        return value[1] if local else value[0]
    return value


def layer_type_parameters(config) -> dict[str, dict | None] | None:
    """The RoPE parameters per layer type, as transformers' config class standardises them, or None for a config
    with one set for every layer. Null entries are layer types without RoPE (NoPE).

    Per-layer-type forms: a nested rope_parameters dict (5.x, every entry checked); Gemma 3's rope_theta +
    rope_local_base_freq (rope_scaling on full-attention layers only); ModernBERT's global_rope_theta +
    local_rope_theta (rope_scaling on both). ``config``: any form ``load_rope_config`` accepts but a RopeConfig.
    """
    cfg = rope_section(as_mapping(config))
    scaling = _scaling_of(cfg)
    if _is_nested(scaling):
        return _nested_entries(scaling)
    family = _family(cfg)
    if family is None:
        return None
    global_key, local_key, scale_local = LOCAL_GLOBAL_THETA[family]
    flat = {k: v for k, v in _normalised_scaling(scaling, {}).items() if v is not None} if scaling else {}
    full = {"rope_type": "default", **flat}
    local = dict(full) if scale_local else {"rope_type": "default"}
    full.setdefault("rope_theta", cfg.get(global_key) if cfg.get(global_key) is not None else _default_theta(cfg))
    local.setdefault("rope_theta", cfg.get(local_key) if local_key is not None and cfg.get(local_key) is not None
                     else _default_theta(cfg, local=True))
    return {"full_attention": full, "sliding_attention": local}


def rope_layer_types(config) -> list[str] | None:
    """The layer types of a per-layer-type config that use RoPE, in file order (Gemma 3: ["full_attention",
    "sliding_attention"]; null entries, NoPE layers, left out); None for a config with one set of RoPE parameters.

    Each is a valid ``layer_type`` for ``load_rope_config``. ``config``: any form ``load_rope_config`` accepts.
    """
    if isinstance(config, RopeConfig):
        return None
    entries = layer_type_parameters(config)
    return None if entries is None else [k for k, v in entries.items() if v is not None]


def _select_entry(cfg: Mapping, layer_type: str | None) -> tuple[dict, bool]:
    """The flat scaling dict for ``layer_type`` and whether it came from a per-layer-type form."""
    entries = layer_type_parameters(cfg)
    if entries is not None:
        nested = _is_nested(_scaling_of(cfg))
        if layer_type is None:
            if nested:
                raise ConfigError(f"this config has per-layer-type RoPE parameters for {sorted(entries)}; "
                                  "pass layer_type= one of them")
            layer_type = "full_attention"  # a flat local/global config: its rope_theta / rope_scaling are global
        if layer_type not in entries:
            raise ConfigError(f"layer_type {layer_type!r} not in the config's RoPE parameters; "
                              f"available: {sorted(entries)}")
        if entries[layer_type] is None:
            raise ConfigError(f"layer_type {layer_type!r} has no RoPE (its rope parameters are null: a NoPE layer)")
        return entries[layer_type], True
    if layer_type is not None:
        layer_types = cfg.get("layer_types")
        if isinstance(layer_types, list) and layer_types and layer_type not in layer_types:
            raise ConfigError(f"layer_type {layer_type!r} not among the config's layer_types "
                              f"{sorted({str(t) for t in layer_types})}")
    return dict(_scaling_of(cfg)), False


def _get(cfg: Mapping, key: str):
    """cfg[key], or its GPT-J alias (n_embd, n_head, n_positions) when the usual key is absent or null."""
    value = cfg.get(key)
    return cfg.get(KEY_ALIASES[key]) if value is None and key in KEY_ALIASES else value


def _pos_int(x) -> bool:
    return is_int(x) and x > 0


def _head_dim(cfg: Mapping) -> int:
    """head_dim, else hidden_size // num_attention_heads, which must divide exactly (as transformers' configs
    require: a remainder would leave hidden dims outside every head)."""
    head_dim = cfg.get("head_dim")
    if head_dim:  # 0 / null fall back to the ratio, as in transformers (`head_dim or hidden // heads`)
        return check_int(head_dim, "head_dim", min=1, error=ConfigError)
    hidden_key = "embed_dim" if model_type_of(cfg) in EMBED_DIM_HEADS else "hidden_size"
    hidden = cfg.get(hidden_key) if hidden_key == "embed_dim" else _get(cfg, "hidden_size")
    heads = _get(cfg, "num_attention_heads")
    if heads is None:
        heads = cfg.get("num_heads")        # vision configs (transformers' attribute_map)
    if hidden is None or heads is None:
        raise ConfigError(f"config must give head_dim, or {hidden_key} and num_attention_heads; missing "
                          f"{[k for k, v in ((hidden_key, hidden), ('num_attention_heads', heads)) if v is None]}")
    hidden = check_int(hidden, hidden_key, min=1, error=ConfigError)
    heads = check_int(heads, "num_attention_heads", min=1, error=ConfigError)
    try:
        return heads_divide(hidden, heads, error=ConfigError)
    except ConfigError:
        raise ConfigError(f"{hidden_key} ({hidden}) is not divisible by num_attention_heads ({heads}) and the "
                          f"config gives no head_dim: {hidden} // {heads} = {hidden // heads} would silently drop "
                          f"{hidden % heads} dims (transformers' configs refuse it too); give head_dim") from None


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
        dim = check_int(dim, f"{key} (dims rotated per head)", min=1, error=ConfigError)
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


def _rope_type_of(cfg: Mapping, entry: Mapping) -> str:
    """The registered rope type an entry names, after the family remaps transformers' model classes make."""
    key = "rope_type" if entry.get("rope_type") is not None else "type"
    rope_type = entry.get(key)
    if rope_type is None:
        rope_type = "default"
    if not isinstance(rope_type, str):
        raise ConfigError(f"{key} must be a string naming a rope type such as 'yarn', got {rope_type!r}")
    rope_type = _ALIASES.get(rope_type, rope_type)
    model_type = model_type_of(cfg)
    if rope_type == "yarn" and model_type == "phi3" and "short_factor" in entry:
        rope_type = "longrope"  # Phi-3 configs once called LongRoPE "yarn"; transformers' Phi3Config remaps it
    if rope_type == "dynamic" and entry.get("alpha"):
        rope_type = "ntk_alpha"  # Hunyuan: a fixed alpha makes "dynamic" static (transformers' HunYuan models)
    if model_type in AXIAL_VISION_TYPES and rope_type in ("default", "axial"):
        rope_type = AXIAL_VISION_TYPES[model_type]  # the config class's default_rope_type is "axial"
    elif rope_type == "axial" and model_type is not None:
        # transformers' vision towers lay 2-D pairs out in several ways (Gemma 4: h h w w; Kimi: interleaved w, h)
        raise ConfigError(f"rope_type 'axial' of model_type {model_type!r}: posenc reproduces the 2-D RoPE of "
                          f"{sorted(AXIAL_VISION_TYPES)} only; its pair layout may differ")
    return rope_type


def load_rope_config(config, layer_type: str | None = None) -> RopeConfig:
    """Normalise any Hugging Face config form into a validated ``RopeConfig``.

    Args:
        config: a mapping in config.json form, a path to a config.json (or a folder holding one), a transformers
            ``PretrainedConfig``, or a ``RopeConfig`` (returned unchanged). Multimodal configs whose RoPE lives
            under "text_config" are read from there (``vision_rope_config`` reads the vision tower).
        layer_type: for per-layer-type configs (Gemma 3, ModernBERT: "full_attention" / "sliding_attention"),
            which one (``rope_layer_types`` lists them). A flat local/global config (Gemma 3 on transformers 4.x,
            ModernBERT) without it gives its full-attention (global) parameters.
    Geometry: head_dim, else hidden_size // num_attention_heads (which must divide; GPT-J's n_embd / n_head also
    read, as is n_positions for max_position_embeddings); rotary dim = qk_rope_head_dim (MLA), else rotary_dim
    (GPT-J), else int(head_dim * partial_rotary_factor) (or rotary_pct, GPT-NeoX; absent: the family's default,
    ``DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE``, else 1). rope_theta absent: the family's default
    (``DEFAULT_THETA_BY_MODEL_TYPE``), else 10000.
    Raises:
        ConfigError: unreadable file, missing keys (named, with the rope type), unknown rope_type (lists the
            known ones), a rope_type that is not a string, odd rotary dim, malformed values (named), conflicting
            rope_scaling and rope_parameters, a malformed per-layer-type entry, hidden_size not divisible by the
            head count without head_dim.
    Warns:
        UserWarning for unknown keys and suspicious values (rope_theta <= 1, factor < 1, beta_fast < beta_slow,
        wrong longrope list length, llama3 high_freq_factor < low_freq_factor, yarn factor != Lmax / L0,
        rotary_dim or qk_rope_head_dim disagreeing with head_dim x partial_rotary_factor).
    """
    if isinstance(config, RopeConfig):
        return config
    cfg = rope_section(as_mapping(config))
    entry, nested = _select_entry(cfg, layer_type)
    rope_type = _rope_type_of(cfg, entry)

    theta = entry.get("rope_theta")
    if theta is None and BASE_KEY_TYPES.get(model_type_of(cfg)) in cfg:
        theta = cfg[BASE_KEY_TYPES[model_type_of(cfg)]]   # what that family's config class reads first
    if theta is None:
        theta = cfg.get("rope_theta", cfg.get("rotary_emb_base"))
    if theta is None:
        theta = _default_theta(cfg)
    prf = entry.get("partial_rotary_factor")
    if prf is None:
        prf = cfg.get("partial_rotary_factor", cfg.get("rotary_pct"))
    prf_given = prf is not None
    if prf is None and cfg.get("rotary_dim") is None and cfg.get("qk_rope_head_dim") is None:
        prf = DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE.get(model_type_of(cfg))
    prf = check_float(1.0 if prf is None else prf, "partial_rotary_factor", error=ConfigError)
    head_dim, rotary_dim, prf = _rotary_geometry(cfg, prf, prf_given)

    max_len = _get(cfg, "max_position_embeddings")
    if max_len is None and "max_position_embeddings" not in cfg and "n_positions" not in cfg:
        max_len = config_value(cfg, "max_position_embeddings")      # the config class's default (Falcon)
    orig = entry.get("original_max_position_embeddings")
    top = cfg.get("original_max_position_embeddings")
    if top is not None and not nested:
        # Phi-3 style: the pre-extension length lives next to rope_scaling; it wins, as in transformers' Phi3Config
        if orig is not None and orig != top:
            warnings.warn(f"original_max_position_embeddings is {top} at the top level but {orig} inside the RoPE "
                          f"parameters; using the top-level {top}", UserWarning, stacklevel=2)
        orig = top
    if orig is None and "original_max_position_embeddings" in rope_type_function(rope_type).required_keys:
        orig = max_len  # transformers' standardisation: L0 defaults to max_position_embeddings

    attention_keys = ATTENTION_ROPE_KEYS.get(model_type_of(cfg), ())
    params = {k: v for k, v in entry.items() if k not in _FIELD_KEYS and k not in attention_keys}
    family = MROPE_FAMILIES.get(model_type_of(cfg))
    if family is not None:
        section, interleaved = family
        params.setdefault("mrope_section", list(section))
        given = params.get("mrope_interleaved")
        if given is not None and given != interleaved:
            warnings.warn(f"mrope_interleaved {given!r} is ignored: {model_type_of(cfg)}'s rotary always uses "
                          f"{'interleaved' if interleaved else 'contiguous'} M-RoPE sections",
                          UserWarning, stacklevel=_user_stacklevel())
        params["mrope_interleaved"] = interleaved
    return RopeConfig(rope_type=rope_type, theta=theta, head_dim=head_dim,
                      rotary_dim=rotary_dim, partial_rotary_factor=prf,
                      max_position_embeddings=max_len, original_max_position_embeddings=orig, params=params)


def rope_attention_keys(config) -> dict[str, Any]:
    """The keys of a config's RoPE parameters that its family's attention reads, not its rotary
    (``ATTENTION_ROPE_KEYS``: Ministral 3's llama_4_scaling_beta ...), as given; {} when there are none.
    ``config``: any form ``load_rope_config`` accepts but a RopeConfig."""
    cfg = rope_section(as_mapping(config))
    keys = ATTENTION_ROPE_KEYS.get(model_type_of(cfg))
    scaling = _scaling_of(cfg)
    if not keys or _is_nested(scaling):
        return {}
    return {k: scaling[k] for k in sorted(keys) if k in scaling}


def vision_config_of(config) -> Mapping | None:
    """The vision-tower part of a config whose vision tower uses 2-D (axial) RoPE, with its model_type filled in,
    or None: the config itself when it is such a vision config (Pixtral, a Qwen2-VL vision_config), else its
    "vision_config" when that is one."""
    cfg = as_mapping(config)
    if _is_axial(cfg):
        return cfg
    vision = cfg.get("vision_config")
    if isinstance(vision, Mapping):
        if _is_axial(vision):
            return vision
        tower = VISION_TOWER_OF.get(model_type_of(cfg))
        if tower is not None and vision.get("model_type") in (None, model_type_of(cfg)):
            return {**vision, "model_type": tower}   # old checkpoints: no model_type, or the parent's
    return None


def _is_axial(cfg: Mapping) -> bool:
    """A vision config with 2-D RoPE: a listed vision model_type, or rope_type "axial" in its RoPE dict."""
    if model_type_of(cfg) in AXIAL_VISION_TYPES:
        return True
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    return isinstance(scaling, Mapping) and (scaling.get("rope_type") or scaling.get("type")) == "axial"


def vision_rope_config(config) -> RopeConfig | None:
    """The 2-D (axial) RoPE of a config's vision tower as a RopeConfig (rope_type "axial" or "axial_pixtral"),
    or None when it has none. Positions for it have two rows (patch row, patch column): see
    ``posenc.rope.multiaxis``."""
    vision = vision_config_of(config)
    return None if vision is None else load_rope_config(vision)
