"""What a Hugging Face config does with positions, as data: the scheme it uses (``detect_scheme``) and the full
description ``posenc inspect`` prints (``inspect_config``).

For RoPE configs: rope type and parameters per layer type, head and rotary dims, the rotation layout, how many
frequency pairs are kept / blended / interpolated, multimodal position axes (M-RoPE sections), the attention
scaling and the effective logit scale (with DeepSeek's softmax multiplier), the longest wavelength against the
original context, the context the config claims, the per-layer schedule (NoPE layers, Llama 4's temperature
tuning, Ministral 3's query temperature, gpt-oss's sink logits, chunked / sliding attention), a vision tower's 2-D
RoPE, and warnings for inconsistent settings. Configs
without RoPE are recognised and described: ALiBi (BLOOM, MPT, Falcon/Baichuan variants), learned absolute tables
(GPT-2, OPT, BERT...), sinusoidal tables (Marian...) and T5's relative bias buckets. Every number comes from the
scaling registry (posenc.rope.scaling); nothing here recomputes a scaling formula.

It sits below the tools, so ``posenc eval``, ``search`` and the tools read a config's facts from one place;
``posenc.tools.inspect`` formats the report and is the command.

    >>> report = inspect_config("config.json")        # a dict; posenc.tools.inspect.format_report gives the text
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from posenc._internal.validate import check_float, check_int, is_int, is_number
from posenc._internal.errors import ConfigError
from posenc.rope.contexts import claimed_context, context_length, trained_length


def read_config(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Return a config as a plain dict: a mapping is deep-copied; a path (a config.json or a folder holding one) is
    read with ``posenc.rope.config.read_config_file`` (ConfigError naming the file when missing, unreadable, not
    JSON or not a JSON object).
    """
    from posenc.rope.config import read_config_file

    if isinstance(config, Mapping):
        return json.loads(json.dumps(config))  # a deep copy that also rejects non-JSON values early
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a path to a config.json or a mapping, got {type(config).__name__}")
    return read_config_file(config)

# model_type -> scheme, for configs that carry no position keys of their own
_ALIBI_TYPES = {"bloom"}
_LEARNED_TYPES = {"gpt2", "gpt_neo", "opt", "gpt_bigcode", "bert", "roberta", "xlm-roberta", "distilbert", "bart",
                  "mbart", "electra", "biogpt", "blenderbot", "camembert", "layoutlm", "imagegpt", "ctrl"}
_SINUSOIDAL_TYPES = {"marian", "fsmt", "m2m_100", "xglm", "pegasus", "speech_to_text", "nllb_moe"}
_T5_TYPES = {"t5", "mt5", "umt5", "longt5", "switch_transformers"}
_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim", "rotary_pct", "rotary_emb_base",
              "partial_rotary_factor", "rope_local_base_freq", "global_rope_theta", "local_rope_theta")
_ROPE_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
               "gemma3", "gemma3_text", "phi", "phi3", "gpt_neox", "gptj", "falcon", "starcoder2", "olmo", "olmo2",
               "cohere", "stablelm", "internlm2", "deepseek_v2", "deepseek_v3", "granite", "persimmon", "codegen",
               "baichuan", "mistral3", "llama4", "llama4_text", "glm", "glm4", "exaone", "nemotron", "smollm3",
               "modernbert", "modernbert-decoder", "hunyuan_v1_dense", "hunyuan_v1_moe", "qwen2_vl", "qwen2_5_vl",
               "qwen3_vl", "qwen3_vl_text", "gemma3n_text", "cohere2", "olmo3", "kimi_k2", "ministral3",
               "mistral4", "mistral_large4", "mistral_large4_text"}


# ------------------------------------------------------------------------------------------ scheme detection

def _first(cfg: Mapping, *keys) -> tuple[str | None, Any]:
    """(key, value) of the first of ``keys`` holding a non-null value, or (None, None)."""
    for key in keys:
        if cfg.get(key) is not None:
            return key, cfg[key]
    return None, None


def _length(cfg: Mapping, *keys) -> int | None:
    """The first of ``keys`` the config gives, checked as a context length (ConfigError naming the key for a
    string, a float, a non-positive value or one past MAX_CONTEXT); None when none is given."""
    key, value = _first(cfg, *keys)
    return None if key is None else context_length(value, key)


