"""Per-layer positional schedules and the logit-scale effects that live outside cos/sin.

Some models change positions per layer or scale attention logits in ways cos/sin do not show:

- NoPE layers (Llama 4, SmolLM3): ``no_rope_layers[i]`` is 1 when layer i rotates q/k and 0 when it does not
  (the name reads backwards; transformers' convention); absent (or, for Llama 4, empty), every
  ``no_rope_layer_interval``-th layer (default 4) is NoPE; SmolLM3 refuses an empty list. Per-layer-type RoPE
  parameters with a null entry mark NoPE layer types too.
- Attention temperature tuning (Llama 4; Nakanishi 2025, arXiv:2501.19399): NoPE layers multiply q at absolute
  position p by log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1.
- Query temperature (Ministral 3, Mistral Small 4: ``llama_4_scaling_beta`` in the RoPE parameters): every layer
  multiplies its rotated q at position p by 1 + beta * ln(1 + floor(p / L0)), L0 = original_max_position_embeddings.
- Learned position weights (Mistral Large 4): LeRoPE multiplies each pair's frequency by exp(alpha_j) (the
  checkpoint's ``rotary_emb.alpha``), and every layer multiplies q at position p by scale_h * ln(p + 1) + bias_h
  (``softmax_scaling``, per head). The config cannot give them; the schedule names them
  (``learned_frequency_scale``, ``learned_query_scale``; the formula: ``posenc.temperature.log_position_scale``).
- Chunked attention (Llama 4): RoPE layers attend within blocks of ``attention_chunk_size`` tokens.
- Sink logits (gpt-oss): each head has a learned logit that joins every softmax as one more column and is dropped
  after it, so a query may give part of its weight to no key. No token is kept for it: StreamingLLM's attention
  sinks (the ``sinks`` attention method, the first tokens kept in the cache) are another thing.
- DeepSeek's softmax scale (DeepSeek-V2/V3, MiniCPM3, Kimi K2, ...): with a scaled rope type and
  ``mscale_all_dim``, the softmax scale is qk_head_dim^-0.5 * g(factor, mscale_all_dim)^2, g = YaRN's mscale
  (``posenc.rope.scaling.yarn_mscale``): 1.3689^2 = 1.874 for DeepSeek-V3 (factor 40, mscale_all_dim 1).
- Rotation layout: most models pair dims (j, j + d/2) ("half"); Llama 4, GPT-J, Cohere, GLM and DeepSeek pair
  (2j, 2j + 1) ("interleaved"; DeepSeek-V3 de-interleaves after rotating, which leaves q.k unchanged).

Every rule here is read as transformers' config class and attention module of that family read it (the tests
compare with tiny transformers models).

    >>> schedule = layer_schedule("Llama-4-Scout/config.json")
    >>> schedule.nope_layers                      # [3, 7, 11, ...]
    >>> q = q * schedule.temperature_tuning.query_scale(positions)[:, None]   # on NoPE layers
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from posenc._internal.validate import check_float, check_int, is_int
from posenc._internal.errors import ConfigError
from posenc.rope.config import (CONFIG_DEFAULTS, LOCAL_GLOBAL_THETA, RopeConfig, as_mapping,  # noqa: F401
                                config_value,
                                layer_type_parameters, load_rope_config, model_type_of, rope_attention_keys,
                                rope_section)
from posenc.rope.scaling import yarn_mscale
from posenc.temperature import attention_temperature, query_temperature

# model types whose attention rotates interleaved pairs (2j, 2j+1): complex-number RoPE (Llama 4, DeepSeek-V2),
# rotate_every_two (GPT-J, CodeGen), repeat_interleave'd cos/sin (Cohere, GLM); DeepSeek-V3 when rope_interleave
INTERLEAVED_LAYOUT_TYPES = frozenset({"llama4", "llama4_text", "llama4_vision_model", "deepseek_v2", "gptj",
                                      "codegen", "cohere", "cohere2", "glm", "glm4", "glm4v", "glm4v_text",
                                      "deepseek_v3", "kimi_k2", "mistral4", "mistral_large4",
                                      "mistral_large4_text"})
# of those, the families whose attention reads rope_interleave (default true) and rotates halves when it is false
ROPE_INTERLEAVE_KEY_TYPES = frozenset({"deepseek_v3", "mistral4"})
# model types whose configs carry mscale_all_dim but whose attention does not rescale the softmax (Hunyuan;
# Ministral 3, whose attention keeps head_dim^-0.5 and scales q by its query temperature instead)
NO_SOFTMAX_MSCALE_TYPES = frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe", "ministral3"})
# model types that read no_rope_layers / no_rope_layer_interval, and those with Llama 4's temperature tuning
# (Mistral Large 4's text config, mistral_large4_text, reads them as SmolLM3 does and accepts a longer list)
NOPE_LAYER_TYPES = frozenset({"llama4", "llama4_text", "smollm3", "mistral_large4", "mistral_large4_text"})
# model types with LeRoPE's learned per-pair frequency factors and a learned per-head log-position query scale
# (MistralLarge4TextRotaryEmbedding.alpha, MistralLarge4TextSoftmaxScaling): weights, not config keys
LEARNED_POSITION_WEIGHT_TYPES = frozenset({"mistral_large4", "mistral_large4_text"})
TEMPERATURE_TUNING_TYPES = frozenset({"llama4", "llama4_text"})
# layer kinds (layer_types entries) with no q/k attention, hence nothing to rotate: Qwen3-Next / Qwen3.5's Gated
# DeltaNet layers ("linear_attention") and LFM2's short convolutions ("conv"), as their transformers decoder layers
# build them (no self_attn module, no position embeddings read)
POSITIONLESS_LAYER_KINDS = frozenset({"linear_attention", "conv"})
# model types whose attention adds a learned per-head sink logit to every softmax (transformers' s_aux)
SINK_LOGIT_TYPES = frozenset({"gpt_oss"})
# model types whose layer_types default to a repeating local/global pattern, as their transformers config classes
# build it: (key giving the period or None, default period). Layer i is global when (i + 1) % period == 0
# (ModernBERT: when i % period == 0), sliding otherwise.
LAYER_PATTERNS = {"gemma2": (None, 2), "gemma3_text": ("sliding_window_pattern", 6), "gemma3n_text": (None, 5),
                  "cohere2": ("sliding_window_pattern", 4), "olmo3": (None, 4), "gpt_oss": (None, 2),
                  "modernbert": ("global_attn_every_n_layers", 3),
                  "modernbert-decoder": ("global_attn_every_n_layers", 3)}


def config_mapping(config) -> Mapping:
    """The part of a config (mapping, path, transformers config) holding its text model's attention keys."""
    return rope_section(as_mapping(config))


