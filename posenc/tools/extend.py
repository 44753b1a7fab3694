"""``posenc extend CONFIG --target-length N --method M``: write a config.json extended to a longer context.

The new RoPE dict is written in the form the user's transformers reads: ``rope_scaling`` (4.x, rope_theta stays at
the top level) or ``rope_parameters`` (5.x, rope_theta inside). Every other key is kept as it was; the input file
is never overwritten unless asked (``--in-place``); the write is atomic. The result is checked by evaluating it
through the scaling registry (``posenc.rope_parameters``) before anything is written.

The methods and the configs they write come from the extension-method registry (``posenc.extensions``); the
built-ins (s = target / original context L0, unless --factor is given):
    linear    PI: {"rope_type": "linear", "factor": s}; max_position_embeddings = target.
    ntk       static NTK-aware. transformers has no such rope_type, so it is written as the equivalent base change:
              rope_type "default" with rope_theta' = theta * s^(d/(d-2)) (taken from the registry's "ntk" type).
    dynamic   {"rope_type": "dynamic", "factor": s}; max_position_embeddings stays L0 (dynamic NTK scales
              relative to it, so the config cannot state the target).
    yarn      {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}; max = target.
    llama3    Llama 3.1's published low_freq_factor 1, high_freq_factor 4, plus factor and L0; max = target.
    longrope  short/long factor lists from --short-factor/--long-factor JSON files, or both from --longrope FILE
              (``posenc search``'s rope_scaling.json: factors searched on the model); without them an
              UNSEARCHED initialisation: short = 1 (unchanged inside L0), long_j = default_j / yarn_j (YaRN's
              keep/blend/interpolate per pair, from the registry). extend runs no search (posenc search does).

RoPE per layer type (Gemma 3's local / global layers, ModernBERT, OLMo 3): only the full-attention (global) entry
is rescaled, with s = target / that entry's original context; the sliding entry is written back unchanged (its
layers attend within their window, inside the trained range), in the nested rope_parameters of the 5.x form or
the 4.x form's rope_scaling (beside Gemma 3's rope_local_base_freq) where the family's config class reads that
for the global layers only (Gemma 3, OLMo 3; not ModernBERT). The rule is posenc.rope.layers' (``global_rope_view``,
``with_global_rope``); a per-layer-type config with no full_attention entry is refused.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from posenc._internal.outputs import check_output
from posenc._internal.validate import check_choice, check_float, check_int
from posenc.attention.registry import attention_method_names
from posenc._internal.errors import ConfigError
from posenc.extensions import ExtensionSpec, get_method, method_config, method_names, transformers_config
from posenc.rope.config import BASE_KEY_TYPES, KEY_ALIASES, RopeConfig, load_rope_config
from posenc.rope.families import SCALED_BY_DEFAULT_TYPES
from posenc.rope.scaling import dynamic_ntk_theta, frequency_bands, ntk_theta, rope_parameters
from posenc.tools._io import read_config, write_json_atomic
from posenc.tools.lab_evidence import fill
from posenc.rope.contexts import MAX_CONTEXT, trained_length
from posenc.tools.inspect import HEAD_DIM_DERIVED_TYPES, detect_scheme

HELP = "Write a config.json extended to a longer context with a RoPE scaling method (linear, ntk, yarn, ...)."

# transformers' GPT-J and CodeGen build their sin/cos table from rotary_dim with base 10000 and read no RoPE keys
IGNORES_ROPE_KEYS = {"gptj", "codegen"}
# model types whose transformers config class accepts only some rope types (Phi3Config.validate_rope: default and
# longrope; it also renames yarn to longrope and then asks for factor lists)
ACCEPTED_ROPE_TYPES = {"phi3": ("default", "longrope"), "phi4_multimodal": ("default", "longrope")}


@dataclass
class ExtendResult:
    """The extended config plus what changed and what to expect."""

    config: dict[str, Any]
    method: str
    factor: float
    original_context: int
    target_length: int
    transformers_version: int
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    check: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Request:
    """What ``_validated`` establishes about one extend call: the method, the config (its text part for multimodal
    configs: ``outer`` is the whole file, ``text_key`` where the part sits), its RoPE, the original context and
    the factor s."""

    method: Any
    outer: dict
    text_key: str | None
    cfg: dict
    rc: RopeConfig
    old_warnings: set
    original: int
    factor: float
    layered: dict | None = None      # the text config as given when its RoPE is per layer type (cfg: its global view)

    @property
    def base(self) -> float:
        """The base the model trained with: rope_theta, raised by a scaling that only raises it (Hunyuan's
        NTK-alpha: theta x alpha^(d/(d-2)) at every length). A replacing method scales from it and keeps it."""
        from posenc.rope.scaling import trained_theta

        return trained_theta(self.rc.rope_type, self.rc.theta, self.rc.params, self.rc.rotary_dim)


def extend_config(config: str | os.PathLike | Mapping[str, Any], target_length: int, method: str, *,
                  transformers_version: int = 5, factor: float | None = None, short_factor=None, long_factor=None,
                  replace: bool = False) -> ExtendResult:
    """Return the config extended to ``target_length`` tokens with ``method`` (see the module docstring).

    config: a path to config.json (or folder) or a mapping; transformers_version: 4 (``rope_scaling``) or 5
    (``rope_parameters``); factor: override s = target / original; short_factor / long_factor: longrope lists or
    JSON files; replace: allow replacing an existing non-default scaling (computed from its original context).
    Raises ConfigError (a ValueError) for a non-RoPE config, an unknown method, a target not longer than the
    original context, or a result the registry rejects.

    Four steps: validate the request, compute the method's scaling, write it in the version's form, check the
    written config through the registry (then the changes and notes are described).
    """
    req = _validated(config, target_length, method, transformers_version, factor, replace)
    options = {k: v for k, v in (("short_factor", short_factor), ("long_factor", long_factor)) if v is not None}
    own, scaling, max_positions, notes = _computed(req, method, target_length, options)
    new, lmax_key = _written(req, scaling, max_positions, transformers_version, notes)
    check = _self_check(req, new, own, scaling, target_length)
    new = _put_back(req, new, transformers_version)
    changes = _changes(req.layered if req.layered is not None else req.cfg, new)
    _add_notes(notes, req, target_length, factor, transformers_version, lmax_key)
    if req.text_key is not None:
        changes = [f"{req.text_key}.{change}" for change in changes]
        new = {**req.outer, req.text_key: new}
    return ExtendResult(config=new, method=method, factor=req.factor, original_context=req.original,
                        target_length=target_length, transformers_version=transformers_version, changes=changes,
                        notes=notes, check=check)


def unscaled_config(config: str | os.PathLike | Mapping[str, Any], *, transformers_version: int = 5) -> dict:
    """The config with its RoPE scaling removed: plain RoPE (rope_type default) at the base the model trained with
    and its original context as max_position_embeddings -- what ``--replace`` computes a method from, for a
    caller that changes attention instead of the config (``posenc tune``'s attention candidates on a fine-tuned
    model). A config without a scaling comes back with the same RoPE. ConfigError as ``extend_config``'s."""
    # the longest target is only a probe: _validated checks the request; the scaling written is none
    req = _validated(config, MAX_CONTEXT, "linear", transformers_version, None, True)
    new, _ = _written(req, {"rope_type": "default"}, req.original, transformers_version, [])
    new = _put_back(req, new, transformers_version)
    return {**req.outer, req.text_key: new} if req.text_key is not None else new


