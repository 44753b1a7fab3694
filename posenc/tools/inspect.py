"""``posenc inspect CONFIG``: what a Hugging Face config.json does with positions.

For RoPE configs: rope type and parameters per layer type, head and rotary dims, the rotation layout, how many
frequency pairs are kept / blended / interpolated, multimodal position axes (M-RoPE sections), the attention
scaling and the effective logit scale (with DeepSeek's softmax multiplier), the longest wavelength against the
original context, the context the config claims, the per-layer schedule (NoPE layers, Llama 4's temperature
tuning, chunked / sliding attention), a vision tower's 2-D RoPE, and warnings for inconsistent settings. Configs without RoPE are recognised and described: ALiBi (BLOOM,
MPT, Falcon/Baichuan variants), learned absolute tables (GPT-2, OPT, BERT...), sinusoidal tables (Marian...) and
T5's relative bias buckets. Every number comes from the scaling registry (posenc.rope.scaling); nothing here
recomputes a scaling formula.

    >>> report = inspect_config("config.json")        # a dict; format_report(report) gives the text
"""


from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# the analysis lives below the tools (posenc.rope.describe); its public names are re-exported for this path
from posenc.rope.describe import (HEAD_DIM_DERIVED_TYPES, axes_text, detect_scheme,  # noqa: F401
                                  inspect_config)

HELP = "Describe the positional encoding of a Hugging Face config.json (RoPE scaling, ALiBi, learned...)."


def _json_safe(obj):
    """Replace non-finite floats by None so json.dumps(..., allow_nan=False) always succeeds."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj



# --------------------------------------------------------------------------------------------------- output

def _fmt_len(n) -> str:
    return "-" if n is None else f"{n:,}"


def _fmt_num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _ranges(indices: list[int]) -> str:
    """[3, 7, 11] -> "3, 7, 11"; long lists shortened."""
    text = ", ".join(map(str, indices[:12]))
    return text + (f", ... ({len(indices)} in all)" if len(indices) > 12 else "")


def _rope_lines(e: dict[str, Any]) -> list[str]:
    """The text of one RoPE layer type's entry of the report."""
    lines = []
    if e["layer_type"]:
        lines.append(f"\n[{e['layer_type']}]")
    lines += [
        f"  rope_type            {e['rope_type']}   rope_theta {e['rope_theta']:g}   layout {e['layout']}",
        f"  parameters           {json.dumps(e['parameters'])}",
        f"  head_dim / rotary    {e['head_dim']} / {e['rotary_dim']} ({e['pairs']} pairs, "
        f"partial_rotary_factor {e['partial_rotary_factor']:g})",
    ]
    if e.get("mla"):
        lines.append(f"  MLA                  RoPE on qk_rope_head_dim {e['mla']['qk_rope_head_dim']} of each "
                     f"{sum(e['mla'].values())}-dim q/k head; qk_nope_head_dim {e['mla']['qk_nope_head_dim']} "
                     "not rotated (the softmax scale's qk_head_dim is the sum)")
    if e["position_axes"]:
        a = e["position_axes"]
        lines.append(f"  position axes        {' / '.join(a['axes'])} rows on {a['pairs_per_axis']} pairs "
                     f"({'interleaved' if a['interleaved'] else 'chunked'} M-RoPE; positions [3, batch, seq])")
    if e["rope_type"] == "yarn" and e["parameters"].get("truncate") is False:
        lines.append("  correction range     unrounded (truncate: false): the ramp's ends stay fractional dims")
    lines += [
        f"  pairs                {e['bands']['kept']} kept / {e['bands']['blended']} blended / "
        f"{e['bands']['interpolated']} interpolated"
        + (f" / {e['bands']['removed']} removed" if e["bands"]["removed"] else "")
        + f"  (at length {_fmt_len(e['evaluated_at_length'])})",
        f"  attention scaling    {e['attention_scaling']:.6g} on cos and sin (logits x{e['logit_scaling']:.6g})",
    ]
    if e["softmax_scale_multiplier"] != 1:
        lines.append(f"  softmax scale        x{e['softmax_scale_multiplier']:.6g} on 1/sqrt(qk_head_dim) (DeepSeek "
                     f"mscale^2): effective logit scale x{e['effective_logit_scale']:.6g}")
    lines += [
        f"  original context     {_fmt_len(e['original_context'])}",
        f"  claimed context      {_fmt_len(e['claimed_context'])}  ({e['claimed_context_from']})",
        f"  longest wavelength   {_fmt_num(e['longest_wavelength'], ',.0f')} tokens scaled, "
        f"{_fmt_num(e['longest_wavelength_unscaled'], ',.0f')} unscaled"
        + (f" = {e['longest_wavelength_over_original_context']:.3g}x the original context"
           if e["longest_wavelength_over_original_context"] else ""),
        f"  shortest wavelength  {_fmt_num(e['shortest_wavelength'], '.3g')} tokens;  mean interpolation "
        f"x{_fmt_num(e['mean_interpolation'], '.3g')} (geometric)",
    ]
    return lines