@dataclass(frozen=True)
class TemperatureTuning:
    """Llama 4's attention temperature for NoPE layers: q is multiplied by
    log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 at absolute position p (1 below floor_scale - 1)."""

    floor_scale: float
    attn_scale: float

    def query_scale(self, positions) -> torch.Tensor:
        """float32 multipliers for q at ``positions`` (any shape of absolute positions, integers)."""
        positions = torch.as_tensor(positions)
        if positions.is_floating_point() or positions.dtype == torch.bool or positions.is_complex():
            raise ConfigError(f"positions must be integers, got {positions.dtype}")
        return attention_temperature(positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale)


@dataclass(frozen=True)
class QueryTemperature:
    """Ministral 3's query temperature on every layer: q (after RoPE) is multiplied by
    1 + beta * ln(1 + floor(p / original)) at absolute position p (1 below ``original``)."""

    beta: float
    original: int

    def query_scale(self, positions) -> torch.Tensor:
        """float32 multipliers for q at ``positions`` (any shape of absolute positions, integers)."""
        positions = torch.as_tensor(positions)
        if positions.is_floating_point() or positions.dtype == torch.bool or positions.is_complex():
            raise ConfigError(f"positions must be integers, got {positions.dtype}")
        return query_temperature(positions, beta=self.beta, original=self.original)