def _put_back(req: _Request, new: dict, transformers_version: int) -> dict:
    """The written text config, for a config with RoPE per layer type its global layers' new RoPE put back beside
    the other layer types' unchanged RoPE (``posenc.rope.layers.with_global_rope``); else ``new`` itself."""
    if req.layered is None:
        return new
    from posenc.rope.layers import with_global_rope

    return with_global_rope(req.layered, new, transformers_version=transformers_version)


def _changes(old: Mapping, new: Mapping) -> list[str]:
    """"key: old -> new" for each key that changed; a nested rope_parameters (one entry per layer type) entry by
    entry, so that the entries left as they were are not listed."""
    def nested(value):
        return isinstance(value, Mapping) and value and all(v is None or isinstance(v, Mapping) for v in value.values())

    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if key == "rope_parameters" and nested(a) and nested(b):
            out += [f"{key}.{change}" for change in _changes(a, b)]
        elif a != b:
            out.append(f"{key}: {_short(a)} -> {_short(b)}")
    return out


def _refuse_position_weights(cfg: Mapping) -> None:
    """ConfigError when the model's attention reads positions through more than the RoPE dict extend rewrites."""
    from posenc.rope.config import rope_attention_keys
    from posenc.rope.layers import LEARNED_POSITION_WEIGHT_TYPES

    if "llama_4_scaling_beta" in rope_attention_keys(cfg):
        raise ConfigError("the config's RoPE parameters carry a query temperature (llama_4_scaling_beta, Ministral 3 "
                          "/ Mistral Small 4) that divides positions by their original_max_position_embeddings: "
                          "extend would rewrite that dict without it, which the model's attention cannot run; edit "
                          "rope_parameters by hand")
    if cfg.get("model_type") in LEARNED_POSITION_WEIGHT_TYPES:
        raise ConfigError("Mistral Large 4 multiplies each RoPE frequency by a learned exp(alpha) (LeRoPE) and every "
                          "query by a learned per-head scale x ln(p + 1) + bias, both trained with its yarn: extend "
                          "cannot see those weights, so a rewritten RoPE dict would be computed blind to the "
                          "frequencies the model really uses; its yarn already reaches max_position_embeddings")


