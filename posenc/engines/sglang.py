"""SGLang's RoPE rules (sgl-project/sglang, files and commits in SOURCE), restated as differences from
posenc.rope.scaling (transformers' formulas):

- default, linear, llama3, proportional and Hunyuan's alpha: transformers' numbers (factory.get_rope).
- yarn: truncate honoured; the attention factor is g(s, mscale) / g(s, mscale_all_dim) when both keys are present
  (not None), else g(s), times the key ``attn_factor`` (default 1): a config's ``attention_factor`` is not read.
- dynamic: evaluated once at L = s x Lmax, the same base for every length (posenc's ``vllm_dynamic``:
  theta x (s^2 - s + 1)^(d/(d-2))).
- longrope: per forward batch, the long factors when any position in the batch exceeds the original length
  (positions count from 0, so a sequence of L tokens switches at L > L0 + 1), and the keys cached before keep
  their short-factor rotation; attention factor as vLLM's.
- context length (get_context_length): vLLM's rule without the Gemma 3 exception.
"""

from __future__ import annotations

from posenc.engines.common import POSENC_ONLY_TYPES, frequencies, variant
from posenc.engines.registry import AuditModel, EngineRope, register_engine
from posenc.engines.vllm import derived_max_len
from posenc.rope.scaling import yarn_mscale

SOURCE = ("sgl-project/sglang: python/sglang/srt/layers/rotary_embedding/factory.py @108c36c00829 (get_rope), "
          "yarn.py @0b1fd02d56f0, rope_variant.py @0b1fd02d56f0 (Phi3LongRoPEScaledRotaryEmbedding, "
          "DynamicNTKScalingRotaryEmbedding); python/sglang/srt/utils/hf_transformers_utils.py @2aa2e2d0ffda "
          "(get_context_length)")
LONGROPE_SWITCH = ("per forward batch: long factors when any position in the batch exceeds "
                   "original_max_position_embeddings; cached keys keep the rotation they were stored with")
SAME_AS_TRANSFORMERS = ("default", "linear", "llama3", "proportional", "ntk_alpha")


def yarn_attention(rc, s: float) -> float:
    """SGLang's YaRN factor on cos and sin (YaRNScalingRotaryEmbedding)."""
    mscale, mscale_all_dim = rc.params.get("mscale"), rc.params.get("mscale_all_dim")
    if mscale is not None and mscale_all_dim is not None:
        ratio = yarn_mscale(s, float(mscale)) / yarn_mscale(s, float(mscale_all_dim))
    else:
        ratio = yarn_mscale(s)
    return ratio * float(rc.params.get("attn_factor", 1.0))


@register_engine("sglang", label="SGLang", source=SOURCE)
def sglang_rope(model: AuditModel, layer_type: str | None) -> EngineRope:
    rc = model.configs[layer_type]
    limit, note = derived_max_len(model, skip_gemma3=False)
    row = EngineRope("sglang", layer_type, rc.rope_type, context_limit=limit, context_note=f"context length = {note}",
                     layout=f"{model.layout} (is_neox_style per model file)")
    t = rc.rope_type
    if t in SAME_AS_TRANSFORMERS:
        row.inv_freq, row.attention_factor = frequencies(rc, model.length)
    elif t == "yarn":
        row.inv_freq, _ = frequencies(rc, model.length)
        s = rc.params.get("factor") or rc.max_position_embeddings / rc.original_max_position_embeddings
        row.attention_factor = yarn_attention(rc, float(s))
        if rc.params.get("attention_factor") is not None:
            row.notes.append("the config's attention_factor is not read (SGLang reads attn_factor)")
    elif t == "dynamic":
        row.method, row.switch = "vllm_dynamic (fixed at L = s x Lmax)", "none: the same base at every length"
        row.inv_freq, row.attention_factor = frequencies(variant(rc, "vllm_dynamic"), None)
    elif t == "longrope":
        row.method, row.switch = "longrope (batch switch at any position > L0)", LONGROPE_SWITCH
        # the last position of a sequence of L tokens is L - 1: vllm_longrope's "served length > L0" test at L - 1
        row.inv_freq, row.attention_factor = frequencies(variant(rc, "vllm_longrope"), model.length - 1 or 1)
    else:
        why = "a posenc variant" if t in POSENC_ONLY_TYPES else "get_rope raises Unknown RoPE scaling type"
        row.supported, row.reason = False, f"rope type {t!r}: {why}"
    return row
