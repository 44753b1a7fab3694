"""llama.cpp's RoPE rules, read from its code (ggml-org/llama.cpp, files and commits in SOURCE), restated as
differences from posenc.rope.scaling (transformers' formulas):

- What reaches llama.cpp from a config.json is what convert_hf_to_gguf.py writes (TextModel.set_gguf_parameters):
  linear and yarn become ``rope.scaling.*`` keys (yarn only with a factor); longrope becomes type "longrope" plus
  ``rope_factors_long`` / ``rope_factors_short`` tensors and an attention factor sqrt(1 + ln(Lmax/L0)/ln L0)
  (Phi-3's converter); llama3 becomes a ``rope_freqs`` tensor holding transformers' per-pair divisors; "dynamic" is
  written as nothing (llama.cpp has no dynamic NTK), except HunYuan's NTK-alpha, whose converter folds alpha into
  ``rope.freq_base`` and sets the context to 256k. A GGUF file's own ``rope.scaling.*`` keys are read as they are.
- YaRN's correction range is always rounded (ggml_rope_yarn_corr_dims: floor / ceil), whatever ``truncate`` says.
- YaRN's attention factor: the kernel multiplies cos and sin by 1 + 0.1 ln s; since PR #17945 (Dec 2025)
  llama_context cancels that and sets g(s) = 0.1 ln s + 1 itself (DeepSeek: mscale = mscale_all_dim, ratio 1), so a
  config's ``attention_factor`` is not used; before it, a file's ``yarn_attn_factor`` multiplied g(s) again.
- LongRoPE: the long factors are used when the context per slot (n_ctx / n_seq_max) exceeds the original length,
  chosen once when the context is created (llama_model::get_rope_factors), not per sequence.
- Gemma 3's sliding-window layers run with their own base and scale 1 (rope_freq_scale_train_swa).
"""

from __future__ import annotations

from posenc._internal.errors import ConfigError
from posenc.engines.common import frequencies, variant
from posenc.engines.registry import AuditModel, EngineRope, register_engine
from posenc.rope.scaling import yarn_betas, yarn_mscale

SOURCE = ("ggml-org/llama.cpp: convert_hf_to_gguf.py @a458664fc83b (rope block of set_gguf_parameters; HunYuan "
          "converter); ggml/src/ggml-cpu/ops.cpp @1f08e2d66271 (rope_yarn, ggml_rope_yarn_corr_dims: floor/ceil); "
          "src/llama-context.cpp @4c7103b96d72 (before PR #17945) and as stored @001d906a6d86 (the YaRN attention "
          "factor after PR #17945); src/llama-model.cpp @a5410f046c01 (get_rope_factors, rope_freq_scale_train_swa)")
SWITCH = ("once, when the context is created: long factors when n_ctx / n_seq_max (the context per slot, not the "
          "sequence's length) exceeds original_context_length; audited as -c L with one slot")
# transformers model types llama.cpp converts to its deepseek2 architecture (the YaRN mscale special case)
DEEPSEEK2_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
HUNYUAN_CONTEXT = 256 * 1024


def _context(model: AuditModel, rc) -> tuple[int | None, str]:
    if model.gguf is not None:
        key = f"{model.gguf.architecture}.context_length"
        return model.gguf.metadata.get(key), f"{key} (-c 0 uses it; a longer -c only warns)"
    if rc.rope_type == "ntk_alpha":
        return HUNYUAN_CONTEXT, "HunYuan's converter writes context_length 256k (alpha folded into the base)"
    return rc.max_position_embeddings, "context_length = max_position_embeddings (-c 0 uses it; a longer -c warns)"