_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")


def _rotary_fraction(cfg: Mapping) -> tuple[str | None, Any]:
    """(key, value) of the rotary fraction a config gives (partial_rotary_factor, GPT-NeoX's rotary_pct; at the
    top level or in the RoPE dict), or (None, None)."""
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    for where in (cfg, scaling if isinstance(scaling, Mapping) else {}):
        key, value = _first(where, "partial_rotary_factor", "rotary_pct")
        if key is not None:
            return key, value
    return None, None


def detect_scheme(cfg: Mapping, _nested: bool = False) -> tuple[str, str]:
    """Return (scheme, why) with scheme in rope / nope / alibi / learned / sinusoidal / relative_bias / unknown."""
    from posenc.rope.config import vision_config_of

    model_type = str(cfg.get("model_type", "")).lower()
    attn = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), Mapping) else {}
    if model_type in _ALIBI_TYPES:
        return "alibi", f"model_type {model_type!r} uses ALiBi"
    if attn.get("alibi"):
        return "alibi", "attn_config.alibi is true (MPT)"
    if cfg.get("alibi") is True:
        return "alibi", "alibi is true (Falcon RW style)"
    if cfg.get("position_embedding_type") == "alibi":
        return "alibi", "position_embedding_type is 'alibi'"
    if model_type == "baichuan" and cfg.get("hidden_size") == 5120:
        return "alibi", "Baichuan 13B (hidden_size 5120) uses ALiBi; the 7B uses RoPE (heuristic on hidden_size)"
    if model_type in _T5_TYPES or "relative_attention_num_buckets" in cfg:
        return "relative_bias", "T5-style learned relative position buckets"
    key, fraction = _rotary_fraction(cfg)
    if is_number(fraction) and fraction == 0:
        return "nope", f"{key} is 0: no dimension is rotated"
    if any(cfg.get(k) is not None for k in _ROPE_KEYS):
        return "rope", "RoPE keys present"
    if model_type in _ROPE_TYPES:
        return "rope", f"model_type {model_type!r} uses RoPE (defaults apply: no RoPE keys in the file)"
    if vision_config_of(cfg) is cfg:
        return "rope", f"a vision tower with 2-D (axial) RoPE (model_type {model_type!r})"
    if isinstance(cfg.get("text_config"), Mapping) and not _nested:   # one level: text configs do not nest
        scheme, why = detect_scheme(cfg["text_config"], _nested=True)
        return scheme, f"text_config: {why}"
    if model_type in _SINUSOIDAL_TYPES or cfg.get("static_position_embeddings") is True:
        return "sinusoidal", f"model_type {model_type!r} uses a fixed sinusoidal table"
    pet = cfg.get("position_embedding_type")
    if model_type in _LEARNED_TYPES or pet == "absolute" or "n_positions" in cfg:
        return "learned", f"model_type {model_type!r} uses a learned absolute position table"
    return "unknown", "no RoPE, ALiBi or position-table keys recognised"


# ----------------------------------------------------------------------------------------------------- RoPE

# Families whose transformers attention reads `getattr(config, "head_dim", None) or hidden_size //
# num_attention_heads` (modeling_mistral / mixtral / ministral3 / starcoder2 / minimax / voxtral_realtime, 5.x): for
# them head_dim 0 means "derive it", as posenc.rope.config reads it. Every other family's attention takes head_dim
# as given (`getattr(config, "head_dim", hidden // heads)`: Llama, Qwen, Gemma... ~160 modeling files), so 0 there
# builds no model (Llama's attention fails on head_dim ** -0.5) although its rotary alone would derive the ratio:
# refused like any other non-positive head_dim.
# null / absent head_dim is "derive it" in every family (the config classes fill it in).
HEAD_DIM_DERIVED_TYPES = {"mistral", "mixtral", "ministral3", "starcoder2", "minimax", "voxtral_realtime"}