def _validated(config, target_length, method, transformers_version, factor, replace) -> _Request:
    """Every check of the request before anything is computed; ConfigError naming the argument otherwise."""
    from posenc.rope.config import rope_section, vision_config_of
    from posenc.rope.layers import global_rope_view

    m = get_method(method)
    if m.fit is not None:
        raise ConfigError(f"method {method!r} computes its config from a trained model and data, which extend does "
                          "not have; run it where the model is (posenc lab) and pass the result")
    if m.recalibrates:
        raise ConfigError(f"method {method!r} needs the model trained again at its trained length (recalibration), "
                          "which a config cannot express; run it in posenc lab with --finetune-steps")
    check_choice(transformers_version, "transformers_version (4: rope_scaling, 5: rope_parameters)", (4, 5),
                 error=ConfigError)
    check_int(target_length, "target_length", min=1, max=MAX_CONTEXT, error=ConfigError)
    cfg = read_config(config)
    scheme, why = detect_scheme(cfg)
    if scheme != "rope":
        raise ConfigError(f"extend needs a RoPE config; this one is {scheme} ({why}). "
                          + ("ALiBi runs past its trained length without a config change"
                             if scheme == "alibi" else "its positions cannot be rescaled by a config edit"))
    if vision_config_of(cfg) is cfg:
        raise ConfigError("this is a vision tower with 2-D (axial) RoPE: its positions are the row and column of "
                          "each image patch, bounded by the image size, so there is no context to extend; extend "
                          "the language model's config instead")
    outer, text_key = cfg, None
    if rope_section(cfg) is not cfg:      # multimodal: the language model's RoPE lives in its text_config
        text_key, cfg = "text_config", dict(cfg["text_config"])
    # RoPE per layer type (Gemma 3's local / global layers): the global layers' RoPE is extended as a config of
    # its own and put back beside the others, unchanged (posenc.rope.layers owns the rule)
    view = global_rope_view(cfg)
    layered, cfg = (None, cfg) if view is None else (cfg, view)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = load_rope_config(cfg)
    old_warnings = {str(w.message) for w in caught}
    _refuse_position_weights(rope_section(outer))    # the text config with its family filled in
    if rc.rope_type != "default" and not replace:
        raise ConfigError(f"the config already uses rope_type {rc.rope_type!r} (original context "
                          f"{trained_length(rc)}); pass --replace to swap it for {method!r} computed from that "
                          "original context")
    original = trained_length(rc)
    if original is None:
        raise ConfigError("the config has no max_position_embeddings (or original_max_position_embeddings): "
                          "the original context is unknown")
    if target_length <= original:
        raise ConfigError(f"target_length ({target_length}) must be longer than the original context ({original})")
    s = (float(target_length / original) if factor is None
         else check_float(factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError))
    if s == 1 and not m.keeps_original_length:
        # factor 1 leaves every frequency as it was, yet the written max_position_embeddings would claim the target:
        # a longer context on paper only. Dynamic NTK is the exception: it keeps max_position_embeddings at L0 and
        # still rescales past it (factor 1 is transformers' rule at its gentlest; see the note below).
        raise ConfigError(f"factor must be > 1 for method {method!r}: factor 1 changes no frequency while "
                          f"max_position_embeddings would claim {target_length} ({target_length / original:g}x "
                          f"the original context {original}); leave --factor out for target / original = "
                          f"{target_length / original:g}")
    return _Request(m, outer, text_key, cfg, rc, old_warnings, original, s, layered)


