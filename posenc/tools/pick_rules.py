"""The picker's decision table (``posenc pick``, docs/picker.md): the evidence it cites and one rule per case.

``EVIDENCE`` holds every sentence a recommendation cites (a paper by author, year and table, transformers'
modeling_rope_utils, a model card, docs/lesson.md, or a measured lab preset in docs/lab.md with its settings). The
rules: a new model (``pick_pretrain``), an existing RoPE model zero-shot or with a short fine-tune
(``pick_existing``), an existing config whose own scaling already reaches the target (``covers``,
``keep_existing``), an ALiBi model (``non_rope_model``). posenc.tools.pick reads the inputs and a config and calls
them; posenc.tools.pick_study lets a real-model study of the very model override the papers' choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from posenc.extensions import ExtensionSpec, get_method, method_config


def _copy(scheme: str, length: int) -> str:
    """The field citing the copy-cpu preset's mean token accuracy of ``scheme`` at ``length`` (a percentage)."""
    return f"{{copy-cpu[{scheme}@{length}#token_accuracy]:.0%}}"


def _attn(scaling: str, attr: str = "", at: int = 1024) -> str:
    """The field citing the attention-extension run's mean perplexity (``attr`` ".std": its std over the seeds)."""
    model = "rope" if scaling == "none" else f"rope/{scaling}"
    return f"{{attention-extension[{model}@{at}]{attr}:.2f}}"


