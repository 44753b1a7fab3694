"""``posenc pick``: the lesson's "positional-encoding picker" skill as a decision procedure.

Given the context the model must serve, the context it was (or will be) trained at, the training budget, the task and
whether it must work past every trained length, recommend a scheme and an extension method with parameters, the
reasons (each citing its evidence: a paper by author, year and table, transformers' modeling_rope_utils, a model
card, docs/lesson.md, or a measured lab preset in docs/lab.md with its settings), the alternatives and why not, and a
ready config snippet. The decision table is documented in docs/picker.md; keep the two in step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from posenc._validate import check_choice, check_int, is_number
from posenc.errors import PosencError
from posenc.attention import get_attention_method, is_attention_method
from posenc.extensions import ExtensionSpec, get_method, method_config, method_label
from posenc.tools.contexts import MAX_CONTEXT

# the snippet's rope_theta when the existing model's base is not given: visibly not a number to copy
THETA_PLACEHOLDER = "<your model's rope_theta: pass --rope-theta, or --config config.json to read it>"

HELP = "Recommend a positional encoding / context-extension method for a target context, budget and task."

BUDGETS = ("none", "finetune", "pretrain")
TASKS = ("lm", "code", "retrieval", "encoder")

# Evidence: published results cited by paper (author, year, table), transformers' semantics, the spec (docs/lesson.md)
# and posenc's own lab measurements (docs/lab.md); see docs/picker.md.
EVIDENCE = {
    "lab_attention": "posenc lab (docs/attention-extension.md, 3 seeds): on the default preset's model at 8x, "
                     "Self-Extend 6.86 +- 0.10, Leaky ReRoPE 6.85, ReRoPE 6.93, Dual Chunk 7.06, sinks 6.73 ppl vs "
                     "YaRN 10.92 and RoPE 15.72 (6.79 at 1x); but passkey retrieval past the trained length stayed "
                     "at 0-11% for all of them on the passkey preset (sinks: evicted keys are gone by design)",
    "alibi_table2": "Press et al. 2022 (ALiBi), Table 2: trained at L=512, ALiBi ppl 19.73 at 512 -> 18.31 "
                    "at 15512, while rotary reaches 79.25 and sinusoidal 406.01",
    "alibi_short_train": ("ALiBi trained at only L=64 still goes 28.46 -> 21.53 at 3072 (Press et al. 2022, "
                          "Table 5)"),
    "alibi_sliding": "with stride-1 sliding-window eval ALiBi stays flat (17.98 -> 18.30) instead of improving: much "
                     "of its gain is the early-token curse, not use of the far context (Press et al. 2022, "
                     "sliding-window analysis)",
    "kazemnejad": "Kazemnejad et al. 2023 (synthetic tasks at 2x the train length): MRR NoPE 0.69, "
                  "T5 0.55, ALiBi 0.50, RoPE 0.33, absolute 0.22; on copy RoPE and absolute fall to ~0",
    "pi": "Position interpolation (Chen et al. 2023, Table 3): Llama 7B at an 8k window has 16.10 ppl "
          "with no fine-tuning, 7.12 after 200 steps and 6.95 after 1000",
    "zero_shot": "Ding et al. 2024 (LongRoPE), Table 1 (Llama-2-7B zero-shot from 4k, PG19 ppl at 8k/16k): "
                 "dynamic NTK 10.21/23.29, PI 10.65/20.49, YaRN 32.64/87.89 -- zero-shot YaRN is poor, it is meant for "
                 "fine-tuning",
    "yarn": "Peng et al. 2023 (YaRN), Table 2 (Llama-2-7B fine-tuned at s=32): 3.56 ppl at 8k, 2.37 at 128k; its "
            "passkey test: 99.4% to 128k",
    "lab_default": "posenc lab, default preset (docs/lab.md: d_model 64, 2 layers, 600 steps x 20 at 128 tokens, "
                   "seed 0): RoPE ppl 6.93 -> 12.53 at 4x, 16.51 at 8x; zero-shot dynamic NTK 9.43 / 11.87, "
                   "NTK-aware 8.78 / 11.87, YaRN 10.34 / 10.68, PI ~16.4 at every length; ALiBi 7.74 -> 7.69",
    "lab_schemes": "posenc lab --preset schemes (docs/lab.md: d_model 64, 2 layers, 300 steps x 16 at 128 tokens, "
                   "seeds 0-2, mean): ppl 1x -> 8x ALiBi 8.32 -> 8.29, KERPLE 8.26 -> 8.28, RoPE+ALiBi 7.78 -> "
                   "7.81, xPos 7.75 -> 8.67, CoPE 7.77 -> 9.31, FIRE 8.69 -> 9.42, T5 9.57 -> 10.44, NoPE 10.02 "
                   "-> 10.52, RoPE 7.76 -> 12.12",
    "lab_copy": "posenc lab --preset copy-cpu (docs/lab.md: 4 layers, d_model 64, 2 heads, copies of distinct bytes "
                "trained at 128 after a 32/64-token warmup until 98% of two held-out sets are exact, cap 2500 steps "
                "(NoPE, ALiBi 3000), seeds 0-2, bf16; {copy_passed} >= 95% exact at 1x): past 1x ALiBi keeps 51% "
                "token accuracy at 2x and 24% at 4x where RoPE keeps 43% and 4%; KERPLE holds 99% / 97%, T5 83% / "
                "63%, CoPE 59% / 46%",
    "rope_default": "docs/lesson.md: RoPE dominates frontier models (Llama 2/3/4, Qwen 2/3, Mistral, DeepSeek-V3) -- no "
                    "architecture change, relative position in the dot product, and its base is a clean knob for "
                    "long-context fine-tuning",
    "llama31": "Llama 3.1 went from 8k to 128k with llama3 scaling (factor 8, low 1, high 4) plus long-context "
               "training (docs/lesson.md 'Use it'; Dubey et al. 2024, the Llama 3 paper; the scaling values are "
               "in Llama 3.1's published config.json, its model card)",
    "encoder_alibi": "bidirectional use needs the symmetric bias -m_h*|i-j|; the causal shortcut m_h*j is only "
                     "valid under a causal mask, where softmax ignores a per-row constant (Press et al. 2022 "
                     "define ALiBi for causal LMs)",
    "absolute": "sinusoidal and learned absolute positions do not extrapolate (docs/lesson.md, the comparison "
                "table); sinusoidal ppl 20.05 -> 406.01 at 30x the train length (Press et al. 2022, Table 2)",
    "lab_finetune": "posenc lab --preset extend (docs/lab.md; byte LM trained at 128, 8x to 1024, 3 seeds): 100 "
                    "fine-tune steps at 1024 (13% of pre-training's tokens) bring YaRN to 6.82 +- 0.10 ppl at 1024 "
                    "(zero-shot 10.92), NTK 6.89, Llama 3 6.89, searched LongRoPE 6.85, PI 8.63 (zero-shot 16.88)",
    "lab_pose": "posenc lab --preset extend: PoSE (fine-tune at the original length, positions covering the "
                "target) at the same 100 steps costs 1.7x less CPU than fine-tuning at 8x the length; PI + PoSE "
                "8.26 vs PI 8.63 at full length, YaRN + PoSE 7.19 vs YaRN 6.82 (docs/lab.md)",
    "lab_longrope": "posenc lab --preset extend: LongRoPE's search (192 evaluations, ~11 CPU s on the lab model) "
                    "gives 9.73 +- 0.40 ppl at 8x zero-shot vs YaRN 10.92, NTK 11.78, PI 16.88 -- better on every "
                    "seed at the searched length, not at 2x/4x (NTK better there); on the ntk preset's model (256 "
                    "-> 1024, --preset extend-ntk) 3.92 +- 0.12 vs Llama 3 4.20, YaRN 5.10, NTK 5.28 at 4x, better "
                    "on every seed (docs/lab.md)",
    "dynamic": "dynamic NTK raises the base only once the sequence passes max_position_embeddings, so short inputs "
               "keep the original frequencies exactly (transformers' modeling_rope_utils, dynamic rope type)",
}

# Published (theta, trained context) anchors used to size the RoPE base for a new model.
_THETA_ANCHORS = (  # (longest context, theta, who)
    (4096, 10_000.0, "Llama 2 (4k)"),
    (8192, 500_000.0, "Llama 3 (8k)"),
    (10**12, 1_000_000.0, "Qwen 2.5 / Mistral 7B v0.2 (32k), Code Llama (16k)"),
)


@dataclass
class Recommendation:
    """The picker's answer. ``to_dict()`` is what ``posenc pick --json`` prints."""

    scheme: str                      # "RoPE", "ALiBi", ...
    method: str                      # extension method or "none"
    parameters: dict[str, Any]
    reasons: list[str]
    alternatives: list[dict[str, str]]  # [{"option": ..., "why_not": ...}]
    config_snippet: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alt(option: str, why_not: str) -> dict[str, str]:
    return {"option": option, "why_not": why_not}