@dataclass(frozen=True)
class LayerSchedule:
    """What each layer does with positions, plus the logit-scale effects outside cos/sin.

    Attributes:
        num_layers: num_hidden_layers (None when the config does not say).
        layer_types: attention kind per layer ("full_attention", "sliding_attention", "chunked_attention", ...),
            None when the config defines none.
        rope: per layer, whether it rotates q and k (None: every layer does, count unknown).
        rope_layer_types: per layer, the ``layer_type=`` to read its RoPE parameters with (``Rotary.from_config``,
            ``rope_parameters``), None for configs with one set; None entries are NoPE layers.
        attention_chunk_size: block size of chunked-attention layers (Llama 4), else None.
        sliding_window: window of sliding-attention layers, else None.
        temperature_tuning: Llama 4's NoPE-layer query temperature, else None.
        softmax_scale_multiplier: multiplies qk_head_dim^-0.5 (DeepSeek's mscale^2; 1 elsewhere).
        layout: "half" or "interleaved", the pairing the model's attention rotates.
        query_temperature: the every-layer query temperature of Ministral 3 / Mistral Small 4
            (llama_4_scaling_beta), else None.
        sink_logits: whether each head's softmax has a learned sink logit (gpt-oss), which no token carries.
        learned_frequency_scale: whether the checkpoint multiplies each pair's frequency by a learned exp(alpha_j)
            (LeRoPE, Mistral Large 4): the frequencies read from the config are those before it.
        learned_query_scale: whether every layer multiplies q at position p by a learned per-head
            scale_h * ln(p + 1) + bias_h (Mistral Large 4's softmax scaling).
    """

    num_layers: int | None
    layer_types: tuple[str, ...] | None
    rope: tuple[bool, ...] | None
    rope_layer_types: tuple[str | None, ...] | None
    attention_chunk_size: int | None
    sliding_window: int | None
    temperature_tuning: TemperatureTuning | None
    softmax_scale_multiplier: float
    layout: str
    query_temperature: QueryTemperature | None = None
    sink_logits: bool = False
    learned_frequency_scale: bool = False
    learned_query_scale: bool = False

    @property
    def nope_layers(self) -> list[int]:
        """Indices of layers that do not rotate q and k."""
        return [] if self.rope is None else [i for i, r in enumerate(self.rope) if not r]

    def softmax_scale(self, qk_head_dim: int) -> float:
        """The scale attention logits q.k get: qk_head_dim^-0.5 x ``softmax_scale_multiplier``.

        qk_head_dim: the full q/k head width (DeepSeek MLA: qk_nope_head_dim + qk_rope_head_dim = 192, not the
        64-dim RoPE part). RoPE's attention_scaling multiplies cos and sin on top of this (logits x its square).
        """
        return check_int(qk_head_dim, "qk_head_dim", min=1, error=ConfigError) ** -0.5 * self.softmax_scale_multiplier


def rope_layout(config) -> str:
    """"interleaved" when the model family rotates pairs (2j, 2j+1) (``INTERLEAVED_LAYOUT_TYPES``), else "half"
    (transformers' rotate_half). ``config``: a mapping / path / transformers config (a RopeConfig: "half")."""
    if isinstance(config, RopeConfig):
        return "half"
    cfg = config_mapping(config)
    model_type = model_type_of(cfg)
    if model_type in ROPE_INTERLEAVE_KEY_TYPES and not cfg.get("rope_interleave", True):
        return "half"                             # their attention tests the key's truth: null rotates halves
    return "interleaved" if model_type in INTERLEAVED_LAYOUT_TYPES else "half"


def softmax_scale_multiplier(config, *, rope: RopeConfig | None = None) -> float:
    """DeepSeek's softmax-scale factor g(factor, mscale_all_dim)^2 (1.0 when the rule does not apply).

    transformers' DeepSeek-style attention (yarn_apply_mscale): when the rope type is not "default" and
    mscale_all_dim is set (non-zero), qk_head_dim^-0.5 is multiplied by g(factor, mscale_all_dim)^2, with
    g(s, m) = 0.1 m ln s + 1 for s > 1. Families listed in ``NO_SOFTMAX_MSCALE_TYPES`` ignore the key.
    config: a mapping / path / transformers config, or a RopeConfig (no family known: DeepSeek's rule);
    rope: the config's RopeConfig when already loaded (saves reading it twice).
    """
    if not isinstance(config, RopeConfig):
        cfg = config_mapping(config)
        if model_type_of(cfg) in NO_SOFTMAX_MSCALE_TYPES or layer_type_parameters(cfg) is not None:
            return 1.0
        config = rope if rope is not None else load_rope_config(cfg)
    mscale_all_dim, factor = config.params.get("mscale_all_dim"), config.params.get("factor")
    if config.rope_type == "default" or not mscale_all_dim or factor is None:
        return 1.0
    mscale_all_dim = check_float(mscale_all_dim, "mscale_all_dim", min=0, error=ConfigError)
    factor = check_float(factor, "factor", positive=True, error=ConfigError)
    g = yarn_mscale(factor, mscale_all_dim)
    if not math.isfinite(g * g):
        raise ConfigError(f"mscale_all_dim {mscale_all_dim!r} with factor {factor!r} gives a softmax-scale multiplier "
                          "g(factor, mscale_all_dim)^2 that is not finite")
    return g * g