def _layer_lines(layers: dict[str, Any] | None) -> list[str]:
    """The text of the report's per-layer schedule (none without one)."""
    if not layers:
        return []
    lines = ["\nlayers"]
    if layers["num_layers"] is not None:
        nope = layers["nope_layers"]
        kinds = layers.get("positionless_kinds") or []
        lines.append(f"  rotate q/k           {layers['num_layers'] - len(nope)} of {layers['num_layers']} layers"
                     + (f"; {'no RoPE on' if kinds else 'NoPE layers'} {_ranges(nope)}" if nope else "")
                     + (f" ({' and '.join(kinds)} layers have no q/k attention)" if kinds else ""))
    if layers["layer_types"]:
        lines.append("  attention kinds      " + ", ".join(f"{k} x{v}" for k, v in layers["layer_types"].items()))
    if layers["attention_chunk_size"]:
        lines.append(f"  chunked attention    blocks of {layers['attention_chunk_size']:,} tokens")
    if layers["sliding_window"]:
        lines.append(f"  sliding window       {layers['sliding_window']:,} tokens")
    if layers["temperature_tuning"]:
        t = layers["temperature_tuning"]
        lines.append(f"  temperature tuning   floor_scale {t['floor_scale']:g}, attn_scale {t['attn_scale']:g} "
                     f"({t['applies_to']})")
    if layers.get("sink_logits"):
        lines.append("  sink logits          a learned logit per head joins every softmax and takes weight from all "
                     "keys (no token kept: not the 'sinks' attention method)")
    if layers.get("query_temperature"):
        t = layers["query_temperature"]
        lines.append(f"  query temperature    llama_4_scaling_beta {t['beta']:g}, original {t['original']:,} "
                     f"({t['applies_to']})")
    if layers.get("learned_frequency_scale"):
        lines.append("  learned frequencies  LeRoPE: each pair's frequency x exp(alpha_j), alpha in the checkpoint "
                     "(rotary_emb.alpha); the frequencies above are those before it")
    if layers.get("learned_query_scale"):
        lines.append("  learned query scale  every layer: q x (scale_h x ln(p + 1) + bias_h), per head, weights in "
                     "the checkpoint (softmax_scaling)")
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The human-readable form of an inspect_config report."""
    title = report["source"] or "config"
    lines = [f"{title}: model_type={report['model_type']}  scheme={report['scheme']}", report["description"]]
    if "gguf" in report:
        g = report["gguf"]
        types = ", ".join(f"{k} x{v}" for k, v in g["tensor_types"].items())
        lines += [f"\ngguf ({g['architecture']}: {g['name']}; tensors {types})"]
        lines += [f"  {k:<36} {v}" for k, v in g["keys"].items()]
        lines += [f"  {g['architecture'] + '.rope.scaling.' + k:<36} {v}" for k, v in g["rope_scaling_keys"].items()]
    for e in report.get("rope", []):
        lines += _rope_lines(e)
    lines += _layer_lines(report.get("layers"))
    if "vision" in report:
        v = report["vision"]
        lines += [f"\nvision tower ({v['model_type']})",
                  f"  rope_type            {v['rope_type']}   rope_theta {v['rope_theta']:g}   layout {v['layout']}",
                  f"  head_dim / rotary    {v['head_dim']} / {v['rotary_dim']} ({axes_text(v)})",
                  f"  longest wavelength   {_fmt_num(v['longest_wavelength_patches'], ',.0f')} patches",
                  f"  note                 {v['note']}"]
    if "alibi" in report:
        a = report["alibi"]
        slopes = a.get("slopes")
        lines.append(f"  heads                {_fmt_len(a['n_heads'])}")
        if slopes:
            lines.append(f"  slopes               {slopes[0]:.4g} ... {slopes[-1]:.4g} "
                         f"(2^{math.log2(slopes[0]):.3g} ... 2^{math.log2(slopes[-1]):.3g})")
        lines.append(f"  context              {_fmt_len(a['context'])}  ({a['context_note']})")
    if "learned" in report:
        lines.append(f"  table size           {_fmt_len(report['learned']['table_size'])}")
        if report["learned"].get("note"):
            lines.append(f"  note                 {report['learned']['note']}")
    if "relative_bias" in report:
        r = report["relative_bias"]
        lines.append(f"  buckets              {r['num_buckets']} (max distance {r['max_distance']})")
    if "sinusoidal" in report:
        s = report["sinusoidal"]
        lines.append(f"  table size           {_fmt_len(s['table_size'])}  dim {_fmt_len(s['dim'])}")
    if report["warnings"]:
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in report["warnings"]]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("config", help="a Hugging Face config.json (or a folder holding one), or a .gguf file")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="evaluate length-dependent values at this length (default: the claimed context; "
                             "at most 2^30)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    report = inspect_config(args.config, seq_len=args.seq_len)
    print(json.dumps(_json_safe(report), indent=2, allow_nan=False) if args.json else format_report(report))
    return 0