def attention_alternatives() -> list[dict[str, str]]:
    """The registry's attention-changing methods as zero-shot alternatives, each with what it costs at inference:
    they need no config change but run only where posenc patches the model's attention (docs/attention-extension.md
    has the lab's measurements)."""
    from posenc.attention import ATTENTION_METHODS

    return [_alt(f"{m.label} (changes attention: posenc.patch(model, method={n!r}))",
                 f"not a config edit: the model must run under posenc.patch; costs: {m.costs}. {m.note}")
            for n, m in ATTENTION_METHODS.items()]


def _pretrain_theta(context: int) -> tuple[float, str]:
    for limit, theta, who in _THETA_ANCHORS:
        if context <= limit:
            return theta, who
    raise AssertionError("unreachable")  # pragma: no cover


def copy_cpu_passed(bar: float = 0.95, root=None) -> str:
    """"32 of 33 models": models (scheme x seed) of the copy-cpu results at >= ``bar`` exact match at the training
    length, counted from the packaged extract of docs/results/copy-cpu/results.json (posenc.tools.evidence; "the
    models" when it is missing)."""
    from posenc.tools.evidence import read_results

    doc = read_results("copy-cpu", root)
    try:
        values = [v for r in doc["rows"] if r["metric"] == "exact_match" and r["eval_len"] == r["train_len"]
                  and not r.get("finetuned") for v in (r.get("values") or [r["value"]])]
    except (KeyError, TypeError):
        return "the models"
    passed = sum(1 for v in values if v is not None and v >= bar)
    return f"{'all ' if passed == len(values) else ''}{passed} of {len(values)} models"


def _evidence(key: str) -> str:
    text = EVIDENCE[key]
    return text.format(copy_passed=copy_cpu_passed()) if "{copy_passed}" in text else text


def _check_inputs(target_context, train_context, budget, task, rope_theta):
    check_int(target_context, "target_context", min=1, max=MAX_CONTEXT)
    check_int(train_context, "train_context", min=1, max=MAX_CONTEXT)
    check_choice(budget, "budget", BUDGETS)
    check_choice(task, "task", TASKS)
    if rope_theta is not None:
        check_pick_theta(rope_theta)


def check_pick_theta(rope_theta) -> float:
    """``rope_theta`` for pick: one range, stated as enforced: a number > 1 (a base <= 1 orders no wavelengths) and at
    most float32's largest value (RoPE raises it to a power in float32)."""
    from posenc.rope.config import MAX_THETA

    text = f"rope_theta must be a number > 1 and at most {MAX_THETA:.4g}, got {rope_theta!r}"
    if not is_number(rope_theta):
        raise PosencError(text)
    if not 1 < float(rope_theta) <= MAX_THETA:   # NaN fails this too
        raise PosencError(text)
    return float(rope_theta)


def _snippet(method: str, train: int, target: int, theta: float, lmax: int | None = None,
             rotary_dim: int | None = None) -> dict[str, Any]:
    """The config keys ``method`` writes (from the extension-method registry), transformers 5.x form.
    lmax: the config's current max_position_embeddings (default ``train``): the snippet sets it when it differs."""
    # a method the lab evaluates at its own factor (dynamic NTK: 1) is recommended at it: that is what was measured
    factor = get_method(method).lab_factor or _factor(target, train)
    written = method_config(method, ExtensionSpec(original=train, factor=factor, rotary_dim=rotary_dim, theta=theta,
                                                  target=target))
    snippet: dict[str, Any] = {}
    if written.max_position_embeddings != (train if lmax is None else lmax):
        snippet["max_position_embeddings"] = written.max_position_embeddings
    snippet["rope_parameters"] = {**written.scaling, "rope_theta": theta}
    return snippet


