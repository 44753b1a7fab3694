"""``posenc pick``: the lesson's "positional-encoding picker" skill as a decision procedure.

Given the context the model must serve, the context it was (or will be) trained at, the training budget, the task and
whether it must work past every trained length, recommend a scheme and an extension method with parameters, the
reasons (each citing its evidence: a paper by author, year and table, transformers' modeling_rope_utils, a model
card, docs/lesson.md, or a measured lab preset in docs/lab.md with its settings), the alternatives and why not, and a
ready config snippet. The decision table is documented in docs/picker.md; keep the two in step.

This module reads the inputs and an existing model's config and applies the family rules of its config class; the
decision table and the evidence it cites are posenc.tools.pick_rules, a real-model study of the very model
(posenc.tools.pick_study) has the last word where it measured the target length.
"""

from __future__ import annotations

import json
from typing import Any

from posenc._internal.validate import check_choice, check_int, is_number
from posenc._internal.errors import PosencError
from posenc.rope.contexts import MAX_CONTEXT
# the decision table and its evidence live in posenc.tools.pick_rules; its public names are re-exported here
from posenc.tools.pick_rules import (EVIDENCE, Recommendation, attention_alternatives,  # noqa: F401 (re-exported)
                                     copy_cpu_passed, covers, describe_existing, keep_existing, method_snippet,
                                     non_rope_model, pick_existing, pick_pretrain)
from posenc.tools.pick_study import real_model_evidence

# the snippet's rope_theta when the existing model's base is not given: visibly not a number to copy
THETA_PLACEHOLDER = "<your model's rope_theta: pass --rope-theta, or --config config.json to read it>"

HELP = "Recommend a positional encoding / context-extension method for a target context, budget and task."

BUDGETS = ("none", "finetune", "pretrain")
TASKS = ("lm", "code", "retrieval", "encoder")


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


def _read_existing(config, rope_theta, theta_from: str, train_context):
    """An existing model's RoPE entry, with the base and trained context it gives where the caller gave none:
    -> (entry, rope_theta, where the base came from, train_context)."""
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
    return entry, rope_theta, theta_from, train_context


