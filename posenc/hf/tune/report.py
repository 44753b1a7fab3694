"""What ``posenc tune`` writes into --out: the deploy file (config.json for a frequency method, patch_spec.json for
an attention method), results.json and report.md, each written atomically (the plots: posenc.hf.tune.plots)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from posenc._internal.errors import ConfigError
from posenc.hf.tune import searched
from posenc.hf.tune.plan import BASELINE
from posenc.hf.tune.plots import PLOTS

# what --out receives; a folder already holding one needs --overwrite (or --resume for an interrupted tune)
OUTPUT_FILES = ("results.json", "report.md", "config.json", "patch_spec.json", "extended.gguf", *PLOTS,
                searched.CHECKPOINT, searched.CONFIG)
# the GGUF file written for llama.cpp when the input is a GGUF file and a frequency method llama.cpp runs won
GGUF_OUT = "extended.gguf"
WHERE = {"config": "config.json: transformers and vLLM load it as the model's config (copy it beside the weights)",
         "attention": "patch_spec.json: posenc.patch(model, 'patch_spec.json') applies it to a transformers model "
                      "loaded through posenc; vLLM and llama.cpp do not run attention methods"}


def check_out_folder(out: str | os.PathLike, overwrite: bool) -> None:
    """Refuse (one line naming --out) a folder that already holds tune's outputs without ``overwrite``."""
    from posenc._internal.atomic import check_writable_folder

    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"out {out}: exists and is not a folder")
    held = [name for name in OUTPUT_FILES if (folder / name).exists()]
    if held and not overwrite:
        raise ConfigError(f"out {out}: already holds {', '.join(held)} (an earlier tune); pass --overwrite to "
                          "replace them, --resume to continue an interrupted tune, or choose another folder")
    check_writable_folder(folder, f"out {out} (--out)")


def write_deploy(out: Path, winner: dict, config, target: int, trained: int, *, replace: bool = False) -> list[str]:
    """The winner's deploy files -> their names: a frequency method's complete config (written by
    ``extend_for_factor``, the code eval loads it with, so it is the config that was measured), the model's own
    config for the model as configured, or an attention method's patch spec (its rule resolved for this model and
    target, every field set). ``replace``: the config holds a scaling the winner replaces (posenc.hf.tune.configured):
    a frequency method is computed from the original RoPE parameters, and an attention winner also gets config.json
    with those parameters (the rule runs on them, not on top of the scaling)."""
    from posenc._internal.atomic import atomic_write_json

    if winner.get("configured") or winner["method"] == BASELINE:      # the model's own config deploys as it is
        atomic_write_json(out / "config.json", config.to_dict())
        return ["config.json"]
    if winner.get("searched"):       # the config posenc search wrote, with the searched factors
        atomic_write_json(out / "config.json", searched.deploy_config(winner))
        return ["config.json"]
    if winner["kind"] == "config":
        from posenc.hf.scaling import extend_for_factor

        atomic_write_json(out / "config.json", extend_for_factor(config.to_dict(), winner["method"], target / trained,
                                                                 replace=replace).config)
        return ["config.json"]
    from posenc.attention import attention_rule, rule_spec
    from posenc.extensions import ExtensionSpec

    spec = ExtensionSpec(original=trained, factor=target / trained, rotary_dim=None, target=target)
    atomic_write_json(out / "patch_spec.json", rule_spec(attention_rule(winner["method"], spec, **winner["options"])))
    if not replace:
        return ["patch_spec.json"]
    from posenc.hf.scaling import transformers_major
    from posenc.tools.extend import unscaled_config

    atomic_write_json(out / "config.json", unscaled_config(config.to_dict(),
                                                           transformers_version=min(transformers_major(), 5)))
    return ["patch_spec.json", "config.json"]