def _query_temperature(cfg: Mapping) -> QueryTemperature | None:
    """Ministral 3's (and Mistral Small 4's) query temperature from its RoPE parameters (llama_4_scaling_beta with the original length), or
    None when the family's attention reads none. A given beta needs original_max_position_embeddings, as the
    attention divides the position by it."""
    beta = rope_attention_keys(cfg).get("llama_4_scaling_beta")
    if beta is None:
        return None
    beta = check_float(beta, "llama_4_scaling_beta", min=0, error=ConfigError)
    original = load_rope_config(cfg).original_max_position_embeddings
    if original is None:
        raise ConfigError("llama_4_scaling_beta needs original_max_position_embeddings in the RoPE parameters: the "
                          "query temperature divides each position by it")
    return QueryTemperature(beta=beta, original=original)


def _num_layers(cfg: Mapping) -> int | None:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if cfg.get(key) is not None:
            return check_int(cfg[key], key, min=1, error=ConfigError)
    return None


def _rope_flags(cfg: Mapping, n: int | None) -> tuple[bool, ...] | None:
    """Per-layer "rotates q/k" from no_rope_layers (1 = RoPE) or its interval, for families that read them."""
    model_type = model_type_of(cfg)
    if model_type not in NOPE_LAYER_TYPES or n is None:
        return None
    flags = cfg.get("no_rope_layers")
    # Llama 4 falls back to the interval when the list is empty; the others only when it is absent
    if flags is None or (flags == [] and model_type in TEMPERATURE_TUNING_TYPES):
        interval = check_int(cfg.get("no_rope_layer_interval", 4), "no_rope_layer_interval", min=1,
                             error=ConfigError)
        return tuple((i + 1) % interval != 0 for i in range(n))
    if model_type in LEARNED_POSITION_WEIGHT_TYPES and isinstance(flags, list) and len(flags) > n:
        flags = flags[:n]                          # "at least the same length" (MistralLarge4TextConfig)
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) for f in flags):
        raise ConfigError(f"no_rope_layers must list 0 / 1 (1 = the layer uses RoPE) for each of the "
                          f"num_hidden_layers = {n} layers, got {str(flags)[:80]}")
    return tuple(bool(f) for f in flags)


def _layer_types(cfg: Mapping, n: int | None, rope: tuple[bool, ...] | None, chunk: int | None):
    given = cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or not all(isinstance(t, str) for t in given) \
                or (n is not None and len(given) != n):
            raise ConfigError(f"layer_types must list one attention kind (a string) per layer "
                              f"({n} layers), got {str(given)[:80]}")
        return tuple(given)
    if n is None:
        return None
    model_type = model_type_of(cfg)
    if model_type in TEMPERATURE_TUNING_TYPES and rope is not None:       # Llama4TextConfig
        return tuple("chunked_attention" if r and chunk is not None else "full_attention" for r in rope)
    if model_type == "smollm3" and rope is not None:
        sliding = config_value(cfg, "use_sliding_window") and config_value(cfg, "sliding_window") is not None
        return tuple("sliding_attention" if sliding and not r else "full_attention" for r in rope)
    if model_type in LAYER_PATTERNS:
        key, default = LAYER_PATTERNS[model_type]
        period = default if key is None or cfg.get(key) is None else \
            check_int(cfg[key], key, min=1, error=ConfigError)
        if model_type.startswith("modernbert"):      # ModernBertConfig: layer 0, n, 2n, ... are global
            return tuple("sliding_attention" if i % period else "full_attention" for i in range(n))
        return tuple("sliding_attention" if (i + 1) % period else "full_attention" for i in range(n))
    return None


