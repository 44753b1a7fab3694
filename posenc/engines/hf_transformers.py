"""transformers, the reference row: posenc.rope.scaling is transformers' modeling_rope_utils (and the model files'
own types: HunYuan's NTK-alpha), checked value for value by tests/rope/test_scaling_hf_parity.py; the audit's tests
check this row against the installed ``ROPE_INIT_FUNCTIONS`` again for every fixture config."""

from __future__ import annotations

from posenc.engines.common import POSENC_ONLY_TYPES, frequencies
from posenc.engines.registry import AuditModel, EngineRope, register_engine
from posenc.rope.contexts import claimed_context

SOURCE = ("huggingface/transformers modeling_rope_utils.py (ROPE_INIT_FUNCTIONS, dynamic_rope_update), the version "
          "installed; posenc/rope/scaling.py follows it exactly")

SWITCHES = {
    "longrope": "per forward: long factors when the sequence is longer than original_max_position_embeddings, "
                "short otherwise (the cache is re-rotated when it switches)",
    "dynamic": "per forward: the base grows with the sequence once it passes max_position_embeddings",
}


def version() -> str | None:
    """The installed transformers version, or None."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


@register_engine("transformers", label="transformers", source=SOURCE)
def transformers_rope(model: AuditModel, layer_type: str | None) -> EngineRope:
    rc = model.configs[layer_type]
    claimed, why = claimed_context(rc)
    row = EngineRope("transformers", layer_type, rc.rope_type, switch=SWITCHES.get(rc.rope_type, "none"),
                     context_limit=claimed, context_note=why, layout=model.layout)
    if rc.rope_type in POSENC_ONLY_TYPES:
        row.supported, row.reason = False, f"transformers has no rope type {rc.rope_type!r} (a posenc/vLLM variant)"
        return row
    row.inv_freq, row.attention_factor = frequencies(rc, model.length)
    return row