def _yarn_betas(snippet: dict[str, Any]) -> dict[str, Any]:
    """The YaRN snippet with the ramp bounds its text cites written out (transformers' defaults, YaRN paper)."""
    snippet["rope_parameters"] = {**snippet["rope_parameters"], "beta_fast": 32, "beta_slow": 1}
    return snippet


def _factor(target: int, train: int) -> float:
    return target / train  # exact: transformers warns when a yarn factor differs from Lmax / L0


def _config_rope(config) -> dict[str, Any]:
    """The RoPE entry ``posenc inspect`` reports for the global (full-attention) layer type of a config. PosencError
    for a config without language-model RoPE (ALiBi, learned positions, a vision tower)."""
    from posenc.tools.inspect import inspect_config

    report = inspect_config(config)
    entries = report.get("rope") or []
    if not entries:
        raise PosencError(f"pick reads rope_theta and the trained context from a RoPE language-model config; this "
                          f"one is {report['scheme']}" + (" (a vision tower)" if "vision" in report else ""))
    return next((e for e in entries if e["layer_type"] in (None, "full_attention")), entries[0])


def _entry_context(entry: dict[str, Any]) -> int | None:
    return entry["original_context"] or entry["max_position_embeddings"]


def config_context(config) -> tuple[float, int]:
    """(rope_theta, trained context) of an existing model's config, read as ``posenc inspect`` reads them: the
    global (full-attention) layer type's base and the original, pre-extension context. PosencError for a config
    without language-model RoPE (ALiBi, learned positions, a vision tower)."""
    entry = _config_rope(config)
    if _entry_context(entry) is None:
        raise PosencError("the config states no context length (max_position_embeddings): give --train-context")
    return entry["rope_theta"], _entry_context(entry)


def _existing_scaling(entry: dict[str, Any]) -> dict[str, Any] | None:
    """What a config's own (non-default) RoPE scaling already does, from its inspect entry; None for plain RoPE."""
    if entry["rope_type"] == "default":
        return None
    factor = entry["parameters"].get("factor")
    return {"rope_type": entry["rope_type"], "factor": factor if isinstance(factor, (int, float)) else None,
            "original_context": entry["original_context"], "claimed_context": entry["claimed_context"],
            "claimed_from": entry["claimed_context_from"], "max_position_embeddings": entry["max_position_embeddings"]}


def _describe_existing(ex: dict[str, Any]) -> str:
    factor = f" (factor {ex['factor']:g})" if ex["factor"] is not None else ""
    claims = (f"claims {ex['claimed_context']:,} tokens" if ex["claimed_context"] is not None
              else "claims no fixed limit")
    original = f"from an original {ex['original_context']:,}" if ex["original_context"] else "original unknown"
    return f"the config's {ex['rope_type']} scaling{factor}, {original}, {claims}"


def pick(target_context: int, train_context: int | None = None, budget: str = "none", task: str = "lm",
         extrapolation_needed: bool = False, *, rope_theta: float | None = None, config=None) -> Recommendation:
    """Recommend a positional-encoding strategy.

    target_context: tokens the model must handle; train_context: tokens it was (budget none/finetune: an existing
    model's original context) or will be (budget pretrain) trained at; budget: "none" (use an existing model as is),
    "finetune" (a short fine-tune of an existing model), "pretrain" (train a new model); task: "lm", "code",
    "retrieval" or "encoder" (bidirectional); extrapolation_needed: inputs may exceed every length ever trained on;
    rope_theta: the existing model's base (budget none/finetune), written into the snippet (None: a placeholder
    string, never a made-up number); config: an existing model's config.json (path or mapping): rope_theta and
    train_context default to what it says (``config_context``).
    """
    existing, theta_from = None, "given"
    if config is not None and budget != "pretrain":
        kept = _non_rope_model(config, target_context, train_context, budget, task, extrapolation_needed)
        if kept is not None:
            return kept
    if config is not None:   # explicit arguments win over what the config says
        entry = _config_rope(config)
        if rope_theta is None:
            from posenc.rope.scaling import trained_theta

            rope_theta, theta_from = entry["rope_theta"], "read from the config"
            trained = trained_theta(entry["rope_type"], rope_theta, entry["parameters"], entry["rotary_dim"])
            if trained != rope_theta:   # Hunyuan's NTK-alpha: the model trained with the raised base, keep it
                rope_theta, theta_from = trained, (f"the base the model trained with: the config's rope_theta "
                                                   f"{entry['rope_theta']:g} raised by its {entry['rope_type']} "
                                                   "scaling at every length")
        if train_context is None:
            train_context = _entry_context(entry)
            if train_context is None:
                raise PosencError("the config states no context length (max_position_embeddings): give "
                                  "--train-context")
        existing = _existing_scaling(entry)
    if train_context is None:
        raise PosencError("train_context is required (or give config= to read it from a model config)")
    _check_inputs(target_context, train_context, budget, task, rope_theta)
    inputs = {"target_context": target_context, "train_context": train_context, "budget": budget, "task": task,
              "extrapolation_needed": bool(extrapolation_needed), "rope_theta": rope_theta,
              "existing_scaling": existing}
    if budget == "pretrain":
        rec = _pick_pretrain(target_context, train_context, task, extrapolation_needed,
                             None if rope_theta is None else float(rope_theta), theta_from)
        if existing is not None:
            rec.notes.append(f"{_describe_existing(existing)}: a new model is pretrained from scratch, so the "
                             "recommendation above does not build on it")
    elif existing is not None and _covers(existing, target_context, budget):
        rec = _keep_existing(existing, target_context, budget)
    else:
        rec = _pick_existing(target_context, train_context, budget, task, extrapolation_needed,
                             10_000.0 if rope_theta is None else float(rope_theta),
                             lmax=None if config is None else entry["max_position_embeddings"],
                             known_rope=config is not None, replacing=existing is not None)
        if existing is not None and rec.config_snippet:
            rec.method += f", replacing the config's {existing['rope_type']} scaling"
            short = (f"short of the target {target_context:,}" if existing["claimed_context"] is not None else
                     "whose frequencies move with the length (a moving target to fine-tune on)")
            rec.notes.insert(0, f"{_describe_existing(existing)}, {short}: the snippet replaces that scaling "
                                "(its rope_parameters take the place of the config's rope_scaling / "
                                f"rope_parameters), sized from the trained context {train_context:,} (`posenc "
                                "extend CONFIG --method ... --replace` does the same); the model was trained with "
                                "the old scaling, so its behaviour inside the range that scaling served changes too")
        if config is not None and rec.config_snippet.get("rope_parameters"):
            from posenc.tools._io import read_config

            raw = read_config(config)           # (read once for both family rules)
            _per_layer_type(rec, raw)
            _family_rope_types(rec, raw, train_context, target_context,
                               10_000.0 if rope_theta is None else float(rope_theta), entry["max_position_embeddings"],
                               entry["rotary_dim"])
        if rope_theta is None and rec.config_snippet:  # never a made-up base for an existing model
            rec.config_snippet["rope_parameters"]["rope_theta"] = THETA_PLACEHOLDER
            rec.parameters["rope_theta"] = THETA_PLACEHOLDER
            rec.notes.append("rope_theta in the snippet is a placeholder: use your model's own value (`--config "
                             "config.json` or `--rope-theta` fills it in; `posenc inspect config.json` shows it)")
    if config is not None and budget == "none" and existing is None and rec.config_snippet:
        _real_model_evidence(rec, config, train_context, target_context,
                             10_000.0 if rope_theta is None else float(rope_theta), entry)
    rec.inputs = inputs
    return rec