def pick(target_context: int, train_context: int | None = None, budget: str = "none", task: str = "lm",
         extrapolation_needed: bool = False, *, rope_theta: float | None = None, config=None,
         evidence=None) -> Recommendation:
    """Recommend a positional-encoding strategy.

    target_context: tokens the model must handle; train_context: tokens it was (budget none/finetune: an existing
    model's original context) or will be (budget pretrain) trained at; budget: "none" (use an existing model as is),
    "finetune" (a short fine-tune of an existing model), "pretrain" (train a new model); task: "lm", "code",
    "retrieval" or "encoder" (bidirectional); extrapolation_needed: inputs may exceed every length ever trained on;
    rope_theta: the existing model's base (budget none/finetune), written into the snippet (None: a placeholder
    string, never a made-up number); config: an existing model's config.json (path or mapping): rope_theta and
    train_context default to what it says (``config_context``); evidence: the --out folder of a ``posenc tune`` of
    that model, cited (and its config winner recommended) in place of studies of other models
    (posenc.tools.pick_tune), or of a ``posenc eval`` of it, cited as measured on it (fine-tuned by posenc
    finetune, or zero-shot; posenc.tools.pick_eval).
    """
    existing, theta_from = None, "given"
    if evidence is not None and config is None:
        raise PosencError("evidence: --evidence cites a posenc tune or eval of the model --config describes: pass "
                          "--config with it")
    if config is not None and budget != "pretrain":
        kept = non_rope_model(config, target_context, train_context, budget, task, extrapolation_needed)
        if kept is not None:
            return kept
    if config is not None:   # explicit arguments win over what the config says
        entry, rope_theta, theta_from, train_context = _read_existing(config, rope_theta, theta_from, train_context)
        existing = _existing_scaling(entry)
    if train_context is None:
        raise PosencError("train_context is required (or give config= to read it from a model config)")
    _check_inputs(target_context, train_context, budget, task, rope_theta)
    inputs = {"target_context": target_context, "train_context": train_context, "budget": budget, "task": task,
              "extrapolation_needed": bool(extrapolation_needed), "rope_theta": rope_theta,
              "existing_scaling": existing}
    if budget == "pretrain":
        rec = pick_pretrain(target_context, train_context, task, extrapolation_needed,
                            None if rope_theta is None else float(rope_theta), theta_from)
        if existing is not None:
            rec.notes.append(f"{describe_existing(existing)}: a new model is pretrained from scratch, so the "
                             "recommendation above does not build on it")
    elif existing is not None and covers(existing, target_context, budget):
        rec = keep_existing(existing, target_context, budget)
    else:
        rec = pick_existing(target_context, train_context, budget, task, extrapolation_needed,
                            10_000.0 if rope_theta is None else float(rope_theta),
                            lmax=None if config is None else entry["max_position_embeddings"],
                            known_rope=config is not None, replacing=existing is not None)
        if existing is not None and rec.config_snippet:
            rec.method += f", replacing the config's {existing['rope_type']} scaling"
            short = (f"short of the target {target_context:,}" if existing["claimed_context"] is not None else
                     "whose frequencies move with the length (a moving target to fine-tune on)")
            rec.notes.insert(0, f"{describe_existing(existing)}, {short}: the snippet replaces that scaling "
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
    _measured_evidence(rec, config, evidence, budget, existing, train_context, target_context, rope_theta,
                       entry if config is not None else None)
    rec.inputs = inputs
    return rec


def _measured_evidence(rec: Recommendation, config, evidence, budget: str, existing, L: int, T: int, rope_theta,
                       entry) -> None:
    """The measured evidence of real models: a tune of this model (``evidence``), else a committed study of it
    (posenc.tools.pick_study), and the studies of other models labelled as such (posenc.tools.pick_tune); an eval
    of this model (``evidence`` a posenc eval folder) is cited as measured on it (posenc.tools.pick_eval); with
    budget finetune, a fine-tune study of this model (posenc.tools.pick_finetune)."""
    from posenc.tools.pick_eval import eval_evidence, is_eval_result, read_evidence
    from posenc.tools.pick_tune import (other_model_evidence, read_tune_result, tune_evidence, tune_retrieval_note,
                                        tune_summary)

    if evidence is not None and is_eval_result(read_evidence(evidence)):   # an eval of this model: cited as such
        eval_evidence(rec, evidence, config, budget, T)
        return
    if evidence is None and config is not None and budget == "finetune":   # a fine-tune study of this very model
        from posenc.tools.pick_finetune import finetune_evidence

        finetune_evidence(rec, config, T)
    applies = config is not None and budget == "none" and existing is None and bool(rec.config_snippet)
    if evidence is not None and not applies:
        doc = read_tune_result(evidence, config)
        rec.notes.append(tune_summary(doc, evidence) + ": tune measures the model as is (budget none) and this case "
                         "keeps or retrains it, so the recommendation rests on the rules above")
        tune_retrieval_note(rec, doc)
    if not applies:
        return
    if evidence is not None:
        tune_evidence(rec, evidence, config, L, T, entry)
        return
    real_model_evidence(rec, config, L, T, 10_000.0 if rope_theta is None else float(rope_theta), entry)
    other_model_evidence(rec, config, T)


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
    rec.config_snippet = method_snippet("longrope", L, T, theta, lmax, rotary_dim)
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
    would be taken for neither, and the full-attention layers would stay plain RoPE) -- posenc.rope.layers' rule,
    the one ``posenc extend`` writes by."""
    from posenc.rope.layers import GLOBAL_LAYER_TYPE, global_rope_entry, with_global_rope

    if global_rope_entry(config) is None:
        return
    flat = rec.config_snippet["rope_parameters"]
    rec.config_snippet["rope_parameters"] = with_global_rope(config, {"rope_parameters": flat})["rope_parameters"]
    rec.notes.append(f"this config has RoPE parameters per layer type: the snippet rescales the {GLOBAL_LAYER_TYPE} "
                     "(global) entry and keeps the others as they are (their layers attend within a window inside "
                     "the trained range); `posenc extend` writes the same")


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
            head += f"\n  existing scaling: {describe_existing(i['existing_scaling'])}"
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
    from posenc._internal.flags import add_shared

    add_shared(parser, "target_length", dest="target_context", required=True, help="tokens the model must handle")
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
    parser.add_argument("--evidence", default=None,
                        help="the --out folder of a posenc tune of the --config model (its winner, runners-up and "
                             "paired differences are cited, and a config winner is recommended) or of a posenc eval "
                             "of it (its perplexities are cited: on the fine-tuned model when posenc finetune made "
                             "it, else zero-shot); either's passkey and RULER scores are cited beside perplexity")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    rec = pick(args.target_context, args.train_context, args.budget, args.task, args.extrapolation_needed,
               rope_theta=args.rope_theta, config=args.config, evidence=args.evidence)
    print(json.dumps(rec.to_dict(), indent=2) if args.json else format_recommendation(rec))
    return 0
