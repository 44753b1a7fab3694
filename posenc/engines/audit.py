"""The cross-engine RoPE audit: every registered engine's rule on every RoPE layer type of a model at length L,
compared with transformers (the reference row): the largest angle difference over the pairs at position L
(L x max_j |inv_j - inv_ref_j|), the attention-factor ratio, the context limit, and what the engine does not run.

    >>> report = audit("config.json", length=32768)      # a dict; posenc.tools.audit formats it
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from posenc._internal.errors import ConfigError
from posenc.engines.builtin import engine_names
from posenc.engines.registry import ENGINES, AuditModel, EngineRope
from posenc.rope.contexts import claimed_context, context_length

REFERENCE = "transformers"
# angles closer than this at position L are the same rotation (float32 frequencies differ by rounding only)
ANGLE_TOLERANCE = 1e-3
RATIO_TOLERANCE = 1e-6


def load_model(source, length: int | None = None) -> tuple[AuditModel | None, str]:
    """(the AuditModel of a config.json / folder / mapping / .gguf file, "") or (None, why it has no text RoPE)."""
    from posenc.gguf import is_gguf, read_gguf
    from posenc.rope.config import load_rope_config, rope_layer_types, rope_section, vision_config_of
    from posenc.rope.describe import detect_scheme, read_config
    from posenc.rope.layers import rope_layout

    if length is not None:
        length = context_length(length, "length")
    cfg = read_config(source)
    scheme, why = detect_scheme(cfg)
    if scheme != "rope":
        return None, f"the model has no RoPE ({scheme}: {why})"
    if vision_config_of(cfg) is cfg:
        return None, "a vision tower's 2-D RoPE only: the audit covers a text model's RoPE"
    section = rope_section(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # inspect reports the config's warnings
        configs = {lt: load_rope_config(section, lt) for lt in rope_layer_types(section) or [None]}
        first = next(iter(configs.values()))
        claimed = claimed_context(first)[0]
    length = length or claimed or (2 * first.max_position_embeddings if first.max_position_embeddings else None)
    if length is None:
        raise ConfigError("length: the config states no context length; give --length")
    gguf = read_gguf(source) if not isinstance(source, Mapping) and is_gguf(source) else None
    name = "config" if isinstance(source, Mapping) else os.fspath(source)
    return AuditModel(name, section, section.get("model_type"), configs, length, rope_layout(section), gguf), ""


def _angle_gap(row: EngineRope, ref: EngineRope, length: int) -> tuple[float, int] | None:
    """(max |delta angle| at position ``length`` in radians, the pair where it is largest), or None when either row
    has no frequencies or their pair counts differ."""
    if row.inv_freq is None or ref.inv_freq is None or row.inv_freq.shape != ref.inv_freq.shape:
        return None
    gap = (row.inv_freq.double() - ref.inv_freq.double()).abs() * length
    return float(gap.max()), int(gap.argmax())


def disagreements(row: EngineRope, ref: EngineRope, length: int) -> list[dict[str, Any]]:
    """Where ``row`` differs from the reference row, each with its size and a one-line consequence."""
    out = []
    where = f" ({row.layer_type} layers)" if row.layer_type else ""
    if not row.supported:
        runs = "; it runs the frequencies shown" if row.inv_freq is not None else ""
        out.append({"kind": "unsupported", "value": None,
                    "consequence": f"{row.engine}{where} does not run this config as written: {row.reason}{runs}"})
    gap = _angle_gap(row, ref, length)
    if gap is not None and gap[0] > ANGLE_TOLERANCE:
        out.append({"kind": "angles", "value": gap[0], "pair": gap[1],
                    "consequence": f"{row.engine}{where} rotates pair {gap[1]} {gap[0]:.3g} rad away from "
                                   f"transformers at position {length:,}: attention scores over that distance "
                                   "differ, so outputs and log-probabilities differ"})
    if row.attention_factor is not None and ref.attention_factor is not None:
        ratio = row.attention_factor / ref.attention_factor
        if abs(ratio - 1) > RATIO_TOLERANCE:
            out.append({"kind": "attention_factor", "value": ratio,
                        "consequence": f"{row.engine}{where} scales every attention logit by {ratio ** 2:.4g}x "
                                       f"transformers' (factor {row.attention_factor:.4g} vs "
                                       f"{ref.attention_factor:.4g} on q and k): a "
                                       f"{'sharper' if ratio > 1 else 'flatter'} softmax at every position"})
    if row.context_limit != ref.context_limit and row.context_limit is not None:
        claimed = "no fixed length" if ref.context_limit is None else f"{ref.context_limit:,}"
        out.append({"kind": "context", "value": row.context_limit,
                    "consequence": f"{row.engine} accepts {row.context_limit:,} tokens by default "
                                   f"({row.context_note}); the config claims {claimed}"})
    return out


def _row_dict(row: EngineRope, ref: EngineRope, length: int) -> dict[str, Any]:
    gap = _angle_gap(row, ref, length)
    inv = None if row.inv_freq is None else [float(x) for x in row.inv_freq.double().tolist()]
    return {"engine": row.engine, "layer_type": row.layer_type, "method": row.method, "supported": row.supported,
            "reason": row.reason, "inv_freq": inv, "attention_factor": row.attention_factor,
            "max_delta_angle": None if gap is None else gap[0], "switch": row.switch,
            "context_limit": row.context_limit, "context_note": row.context_note, "layout": row.layout,
            "notes": row.notes, "checked": row.checked}


def audit(source, *, length: int | None = None, engines: list[str] | None = None) -> dict[str, Any]:
    """The audit report of ``source`` (a config.json, a folder, a mapping or a .gguf file) at ``length`` (default:
    the context the config claims): {"source", "length", "engines": {name: source cited}, "rows": [...],
    "disagreements": [...], "note"}. Every engine has a row per RoPE layer type, or one row saying why not."""
    names = engine_names() if engines is None else engines
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ConfigError(f"engines: unknown {unknown}; known: {', '.join(ENGINES)}")
    model, why = load_model(source, length)
    report: dict[str, Any] = {"source": None if isinstance(source, Mapping) else os.fspath(source),
                              "length": None if model is None else model.length,
                              "engines": {n: ENGINES[n].source for n in names}, "rows": [], "disagreements": []}
    if model is None:
        report["rows"] = [{"engine": n, "layer_type": None, "supported": False, "reason": why} for n in names]
        report["note"] = why
        return report
    for layer_type in model.configs:
        ref = ENGINES[REFERENCE].rule(model, layer_type)
        for name in names:
            row = ref if name == REFERENCE else ENGINES[name].rule(model, layer_type)
            report["rows"].append(_row_dict(row, ref, model.length))
            if name != REFERENCE:
                report["disagreements"] += [{"engine": name, "layer_type": layer_type, **d}
                                            for d in disagreements(row, ref, model.length)]
    report["note"] = "" if model.gguf is None else (
        "transformers' row is the model transformers' GGUF loader builds; llama.cpp's reads the file's own keys")
    return report