def _real_model_evidence(rec: Recommendation, config, L: int, T: int, theta: float, entry: dict) -> None:
    """When a committed real-model study measured this very model at the target length (posenc.tools.evidence):
    recommend its best zero-shot method, citing every method's number there beside the papers' and the lab's."""
    from posenc.extensions import transformers_config
    from posenc.tools.evidence import FIRST_TEXT, matching_study, other_texts, passkey, zero_shot

    found = matching_study(config)
    if found is None:
        return
    path, study = found
    where = study.get("results") or str(path)  # a packaged extract names the full study it was made from
    table = zero_shot(study, T, text=FIRST_TEXT)
    if not table:
        lens = sorted({r["eval_len"] for r in study.get("rows", []) if r.get("task") == "lm"})
        rec.notes.append(f"the real-model study of this model ({where}) measured lengths {lens}, not {T:,}: the "
                         "recommendation rests on the papers and the lab")
        return
    base = next((e for e in zero_shot(study, L, text=FIRST_TEXT) if e["method"] == "none"), None)

    def label(method):
        return "unscaled" if method == "none" else method_label(method)

    # a config can carry only a frequency method: the attention methods measured in the study are weighed apart
    everything = table
    attention = [e for e in table if is_attention_method(e["method"])]
    table = [e for e in table if e not in attention]
    # LongRoPE's rows ran with the factors the study searched: only those can be recommended, never unsearched ones
    searched = study.get("search") if isinstance(study.get("search"), dict) else {}
    if any(e["method"] == "longrope" for e in table) and not isinstance(searched.get("rope_parameters"), dict):
        table = [e for e in table if e["method"] != "longrope"]
        rec.notes.append(f"LongRoPE's row in {where} ran with searched factors the study does not record, so it is "
                         "not recommended here")

    windows = table[0]["windows"]

    def value(e):
        return f"{e['ppl']:.2f}" + (f" +- {e['std']:.2f}" if e.get("std") is not None else "")

    measured = (f"measured on this model ({study.get('name', 'real model')}; {where}): zero-shot perplexity at "
                f"{T:,} tokens ({windows} window{'s' if windows != 1 else ''} of {T:,} tokens of the CPython "
                "validation text, bf16" + ("; mean +- std over the windows" if windows > 1 else "") + ") "
                + ", ".join(f"{label(e['method'])} {value(e)}" for e in everything)
                + (f"; unscaled at the trained {L:,}: {base['ppl']:.2f}" if base else ""))
    keys = passkey(study, T)
    if keys:
        rec.notes.append(f"passkey retrieval on this model at {T:,} tokens (keys found / trials over the depths "
                         "measured, greedy decoding): " + ", ".join(f"{label(m)} {f}/{n}" for m, (f, n) in keys.items())
                         + (f"; attention sinks only see the first tokens and a recent window: {get_attention_method('sinks').costs}"
                            if "sinks" in keys else ""))
    better = [e for e in attention if e["ppl"] < table[0]["ppl"]]
    if better:
        # the one to run: the lowest perplexity among those that retrieved best where passkey was measured (a
        # method that keeps perplexity by dropping the middle, as sinks do, should not be the first named)
        def retrieval(e):
            found, trials = keys.get(e["method"], (None, None))
            return -(found / trials) if trials else 0.0
        first = min(better, key=lambda e: (retrieval(e), e["ppl"]))
        why = (f", the lowest of those that found the passkey in {keys[first['method']][0]}/"
               f"{keys[first['method']][1]}" if first is not better[0] and first["method"] in keys else "")
        rec.notes.append(
            "measured lower still on this model, by changing attention rather than the config: "
            + ", ".join(f"{label(e['method'])} {e['ppl']:.2f}" for e in better)
            + f" (run the model under posenc.patch(model, method='{first['method']}', ...){why}, with the study's "
            f"options, {study.get('report') or f'docs/results/{path.parent.name}/report.md'}; costs: {get_attention_method(first['method']).costs})")
    best = table[0]["method"]
    if len(table) == 1:
        rec.notes.append(measured + f": the study has no extension method at {T:,} yet, so the recommendation rests "
                                    "on the papers and the lab")
        return
    if best == "none":
        rec.reasons.insert(0, measured + ": no method beat the unscaled model at this length")
        return
    old_method = rec.method
    old_type = (rec.config_snippet.get("rope_parameters") or {}).get("rope_type")
    old_measured = next((e for e in table if e["method"] == old_type), None)
    if old_measured is not None and old_measured["ppl"] <= table[0]["ppl"]:
        # the papers' choice measured best here too (or tied: dynamic NTK at exactly its static base), so it stays
        tied = [label(e["method"]) for e in table if e["ppl"] == old_measured["ppl"] and e["method"] != old_type]
        rec.reasons.insert(0, measured + f": {label(old_type)} measures best here"
                           + (f" (tied with {', '.join(tied)})" if tied else ""))
        return
    snippet: dict[str, Any] = {}
    if best == "longrope":  # the searched factors the rows ran with (the study's posenc search)
        if searched.get("max_position_embeddings") not in (None, entry["max_position_embeddings"] or L):
            snippet["max_position_embeddings"] = searched["max_position_embeddings"]
        snippet["rope_parameters"] = {"rope_theta": theta, **searched["rope_parameters"]}
    else:
        factor = get_method(best).lab_factor or _factor(T, L)
        spec = ExtensionSpec(original=L, factor=factor, rotary_dim=entry["rotary_dim"], theta=theta, target=T)
        written = transformers_config(best, method_config(best, spec), spec)
        if written.max_position_embeddings != (entry["max_position_embeddings"] or L):
            snippet["max_position_embeddings"] = written.max_position_embeddings
        snippet["rope_parameters"] = {"rope_theta": theta, **written.scaling}
    if best == "yarn":
        snippet = _yarn_betas(snippet)
    rec.method = f"{best} (zero-shot: the best measured on this model at {T:,})"
    rec.config_snippet = snippet
    rec.parameters = {**snippet["rope_parameters"], **{k: v for k, v in snippet.items() if k != "rope_parameters"}}
    papers = list(rec.reasons)
    if papers:
        papers[0] = f"the papers and the lab, which rank {old_method} first for this case: {papers[0]}"
    rec.reasons = [measured, *papers]
    mine = next(e for e in table if e["method"] == best)
    rec.alternatives.insert(0, _alt(old_method, "the papers' and the lab's choice for this case; "
                                    + (f"measured on this model at {T:,}: {old_measured['ppl']:.2f} vs "
                                       f"{label(best)} {mine['ppl']:.2f}" if old_measured else
                                       f"not measured in this model's study at {T:,}")))
    # the generic list's entry for the method now recommended argued against it from other models' numbers
    rec.alternatives = [a for a in rec.alternatives if not a["option"].startswith(label(best))]
    runner = next((e for e in table[1:] if e["ppl"] > mine["ppl"]), None)
    if runner is not None and runner["ppl"] < 1.05 * mine["ppl"]:
        # the study's other texts say whether the order transfers
        elsewhere = []
        for text in other_texts(study):
            other = {e["method"]: e for e in zero_shot(study, T, text=text)}
            if best in other and runner["method"] in other:
                a, b = other[best], other[runner["method"]]
                elsewhere.append(f"on the study's {text} text ({a['windows']} window"
                                 f"{'s' if a['windows'] != 1 else ''}) {label(best)} {a['ppl']:.2f} against "
                                 f"{label(runner['method'])} {b['ppl']:.2f}, "
                                 + ("the same order" if a["ppl"] < b["ppl"] else "the other order"))
        rec.notes.append(f"a close call: {label(best)} leads {label(runner['method'])} by "
                         f"{100 * (runner['ppl'] / mine['ppl'] - 1):.1f}% over {windows} window"
                         f"{'s' if windows != 1 else ''}; "
                         + ("; ".join(elsewhere) if elsewhere else "more windows or another text may reorder them"))
    rec.notes = [n for n in rec.notes if "dynamic NTK scales" not in n and not n.startswith("factor 1:")]
    how = (f"these are the factors the study's search found ({searched.get('config', 'its search')}: `"
           f"{searched.get('command', 'posenc search')}`); `posenc search MODEL --target-length {T}` searches your own"
           if best == "longrope" else f"`posenc extend CONFIG --method {best} --target-length {T}` writes this config")
    rec.notes.append(how + "; the study's settings, wall times and coverage are in "
                     + (study.get("report") or f"docs/results/{path.parent.name}/report.md"))


