"""``posenc audit CONFIG|MODEL.gguf [--length L]``: what each inference engine computes for a model's RoPE, and
where the engines disagree with transformers at length L (posenc.engines.audit)."""

from __future__ import annotations

import json

from posenc.engines.audit import audit

HELP = "Compare the RoPE that transformers, llama.cpp, vLLM, SGLang and MLX compute for a model."


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _row_line(r: dict) -> str:
    if r.get("inv_freq") is None:
        return f"  {r['engine']:<13} not supported: {r['reason']}"
    inv = r["inv_freq"]
    state = "" if r["supported"] else "  [not as written]"
    return (f"  {r['engine']:<13} {r['method'][:44]:<44} pairs {len(inv):<4} inv {max(inv):.3g}..{min(inv):.3g}  "
            f"attn {_num(r['attention_factor'], '.4g'):<7} max dAngle {_num(r['max_delta_angle'], '.3g'):<8} "
            f"ctx {_num(r['context_limit'], ',')}{state}")


def format_audit(report: dict) -> str:
    """The text form of an audit report: one table per RoPE layer type, then the disagreements and the sources."""
    lines = [f"{report['source'] or 'config'}: RoPE across engines at length "
             f"{_num(report['length'], ',')} (max dAngle: radians at that position, against transformers)"]
    layer = object()
    for r in report["rows"]:
        if r["layer_type"] != layer:
            layer = r["layer_type"]
            lines.append(f"\n[{layer}]" if layer else "")
        lines.append(_row_line(r))
        if r.get("switch", "none") != "none":
            lines.append(f"  {'':<13} switch: {r['switch']}")
        for note in r.get("notes", []):
            lines.append(f"  {'':<13} note: {note}")
    if report["note"]:
        lines.append(f"\n{report['note']}")
    if report["disagreements"]:
        lines.append("\ndisagreements:")
        lines += [f"  ! {d['consequence']}" for d in report["disagreements"]]
    else:
        lines.append("\nno disagreement: every engine computes the same RoPE for this config")
    lines.append("\nsources:")
    lines += [f"  {name}: {source}" for name, source in report["engines"].items()]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("config", help="a Hugging Face config.json (or a folder holding one), or a .gguf file")
    parser.add_argument("--length", type=int, default=None,
                        help="the length L to evaluate at (default: the context the config claims)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    report = audit(args.config, length=args.length)
    print(json.dumps(report, indent=2) if args.json else format_audit(report))
    return 0