# Evidence: published results cited by paper (author, year, table), transformers' semantics, the spec (docs/lesson.md)
# and posenc's own lab measurements (docs/lab.md; their numbers are format fields that ``evidence(key)`` fills from
# the packaged extracts of docs/results/, posenc.tools.lab_evidence); see docs/picker.md.
EVIDENCE = {
    "lab_attention": "posenc lab (docs/attention-extension.md, 3 seeds): on the default preset's model at 8x, "
                     f"Self-Extend {_attn('self-extend')} +- {_attn('self-extend', '.std')}, Leaky ReRoPE "
                     f"{_attn('leaky-rerope')}, ReRoPE {_attn('rerope')}, Dual Chunk {_attn('dca')}, sinks "
                     f"{_attn('sinks')} ppl vs YaRN {_attn('yarn')} and RoPE {_attn('none')} ({_attn('none', at=128)} "
                     "at 1x); but passkey retrieval past the trained length stayed at 0-11% for all of them on the "
                     "passkey preset (sinks: evicted keys are gone by design)",
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
                   "seed 0): RoPE ppl {default[rope@128]:.2f} -> {default[rope@512]:.2f} at 4x, "
                   "{default[rope@1024]:.2f} at 8x; zero-shot dynamic NTK {default[rope/dynamic@512]:.2f} / "
                   "{default[rope/dynamic@1024]:.2f}, NTK-aware {default[rope/ntk@512]:.2f} / "
                   "{default[rope/ntk@1024]:.2f}, YaRN {default[rope/yarn@512]:.2f} / "
                   "{default[rope/yarn@1024]:.2f}, PI ~{default[rope/linear@*]:.1f} at every length; ALiBi "
                   "{default[alibi@128]:.2f} -> {default[alibi@1024]:.2f}",
    "lab_schemes": "posenc lab --preset schemes (docs/lab.md: d_model 64, 2 layers, 300 steps x 16 at 128 tokens, "
                   "seeds 0-2, mean): ppl 1x -> 8x "
                   + ", ".join(f"{label} {{schemes[{scheme}@128]:.2f}} -> {{schemes[{scheme}@1024]:.2f}}"
                               for label, scheme in (("ALiBi", "alibi"), ("KERPLE", "kerple"),
                                                     ("RoPE+ALiBi", "rope+alibi"), ("xPos", "xpos"), ("CoPE", "cope"),
                                                     ("FIRE", "fire"), ("T5", "t5"), ("NoPE", "nope"),
                                                     ("RoPE", "rope"))),
    "lab_nope": "in the lab it is {schemes[nope@128].vs[rope@128]:.0%} worse than RoPE at the training length "
                "({schemes[nope@128]:.2f} vs {schemes[rope@128]:.2f}, docs/lab.md schemes preset)",
    "lab_copy": "posenc lab --preset copy-cpu (docs/lab.md: 4 layers, d_model 64, 2 heads, copies of distinct bytes "
                "trained at 128 after a 32/64-token warmup until 98% of two held-out sets are exact, cap 2500 steps "
                "(NoPE, ALiBi 3000), seeds 0-2, bf16; {copy_passed} >= 95% exact at 1x): past 1x ALiBi keeps "
                f"{_copy('alibi', 256)} token accuracy at 2x and {_copy('alibi', 512)} at 4x where RoPE keeps "
                f"{_copy('rope', 256)} and {_copy('rope', 512)}; KERPLE holds {_copy('kerple', 256)} / "
                f"{_copy('kerple', 512)}, T5 {_copy('t5', 256)} / {_copy('t5', 512)}, CoPE {_copy('cope', 256)} / "
                f"{_copy('cope', 512)}",
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


def alt(option: str, why_not: str) -> dict[str, str]:
    return {"option": option, "why_not": why_not}


def attention_alternatives() -> list[dict[str, str]]:
    """The registry's attention-changing methods as zero-shot alternatives, each with what it costs at inference:
    they need no config change but run only where posenc patches the model's attention (docs/attention-extension.md
    has the lab's measurements)."""
    from posenc.attention import ATTENTION_METHODS

    return [alt(f"{m.label} (changes attention: posenc.patch(model, method={n!r}))",
                f"not a config edit: the model must run under posenc.patch; costs: {m.costs}. {m.note}")
            for n, m in ATTENTION_METHODS.items()]


def pretrain_theta(context: int) -> tuple[float, str]:
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


def evidence(key: str) -> str:
    """``EVIDENCE[key]`` with its measured numbers filled in: the lab's from the packaged extracts
    (posenc.tools.lab_evidence) and the copy-cpu count."""
    from posenc.tools.lab_evidence import fill

    text = EVIDENCE[key]
    return fill(text, copy_passed=copy_cpu_passed()) if "{copy_passed}" in text else fill(text)


def method_snippet(method: str, train: int, target: int, theta: float, lmax: int | None = None,
                   rotary_dim: int | None = None) -> dict[str, Any]:
    """The config keys ``method`` writes (from the extension-method registry), transformers 5.x form.
    lmax: the config's current max_position_embeddings (default ``train``): the snippet sets it when it differs."""
    # a method the lab evaluates at its own factor (dynamic NTK: 1) is recommended at it: that is what was measured
    factor = get_method(method).lab_factor or extension_factor(target, train)
    written = method_config(method, ExtensionSpec(original=train, factor=factor, rotary_dim=rotary_dim, theta=theta,
                                                  target=target))
    snippet: dict[str, Any] = {}
    if written.max_position_embeddings != (train if lmax is None else lmax):
        snippet["max_position_embeddings"] = written.max_position_embeddings
    snippet["rope_parameters"] = {**written.scaling, "rope_theta": theta}
    return snippet


def yarn_betas(snippet: dict[str, Any]) -> dict[str, Any]:
    """The YaRN snippet with the ramp bounds its text cites written out (transformers' defaults, YaRN paper)."""
    snippet["rope_parameters"] = {**snippet["rope_parameters"], "beta_fast": 32, "beta_slow": 1}
    return snippet


def extension_factor(target: int, train: int) -> float:
    return target / train  # exact: transformers warns when a yarn factor differs from Lmax / L0


def describe_existing(ex: dict[str, Any]) -> str:
    factor = f" (factor {ex['factor']:g})" if ex["factor"] is not None else ""
    claims = (f"claims {ex['claimed_context']:,} tokens" if ex["claimed_context"] is not None
              else "claims no fixed limit")
    original = f"from an original {ex['original_context']:,}" if ex["original_context"] else "original unknown"
    return f"the config's {ex['rope_type']} scaling{factor}, {original}, {claims}"


def non_rope_model(config, target: int, train: int | None, budget: str, task: str,
                   extrapolate: bool) -> Recommendation | None:
    """An existing ALiBi model needs no change to run longer: the recommendation says so (None for other configs,
    which posenc.tools.pick reads or refuses by name)."""
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
        alternatives=[alt("a RoPE extension method", "there are no rotary frequencies to rescale")],
        config_snippet={},
        notes=notes + ["raise the serving length in the config if it caps inputs (MPT's max_seq_len; BLOOM has no "
                       "cap)"],
        inputs={"target_context": target, "train_context": train, "budget": budget, "task": task,
                "extrapolation_needed": bool(extrapolate), "rope_theta": None, "existing_scaling": None})