def _family_rope_types(rec: Recommendation, config: dict, L: int, T: int, theta: float, lmax,
                       rotary_dim: int) -> None:
    """A family whose transformers config accepts only some rope types (Phi-3: longrope): a snippet of another type
    would not load, so the recommendation becomes LongRoPE's (unsearched factors; ``posenc search`` finds better)."""
    from posenc.tools.extend import ACCEPTED_ROPE_TYPES

    model_type = config.get("model_type")
    accepted = ACCEPTED_ROPE_TYPES.get(model_type)
    rope_type = rec.config_snippet["rope_parameters"].get("rope_type")
    if accepted is None or rope_type in accepted:
        return
    replacing = rec.method[rec.method.find(", replacing"):] if ", replacing" in rec.method else ""
    rec.method = f"longrope (model_type {model_type} accepts rope_type {' or '.join(accepted)} only){replacing}"
    rec.config_snippet = _snippet("longrope", L, T, theta, lmax, rotary_dim)
    rec.parameters = {**rec.config_snippet["rope_parameters"],
                      **{k: v for k, v in rec.config_snippet.items() if k != "rope_parameters"}}
    rec.reasons = [f"transformers' config class for {model_type} refuses rope_type {rope_type!r} (it accepts "
                   f"{' or '.join(accepted)}), so the {rope_type} recommendation for other RoPE models cannot be "
                   "written for this one; Phi-3's own long-context checkpoints use LongRoPE (Ding et al. 2024)",
                   EVIDENCE["lab_longrope"]]
    rec.notes = [n for n in rec.notes if "`posenc extend CONFIG" not in n and rope_type not in n
                 and not n.startswith("factor 1:")]
    rec.notes.insert(0, "the snippet is LongRoPE with posenc extend's unsearched factors; `posenc search MODEL_DIR` "
                        "finds factors for the model, and `posenc extend CONFIG --method longrope` (with --replace "
                        "when the config has a scaling already) writes the unsearched ones")


def _per_layer_type(rec: Recommendation, config: dict) -> None:
    """A config with RoPE parameters per layer type (Gemma 3: local and global layers): the snippet rescales the
    full-attention entry only and keeps the others, in the nested form transformers reads (a flat rope_parameters
    would be taken for neither, and the full-attention layers would stay plain RoPE)."""
    from posenc.rope.config import layer_type_parameters, rope_section

    entries = layer_type_parameters(rope_section(config))
    if entries is None:
        return
    flat = rec.config_snippet["rope_parameters"]
    rec.config_snippet["rope_parameters"] = {**{k: v for k, v in entries.items()}, "full_attention": flat}
    rec.notes = [n for n in rec.notes if "`posenc extend CONFIG" not in n]
    rec.notes.append("this config has RoPE parameters per layer type: the snippet rescales the full_attention "
                     "(global) entry and keeps the others as they are; merge it by hand (`posenc extend` refuses "
                     "per-layer-type configs)")


