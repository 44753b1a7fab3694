"""``posenc extend CONFIG --target-length N --method M``: write a config.json extended to a longer context.

The new RoPE dict is written in the form the user's transformers reads: ``rope_scaling`` (4.x, rope_theta stays at
the top level) or ``rope_parameters`` (5.x, rope_theta inside). Every other key is kept as it was; the input file
is never overwritten unless asked (``--in-place``); the write is atomic. The result is checked by evaluating it
through the scaling registry (``posenc.rope_parameters``) before anything is written.

Per method (s = target / original context L0, unless --factor is given):
    linear    PI: {"rope_type": "linear", "factor": s}; max_position_embeddings = target.
    ntk       static NTK-aware. transformers has no such rope_type, so it is written as the equivalent base change:
              rope_type "default" with rope_theta' = theta * s^(d/(d-2)) (taken from the registry's "ntk" type).
    dynamic   {"rope_type": "dynamic", "factor": s}; max_position_embeddings stays L0 (dynamic NTK scales
              relative to it, so the config cannot state the target).
    yarn      {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}; max = target.
    llama3    Llama 3.1's published low_freq_factor 1, high_freq_factor 4, plus factor and L0; max = target.
    longrope  short/long factor lists from --short-factor/--long-factor JSON files; without them an
              UNSEARCHED initialisation: short = 1 (unchanged inside L0), long_j = default_j / yarn_j (YaRN's
              keep/blend/interpolate per pair, from the registry). LongRoPE's evolutionary search is not run.
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

from posenc.errors import ConfigError
from posenc.rope.config import KEY_ALIASES, load_rope_config
from posenc.tools._io import read_config, write_json_atomic

HELP = "Write a config.json extended to a longer context with a RoPE scaling method (linear, ntk, yarn, ...)."

METHODS = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
# transformers' GPT-J and CodeGen build their sin/cos table from rotary_dim with base 10000 and read no RoPE keys
IGNORES_ROPE_KEYS = {"gptj", "codegen"}
LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's published values

# What each method expects after the config change (evidence in facts.md §4 / the lesson).
FINE_TUNING = {
    "linear": "PI needs a fine-tune at the new length: Chen et al. (facts.md §4) report 16.10 ppl at 8k untuned, "
              "7.12 after 200 steps, 6.95 after 1000. Expect ~hundreds of steps / ~1B tokens (lesson).",
    "ntk": "static NTK-aware works zero-shot (lesson; the posenc probe: s=8 gives 7.7 ppl at 4x vs ~20 for PI); "
           "a short fine-tune helps further. It changes every frequency at every length, short inputs included.",
    "dynamic": "zero-shot: no fine-tuning expected (LongRoPE Table 1: 10.21 ppl at 2x, 23.29 at 4x from 4k, "
               "facts.md §4). Frequencies change with the sequence length; under a KV cache it is exact only "
               "if keys are cached before rotation.",
    "yarn": "YaRN is meant for a short fine-tune (facts.md §4: zero-shot YaRN can be poor, 32.64 ppl at 8k; "
            "fine-tuned at s=32: 3.56 at 8k, 2.37 at 128k, passkey 99.4%). Fine-tune on documents near the "
            "target length.",
    "llama3": "Meta paired llama3 scaling with long-context continued pretraining (Llama 3.1: 8k -> 128k); "
              "expect to train at the target length before relying on it.",
    "longrope": "LongRoPE's factors come from an evolutionary search, then a fine-tune; with searched factors "
                "it is the best zero-shot method in its Table 1 (9.37/11.34 at 8k/16k, facts.md §4).",
}


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


def _load_factor_list(value, name: str, n_pairs: int) -> list[float]:
    """A factor list given as a list or a path to a JSON file holding one; must have n_pairs numbers."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.exists():
            raise FileNotFoundError(f"{name} file not found: {path}")
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} file {path} is not valid JSON: {exc.msg}") from None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x) for x in value):
        raise ConfigError(f"{name} must be a JSON list of positive numbers, got {str(value)[:80]}")
    if len(value) != n_pairs:
        raise ConfigError(f"{name} must have rotary_dim // 2 = {n_pairs} numbers, got {len(value)}")
    return [float(x) for x in value]


def _geometry(rc) -> dict[str, Any]:
    """A minimal config mapping with rc's geometry, for asking the registry about another rope type."""
    return {"head_dim": rc.head_dim, "rotary_dim": rc.rotary_dim}


def _derived_longrope_long_factor(rc, s: float, original: int) -> list[float]:
    """Unsearched LongRoPE init: per-pair default / YaRN frequency (1 kept ... s interpolated), from the registry."""
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import rope_parameters

    yarn_inv, _ = rope_parameters({**_geometry(rc), "rope_parameters": {
        "rope_type": "yarn", "factor": s, "original_max_position_embeddings": original, "rope_theta": rc.theta}})
    ratio = default_inv_freq(rc.rotary_dim, rc.theta).double() / yarn_inv.double()
    return [float(f"{r:.6g}") for r in ratio.tolist()]