def covers(ex: dict[str, Any], T: int, budget: str) -> bool:
    """Whether a config's existing scaling already serves T tokens. Dynamic NTK claims no limit: it covers any T
    zero-shot (budget none), and up to max_position_embeddings, where it starts acting, for a fine-tune (whose
    frequencies must not move with the length)."""
    if ex["claimed_context"] is not None:
        return T <= ex["claimed_context"]
    if ex["rope_type"] == "dynamic":
        return budget == "none" or (ex["max_position_embeddings"] is not None and T <= ex["max_position_embeddings"])
    return False


def keep_existing(ex: dict[str, Any], T: int, budget: str) -> Recommendation:
    """The config's own scaling already reaches T: nothing to change."""
    if ex["claimed_context"] is not None:
        why = (f"{describe_existing(ex)} ({ex['claimed_from']}), which covers the target {T:,}: the model was "
               f"trained or tuned with these frequencies (transformers' modeling_rope_utils computes them from the "
               f"config's {ex['rope_type']} keys), so no extension is needed")
    elif ex["max_position_embeddings"] is not None and T <= ex["max_position_embeddings"]:
        why = (f"{describe_existing(ex)}: the target {T:,} fits in max_position_embeddings "
               f"({ex['max_position_embeddings']}), below which dynamic NTK keeps the trained frequencies "
               "(transformers' modeling_rope_utils, dynamic rope type), so no extension is needed")
    else:
        why = (f"{describe_existing(ex)}: dynamic NTK rescales the base for every length past "
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
        alternatives=[alt("another extension method", f"replacing the {ex['rope_type']} scaling would change the "
                          "frequencies the model was trained with, inside the range it already serves")],
        config_snippet={}, notes=notes)