def _check_head_dim(cfg: Mapping) -> None:
    from posenc.rope.config import model_type_of

    head_dim = cfg.get("head_dim")
    if head_dim is None:
        return
    model_type = model_type_of(cfg)
    if is_number(head_dim) and head_dim == 0:
        if model_type in HEAD_DIM_DERIVED_TYPES:
            return
        raise ConfigError(f"head_dim must be a positive integer, got 0: transformers' {model_type or 'model'} "
                          "attention takes head_dim as given and cannot build 0-wide heads; omit it or set it to "
                          "null to derive hidden_size // num_attention_heads")
    check_int(head_dim, "head_dim", min=1, error=ConfigError)


def _inspect_rope(cfg: Mapping, layer_type: str | None, seq_len: int | None, multiplier: float,
                  reach: int | None = None) -> dict[str, Any]:
    import torch

    from posenc.rope.apply import default_inv_freq
    from posenc.rope.config import load_rope_config
    from posenc.rope.layers import rope_layout
    from posenc.rope.multiaxis import axis_count
    from posenc.rope.registry import rope_type_function
    from posenc.rope.scaling import frequency_bands, rope_parameters

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rc = load_rope_config(cfg, layer_type)
        claimed, claimed_from = claimed_context(rc)
        original = trained_length(rc)
        at = seq_len or claimed or (2 * rc.max_position_embeddings if rc.max_position_embeddings else None)
        inv, attention_scaling = rope_parameters(rc, at)
        bands = frequency_bands(rc, at)
        axes = _position_axes(rc)
    caught = [str(w.message) for w in record]

    inv = inv.double()
    whole_head = rope_type_function(rc.rope_type).whole_head
    if whole_head:
        # Gemma 4: head_dim // 2 frequencies theta^(-2j/head_dim), zeros past the rotated pairs
        base = default_inv_freq(rc.head_dim, rc.theta).double()[: inv.numel()]
    else:
        base = default_inv_freq(rc.rotary_dim, rc.theta).double()
    if base.numel() != inv.numel():
        raise ConfigError(f"rope_type {rc.rope_type!r} gave {inv.numel()} frequencies for rotary_dim "
                          f"{rc.rotary_dim} (expected {base.numel()})")
    rotated = inv > 0                               # removed / unrotated pairs have inv 0: no wavelength
    base_rot = base[: rc.rotary_dim // 2] if whole_head else base
    longest_default = _finite(2 * math.pi / base_rot.min()) if base_rot.numel() else None
    if rotated.any():
        longest = _finite(2 * math.pi / inv[rotated].min())
        shortest = _finite(2 * math.pi / inv[rotated].max())
        mean_interp = _finite(torch.exp(torch.log(base[rotated] / inv[rotated]).mean()))
    else:
        longest = shortest = mean_interp = None
    warn = [*dict.fromkeys(caught)]  # unique, in order
    warn += _rope_consistency(cfg, rc, claimed, original, longest, at, reach)
    params = {k: (f"[{len(v)} values {min(v):g}..{max(v):g}]" if isinstance(v, list) and k != "mrope_section"
                  and v and all(_is_num(x) for x in v) else v)
              for k, v in rc.params.items()}
    return {
        "layer_type": layer_type,
        "rope_type": rc.rope_type,
        "rope_theta": rc.theta,
        "parameters": params,
        "head_dim": rc.head_dim,
        "rotary_dim": rc.rotary_dim,
        "partial_rotary_factor": rc.partial_rotary_factor,
        "pairs": rc.rotary_dim // 2,
        # MLA (DeepSeek, Mistral 4): RoPE acts on the qk_rope_head_dim part of each q/k head only
        "mla": {"qk_rope_head_dim": rc.rotary_dim, "qk_nope_head_dim": cfg["qk_nope_head_dim"]}
        if is_int(cfg.get("qk_rope_head_dim")) and is_int(cfg.get("qk_nope_head_dim")) else None,
        "layout": rope_layout(cfg),
        "position_axes": axes,
        "max_position_embeddings": rc.max_position_embeddings,
        "original_context": original,
        "claimed_context": claimed,
        "claimed_context_from": claimed_from,
        "evaluated_at_length": at,
        "bands": {k: bands.get(k, 0) for k in ("kept", "blended", "interpolated", "removed")},
        "attention_scaling": float(attention_scaling),
        "logit_scaling": float(attention_scaling) ** 2,
        "softmax_scale_multiplier": multiplier,
        "effective_logit_scale": float(attention_scaling) ** 2 * multiplier,
        "longest_wavelength": longest,
        "longest_wavelength_unscaled": longest_default,
        "longest_wavelength_over_original_context": (longest_default / original)
        if original and longest_default else None,
        "shortest_wavelength": shortest,
        "mean_interpolation": mean_interp,
        "warnings": warn,
        "_axis_count": axis_count(rc),
    }


def _is_num(x) -> bool:
    return is_number(x)


def _position_axes(rc) -> dict[str, Any] | None:
    """M-RoPE: how the pairs split between the t / h / w position rows; None for 1-D positions."""
    from posenc.rope.multiaxis import position_axes

    axes = position_axes(rc)
    if axes is None:
        return None
    counts = [int((axes == a).sum()) for a in range(int(axes.max()) + 1)]
    return {"kind": "mrope", "axes": ["temporal", "height", "width"][: len(counts)], "pairs_per_axis": counts,
            "mrope_section": rc.params.get("mrope_section"),
            "interleaved": bool(rc.params.get("mrope_interleaved", False))}


def _inspect_vision(vision: Mapping) -> dict[str, Any]:
    """The 2-D (axial) RoPE of a vision tower: two position axes (patch row, column), never rescaled."""
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import rope_parameters

    from posenc.rope.layers import rope_layout

    rc = load_rope_config(vision)
    inv, _ = rope_parameters(rc)
    half = inv.numel() // 2
    llama4 = vision.get("model_type") == "llama4_vision_model"     # axis 0 is the column there
    first, second = ("column", "row") if llama4 else ("row", "column")
    helper = "llama4_vision_position_ids: (column + 1, row + 1), CLS at 0" if llama4 else "vision_position_ids"
    return {
        "model_type": vision.get("model_type"),
        "rope_type": rc.rope_type,
        "rope_theta": rc.theta,
        "head_dim": rc.head_dim,
        "rotary_dim": rc.rotary_dim,
        "pairs_per_axis": {first: half, second: inv.numel() - half},
        "layout": rope_layout(vision),
        "longest_wavelength_patches": _finite(2 * math.pi / float(inv.min())) if float(inv.min()) > 0 else None,
        "note": f"positions are the patch coordinates of each image (posenc.rope.mm_positions.{helper}); they are "
                "bounded by the image size, so context extension does not apply",
    }


def axes_text(vision: dict) -> str:
    """"22 pairs by patch row, 22 by patch column", axes in the tower's pair order."""
    return ", ".join(f"{n} pairs by patch {axis}" for axis, n in vision["pairs_per_axis"].items())


def _schedule(cfg: Mapping) -> dict[str, Any]:
    """Per-layer schedule: which layers rotate, attention kinds, temperature tuning, query temperature, softmax
    multiplier."""
    from collections import Counter

    from posenc.rope.layers import POSITIONLESS_LAYER_KINDS, layer_schedule

    s = layer_schedule(cfg)
    tuning = s.temperature_tuning
    return {
        "num_layers": s.num_layers,
        "nope_layers": s.nope_layers,
        # the kinds of layer with no q/k attention at all among them (linear attention, convolutions)
        "positionless_kinds": sorted({s.layer_types[i] for i in s.nope_layers} & POSITIONLESS_LAYER_KINDS)
        if s.layer_types else [],
        "rope_layers": None if s.rope is None else sum(s.rope),
        "layer_types": None if s.layer_types is None else dict(Counter(s.layer_types)),
        "attention_chunk_size": s.attention_chunk_size,
        "sliding_window": s.sliding_window,
        "temperature_tuning": None if tuning is None else {
            "floor_scale": tuning.floor_scale, "attn_scale": tuning.attn_scale,
            "applies_to": "NoPE layers: q x (log(1 + floor((p + 1) / floor_scale)) x attn_scale + 1)"},
        "query_temperature": None if s.query_temperature is None else {
            "beta": s.query_temperature.beta, "original": s.query_temperature.original,
            "applies_to": "every layer: q x (1 + beta x ln(1 + floor(p / original)))"},
        "softmax_scale_multiplier": s.softmax_scale_multiplier,
        "sink_logits": s.sink_logits,
        # Mistral Large 4's learned position weights (LeRoPE's exp(alpha) per pair, a per-head log-position scale)
        "learned_frequency_scale": s.learned_frequency_scale,
        "learned_query_scale": s.learned_query_scale,
        "layout": s.layout,
    }


def _finite(x) -> float | None:
    """float(x), or None when it is inf / nan (JSON has no Infinity)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _rope_consistency(cfg, rc, claimed, original, longest, at, reach=None) -> list[str]:
    """Checks transformers does not make: lengths that disagree, partial-rotary mismatches, aliasing.

    reach: the farthest distance this layer type attends over when it is bounded (a sliding window)."""
    out = []
    lmax, l0, s = rc.max_position_embeddings, rc.original_max_position_embeddings, rc.params.get("factor")
    # yarn and longrope read the factor as Lmax / L0 (transformers warns / derives it); llama3's factor is only the
    # low-frequency divisor (Llama 3.1 pairs factor 8 with 8k -> 128k), so it is not checked against the lengths
    if rc.rope_type in ("yarn", "longrope") and lmax and l0 and s:
        implied = lmax / l0
        if implied == 1 and s != 1:
            out.append(f"max_position_embeddings ({lmax}) equals the original context, but the {rc.rope_type} "
                       f"factor {s:g} claims {int(round(s * l0))}: tools that read max_position_embeddings "
                       f"(generation limits, serving max length) will stop at {lmax}")
        elif not math.isclose(implied, s, rel_tol=1e-3):
            out.append(f"factor {s:g} does not match max_position_embeddings / original_max_position_embeddings "
                       f"= {lmax}/{l0} = {implied:g}")
    if rc.rope_type == "linear" and s and lmax and "original_max_position_embeddings" not in cfg:
        out.append(f"linear scaling has no original length in the config: assuming max_position_embeddings "
                   f"({lmax}) is the extended length, i.e. original {int(round(lmax / s))} (the file cannot say; "
                   "a model may have been trained longer and scaled past Lmax / factor)")
    if original and claimed and original > claimed:
        out.append(f"the original context ({original}) is longer than the claimed context ({claimed})")
    prf = rc.partial_rotary_factor
    if prf < 1 and not math.isclose(rc.head_dim * prf, rc.rotary_dim, abs_tol=1e-9):
        out.append(f"partial_rotary_factor {prf:g} x head_dim {rc.head_dim} = {rc.head_dim * prf:g} is not an "
                   f"integer; int() truncates it to rotary_dim {rc.rotary_dim}")
    inner = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    if "rope_theta" in inner and "rope_theta" in cfg and inner["rope_theta"] != cfg["rope_theta"]:
        out.append(f"rope_theta is {cfg['rope_theta']} at the top level but {inner['rope_theta']} inside "
                   "rope_parameters; the inner value is used")
    span = min(at, reach) if at and reach else at
    if span and longest is not None and longest < span:
        out.append(f"the longest wavelength ({longest:,.0f} tokens) is shorter than the "
                   + (f"sliding window ({span:,})" if span != at else f"length evaluated ({at:,})")
                   + ": every pair wraps around, so far positions alias onto nearer ones")
    if lmax is None:
        out.append("max_position_embeddings is absent: the config claims no context length")
    elif "max_position_embeddings" not in cfg and "n_positions" not in cfg:
        from posenc.rope.config import model_type_of

        out.append(f"max_position_embeddings is absent: transformers' {model_type_of(cfg)} config class puts "
                   f"{lmax:,} in its place, which is what the model runs with (used here)")
    return out


# ----------------------------------------------------------------------------------------- non-RoPE schemes

def _inspect_alibi(cfg: Mapping) -> dict[str, Any]:
    from posenc.alibi import MAX_HEADS, alibi_slopes

    attn = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), Mapping) else {}
    key, n = _first(cfg, *_HEAD_KEYS)
    info: dict[str, Any] = {"n_heads": None, "warnings": [],
                            "context": _length(cfg, "max_seq_len", "seq_length", "max_position_embeddings",
                                               "model_max_length")}
    if key is None:
        info["warnings"].append(f"no head count ({' / '.join(_HEAD_KEYS)}) in the config: slopes unknown")
    else:
        info["n_heads"] = check_int(n, key, min=1, max=MAX_HEADS, error=ConfigError)
        info["slopes"] = [float(x) for x in alibi_slopes(info["n_heads"])]
    bias_max = attn.get("alibi_bias_max")
    if bias_max is not None:
        bias_max = check_float(bias_max, "attn_config.alibi_bias_max", positive=True, error=ConfigError)
        if bias_max != 8:
            info["warnings"].append(f"alibi_bias_max={bias_max:g} (not 8): slopes are 2^(-{bias_max:g}h/H), not "
                                    "the paper's 2^(-8h/H) listed here")
    if info["context"] is None:
        info["context_note"] = "no length in the config: ALiBi has no position table, so no hard limit"
    else:
        info["context_note"] = "trained/declared length; ALiBi runs past it without a table limit"
    return info


def _inspect_learned(cfg: Mapping) -> dict[str, Any]:
    n = _length(cfg, "n_positions", "max_position_embeddings", "n_ctx")
    info = {"table_size": n, "warnings": []}
    if str(cfg.get("model_type")) == "opt":
        info["note"] = "OPT offsets positions by 2, so its table holds max_position_embeddings + 2 rows"
    if n is None:
        info["warnings"].append("no table size (n_positions / max_position_embeddings) in the config")
    return info


def inspect_config(config: str | os.PathLike | Mapping[str, Any], *, seq_len: int | None = None) -> dict[str, Any]:
    """Describe the positional encoding of a Hugging Face config (a path to config.json, a folder, or a mapping).

    seq_len: evaluate length-dependent values (dynamic NTK, LongRoPE short/long factors, attention scaling) at this
    length instead of the claimed context. Returns a JSON-serialisable dict; see format_report for the text form.
    """
    if seq_len is not None:
        context_length(seq_len, "seq_len")
    try:
        cfg = read_config(config)
    except RecursionError:
        raise ConfigError("the config nests JSON objects / lists too deeply to read (a config.json is a few "
                          "levels deep)") from None
    scheme, why = detect_scheme(cfg)
    report: dict[str, Any] = {
        "source": None if isinstance(config, Mapping) else os.fspath(config),
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "scheme": scheme,
        "detected_by": why,
    }
    gguf_notes = []
    if not isinstance(config, Mapping):
        from posenc.gguf import is_gguf, read_gguf

        if is_gguf(config):
            g = read_gguf(config)
            report["gguf"] = {"architecture": g.architecture, "name": g.metadata.get("general.name"),
                              "keys": g.rope_keys, "rope_scaling_keys": g.scaling, "tensor_types": g.tensor_types,
                              "note": "the settings transformers' GGUF loader builds from these keys are "
                                      "described below"}
            gguf_notes = g.notes
    if scheme == "rope":
        _describe_rope(report, cfg, seq_len)
    elif scheme == "alibi":
        report["alibi"] = _inspect_alibi(cfg)
        report["warnings"] = report["alibi"].pop("warnings")
    elif scheme == "learned":
        report["learned"] = _inspect_learned(cfg)
        report["claimed_context"] = report["learned"]["table_size"]
        report["warnings"] = report["learned"].pop("warnings")
    elif scheme == "relative_bias":
        # transformers' T5Config defaults: 32 buckets, max distance 128
        buckets = _first(cfg, "relative_attention_num_buckets")[1]
        report["relative_bias"] = {
            "num_buckets": 32 if buckets is None else check_int(buckets, "relative_attention_num_buckets", min=1,
                                                                error=ConfigError),
            "max_distance": _length(cfg, "relative_attention_max_distance") or 128}
        report["warnings"] = []
    elif scheme == "sinusoidal":
        dim_key, dim = _first(cfg, "d_model", "hidden_size")
        report["sinusoidal"] = {"table_size": _length(cfg, "max_position_embeddings", "max_source_positions"),
                                "dim": None if dim_key is None else check_int(dim, dim_key, min=1, error=ConfigError)}
        report["warnings"] = []
    elif scheme == "nope":
        report["warnings"] = []
    else:
        report["warnings"] = ["positional encoding not recognised; nothing to describe"]
    report["warnings"] = gguf_notes + report["warnings"]
    report["description"] = _describe(report)
    return report


def _describe_rope(report: dict[str, Any], cfg: Mapping, seq_len: int | None) -> None:
    """The RoPE part of ``inspect_config``'s report: the vision tower, the per-layer schedule and one entry per
    RoPE layer type, with their warnings (written into ``report``)."""
    from posenc.rope.config import rope_layer_types, rope_section, vision_config_of

    vision = vision_config_of(cfg)
    if vision is not None:
        report["vision"] = _inspect_vision(vision)
    if vision is cfg:            # a vision tower on its own: no text RoPE to describe
        report["rope"], report["layers"], report["warnings"] = [], None, []
    else:
        rope_cfg = rope_section(cfg)
        _check_head_dim(rope_cfg)
        layer_types = rope_layer_types(rope_cfg)
        if layer_types == []:
            raise ConfigError("every layer type has null RoPE parameters: nothing uses RoPE")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # the same warnings are recorded per layer type below
            report["layers"] = _schedule(rope_cfg)
        multiplier = report["layers"]["softmax_scale_multiplier"]
        window = report["layers"]["sliding_window"]
        report["rope"] = [_inspect_rope(rope_cfg, lt, seq_len, multiplier,
                                        window if lt == "sliding_attention" else None)
                          for lt in layer_types or [None]]
        for entry in report["rope"]:
            entry.pop("_axis_count")
        report["warnings"] = list(dict.fromkeys(w for entry in report["rope"] for w in entry["warnings"]))


def _describe(report: dict[str, Any]) -> str:
    scheme = report["scheme"]
    if scheme == "alibi":
        a = report["alibi"]
        heads = "each head" if a["n_heads"] is None else f"each of the {a['n_heads']} heads"
        return (f"ALiBi: no position embedding; {heads} adds -m_h*distance to its scores. "
                "Extrapolates past the trained length without changes (Press et al. 2022, Table 2), but far tokens "
                "are penalised linearly.")
    if scheme == "learned":
        n = report["learned"]["table_size"]
        return (f"Learned absolute positions: a table of {n} rows added to the token embeddings. Positions past "
                f"{n} do not exist: no extrapolation, and extending needs new rows plus training.")
    if scheme == "sinusoidal":
        return "Fixed sinusoidal table added to the embeddings (the original Transformer); poor extrapolation."
    if scheme == "nope":
        return (f"No positional encoding (NoPE; {report['detected_by']}): order comes only from the causal mask "
                "(Kazemnejad et al. 2023). Nothing to rescale for a longer context.")
    if scheme == "relative_bias":
        r = report["relative_bias"]
        return (f"T5 relative position buckets: {r['num_buckets']} learned biases per head, log-spaced up to "
                f"distance {r['max_distance']}; farther tokens share the last bucket.")
    if scheme == "rope" and not report["rope"]:
        v = report["vision"]
        return (f"Vision tower with 2-D RoPE ({v['rope_type']}): rotates all {v['head_dim']} dims per head, "
                f"{axes_text(v)}.")
    if scheme == "rope":
        e = report["rope"][0]
        text = f"RoPE ({e['rope_type']}): rotates {e['rotary_dim']} of {e['head_dim']} dims per head"
        if e.get("mla"):
            text += (f" (MLA: the qk_rope_head_dim part of each {sum(e['mla'].values())}-dim q/k head; "
                     f"its {e['mla']['qk_nope_head_dim']} qk_nope_head_dim dims are not rotated)")
        if e["position_axes"]:
            text += (f", multimodal (M-RoPE{', interleaved' if e['position_axes']['interleaved'] else ''}): "
                     f"t/h/w positions on {'/'.join(map(str, e['position_axes']['pairs_per_axis']))} pairs")
        layers = report.get("layers") or {}
        if layers.get("nope_layers"):
            text += f"; {len(layers['nope_layers'])} of {layers['num_layers']} layers use no positional encoding"
        if len(report["rope"]) > 1:
            text += f"; {len(report['rope'])} layer types with their own RoPE"
        return text + "."
    return "Unknown positional encoding."