def write_gguf_deploy(out: Path, model: str, winner: dict, target: int) -> dict | None:
    """For a GGUF input whose winner is a frequency method: the GGUF file llama.cpp runs extended, written by
    ``posenc extend MODEL.gguf --out NEW.gguf``'s own code (posenc.tools.extend.plan_gguf_extension and
    posenc.tools.extend_gguf), and its llama.cpp flags -> {"file", "flags", "text"}; {"refused": reason} when
    llama.cpp cannot run the method as posenc means it (dynamic NTK, a factor tensor its graph ignores); None for
    a folder input or an attention winner."""
    from posenc.gguf import is_gguf, read_gguf
    from posenc.tools import extend_gguf
    from posenc.tools.extend import plan_gguf_extension

    if winner["kind"] != "config" or not is_gguf(model):
        return None
    if winner.get("configured") or winner["method"] == BASELINE:
        return {"refused": "the winner is the model as configured: the input GGUF runs as it is"}
    if winner.get("searched"):
        return {"refused": "the winner is LongRoPE with searched factors, which tune writes into config.json only: "
                           "posenc extend MODEL.gguf --method longrope with that config's factors writes the GGUF"}
    try:
        extend_gguf.check_method(winner["method"], read_gguf(model).architecture)
        plan = plan_gguf_extension(model, target, winner["method"])
    except ConfigError as exc:    # the tune's answer stands; only llama.cpp's file cannot carry it
        return {"refused": str(exc)}
    extend_gguf.write_gguf_extension(model, out / GGUF_OUT, plan)
    return {"file": GGUF_OUT, "flags": plan.new_flags,
            "text": extend_gguf.format_plan(plan, str(model), str(out / GGUF_OUT))}


def _gguf_lines(gguf: dict | None) -> list[str]:
    """report.md's llama.cpp section."""
    if not gguf:
        return []
    if "refused" in gguf:
        return ["## llama.cpp", "", f"No GGUF written: {gguf['refused']}", ""]
    return ["## llama.cpp", "", f"{gguf['file']}: the input GGUF with the winner's RoPE scaling (`posenc extend "
            "MODEL.gguf --out NEW.gguf`), every tensor copied.", "", "```", gguf["text"], "```", ""]