def _non_rope_model(config, target: int, train: int | None, budget: str, task: str,
                    extrapolate: bool) -> Recommendation | None:
    """An existing ALiBi model needs no change to run longer: the recommendation says so (None for other configs,
    which ``_config_rope`` reads or refuses by name)."""
    from posenc.tools.inspect import inspect_config

    report = inspect_config(config)
    if report["scheme"] != "alibi":
        return None
    notes = [EVIDENCE["alibi_sliding"] + " -- check long-range retrieval (`posenc lab` passkey task) before "
             "trusting it"] if task in ("retrieval", "code") else []
    return Recommendation(
        scheme="ALiBi (existing model)", method="none",
        parameters={"target_context": target, "budget": budget},
        reasons=["ALiBi has no position embedding to rescale: its -m*distance bias is defined at every distance, so "
                 "the model runs past its trained length as it is; " + EVIDENCE["alibi_table2"]],
        alternatives=[_alt("a RoPE extension method", "there are no rotary frequencies to rescale")],
        config_snippet={},
        notes=notes + ["raise the serving length in the config if it caps inputs (MPT's max_seq_len; BLOOM has no "
                       "cap)"],
        inputs={"target_context": target, "train_context": train, "budget": budget, "task": task,
                "extrapolation_needed": bool(extrapolate), "rope_theta": None, "existing_scaling": None})


def _covers(ex: dict[str, Any], T: int, budget: str) -> bool:
    """Whether a config's existing scaling already serves T tokens. Dynamic NTK claims no limit: it covers any T
    zero-shot (budget none), and up to max_position_embeddings, where it starts acting, for a fine-tune (whose
    frequencies must not move with the length)."""
    if ex["claimed_context"] is not None:
        return T <= ex["claimed_context"]
    if ex["rope_type"] == "dynamic":
        return budget == "none" or (ex["max_position_embeddings"] is not None and T <= ex["max_position_embeddings"])
    return False


def _keep_existing(ex: dict[str, Any], T: int, budget: str) -> Recommendation:
    """The config's own scaling already reaches T: nothing to change."""
    if ex["claimed_context"] is not None:
        why = (f"{_describe_existing(ex)} ({ex['claimed_from']}), which covers the target {T:,}: the model was "
               f"trained or tuned with these frequencies (transformers' modeling_rope_utils computes them from the "
               f"config's {ex['rope_type']} keys), so no extension is needed")
    elif ex["max_position_embeddings"] is not None and T <= ex["max_position_embeddings"]:
        why = (f"{_describe_existing(ex)}: the target {T:,} fits in max_position_embeddings "
               f"({ex['max_position_embeddings']}), below which dynamic NTK keeps the trained frequencies "
               "(transformers' modeling_rope_utils, dynamic rope type), so no extension is needed")
    else:
        why = (f"{_describe_existing(ex)}: dynamic NTK rescales the base for every length past "
               f"max_position_embeddings ({ex['max_position_embeddings']}) (transformers' modeling_rope_utils, "
               f"dynamic rope type), so the config already serves {T:,} tokens zero-shot")
    notes = []
    if ex["claimed_context"] is None and budget == "none" and why.endswith("zero-shot"):
        notes.append("dynamic NTK degrades with the ratio to its original length (Ding et al. 2024, LongRoPE "
                     "Table 1); with a fine-tuning budget, --budget finetune recommends YaRN in its place")
    return Recommendation(
        scheme="keep the model's own encoding", method=f"none (the config's {ex['rope_type']} scaling covers it)",
        parameters={"existing_rope_type": ex["rope_type"], "existing_factor": ex["factor"],
                    "original_context": ex["original_context"], "claimed_context": ex["claimed_context"],
                    "target_context": T},
        reasons=[why],
        alternatives=[_alt("another extension method", f"replacing the {ex['rope_type']} scaling would change the "
                           "frequencies the model was trained with, inside the range it already serves")],
        config_snippet={}, notes=notes)


