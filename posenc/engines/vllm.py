"""vLLM's RoPE rules (vllm-project/vllm, files and commits in SOURCE), restated as differences from
posenc.rope.scaling (transformers' formulas):

- default, linear, llama3, yarn (truncate, attention_factor and mscale / mscale_all_dim honoured), proportional and
  Hunyuan's alpha: transformers' numbers (get_rope; YaRNScalingRotaryEmbedding).
- dynamic: evaluated once for the served length (max_model_len), the same frequencies for every request (vLLM PR
  #41277; before it, once at L = s x Lmax whatever was served: posenc's ``vllm_dynamic``).
- longrope: the long factors for every request once max_model_len exceeds the original length (posenc's
  ``vllm_longrope``: Phi3LongRoPEScaledRotaryEmbedding); attention factor short_mscale / long_mscale or
  sqrt(1 + ln(Lmax/L0)/ln L0), never the config's factor or attention_factor.
- max_model_len by default (ModelConfig's derived length): max_position_embeddings x factor for every rope type but
  longrope and llama3, original_max_position_embeddings x factor for yarn; Gemma 3 unscaled.
- a rope type get_rope does not know is refused ("Unknown RoPE scaling type").
"""

from __future__ import annotations

from posenc.engines.common import POSENC_ONLY_TYPES, frequencies, variant
from posenc.engines.registry import AuditModel, EngineRope, register_engine

SOURCE = ("vllm-project/vllm: vllm/model_executor/layers/rotary_embedding/__init__.py @0cd5784803d8 (get_rope), "
          "yarn_scaling_rope.py @0cd5784803d8, phi3_long_rope_scaled_rope.py @17d618b0f944, vllm/config/model.py "
          "@18ec6629253 (derived max_model_len); dynamic: PR #41277 (docs/scaling.md)")
LONGROPE_SWITCH = ("once, at start-up: long factors for every request when max_model_len exceeds "
                   "original_max_position_embeddings (short requests too); audited as --max-model-len L")
SAME_AS_TRANSFORMERS = ("default", "linear", "llama3", "yarn", "proportional", "ntk_alpha")


def derived_max_len(model: AuditModel, *, skip_gemma3: bool = True) -> tuple[int | None, str]:
    """vLLM's default max_model_len (SGLang's context length with ``skip_gemma3=False``): Lmax, times the factor of
    the (last) layer type that states one unless its type is longrope or llama3; a yarn type starts from L0."""
    first = next(iter(model.configs.values()))
    length, factor = first.max_position_embeddings, 1.0
    if length is None:
        return None, "max_position_embeddings is absent"
    if skip_gemma3 and "gemma3" in (model.model_type or ""):
        return length, "max_position_embeddings (Gemma 3: already scaled, not multiplied)"
    for rc in model.configs.values():
        if rc.rope_type in ("longrope", "llama3"):
            continue
        factor = rc.params.get("factor", factor) or factor
        if rc.rope_type == "yarn" and rc.original_max_position_embeddings:
            length = rc.original_max_position_embeddings
    how = "max_position_embeddings" if length == first.max_position_embeddings else "original_max_position_embeddings"
    return int(length * factor), f"{how} x factor {factor:g}" if factor != 1 else how


@register_engine("vllm", label="vLLM", source=SOURCE)
def vllm_rope(model: AuditModel, layer_type: str | None) -> EngineRope:
    rc = model.configs[layer_type]
    limit, note = derived_max_len(model)
    row = EngineRope("vllm", layer_type, rc.rope_type, context_limit=limit, context_note=f"max_model_len = {note}",
                     layout=f"{model.layout} (is_neox_style per model file)")
    t = rc.rope_type
    if t in SAME_AS_TRANSFORMERS:
        row.inv_freq, row.attention_factor = frequencies(rc, model.length)
    elif t == "dynamic":
        row.switch = "once, at start-up, for max_model_len: the same base for every request; audited at L"
        row.inv_freq, row.attention_factor = frequencies(rc, model.length)
    elif t == "longrope":
        row.method, row.switch = "vllm_longrope", LONGROPE_SWITCH
        row.inv_freq, row.attention_factor = frequencies(variant(rc, "vllm_longrope"), model.length)
    else:
        why = "a posenc variant" if t in POSENC_ONLY_TYPES else "get_rope raises Unknown RoPE scaling type"
        row.supported, row.reason = False, f"rope type {t!r}: {why}"
    return row