def _computed(req: _Request, method: str, target_length: int, options: dict):
    """-> (posenc's registry form of the method's config, the scaling transformers reads, the context length to
    write, notes)."""
    from posenc.rope.scaling import MULTI_AXIS_KEYS

    cfg, rc = req.cfg, req.rc
    spec = ExtensionSpec(original=req.original, factor=req.factor, rotary_dim=rc.rotary_dim, theta=req.base,
                         target=target_length, head_dim=rc.head_dim)
    own = method_config(method, spec, **options)         # posenc's registry form (the bands below read it)
    written = transformers_config(method, own, spec)
    scaling, notes = dict(written.scaling), list(written.notes)
    accepted = ACCEPTED_ROPE_TYPES.get(cfg.get("model_type"))
    if accepted is not None and scaling["rope_type"] not in accepted:
        raise ConfigError(f"model_type {cfg['model_type']!r}: transformers' config class accepts rope_type "
                          f"{' or '.join(accepted)} only and would refuse {scaling['rope_type']!r}; use --method "
                          "longrope (`posenc search` finds its factors) or ntk (written as a new base)")
    # M-RoPE keys say how positions split over the pairs (Qwen2-VL ...): they stay with any scaling, as the file
    # gives them (a default filled in by posenc's reader is not written: transformers would flag the unknown key)
    given = {k for d in (cfg.get("rope_scaling"), cfg.get("rope_parameters")) if isinstance(d, Mapping) for k in d}
    scaling.update({k: rc.params[k] for k in sorted(MULTI_AXIS_KEYS) if k in rc.params and k in given})
    if scaling["rope_type"] == "yarn" and rc.rope_type == "yarn" and rc.params.get("truncate") is False:
        # gpt-oss trains YaRN with an unrounded correction range: a YaRN written over it keeps that (a rounded
        # range moves the ramp's ends by up to a pair each side)
        scaling["truncate"] = False
        notes.append("kept truncate: false from the replaced yarn: the model was trained with an unrounded "
                     "correction range")
    return own, scaling, written.max_position_embeddings, notes


def _written(req: _Request, scaling: dict, max_positions: int, transformers_version: int,
             notes: list) -> tuple[dict, str]:
    """The new config (text part) in the version's form, and the key holding its context length."""
    cfg, rc, original = req.cfg, req.rc, req.original
    scaling = dict(scaling)
    theta = scaling.pop("rope_theta", req.base)
    new = dict(cfg)
    lmax_key = "max_position_embeddings"
    if cfg.get(lmax_key) is None and cfg.get(KEY_ALIASES[lmax_key]) is not None:
        lmax_key = KEY_ALIASES[lmax_key]  # GPT-J's n_positions: update the key the file uses
    new[lmax_key] = max_positions
    if "original_max_position_embeddings" in cfg:  # Phi-3 keeps L0 at the top level, and it wins over the dict's
        new["original_max_position_embeddings"] = original
    partial = cfg.get("partial_rotary_factor")
    old_inner = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    if transformers_version == 5:
        inner = {**scaling, "rope_theta": theta}
        if "partial_rotary_factor" in old_inner:
            inner["partial_rotary_factor"] = old_inner["partial_rotary_factor"]
        new["rope_parameters"] = inner
        new.pop("rope_scaling", None)   # transformers 5 prefers rope_scaling when both exist: drop the stale one
        new.pop("rope_theta", None)     # moved inside rope_parameters
    else:
        unscaled = scaling == {"rope_type": "default"} and cfg.get("model_type") not in SCALED_BY_DEFAULT_TYPES
        new["rope_scaling"] = None if unscaled else scaling
        base_key = BASE_KEY_TYPES.get(cfg.get("model_type"))
        if base_key is not None and base_key in cfg:     # the key transformers reads first for this family
            new[base_key] = theta
        if base_key is None or base_key not in cfg or "rope_theta" in cfg:
            new["rope_theta"] = theta
        new.pop("rope_parameters", None)
        if partial is None and "partial_rotary_factor" in old_inner:
            new["partial_rotary_factor"] = old_inner["partial_rotary_factor"]
    if cfg.get("model_type") in HEAD_DIM_DERIVED_TYPES and not cfg.get("head_dim"):
        # transformers' yarn / dynamic / longrope read config.head_dim, which e.g. MixtralConfig leaves None
        new["head_dim"] = rc.head_dim
        notes.append(f"head_dim written explicitly ({rc.head_dim} = hidden_size / num_attention_heads, what the "
                     "attention derives anyway): transformers' yarn, dynamic and longrope read config.head_dim")
    return new, lmax_key