def _pick_pretrain(T: int, L: int, task: str, extrapolate: bool, given_theta: float | None = None,
                   theta_from: str = "given") -> Recommendation:
    causal = task != "encoder"
    if extrapolate and task in ("lm", "encoder"):
        bias = "-m_h*(i-j) under the causal mask" if causal else "symmetric -m_h*|i-j| (bidirectional)"
        reasons = [EVIDENCE["alibi_table2"], EVIDENCE["alibi_short_train"], EVIDENCE["lab_schemes"]]
        if not causal:
            reasons.append(EVIDENCE["encoder_alibi"])
        snippet: dict[str, Any] = {"attn_config": {"alibi": True, "alibi_bias_max": 8}, "max_seq_len": T}
        unused = ([] if given_theta is None else
                  [f"rope_theta {given_theta:g} ({theta_from}) is not used: ALiBi has no rotary base"])
        return Recommendation(
            scheme="ALiBi", method="none (extrapolates without tuning)",
            parameters={"slopes": "geometric 2^(-8h/H), h=1..H (posenc.alibi_slopes(H))", "bias": bias,
                        "train_context": L, "serve_context": T},
            reasons=reasons,
            alternatives=[
                _alt("RoPE + a YaRN long-context stage",
                     "reaches a chosen length but not past it; every extension needs a factor and long data "
                     "(Press et al. 2022, Table 2: rotary 20.07 -> 79.25 ppl at 30x without it)"),
                _alt("NoPE", "best on synthetic length generalisation (MRR 0.69, Kazemnejad et al. 2023) but "
                             "unproven for LM perplexity at scale; in the lab (docs/lab.md, schemes preset) it is "
                             "nearly flat (10.02 -> 10.52) but 20% worse than ALiBi at the training length"),
                _alt("KERPLE / FIRE / T5 bias", "learned biases; in the lab (docs/lab.md, schemes preset) KERPLE "
                     "is as flat as ALiBi (8.26 -> 8.28 vs 8.32 -> 8.29) for extra parameters, FIRE rose 8.69 -> "
                     "9.42 at 8x (against its paper) and T5 9.57 -> 10.44; none has ALiBi's published scale"),
                _alt("RoPE + ALiBi in one attention", "best of the lab's schemes at 2x-8x (7.78 -> 7.81 vs ALiBi "
                     "8.32 -> 8.29, docs/lab.md) but one tiny model at 128 tokens; no published result at scale"),
                _alt("xPos", "the best rotary variant past the training length in the lab (8.67 at 8x vs RoPE "
                             "12.12, docs/lab.md) but it still rises (x1.12) where ALiBi stays flat"),
                _alt("sinusoidal / learned absolute", EVIDENCE["absolute"]),
            ],
            config_snippet=snippet,
            notes=[f"train at {L} tokens; MPT-style config keys shown (max_seq_len is the serving length); "
                   "in posenc: scores += posenc.alibi_bias(n_heads, q_len, k_len)"
                   + ("" if causal else " (symmetric |i-j| is what alibi_bias builds)"),
                   EVIDENCE["alibi_sliding"] + " -- if far-context retrieval matters, prefer --task retrieval",
                   *unused],
        )
    theta, who = _pretrain_theta(min(T, L))
    if given_theta is None:
        theta_reason = (f"rope_theta {theta:g} follows the published choice of {who} (rope_theta in their model "
                        "cards' config.json)")
    else:
        theta_reason = (f"rope_theta {given_theta:g} as {theta_from}; the published choice at this length is {theta:g} "
                        f"({who}, rope_theta in their model cards' config.json)")
        theta = given_theta
    params: dict[str, Any] = {"rope_theta": theta, "layout": "half (HF rotate_half) or interleaved: same math",
                              "train_context": L}
    reasons = [EVIDENCE["rope_default"], theta_reason]
    alternatives = [
        _alt("ALiBi", "extrapolates in perplexity but its linear distance penalty mutes far tokens "
                      + ("(retrieval/code need them: " + EVIDENCE["alibi_sliding"] + "; " + _evidence("lab_copy")
                         + ")" if task in ("code", "retrieval") else "and frontier long-context models "
                         "standardised on RoPE")),
        _alt("sinusoidal / learned absolute", EVIDENCE["absolute"]),
        _alt("NoPE", "no evidence at scale for LM quality; in the lab it is 29% worse than RoPE at the training "
                     "length (10.02 vs 7.76, docs/lab.md schemes preset)"),
    ]
    if T <= L:
        snippet = {"max_position_embeddings": T, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}
        notes = ["train on documents that actually reach the target length"]
        if extrapolate:
            notes.append("past the trained length RoPE needs an extension: plan a YaRN long-context stage, or "
                         "serve with dynamic NTK as a zero-shot fallback (Ding et al. 2024, LongRoPE Table 1)")
        return Recommendation(scheme="RoPE", method="none (train at the target length)", parameters=params,
                              reasons=reasons, alternatives=alternatives, config_snippet=snippet, notes=notes)
    s = _factor(T, L)
    params.update({"stage_2": "continue training at the target length with YaRN", "factor": s,
                   "original_max_position_embeddings": L, "max_position_embeddings": T})
    reasons += [EVIDENCE["llama31"], EVIDENCE["yarn"]]
    notes = ["stage 1: pretrain at train_context with rope_type default; stage 2: switch to the YaRN parameters "
             "below and train on long documents (the Llama 3.1 / Qwen 2.5 recipe)"]
    if extrapolate:
        notes.append("past the stage-2 length no RoPE method is reliable for retrieval; serve beyond it with "
                     "dynamic NTK only as a graceful-degradation fallback (Ding et al. 2024, LongRoPE Table 1)")
    snippet = _snippet("yarn", L, T, theta)
    return Recommendation(scheme="RoPE", method="yarn (long-context stage)", parameters=params, reasons=reasons,
                          alternatives=alternatives, config_snippet=snippet, notes=notes)