def converted_scaling(model: AuditModel, rc, layer_type: str | None) -> dict:
    """The llama.cpp scaling a layer type runs: from a GGUF file's ``rope.scaling.*`` keys, or from what
    convert_hf_to_gguf.py writes for the config. Keys: type (none / linear / yarn / longrope / unsupported), and
    factor, original, attn_factor, tensor, why where they apply."""
    if layer_type == "sliding_attention":
        return {"type": "none", "why": "sliding-window layers run with scale 1 (rope_freq_scale_train_swa)"}
    if model.gguf is not None:
        return _file_scaling(model)
    t, p = rc.rope_type, rc.params
    if t == "linear":
        return {"type": "linear", "factor": p["factor"]}
    if t == "yarn":
        if p.get("factor") is None:
            return {"type": "none", "why": "convert_hf_to_gguf writes YaRN only with a factor: the file runs unscaled"}
        return {"type": "yarn", "factor": p["factor"], "original": rc.original_max_position_embeddings,
                "attn_factor": 1.0}
    if t == "longrope":
        return {"type": "longrope", "tensor": "rope_factors_long / rope_factors_short"}
    if t in ("llama3", "ntk_alpha", "default"):
        return {"type": "as-transformers", "tensor": "rope_freqs" if t == "llama3" else None}
    if t == "dynamic":
        return {"type": "none", "unsupported": "llama.cpp has no dynamic NTK: convert_hf_to_gguf writes no scaling "
                                               "for it, so the file runs plain RoPE at every length"}
    return {"type": "unsupported", "why": f"convert_hf_to_gguf writes nothing llama.cpp runs for rope type {t!r}"}


def _file_scaling(model: AuditModel) -> dict:
    s = model.gguf.scaling
    kind = str(s.get("type", "none"))
    factors = _factor_tensors(model) if any(name.startswith(("rope_freqs", "rope_factors_"))
                                             for name in model.gguf.tensors) else {}
    if kind == "longrope" and {"rope_factors_long", "rope_factors_short"} <= set(factors):
        return {"type": "longrope-file", "original": int(s.get("original_context_length") or 0) or None,
                "attn_factor": float(s.get("attn_factor", 1.0)), **factors}
    if factors and (set(factors) != {"rope_freqs"} or kind not in ("none", "")):
        return {"type": "unsupported", "why": f"factor tensors {sorted(factors)} with rope.scaling.type {kind!r} "
                                              "are not audited"}
    if factors:     # Llama 3.1-style: each pair's angle divided by rope_freqs (llama_model::get_rope_factors)
        return {"type": "divisors", "divisors": factors["rope_freqs"]}
    if kind in ("none", "") or kind == "linear" and not s.get("factor"):
        return {"type": "none"}
    if kind == "linear":
        return {"type": "linear", "factor": float(s["factor"])}
    if kind == "yarn":
        return {"type": "yarn", "factor": float(s["factor"]), "attn_factor": float(s.get("attn_factor", 1.0)),
                "original": int(s.get("original_context_length") or 0) or None,
                "beta_fast": s.get("yarn_beta_fast"), "beta_slow": s.get("yarn_beta_slow")}
    return {"type": "unsupported", "why": f"{model.gguf.architecture}.rope.scaling.type {kind!r} is not audited"}


def _factor_tensors(model: AuditModel) -> dict:
    """{"rope_freqs" | "rope_factors_long" | "rope_factors_short": float64 tensor [rotary_dim / 2]} of the file."""
    import torch
    from gguf import GGUFReader

    return {t.name.removesuffix(".weight"): torch.tensor(t.data.astype("float64").reshape(-1))
            for t in GGUFReader(model.gguf.path).tensors if t.name.startswith(("rope_freqs", "rope_factors_"))}


def _divided(rc, divisors):
    """llama.cpp's inverse frequencies for per-pair divisors: the file's plain ones over the divisors, float32."""
    base, _ = frequencies(variant(rc, "default", drop=tuple(rc.params)), None)
    return (base.double() / divisors).float()


def yarn_attention(s: float, rc, model_type: str | None, attn_factor: float = 1.0) -> float:
    """llama.cpp's YaRN factor on cos and sin after PR #17945: g(s) (DeepSeek2 with mscale_all_dim: g(s, m)/g(s, m)
    = 1, as llama_context takes mscale = mscale_all_dim), times the file's rope.scaling.attn_factor."""
    if model_type in DEEPSEEK2_TYPES and rc.params.get("mscale_all_dim"):
        return 1.0 * attn_factor
    return yarn_mscale(s) * attn_factor