def _scaling_dict(method: str, s: float, original: int, rc, short_factor, long_factor) -> tuple[dict, list[str]]:
    notes: list[str] = []
    if method == "linear":
        return {"rope_type": "linear", "factor": s}, notes
    if method == "dynamic":
        return {"rope_type": "dynamic", "factor": s}, notes
    if method == "yarn":
        return {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": original}, notes
    if method == "llama3":
        return {"rope_type": "llama3", "factor": s, **LLAMA3_DEFAULTS,
                "original_max_position_embeddings": original}, notes
    if method == "ntk":
        from posenc.rope.scaling import ntk_theta

        theta = ntk_theta(rc.theta, s, rc.rotary_dim)
        notes.append(f"transformers has no 'ntk' rope_type: static NTK is written as rope_type 'default' with "
                     f"rope_theta {rc.theta:g} -> {theta:g} (theta * s^(d/(d-2)), d = {rc.rotary_dim})")
        return {"rope_type": "default", "rope_theta": theta}, notes
    # longrope
    n_pairs = rc.rotary_dim // 2
    if (short_factor is None) != (long_factor is None):
        raise ConfigError("longrope needs both short_factor and long_factor (or neither, for the derived "
                          "initialisation)")
    if short_factor is None:
        short = [1.0] * n_pairs
        long = _derived_longrope_long_factor(rc, s, original)
        notes.append("longrope factors were NOT searched: short_factor = 1 (behaviour inside the original context "
                     "unchanged) and long_factor = YaRN's per-pair interpolation (1 for kept pairs ... "
                     f"{s:g} for interpolated ones). Run LongRoPE's search, or pass --short-factor/--long-factor, "
                     "for the paper's results")
    else:
        short = _load_factor_list(short_factor, "short_factor", n_pairs)
        long = _load_factor_list(long_factor, "long_factor", n_pairs)
    return {"rope_type": "longrope", "factor": s, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original}, notes


def extend_config(config: str | os.PathLike | Mapping[str, Any], target_length: int, method: str, *,
                  transformers_version: int = 5, factor: float | None = None, short_factor=None, long_factor=None,
                  replace: bool = False) -> ExtendResult:
    """Return the config extended to ``target_length`` tokens with ``method`` (see the module docstring).

    config: a path to config.json (or folder) or a mapping; transformers_version: 4 (``rope_scaling``) or 5
    (``rope_parameters``); factor: override s = target / original; short_factor / long_factor: longrope lists or
    JSON files; replace: allow replacing an existing non-default scaling (computed from its original context).
    Raises ConfigError (a ValueError) for a non-RoPE config, an unknown method, a target not longer than the
    original context, or a result the registry rejects.
    """
    from posenc.rope.config import layer_type_parameters, rope_section, vision_config_of
    from posenc.rope.scaling import MULTI_AXIS_KEYS, dynamic_ntk_theta, frequency_bands, ntk_theta, rope_parameters
    from posenc.tools.inspect import detect_scheme, original_context

    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if transformers_version not in (4, 5):
        raise ConfigError(f"transformers_version must be 4 (rope_scaling) or 5 (rope_parameters), "
                          f"got {transformers_version!r}")
    if isinstance(target_length, bool) or not isinstance(target_length, int) or target_length <= 0:
        raise ConfigError(f"target_length must be a positive integer, got {target_length!r}")
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
    if layer_type_parameters(cfg) is not None:
        raise ConfigError("this config has RoPE parameters per layer type (local / global layers, e.g. Gemma 3, "
                          "ModernBERT): extend writes one RoPE dict for every layer, which would also rescale the "
                          "local layers; edit the full_attention entry by hand")
    outer, text_key = cfg, None
    if rope_section(cfg) is not cfg:      # multimodal: the language model's RoPE lives in its text_config
        text_key, cfg = "text_config", dict(cfg["text_config"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = load_rope_config(cfg)
    old_warnings = {str(w.message) for w in caught}
    if rc.rope_type != "default" and not replace:
        raise ConfigError(f"the config already uses rope_type {rc.rope_type!r} (original context "
                          f"{original_context(rc)}); pass --replace to swap it for {method!r} computed from that "
                          "original context")
    original = original_context(rc)
    if original is None:
        raise ConfigError("the config has no max_position_embeddings (or original_max_position_embeddings): "
                          "the original context is unknown")
    if target_length <= original:
        raise ConfigError(f"target_length ({target_length}) must be longer than the original context ({original})")
    s = float(target_length / original) if factor is None else float(factor)
    if not (s >= 1 and math.isfinite(s)):
        raise ConfigError(f"factor must be a finite number >= 1, got {factor!r}")

    scaling, notes = _scaling_dict(method, s, original, rc, short_factor, long_factor)
    # M-RoPE keys say how positions split over the pairs (Qwen2-VL ...): they stay with any scaling
    scaling.update({k: rc.params[k] for k in sorted(MULTI_AXIS_KEYS) if k in rc.params})
    theta = scaling.pop("rope_theta", rc.theta)
    new = dict(cfg)
    lmax_key = "max_position_embeddings"
    if cfg.get(lmax_key) is None and cfg.get(KEY_ALIASES[lmax_key]) is not None:
        lmax_key = KEY_ALIASES[lmax_key]  # GPT-J's n_positions: update the key the file uses
    new[lmax_key] = original if method == "dynamic" else target_length
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
        new["rope_scaling"] = None if scaling == {"rope_type": "default"} else scaling
        new["rope_theta"] = theta
        new.pop("rope_parameters", None)
        if partial is None and "partial_rotary_factor" in old_inner:
            new["partial_rotary_factor"] = old_inner["partial_rotary_factor"]

    # check the result through the registry: it must load, give finite frequencies, and the rope type must be right
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new_rc = load_rope_config(new)
        inv, attention = rope_parameters(new_rc, target_length)
        bands = frequency_bands(new_rc, target_length)
    new_warnings = [str(w.message) for w in caught if str(w.message) not in old_warnings]
    expected_type = "default" if method == "ntk" else method
    if new_rc.rope_type != expected_type or not bool(inv.isfinite().all()):
        raise ConfigError(f"internal check failed: the written config reads back as {new_rc.rope_type!r}")
    check = {"rope_type": new_rc.rope_type, "rope_theta": new_rc.theta, "attention_scaling": attention,
             "bands": {k: bands.get(k, 0) for k in ("kept", "blended", "interpolated", "removed")},
             "longest_wavelength": float(2 * math.pi / inv.double().min()), "warnings": new_warnings}

    changes = []
    for key in sorted(set(cfg) | set(new)):
        if cfg.get(key, "<absent>") != new.get(key, "<absent>"):
            changes.append(f"{key}: {_short(cfg.get(key, '<absent>'))} -> {_short(new.get(key, '<absent>'))}")
    if factor is not None and not math.isclose(s, target_length / original):
        notes.append(f"factor {s:g} given explicitly (target / original would be {target_length / original:g})")
    if method == "dynamic":
        at_target = dynamic_ntk_theta(rc.theta, s, rc.rotary_dim, target_length, original)
        static = ntk_theta(rc.theta, target_length / original, rc.rotary_dim)
        notes.append(f"{lmax_key} stays {original}: dynamic NTK rescales relative to it from there on. "
                     f"At {target_length} tokens its base is {at_target:.7g} (transformers' rule with factor {s:g}); "
                     f"static NTK sized for this target would use {static:.7g}. --factor 1 makes dynamic reach "
                     "exactly that at the target (gentler); larger factors interpolate more")
    if rc.rope_type != "default":
        notes.append(f"replaced the existing {rc.rope_type!r} scaling; the model was trained with that one, so "
                     "expect to fine-tune")
    if transformers_version == 4:
        notes.append("written as rope_scaling with key 'rope_type' (transformers >= 4.45; older releases read "
                     "'type', and yarn/llama3 need >= 4.43/4.45)")
    if cfg.get("model_type") in IGNORES_ROPE_KEYS:
        notes.insert(0, f"WARNING: transformers' {cfg['model_type']} code reads no rope_theta / RoPE scaling keys "
                        "(base 10000 is hard-coded), so this config changes nothing there; it takes effect only in "
                        "code that reads these keys (posenc, some serving runtimes)")
    notes.append(FINE_TUNING[method])
    if text_key is not None:
        changes = [f"{text_key}.{change}" for change in changes]
        new = {**outer, text_key: new}
    return ExtendResult(config=new, method=method, factor=s, original_context=original, target_length=target_length,
                        transformers_version=transformers_version, changes=changes, notes=notes, check=check)


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
    parser.add_argument("config", help="the model's config.json (or a folder holding one)")
    parser.add_argument("--target-length", type=int, required=True, help="context length to extend to (tokens)")
    parser.add_argument("--method", choices=METHODS, required=True, help="context-extension method")
    parser.add_argument("--transformers-version", type=int, choices=(4, 5), default=5,
                        help="4: write rope_scaling (rope_theta at top level); 5: rope_parameters (default)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="file to write the new config.json to ('-' prints it)")
    where.add_argument("--in-place", action="store_true", help="overwrite the input config (atomically)")
    parser.add_argument("--factor", type=float, default=None,
                        help="scaling factor (default target / original context)")
    parser.add_argument("--short-factor", help="longrope: JSON file with rotary_dim/2 short factors")
    parser.add_argument("--long-factor", help="longrope: JSON file with rotary_dim/2 long factors")
    parser.add_argument("--replace", action="store_true",
                        help="replace an existing non-default rope scaling instead of refusing")


def run(args) -> int:
    src = Path(args.config)
    src_file = src / "config.json" if src.is_dir() else src
    if not args.in_place and args.out != "-" and Path(args.out).resolve() == src_file.resolve():
        raise ConfigError(f"--out {args.out} is the input file; pass --in-place to overwrite it")
    if args.method != "longrope" and (args.short_factor or args.long_factor):
        raise ConfigError("--short-factor/--long-factor only apply to --method longrope")
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