def _pick_existing(T: int, L: int, budget: str, task: str, extrapolate: bool, theta: float, *,
                   lmax: int | None = None, known_rope: bool = False, replacing: bool = False) -> Recommendation:
    """lmax: the config's max_position_embeddings when a config was given; known_rope: the config says RoPE;
    replacing: the config has a scaling of its own, which the recommendation replaces."""
    notes = [] if known_rope else [
        "assumes the existing model uses RoPE (almost every open model does); an ALiBi model (BLOOM, MPT) "
        "needs no change to run longer; a learned-position model (GPT-2, OPT) cannot go past its table "
        "without new rows and training -- run `posenc inspect config.json` to see which you have"]
    if T <= L:
        return Recommendation(
            scheme="keep the model's own encoding", method="none",
            parameters={"train_context": L, "target_context": T},
            reasons=[f"the target ({T}) fits in the trained context ({L}): every extension method would only "
                     "change behaviour inside the trained range (PI/YaRN/static NTK alter frequencies at every "
                     "length: transformers' modeling_rope_utils computes linear and yarn frequencies once, "
                     "whatever the input length)"],
            alternatives=[_alt("any extension", "not needed below the trained length")],
            config_snippet={}, notes=notes)
    s = _factor(T, L)
    if extrapolate:
        notes.append("extrapolation past every length is not something a RoPE extension gives: each method is "
                     "sized for a factor; dynamic NTK degrades the most gracefully past it")
    if budget == "none":
        reasons = [EVIDENCE["zero_shot"], EVIDENCE["dynamic"], EVIDENCE["lab_default"]]
        if s > 4:
            notes.append(f"x{s:g} is a large zero-shot jump: expect a visible perplexity rise (LongRoPE Table 1: "
                         "dynamic NTK 10.21 at 2x but 23.29 at 4x); a short fine-tune with YaRN does far better")
        if task == "retrieval":
            notes.append("long-range retrieval degrades before perplexity does; verify with a passkey test "
                         "(`posenc lab` passkey task) before trusting it")
        notes.append("the attention-changing methods listed among the alternatives: " + EVIDENCE["lab_attention"])
        return Recommendation(
            scheme="RoPE (existing model)", method="dynamic NTK (zero-shot)",
            parameters={"rope_type": "dynamic", "factor": get_method("dynamic").lab_factor or s,
                        "max_position_embeddings": L, "rope_theta": theta},
            reasons=reasons,
            alternatives=[
                _alt("static NTK-aware (raise rope_theta)", "zero-shot works (lab default preset: 8.78 at 4x vs "
                     "RoPE 12.53, docs/lab.md) but changes every "
                     "frequency at all lengths, so short inputs shift too; dynamic leaves them exact"),
                _alt("PI (linear)", "needs fine-tuning: " + EVIDENCE["pi"]),
                _alt("YaRN", "zero-shot it is the worst of the four in LongRoPE Table 1 (32.64 at 8k); use it "
                             "with a fine-tune (--budget finetune)"),
                _alt("LongRoPE", "needs an evolutionary search of per-dimension factors on your model and data "
                                 "(`posenc search`); it then beats the fixed methods at the searched length: "
                                 + EVIDENCE["lab_longrope"]),
                _alt("ALiBi", "needs pretraining from scratch"),
                *attention_alternatives(),
            ],
            config_snippet=_snippet("dynamic", L, T, theta, lmax),
            notes=notes + ["keep max_position_embeddings at the original context: dynamic NTK scales relative to "
                           "it; cache keys before rotation for exactness under a KV cache (docs/scaling.md, the "
                           "Rotary module)",
                           f"factor 1: past the original context, a length L gets static NTK's base for exactly "
                           f"L / {L} (what the lab numbers above measured); transformers' rule with factor {s:g} "
                           f"interpolates more: {s * s - s + 1:g}x instead of {s:g}x at the target"])
    # budget == "finetune"
    reasons = [EVIDENCE["yarn"], EVIDENCE["pi"], EVIDENCE["lab_finetune"],
               "YaRN interpolates only the low-frequency pairs (wavelength > original context) and keeps the "
               "high-frequency ones, plus an attention temperature 0.1*ln(s)+1 that preserves attention entropy "
               "(docs/lesson.md; Peng et al. 2023, YaRN)"]
    if task in ("code", "retrieval"):
        reasons.append("kept high-frequency pairs preserve local token order, which code and exact retrieval "
                       "depend on; PI compresses them by the full factor (Peng et al. 2023, YaRN: its ramp keeps pairs "
                       "that turn more than beta_fast=32 times within L0)")
    return Recommendation(
        scheme="RoPE (existing model)", method="yarn + short fine-tune",
        parameters={"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L,
                    "max_position_embeddings": T, "rope_theta": theta, "beta_fast": 32, "beta_slow": 1},
        reasons=reasons,
        alternatives=[
            _alt("PI (linear)", "also fine after a fine-tune, but divides every frequency by s, losing local "
                                "resolution, and needs more steps to recover (posenc lab: 8.63 vs YaRN's 6.82 after "
                                "the same 100 steps)"),
            _alt("llama3", "the same keep/blend/interpolate idea with fixed wavelength cut-offs; Meta paired it "
                           "with long-context pretraining rather than a short fine-tune -- a fine choice if you "
                           "follow that recipe (`posenc extend --method llama3`)"),
            _alt("LongRoPE", "better zero-shot (LongRoPE Table 1: 9.37/11.34; " + EVIDENCE["lab_longrope"] + ") "
                             "but needs its factor search on the model (`posenc search`, then `posenc extend "
                             "--method longrope --longrope rope_scaling.json`); after the same fine-tune it ties "
                             "YaRN (6.85 vs 6.82) and loses quality inside the original context (7.49 vs 6.91 at "
                             "1x) unless its short factors are searched too"),
            _alt("PoSE", "fine-tune at the original length with skip-wise positions: cheaper per step; "
                         + EVIDENCE["lab_pose"]),
            _alt("dynamic NTK", "a zero-shot method: fine-tuning under frequencies that change with length "
                                "trains on a moving target"),
            _alt("ALiBi", "needs pretraining from scratch"),
        ],
        config_snippet=_yarn_betas(_snippet("yarn", L, T, theta, lmax)),
        notes=notes + ["fine-tune on documents up to the target length (hundreds of steps / ~1B tokens: docs/lesson.md "
                       "'PI + fine-tune'); `posenc extend CONFIG --method yarn --target-length "
                       f"{T}{' --replace' if replacing else ''}` writes the config"])


def format_recommendation(rec: Recommendation) -> str:
    """Human-readable text for a Recommendation."""
    i = rec.inputs
    head = f"Recommendation: {rec.scheme} -- {rec.method}"
    if i:
        trained = ("" if i["train_context"] is None else
                   f" (trained at {i['train_context']}, x{i['target_context'] / i['train_context']:g})")
        head += (f"\n  for {i['target_context']} tokens{trained}, "
                 f"budget {i['budget']}, task {i['task']}"
                 + (", extrapolation needed" if i["extrapolation_needed"] else ""))
        if i.get("existing_scaling"):
            head += f"\n  existing scaling: {_describe_existing(i['existing_scaling'])}"
    lines = [head, "", "Parameters:"]
    lines += [f"  {k}: {v}" for k, v in rec.parameters.items()]
    lines += ["", "Why:"] + [f"  - {r}" for r in rec.reasons]
    lines += ["", "Alternatives considered:"] + [f"  - {a['option']}: {a['why_not']}" for a in rec.alternatives]
    if rec.notes:
        lines += ["", "Notes:"] + [f"  - {n}" for n in rec.notes]
    if rec.config_snippet:
        lines += ["", "Config snippet (config.json keys; RoPE in the transformers 5.x form):",
                  json.dumps(rec.config_snippet, indent=2)]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--target-context", type=int, required=True, help="tokens the model must handle")
    parser.add_argument("--train-context", type=int, default=None,
                        help="tokens the model was trained at (existing model) or will be trained at (pretrain); "
                             "read from --config when not given")
    parser.add_argument("--config", default=None,
                        help="an existing model's config.json: its rope_theta and original context are used "
                             "(--rope-theta / --train-context override them), and its existing RoPE scaling is "
                             "taken into account")
    parser.add_argument("--budget", choices=BUDGETS, default="none",
                        help="none: use an existing model as is; finetune: a short fine-tune; pretrain: new model")
    parser.add_argument("--task", choices=TASKS, default="lm", help="workload (encoder = bidirectional)")
    parser.add_argument("--extrapolation-needed", action="store_true",
                        help="inputs may be longer than any length ever trained on")
    parser.add_argument("--rope-theta", type=float, default=None,
                        help="the existing model's rope_theta (a number > 1, at most float32's largest), written "
                             "into the snippet (without it the snippet "
                             "shows a placeholder); with --budget pretrain, the base to train with instead of the "
                             "published anchor")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    rec = pick(args.target_context, args.train_context, args.budget, args.task, args.extrapolation_needed,
               rope_theta=args.rope_theta, config=args.config)
    print(json.dumps(rec.to_dict(), indent=2) if args.json else format_recommendation(rec))
    return 0