def pick_pretrain(T: int, L: int, task: str, extrapolate: bool, given_theta: float | None = None,
                  theta_from: str = "given") -> Recommendation:
    causal = task != "encoder"
    if extrapolate and task in ("lm", "encoder"):
        bias = "-m_h*(i-j) under the causal mask" if causal else "symmetric -m_h*|i-j| (bidirectional)"
        reasons = [EVIDENCE["alibi_table2"], EVIDENCE["alibi_short_train"], evidence("lab_schemes")]
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
                alt("RoPE + a YaRN long-context stage",
                    "reaches a chosen length but not past it; every extension needs a factor and long data "
                    "(Press et al. 2022, Table 2: rotary 20.07 -> 79.25 ppl at 30x without it)"),
                alt("NoPE", "best on synthetic length generalisation (MRR 0.69, Kazemnejad et al. 2023) but "
                            "unproven for LM perplexity at scale; in the lab (docs/lab.md, schemes preset) it is "
                            "nearly flat (10.02 -> 10.52) but 20% worse than ALiBi at the training length"),
                alt("KERPLE / FIRE / T5 bias", "learned biases; in the lab (docs/lab.md, schemes preset) KERPLE "
                    "is as flat as ALiBi (8.26 -> 8.28 vs 8.32 -> 8.29) for extra parameters, FIRE rose 8.69 -> "
                    "9.42 at 8x (against its paper) and T5 9.57 -> 10.44; none has ALiBi's published scale"),
                alt("RoPE + ALiBi in one attention", "best of the lab's schemes at 2x-8x (7.78 -> 7.81 vs ALiBi "
                    "8.32 -> 8.29, docs/lab.md) but one tiny model at 128 tokens; no published result at scale"),
                alt("xPos", "the best rotary variant past the training length in the lab (8.67 at 8x vs RoPE "
                            "12.12, docs/lab.md) but it still rises (x1.12) where ALiBi stays flat"),
                alt("sinusoidal / learned absolute", EVIDENCE["absolute"]),
            ],
            config_snippet=snippet,
            notes=[f"train at {L} tokens; MPT-style config keys shown (max_seq_len is the serving length); "
                   "in posenc: scores += posenc.alibi_bias(n_heads, q_len, k_len)"
                   + ("" if causal else " (symmetric |i-j| is what alibi_bias builds)"),
                   EVIDENCE["alibi_sliding"] + " -- if far-context retrieval matters, prefer --task retrieval",
                   *unused],
        )
    theta, who = pretrain_theta(min(T, L))
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
        alt("ALiBi", "extrapolates in perplexity but its linear distance penalty mutes far tokens "
                     + ("(retrieval/code need them: " + EVIDENCE["alibi_sliding"] + "; " + evidence("lab_copy")
                        + ")" if task in ("code", "retrieval") else "and frontier long-context models "
                        "standardised on RoPE")),
        alt("sinusoidal / learned absolute", EVIDENCE["absolute"]),
        alt("NoPE", "no evidence at scale for LM quality; " + evidence("lab_nope")),
    ]
    if T <= L:
        snippet = {"max_position_embeddings": T, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}
        notes = ["train on documents that actually reach the target length"]
        if extrapolate:
            notes.append("past the trained length RoPE needs an extension: plan a YaRN long-context stage, or "
                         "serve with dynamic NTK as a zero-shot fallback (Ding et al. 2024, LongRoPE Table 1)")
        return Recommendation(scheme="RoPE", method="none (train at the target length)", parameters=params,
                              reasons=reasons, alternatives=alternatives, config_snippet=snippet, notes=notes)
    s = extension_factor(T, L)
    params.update({"stage_2": "continue training at the target length with YaRN", "factor": s,
                   "original_max_position_embeddings": L, "max_position_embeddings": T})
    reasons += [EVIDENCE["llama31"], EVIDENCE["yarn"]]
    notes = ["stage 1: pretrain at train_context with rope_type default; stage 2: switch to the YaRN parameters "
             "below and train on long documents (the Llama 3.1 / Qwen 2.5 recipe)"]
    if extrapolate:
        notes.append("past the stage-2 length no RoPE method is reliable for retrieval; serve beyond it with "
                     "dynamic NTK only as a graceful-degradation fallback (Ding et al. 2024, LongRoPE Table 1)")
    snippet = method_snippet("yarn", L, T, theta)
    return Recommendation(scheme="RoPE", method="yarn (long-context stage)", parameters=params, reasons=reasons,
                          alternatives=alternatives, config_snippet=snippet, notes=notes)


def pick_existing(T: int, L: int, budget: str, task: str, extrapolate: bool, theta: float, *,
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
            alternatives=[alt("any extension", "not needed below the trained length")],
            config_snippet={}, notes=notes)
    s = extension_factor(T, L)
    if extrapolate:
        notes.append("extrapolation past every length is not something a RoPE extension gives: each method is "
                     "sized for a factor; dynamic NTK degrades the most gracefully past it")
    if budget == "none":
        return _zero_shot(T, L, task, theta, s, lmax, notes)
    return _finetune(T, L, task, theta, s, lmax, notes, replacing)


