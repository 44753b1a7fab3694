"""MLX's RoPE rules (ml-explore/mlx-lm, mlx_lm/models/rope_utils.py and the model files, commit in SOURCE),
restated as differences from posenc.rope.scaling (transformers' formulas):

- default, linear, dynamic (re-evaluated from the cache offset plus the new tokens, as transformers does), llama3,
  proportional, mrope (plain RoPE on text positions) and Hunyuan's alpha (hunyuan_v1_dense.py): transformers'
  numbers.
- yarn (YarnRoPE): the correction range is always rounded (``truncate`` is not read), ``attention_factor`` is not
  read, and the factor is g(s, mscale) / g(s, mscale_all_dim) with mscale 1 and mscale_all_dim 0 by default.
- longrope (SuScaledRoPE, also phi3.py): always the long factors, at every length; scale long_mscale or
  sqrt(1 + ln(Lmax/L0)/ln L0) (initialize_rope passes no mscale keys; factor and attention_factor are not read).
- no context limit is enforced; any other type raises "Unsupported RoPE type".
"""

from __future__ import annotations

from posenc.engines.common import POSENC_ONLY_TYPES, frequencies, variant
from posenc.engines.registry import AuditModel, EngineRope, register_engine
from posenc.rope.scaling import yarn_mscale

SOURCE = "ml-explore/mlx-lm @d78bf58e217c: mlx_lm/models/rope_utils.py (initialize_rope), phi3.py, hunyuan_v1_dense.py"
SAME_AS_TRANSFORMERS = ("default", "linear", "dynamic", "llama3", "proportional", "ntk_alpha")


def yarn_attention(rc, s: float) -> float:
    """MLX's YaRN factor on q and k: g(s, mscale) / g(s, mscale_all_dim), defaults 1 and 0."""
    return yarn_mscale(s, float(rc.params.get("mscale", 1) or 0)) / \
        yarn_mscale(s, float(rc.params.get("mscale_all_dim", 0) or 0))


@register_engine("mlx", label="MLX", source=SOURCE)
def mlx_rope(model: AuditModel, layer_type: str | None) -> EngineRope:
    rc = model.configs[layer_type]
    row = EngineRope("mlx", layer_type, rc.rope_type, context_limit=None,
                     context_note="none enforced (max_position_embeddings only sizes the rope)",
                     layout=f"{model.layout} (traditional flag per model file)")
    t = rc.rope_type
    if t in SAME_AS_TRANSFORMERS:
        row.inv_freq, row.attention_factor = frequencies(rc, model.length)
        if t == "dynamic":
            row.switch = "per call: the base grows with offset + new tokens past max_position_embeddings"
    elif t == "yarn":
        row.method = "yarn (range always rounded; attention_factor not read)"
        row.inv_freq, _ = frequencies(variant(rc, truncate=True), model.length)
        s = rc.params.get("factor") or rc.max_position_embeddings / rc.original_max_position_embeddings
        row.attention_factor = yarn_attention(rc, float(s))
    elif t == "longrope":
        row.method, row.switch = "longrope (always the long factors)", "never: the long factors at every length"
        always_long = variant(rc, "vllm_longrope", drop=("short_mscale", "long_mscale"))
        row.inv_freq, row.attention_factor = frequencies(always_long, rc.original_max_position_embeddings + 1)
    else:
        why = "a posenc variant" if t in POSENC_ONLY_TYPES else "initialize_rope raises Unsupported RoPE type"
        row.supported, row.reason = False, f"rope type {t!r}: {why}"
    return row