def layer_schedule(config) -> LayerSchedule:
    """The per-layer positional schedule of a config (mapping, path to config.json, transformers config).

    Raises ConfigError for malformed schedule keys (no_rope_layers of the wrong length or values, non-positive
    attention_chunk_size / floor_scale, layer_types that are not one string per layer).
    """
    cfg = config_mapping(config)
    n = _num_layers(cfg)
    rope = _rope_flags(cfg, n)
    chunk = config_value(cfg, "attention_chunk_size")
    if chunk is not None:
        chunk = check_int(chunk, "attention_chunk_size", min=1, error=ConfigError)
    layer_types = _layer_types(cfg, n, rope, chunk)
    entries = layer_type_parameters(cfg)
    rope_keys = None
    if entries is not None and layer_types is not None:
        missing = sorted({t for t in layer_types if t not in entries})
        if missing:
            raise ConfigError(f"layer_types {missing} have no entry in the per-layer-type RoPE parameters "
                              f"{sorted(entries)}")
        rope_keys = tuple(t if entries[t] is not None else None for t in layer_types)
        rope = tuple(k is not None for k in rope_keys) if rope is None else \
            tuple(r and k is not None for r, k in zip(rope, rope_keys))
    if layer_types is not None and any(t in POSITIONLESS_LAYER_KINDS for t in layer_types):
        attends = tuple(t not in POSITIONLESS_LAYER_KINDS for t in layer_types)
        rope = attends if rope is None else tuple(r and a for r, a in zip(rope, attends))
    tuning = None
    if model_type_of(cfg) in TEMPERATURE_TUNING_TYPES and cfg.get("attn_temperature_tuning", True):
        tuning = TemperatureTuning(
            floor_scale=check_float(cfg.get("floor_scale", 8192), "floor_scale", positive=True, error=ConfigError),
            attn_scale=check_float(cfg.get("attn_scale", 0.1), "attn_scale", min=0, error=ConfigError))
        if rope is not None and all(rope):
            tuning = None                         # it only acts on NoPE layers
    window = config_value(cfg, "sliding_window")
    if window is not None and not (is_int(window) and window > 0):
        window = None                             # some configs write 0 / false for "no window"
    if config_value(cfg, "use_sliding_window") is False:    # Qwen2 / Qwen3 / SmolLM3: the window is off
        window = None
    if model_type_of(cfg) in ("modernbert", "modernbert-decoder"):   # local_attention is the whole window
        window = check_int(cfg.get("local_attention", 128), "local_attention", min=2, error=ConfigError) // 2
    multiplier = softmax_scale_multiplier(cfg)
    if not math.isfinite(multiplier) or multiplier <= 0:
        raise ConfigError(f"the softmax-scale multiplier g(factor, mscale_all_dim)^2 = {multiplier!r} is not a "
                          "positive finite number")
    return LayerSchedule(num_layers=n, layer_types=layer_types, rope=rope, rope_layer_types=rope_keys,
                         attention_chunk_size=chunk if layer_types is None or "chunked_attention" in layer_types
                         else None,
                         sliding_window=window if layer_types is None or "sliding_attention" in layer_types
                         else None,
                         temperature_tuning=tuning, softmax_scale_multiplier=multiplier, layout=rope_layout(cfg),
                         query_temperature=_query_temperature(cfg),
                         sink_logits=model_type_of(cfg) in SINK_LOGIT_TYPES,
                         learned_frequency_scale=model_type_of(cfg) in LEARNED_POSITION_WEIGHT_TYPES,
                         learned_query_scale=model_type_of(cfg) in LEARNED_POSITION_WEIGHT_TYPES)


# ---- extending a config with RoPE parameters per layer type -------------------------------------------------------
# The one rule every context-extension writer follows (posenc extend, and through it eval, tune, finetune, export and
# search; pick's snippet; llama.cpp's GGUF form): only the full-attention (global) layers' RoPE is rescaled. They see
# every distance up to the context; sliding / chunked layers see only their window, which stays inside the trained
# range, so their RoPE keeps the meaning the model trained with. transformers' Gemma 3 reads a 4.x rope_scaling the
# same way (onto the full_attention entry only), and llama.cpp scales only Gemma 3's full-attention layers.
GLOBAL_LAYER_TYPE = "full_attention"
# the top-level keys a local/global family keeps its bases in (Gemma 3's rope_local_base_freq, ModernBERT's two)
# (rope_theta, which OLMo 3 and Gemma 3 use for the global base, is the ordinary key, written with the global RoPE)
_LOCAL_GLOBAL_KEYS = frozenset(k for keys in LOCAL_GLOBAL_THETA.values() for k in keys[:2] if k) - {"rope_theta"}