def _self_check(req: _Request, new: dict, own, scaling: dict, target_length: int) -> dict:
    """The written config read back through the registry: it must load, give finite frequencies and the rope type
    written; -> what it reads as (type, theta, attention scaling, frequency bands, longest wavelength, warnings)."""
    rc, original = req.rc, req.original
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new_rc = load_rope_config(new)
        inv, attention = rope_parameters(new_rc, target_length)
        bands_rc = new_rc
        if own.scaling["rope_type"] != new_rc.rope_type:    # written in another form (ntk as a raised base): the
            bands_rc = RopeConfig(                         # bands are the method's against the original base
                rope_type=own.scaling["rope_type"], theta=req.base, head_dim=rc.head_dim, rotary_dim=rc.rotary_dim,
                partial_rotary_factor=rc.partial_rotary_factor, max_position_embeddings=own.max_position_embeddings,
                original_max_position_embeddings=original,
                params={k: v for k, v in own.scaling.items() if k != "rope_type"})
        bands = frequency_bands(bands_rc, target_length)
    new_warnings = [str(w.message) for w in caught if str(w.message) not in req.old_warnings]
    if new_rc.rope_type != scaling["rope_type"] or not bool(inv.isfinite().all()):
        raise ConfigError(f"internal check failed: the written config reads back as {new_rc.rope_type!r}")
    return {"rope_type": new_rc.rope_type, "rope_theta": new_rc.theta, "attention_scaling": attention,
            "bands": {k: bands.get(k, 0) for k in ("kept", "blended", "interpolated", "removed")},
            "longest_wavelength": float(2 * math.pi / inv.double().min()), "warnings": new_warnings}


def _add_notes(notes: list, req: _Request, target_length: int, factor, transformers_version: int,
               lmax_key: str) -> None:
    """What to expect of the written config, added to ``notes`` (a warning first, the method's note last)."""
    cfg, rc, original, s, m = req.cfg, req.rc, req.original, req.factor, req.method
    if factor is not None and not math.isclose(s, target_length / original):
        notes.append(f"factor {s:g} given explicitly (target / original would be {target_length / original:g})")
    if m.keeps_original_length:
        at_target = dynamic_ntk_theta(req.base, s, rc.rotary_dim, target_length, original)
        static = ntk_theta(req.base, target_length / original, rc.rotary_dim)
        notes.append(f"{lmax_key} stays {original}: dynamic NTK rescales relative to it from there on. "
                     f"At {target_length} tokens its base is {at_target:.7g} (transformers' rule with factor {s:g}); "
                     f"static NTK sized for this target would use {static:.7g}. --factor 1 makes dynamic reach "
                     "exactly that at the target (gentler); larger factors interpolate more")
    if rc.rope_type != "default":
        notes.append(f"replaced the existing {rc.rope_type!r} scaling; the model was trained with that one, so "
                     "expect to fine-tune")
    if req.base != rc.theta:
        notes.append(f"rope_theta {req.base:.7g} kept: the {rc.rope_type!r} scaling raised the base {rc.theta:g} to "
                     f"it at every length, so the model trained with it; {m.name} scales from it")
    if req.layered is not None:
        notes.insert(0, _layer_type_note(req, target_length))
    if transformers_version == 4:
        notes.append("written as rope_scaling with key 'rope_type' (transformers >= 4.45; older releases read "
                     "'type', and yarn/llama3 need >= 4.43/4.45)")
    if cfg.get("model_type") in IGNORES_ROPE_KEYS:
        notes.insert(0, f"WARNING: transformers' {cfg['model_type']} code reads no rope_theta / RoPE scaling keys "
                        "(base 10000 is hard-coded), so this config changes nothing there; it takes effect only in "
                        "code that reads these keys (posenc, some serving runtimes)")
    notes.append(fill(m.note))  # the lab's numbers in the note, from the packaged results