def _zero_shot(T: int, L: int, task: str, theta: float, s: float, lmax: int | None,
               notes: list[str]) -> Recommendation:
    """An existing RoPE model run past its trained length without training: dynamic NTK."""
    reasons = [EVIDENCE["zero_shot"], EVIDENCE["dynamic"], evidence("lab_default")]
    if s > 4:
        notes.append(f"x{s:g} is a large zero-shot jump: expect a visible perplexity rise (LongRoPE Table 1: "
                     "dynamic NTK 10.21 at 2x but 23.29 at 4x); a short fine-tune with YaRN does far better")
    if task == "retrieval":
        notes.append("long-range retrieval degrades before perplexity does; verify with a passkey test "
                     "(`posenc lab` passkey task) before trusting it")
    notes.append("the attention-changing methods listed among the alternatives: " + evidence("lab_attention"))
    return Recommendation(
        scheme="RoPE (existing model)", method="dynamic NTK (zero-shot)",
        parameters={"rope_type": "dynamic", "factor": get_method("dynamic").lab_factor or s,
                    "max_position_embeddings": L, "rope_theta": theta},
        reasons=reasons,
        alternatives=[
            alt("static NTK-aware (raise rope_theta)", "zero-shot works (lab default preset: 8.78 at 4x vs "
                "RoPE 12.53, docs/lab.md) but changes every "
                "frequency at all lengths, so short inputs shift too; dynamic leaves them exact"),
            alt("PI (linear)", "needs fine-tuning: " + EVIDENCE["pi"]),
            alt("YaRN", "zero-shot it is the worst of the four in LongRoPE Table 1 (32.64 at 8k); use it "
                        "with a fine-tune (--budget finetune)"),
            alt("LongRoPE", "needs an evolutionary search of per-dimension factors on your model and data "
                            "(`posenc search`); it then beats the fixed methods at the searched length: "
                            + EVIDENCE["lab_longrope"]),
            alt("ALiBi", "needs pretraining from scratch"),
            *attention_alternatives(),
        ],
        config_snippet=method_snippet("dynamic", L, T, theta, lmax),
        notes=notes + ["keep max_position_embeddings at the original context: dynamic NTK scales relative to "
                       "it; cache keys before rotation for exactness under a KV cache (docs/scaling.md, the "
                       "Rotary module)",
                       f"factor 1: past the original context, a length L gets static NTK's base for exactly "
                       f"L / {L} (what the lab numbers above measured); transformers' rule with factor {s:g} "
                       f"interpolates more: {s * s - s + 1:g}x instead of {s:g}x at the target"])


def _finetune(T: int, L: int, task: str, theta: float, s: float, lmax: int | None, notes: list[str],
              replacing: bool) -> Recommendation:
    """An existing RoPE model given a short fine-tune at the target length: YaRN."""
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
            alt("PI (linear)", "also fine after a fine-tune, but divides every frequency by s, losing local "
                               "resolution, and needs more steps to recover (posenc lab: 8.63 vs YaRN's 6.82 after "
                               "the same 100 steps)"),
            alt("llama3", "the same keep/blend/interpolate idea with fixed wavelength cut-offs; Meta paired it "
                          "with long-context pretraining rather than a short fine-tune -- a fine choice if you "
                          "follow that recipe (`posenc extend --method llama3`)"),
            alt("LongRoPE", "better zero-shot (LongRoPE Table 1: 9.37/11.34; " + EVIDENCE["lab_longrope"] + ") "
                            "but needs its factor search on the model (`posenc search`, then `posenc extend "
                            "--method longrope --longrope rope_scaling.json`); after the same fine-tune it ties "
                            "YaRN (6.85 vs 6.82) and loses quality inside the original context (7.49 vs 6.91 at "
                            "1x) unless its short factors are searched too"),
            alt("PoSE", "fine-tune at the original length with skip-wise positions: cheaper per step; "
                        + EVIDENCE["lab_pose"]),
            alt("dynamic NTK", "a zero-shot method: fine-tuning under frequencies that change with length "
                               "trains on a moving target"),
            alt("ALiBi", "needs pretraining from scratch"),
        ],
        config_snippet=yarn_betas(method_snippet("yarn", L, T, theta, lmax)),
        notes=notes + ["fine-tune on documents up to the target length (hundreds of steps / ~1B tokens: docs/lesson.md "
                       "'PI + fine-tune'); `posenc extend CONFIG --method yarn --target-length "
                       f"{T}{' --replace' if replacing else ''}` writes the config"])