@register_engine("llama.cpp", label="llama.cpp", source=SOURCE)
def llama_cpp_rope(model: AuditModel, layer_type: str | None) -> EngineRope:
    rc = model.configs[layer_type]
    limit, note = _context(model, rc)
    f = converted_scaling(model, rc, layer_type)
    row = EngineRope("llama.cpp", layer_type, f["type"], context_limit=limit, context_note=note,
                     layout=f"{model.layout} (convert_hf_to_gguf permutes Q/K rows where llama.cpp's rope mode "
                            "differs, so the rotation is the same)")
    if f.get("why"):
        row.notes.append(f["why"])
    kind = f["type"]
    if kind == "unsupported":
        row.supported, row.reason = False, f["why"]
        return row
    if kind == "as-transformers":
        row.method = rc.rope_type + (" (rope_freqs tensor: transformers' divisors)" if f["tensor"] else "")
        row.inv_freq, row.attention_factor = frequencies(rc, model.length)
    elif kind == "none":
        row.inv_freq, row.attention_factor = frequencies(variant(rc, "default", drop=tuple(rc.params)), None)
    elif kind == "linear":
        row.inv_freq, row.attention_factor = frequencies(
            variant(rc, "linear", drop=tuple(rc.params), factor=f["factor"]), None)
    elif kind == "yarn":
        _yarn(row, model, rc, f)
    elif kind == "divisors":
        row.method = "rope_freqs tensor (each pair's angle divided by it)"
        row.inv_freq, row.attention_factor = _divided(rc, f["divisors"]), 1.0
    elif kind == "longrope-file":
        row.switch, row.method = SWITCH, "longrope (rope_factors_long / _short tensors)"
        long = f["original"] is not None and model.length > f["original"]
        row.inv_freq = _divided(rc, f["rope_factors_long" if long else "rope_factors_short"])
        row.attention_factor = f["attn_factor"]
    else:   # longrope: transformers' factors at the per-slot context L; the converter's attention factor
        row.switch = SWITCH
        row.inv_freq, row.attention_factor = frequencies(variant(rc, drop=("factor", "attention_factor")),
                                                         model.length)
    if f.get("unsupported"):
        row.supported, row.reason = False, f["unsupported"]
    if model.gguf is not None and layer_type != "sliding_attention":
        _check_in_llama_cpp(row, model, f)
    return row


def _check_in_llama_cpp(row: EngineRope, model: AuditModel, f: dict) -> None:
    """When llama.cpp is installed (the engines set-up), load the file in it and say whether what it read (trained
    context, frequency scale 1 / factor, rope type) is what this row's rule assumes."""
    from posenc.engines import llama_cpp_run

    if not llama_cpp_run.available():
        return
    try:
        hp = llama_cpp_run.read_hparams(model.gguf.path)
    except ConfigError as exc:      # an architecture this llama.cpp does not know: the rule's row still stands
        row.notes.append(f"llama.cpp itself could not check this row: {exc}")
        return
    scale = 1.0 / float(f["factor"]) if f["type"] in ("linear", "yarn") else 1.0
    agree = hp["context_length"] == row.context_limit and abs(hp["rope_freq_scale"] - scale) <= 1e-6 * scale
    row.checked = {**hp, "agrees": agree}
    row.notes.append(f"llama.cpp itself (llama-cpp-python {hp['llama.cpp']}, the file loaded here) reads context "
                     f"{hp['context_length']:,}, frequency scale {hp['rope_freq_scale']:g}, rope type "
                     f"{hp['rope_type']}: " + ("as this row says" if agree else
                                               f"NOT as this row says (context {row.context_limit}, scale {scale:g})"))


def _yarn(row: EngineRope, model: AuditModel, rc, f: dict) -> None:
    """YaRN as llama.cpp runs it: the range rounded (truncate forced), betas from the file or the defaults 32 / 1,
    the attention factor by ``yarn_attention``."""
    fast, slow = yarn_betas(rc)
    fast = f.get("beta_fast") or fast
    slow = f.get("beta_slow") or slow
    original = f.get("original") or rc.original_max_position_embeddings or _context(model, rc)[0]
    yarn = variant(rc, "yarn", drop=("attention_factor", "mscale", "mscale_all_dim", "truncate"),
                   factor=float(f["factor"]), beta_fast=float(fast), beta_slow=float(slow), truncate=True,
                   original_max_position_embeddings=original)
    row.inv_freq, _ = frequencies(yarn, None)
    row.method = "yarn (correction range always rounded)"
    row.attention_factor = yarn_attention(float(f["factor"]), rc, model.model_type, f.get("attn_factor", 1.0))
    if rc.params.get("truncate") is False:
        row.notes.append("the config says truncate: false (an unrounded correction range); ggml always rounds it")
    if rc.params.get("attention_factor") is not None:
        row.notes.append("the config's attention_factor is written as yarn_attn_factor, which llama_context "
                         "replaces by g(s) since PR #17945 (before it, the two multiplied)")