def _layer_type_note(req: _Request, target_length: int) -> str:
    """What extending a config with RoPE per layer type did: the global entry only, and why the others stay."""
    from posenc.rope.config import layer_type_parameters
    from posenc.rope.layers import GLOBAL_LAYER_TYPE, layer_schedule

    others = [k for k in layer_type_parameters(req.layered) if k != GLOBAL_LAYER_TYPE]
    head = (f"RoPE per layer type: only the {GLOBAL_LAYER_TYPE} (global) entry is rescaled, factor {req.factor:g} "
            f"(its original context {req.original}, target {target_length}); {', '.join(others)} left as given")
    try:
        window = layer_schedule(req.layered).sliding_window
    except ConfigError:
        window = None
    if window is not None and window <= req.original:
        return head + f": those layers attend within their {window}-token window, inside the trained range"
    return ("WARNING: " + head + ": their window "
            + ("is not stated" if window is None else f"({window} tokens) is longer than the original context")
            + ", so past it they see distances they did not train on")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."


def format_result(result: ExtendResult, out: str | None) -> str:
    c = result.check
    lines = [f"extend: {result.method} x{result.factor:g}  {result.original_context:,} -> "
             f"{result.target_length:,} tokens (transformers {result.transformers_version}.x form)"]
    if out:
        lines.append(f"wrote {out}")
    lines.append("changed:")
    lines += [f"  {change}" for change in result.changes]
    b = c["bands"]
    lines.append(f"check (via posenc.rope_parameters at {result.target_length:,} tokens): rope_type "
                 f"{c['rope_type']}, {b['kept']} kept / {b['blended']} blended / {b['interpolated']} "
                 f"interpolated pairs, attention scaling {c['attention_scaling']:.6g}, longest wavelength "
                 f"{c['longest_wavelength']:,.0f}")
    lines += [f"  ! {w}" for w in c["warnings"]]
    lines.append("notes:")
    lines += [f"  - {note}" for note in result.notes]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    from posenc._internal.flags import add_shared

    parser.add_argument("config", help="the model's config.json (or a folder holding one), or a .gguf file (with "
                                       "--out NEW.gguf: a new GGUF file for llama.cpp, every tensor copied)")
    add_shared(parser, "target_length", required=True, help="context length to extend to (tokens)")
    add_shared(parser, "method", choices=[m for m in method_names() if get_method(m).fit is None]
                        + list(attention_method_names()), required=True,
                        help="context-extension method (an attention method only for --out NEW.gguf, where "
                             "self-extend prints llama.cpp's group-attention flags)")
    parser.add_argument("--transformers-version", type=int, choices=(4, 5), default=5,
                        help="4: write rope_scaling (rope_theta at top level); 5: rope_parameters (default)")
    where = parser.add_mutually_exclusive_group(required=True)
    add_shared(where, "out", help="file to write the new config.json to ('-' prints it); for a .gguf input, a "
                                     "new .gguf name writes a GGUF file for llama.cpp")
    where.add_argument("--in-place", action="store_true", help="overwrite the input config (atomically)")
    add_shared(parser, "factor", default=None,
               help="scaling factor (default target / original context); > 1, or >= 1 for dynamic")
    parser.add_argument("--short-factor", help="longrope: JSON file with rotary_dim/2 short factors")
    parser.add_argument("--long-factor", help="longrope: JSON file with rotary_dim/2 long factors")
    parser.add_argument("--longrope", metavar="FILE",
                        help="longrope: both factor lists from one JSON file holding a longrope dict (posenc search's "
                             "rope_scaling.json, or a config.json whose rope_scaling/rope_parameters has them)")
    parser.add_argument("--replace", action="store_true",
                        help="replace an existing non-default rope scaling instead of refusing")