def global_rope_entry(config) -> dict | None:
    """The RoPE parameters of the full-attention (global) layers of a config with RoPE parameters per layer type
    (Gemma 3, ModernBERT, OLMo 3), as transformers standardises them; None for a config with one set.

    ConfigError (one line, naming the entries) when the per-layer-type parameters have no full-attention entry, or
    a null one: which layers a context extension should rescale is then not stated. ``config``: a mapping / path /
    transformers config (its text part is read).
    """
    entries = layer_type_parameters(config_mapping(config))
    if entries is None:
        return None
    entry = entries.get(GLOBAL_LAYER_TYPE)
    if entry is None:
        state = "is null (no RoPE)" if GLOBAL_LAYER_TYPE in entries else "is missing"
        raise ConfigError(f"the config has RoPE parameters per layer type ({', '.join(entries)}) but its "
                          f"{GLOBAL_LAYER_TYPE!r} entry {state}: a context extension rescales the global "
                          "(full-attention) layers only, and which those are is not stated")
    return dict(entry)


def global_rope_view(config) -> dict | None:
    """A config with RoPE parameters per layer type as a config with one set, that of its global layers: every key
    kept but the RoPE ones, and ``rope_parameters`` the full-attention entry (rope_theta inside). What a single-set
    writer (``posenc extend``) edits; ``with_global_rope`` puts the edit back. None for a config with one set;
    ConfigError as ``global_rope_entry``'s."""
    entry = global_rope_entry(config)
    if entry is None:
        return None
    cfg = config_mapping(config)
    view = {k: v for k, v in cfg.items()
            if k not in {"rope_parameters", "rope_scaling", "rope_theta"} | _LOCAL_GLOBAL_KEYS}
    view["rope_parameters"] = entry
    return view


def global_rope_config(config) -> RopeConfig:
    """The RopeConfig a context extension rescales: that of the global (full-attention) layers for a config with
    RoPE parameters per layer type, else the config's one set (``load_rope_config``). ConfigError as
    ``global_rope_entry``'s and ``load_rope_config``'s."""
    view = global_rope_view(config)
    return load_rope_config(config if view is None else view)


def with_global_rope(config, edited: Mapping, *, transformers_version: int = 5) -> dict:
    """``edited`` (``global_rope_view(config)`` after an edit, its RoPE in transformers' ``transformers_version``
    form: 5 a flat ``rope_parameters``, 4 ``rope_scaling`` + ``rope_theta``) with the RoPE of ``config``'s other
    layer types put back unchanged: in the 5.x form a nested ``rope_parameters`` (the other entries as the file
    gives them), in the 4.x form the family's local base key beside rope_scaling (Gemma 3's rope_local_base_freq).

    The result is read back: every other entry must mean what it meant. ConfigError when a form cannot say that
    (4.x for a family whose rope_scaling also reaches the local layers, ModernBERT, or with no such key), naming the
    5.x form; and as ``global_rope_entry``'s.
    """
    cfg = config_mapping(config)
    if global_rope_entry(cfg) is None:
        raise ConfigError("with_global_rope: the config has one set of RoPE parameters, not one per layer type")
    entries = layer_type_parameters(cfg)
    out = {k: v for k, v in edited.items() if k not in _LOCAL_GLOBAL_KEYS}
    if transformers_version == 5:
        out["rope_parameters"] = {k: (dict(edited["rope_parameters"]) if k == GLOBAL_LAYER_TYPE else v)
                                  for k, v in entries.items()}
        for key in ("rope_scaling", "rope_theta"):    # inside the nested entries now (5.x prefers rope_scaling)
            out.pop(key, None)
    else:
        keys = LOCAL_GLOBAL_THETA.get(model_type_of(cfg))
        local = entries.get("sliding_attention")
        if keys is not None and keys[1] is not None and local is not None:
            out[keys[1]] = local.get("rope_theta")
    kept = layer_type_parameters(out)
    if kept is None or any(kept.get(k) != v for k, v in entries.items() if k != GLOBAL_LAYER_TYPE):
        raise ConfigError(f"transformers {transformers_version}.x's form cannot rescale the {GLOBAL_LAYER_TYPE} "
                          "RoPE of this config without changing its other layer types' "
                          f"({', '.join(k for k in entries if k != GLOBAL_LAYER_TYPE)}): write the 5.x form "
                          "(nested rope_parameters; --transformers-version 5)")
    return out