def _num(x, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def pooled_ruler(scores: dict[str, dict]) -> tuple[float | None, float, float, int]:
    """One survivor's RULER tasks pooled -> (mean score over every sample, Wilson 95% low, high, samples); None
    mean when no task was scored."""
    from posenc.lab.stats import wilson_interval

    scored = [s for s in scores.values() if s["value"] is not None and s["n"]]
    n = sum(s["n"] for s in scored)
    if not n:
        return None, 0.0, 1.0, 0
    hits = sum(s["value"] * s["n"] for s in scored)
    return (hits / n, *wilson_interval(hits, n), n)


def retrieval_note(winner: str, passkey: dict, ruler: dict) -> str | None:
    """A sentence when the perplexity winner is not the best survivor on retrieval (passkey's mean accuracy; RULER's
    score pooled over its tasks, with Wilson intervals and whether they overlap); None when it is, or when no
    retrieval was measured on it."""
    parts = []
    rates = {k: v for k, v in passkey.items() if v is not None}
    best = max(rates, key=rates.get, default=None)
    if winner in rates and rates[best] > rates[winner]:
        parts.append(f"on passkey {best} finds {rates[best]:.2f} of the keys, {winner} {rates[winner]:.2f}")
    pooled = {k: pooled_ruler(v) for k, v in ruler.items()}
    pooled = {k: v for k, v in pooled.items() if v[0] is not None}
    best = max(pooled, key=lambda k: pooled[k][0], default=None)
    if winner in pooled and pooled[best][0] > pooled[winner][0]:
        (b, b_lo, b_hi, b_n), (w, w_lo, w_hi, w_n) = pooled[best], pooled[winner]
        overlap = b_lo <= w_hi
        parts.append(f"on RULER (pooled over its tasks) {best} scores {b:.2f} [{b_lo:.2f}, {b_hi:.2f}] (n {b_n}), "
                     f"{winner} {w:.2f} [{w_lo:.2f}, {w_hi:.2f}] (n {w_n})"
                     + ("; the Wilson intervals overlap: within the noise of these samples" if overlap else ""))
    if not parts:
        return None
    return f"The perplexity winner {winner} is not the best survivor on retrieval: " + "; ".join(parts) + "."


def _ruler_lines(doc: dict) -> list[str]:
    """report.md's RULER table: survivor x task, score [Wilson 95% interval], samples."""
    ruler = doc.get("ruler") or {}
    if not ruler:
        return []
    tasks = list(next(iter(ruler.values())))
    lines = ["", f"## RULER (survivors, {doc['target']} tokens, {doc.get('ruler_samples')} samples per task)", "",
             "Score: RULER's string_match_all, the mean over the samples, with its Wilson 95% interval and the samples "
             "scored (n); n/a where the task's template does not fit the length.", "",
             "| survivor | " + " | ".join(tasks) + " | pooled |", "|---" * (len(tasks) + 2) + "|"]
    for name, scores in ruler.items():
        cells = [f"{_num(s['value'], 2)} [{_num(s['ci_low'], 2)}, {_num(s['ci_high'], 2)}], n {s['n']}"
                 if s["value"] is not None else "n/a" for s in (scores[t] for t in tasks)]
        mean, low, high, n = pooled_ruler(scores)
        cells.append(f"{_num(mean, 2)} [{low:.2f}, {high:.2f}], n {n}" if mean is not None else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _plot_lines(doc: dict) -> list[str]:
    """report.md's plots: each PNG linked (``![name](name)``, the lab's form), and why any is absent."""
    files, absent = doc.get("plots") or [], doc.get("plots_not_drawn") or []
    if not files and not absent:
        return []
    parts = [f"![{name}]({name})" for name in files] + [f"Note: {why[0].upper()}{why[1:]}." for why in absent]
    return ["", "## Plots"] + [line for part in parts for line in ("", part)]


def report_markdown(doc: dict) -> str:
    """report.md: the plan, the race (per-candidate mean log-perplexity, paired difference to the best and its
    spread), the trained-length check, passkey, RULER, the plots (or why they are absent), the answer and the deploy
    file."""
    ans = doc["answer"]
    lines = [f"# posenc tune: {doc['model']} at {doc['target']} tokens", "", "## Plan", "", "```",
             doc["plan_text"], "```", "", "## Race", "",
             f"Rule: {doc['rules']['race']}", "",
             "| candidate | kind | windows | mean log-ppl | diff to best | sd | tie |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['kind']} | {r['windows']} | {_num(r['mean_loss'])} | {_num(r['diff_to_best'])} | "
              f"{_num(r['sd'])} | {'tie' if r['tie'] else ''} |" for r in ans["ranking"]]
    lines += ["", f"Stopped: {doc['race']['stopped']}. Spent {doc['spent_s']:.1f} s of a {doc['budget_s']:.0f} s "
              f"budget (estimated {doc['plan']['total_s']:.1f} s).", "", "## Trained length", "",
              f"Rule: {doc['rules']['trained']}", ""]
    lines += [f"- {name}: {'+' if d >= 0 else ''}{d:.4f} nats vs unchanged{' **flagged**' if d > doc['margin'] else ''}"
              for name, d in doc["trained_check"].items()] or ["- no candidate changes the trained length's positions"]
    if doc.get("passkey"):
        lines += ["", "## Passkey (survivors)", ""]
        lines += [f"- {name}: {_num(rate, 2)}" for name, rate in doc["passkey"].items()]
    lines += _ruler_lines(doc)
    lines += searched.report_lines(doc)
    lines += _plot_lines(doc)
    lines += ["", "## Answer", "", f"Winner: **{ans['winner']}** ({ans['reason']}).", ""]
    if ans.get("retrieval"):
        lines += [ans["retrieval"], ""]
    if ans["winner"] in doc["flagged"]:
        lines += [f"Note: {ans['winner']} raises log-perplexity at the trained length by "
                  f"{doc['trained_check'][ans['winner']]:.4f} nats (more than {doc['margin']}): short inputs get "
                  "worse with it.", ""]
    lines += [f"Deploy: {doc['deploy']} ({WHERE[doc['winner_kind']]}).", ""]
    if doc["winner_kind"] == "attention" and "config.json" in doc.get("deploy_files", []):
        lines += ["config.json: the model's original RoPE parameters (its scaling removed): load the model with it "
                  "before posenc.patch, since the attention rule replaces the configured scaling.", ""]
    return "\n".join(lines + _gguf_lines(doc.get("gguf")))