def longrope_factors(path: str | os.PathLike) -> tuple[list, list]:
    """(short_factor, long_factor) from a JSON file holding a longrope dict, or a config whose rope_scaling /
    rope_parameters holds one (``posenc search`` writes rope_scaling.json)."""
    try:
        data = read_config(path)
    except ConfigError as exc:
        raise ConfigError(f"--longrope {path}: {exc}") from None
    for candidate in (data, data.get("rope_scaling"), data.get("rope_parameters")):
        if isinstance(candidate, Mapping) and "long_factor" in candidate and "short_factor" in candidate:
            return candidate["short_factor"], candidate["long_factor"]
    raise ConfigError(f"--longrope {path}: expected a longrope dict with short_factor and long_factor (posenc "
                      "search's rope_scaling.json), or a config whose rope_scaling/rope_parameters holds one")


def _factor_files(args) -> None:
    """Check the longrope factor options against --method, and read --longrope FILE into ``args.short_factor`` /
    ``args.long_factor``."""
    if (args.short_factor or args.long_factor or args.longrope) and "short_factor" not in get_method(
            args.method).options:
        raise ConfigError("--short-factor/--long-factor/--longrope only apply to --method longrope")
    if args.longrope:
        if args.short_factor or args.long_factor:
            raise ConfigError("--longrope gives both factor lists: drop --short-factor/--long-factor")
        args.short_factor, args.long_factor = longrope_factors(args.longrope)


def run(args) -> int:
    from posenc.gguf import is_gguf

    src = Path(args.config)
    src_file = src / "config.json" if src.is_dir() else src
    if args.in_place and is_gguf(src):
        raise ConfigError(f"--in-place: {args.config} is a GGUF file, which extend does not rewrite; pass --out "
                          "config.json (load it with from_pretrained(folder, gguf_file=..., config=...) or into "
                          "the folder `posenc convert` writes)")
    if not args.in_place and args.out != "-":
        if os.path.realpath(args.out) == os.path.realpath(src_file):
            raise ConfigError(f"--out {args.out} is the input file; pass --in-place to overwrite it")
        check_output(args.out, f"--out {args.out}", inputs=[
            ("--short-factor file", args.short_factor), ("--long-factor file", args.long_factor),
            ("--longrope file", args.longrope)])
    if not args.in_place and is_gguf(src) and is_gguf(args.out):
        return _run_gguf(args)
    _factor_files(args)
    result = extend_config(src, args.target_length, args.method, transformers_version=args.transformers_version,
                           factor=args.factor, short_factor=args.short_factor, long_factor=args.long_factor,
                           replace=args.replace)
    if args.out == "-":
        json.dump(result.config, sys.stdout, indent=2)
        print()
        print(format_result(result, None), file=sys.stderr)
        return 0
    out = src_file if args.in_place else Path(args.out)
    write_json_atomic(out, result.config)
    print(format_result(result, str(out)))
    return 0


# ---- a GGUF file for llama.cpp (posenc.tools.extend_gguf says how llama.cpp reads each number) -------------------

def plan_gguf_extension(path: str | os.PathLike, target_length: int, method: str, *, factor: float | None = None,
                        short_factor=None, long_factor=None):
    """What ``posenc extend MODEL.gguf --out NEW.gguf`` writes (a posenc.tools.extend_gguf.GGUFExtension): the
    numbers ``extend_config`` computes for the file and method, in llama.cpp's keys and tensors. ConfigError for
    a method or architecture llama.cpp cannot run as posenc means it."""
    from posenc.gguf import read_gguf
    from posenc.tools import extend_gguf

    model = read_gguf(path)
    source = extend_gguf.extend_source(model, method)
    result = extend_config(source, target_length, method, transformers_version=5, factor=factor,
                           short_factor=short_factor, long_factor=long_factor)
    return extend_gguf.llama_cpp_form(model, result)


def _run_gguf(args) -> int:
    """``posenc extend MODEL.gguf --out NEW.gguf`` (--out already checked by run)."""
    from posenc.gguf import read_gguf
    from posenc.tools import extend_gguf

    src, out = args.config, args.out
    extend_gguf.check_method(args.method, read_gguf(src).architecture)
    if args.method == extend_gguf.SELF_EXTEND:
        extend_gguf.print_self_extend(src, args.target_length)
        return 0
    _factor_files(args)
    plan = plan_gguf_extension(src, args.target_length, args.method, factor=args.factor,
                               short_factor=args.short_factor, long_factor=args.long_factor)
    extend_gguf.write_gguf_extension(src, out, plan)
    print(extend_gguf.format_plan(plan, str(src), str(out)))
    return 0
