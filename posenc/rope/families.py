"""What transformers' config classes assume, family by family: the facts ``posenc.rope.config`` reads a config with.

Each table is keyed by a config's ``model_type`` and checked against the transformers config (or rotary) classes in
tests/rope/test_families.py and tests/rope/test_multiaxis.py. ``config_value`` is the one reader of a key a family's
config class fills in when the file leaves it out.
"""

from __future__ import annotations

from collections.abc import Mapping

# GPT-J / CodeGen spell three config keys the GPT-2 way (transformers' attribute_map); the usual name wins if both
KEY_ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"}

# rope_theta that transformers' config class assumes when a config.json gives none, where it is not 10000
# (tests/rope/test_families.py checks every entry against the transformers config classes). Local / global pairs
# are (global, local): the theta of full-attention and of sliding-attention layers.
DEFAULT_THETA_BY_MODEL_TYPE: dict[str, float | tuple[float, float]] = {
    "llama4": 5e5, "llama4_text": 5e5, "smollm3": 2e6, "cohere": 5e5, "exaone": 5e5, "olmo3": (5e5, 5e5),
    "helium": 1e5,
    "gpt_oss": 1.5e5, "qwen2_vl": 1e6, "qwen2_vl_text": 1e6, "qwen2_5_vl": 1e6, "qwen2_5_vl_text": 1e6,
    "qwen3_vl_text": 5e5, "qwen3_vl_moe_text": 5e5, "ernie4_5": 5e5, "bitnet": 5e5,
    "gemma3_text": (1e6, 1e4), "gemma3n_text": (1e6, 1e4), "modernbert": (160_000.0, 1e4),
    "modernbert-decoder": (160_000.0, 1e4),
}
# partial_rotary_factor that transformers' config class assumes when a config.json gives none, where it is not 1
# (also checked against transformers): GLM rotates half of each head, GPT-NeoX and StableLM a quarter.
DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE = {
    "glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5, "phi": 0.5, "persimmon": 0.5, "nemotron": 0.5,
    "recurrent_gemma": 0.5, "stablelm": 0.25, "gpt_neox": 0.25, "qwen3_next": 0.25, "qwen3_5_text": 0.25,
}
# Families with a second RoPE base for sliding-window (local) layers, in transformers 4.x's flat form:
# model_type -> (global theta key, local theta key, whether rope_scaling also applies to local layers).
# Gemma 3 scales its global layers only (linear x8 on gemma-3-4b+); ModernBERT applies rope_scaling to both.
# OLMo 3 has no local key: its config class gives sliding layers the default base whatever rope_theta says.
LOCAL_GLOBAL_THETA = {
    "olmo3": ("rope_theta", None, False),
    "gemma3_text": ("rope_theta", "rope_local_base_freq", False),
    "gemma3n_text": ("rope_theta", "rope_local_base_freq", False),
    "modernbert": ("global_rope_theta", "local_rope_theta", True),
    "modernbert-decoder": ("global_rope_theta", "local_rope_theta", True),
}
# Text models whose rotary splits the pairs by M-RoPE sections whatever the config says: transformers' default
# mrope_section when the config gives none, and the order their rotary hard-codes (True: Qwen3-VL's interleaved
# t, h, w cycling; False: contiguous sections). Checked against those rotary classes in the tests.
MROPE_FAMILIES = {
    "qwen2_vl": ((16, 24, 24), False), "qwen2_vl_text": ((16, 24, 24), False),
    "qwen2_5_vl": ((16, 24, 24), False), "qwen2_5_vl_text": ((16, 24, 24), False),
    "qwen3_vl": ((24, 20, 20), True), "qwen3_vl_text": ((24, 20, 20), True),
    "qwen3_5": ((11, 11, 10), True), "qwen3_5_text": ((11, 11, 10), True),
    "glm4v": ((8, 12, 12), False), "glm4v_text": ((8, 12, 12), False),
}
# model types whose transformers config class puts its own scaling in place of absent (or null) RoPE parameters
# (GptOssConfig: yarn x32 from 4096; Ministral3Config: yarn x16 with the query temperature; Mistral4Config: yarn x128
# with it; MistralLarge4TextConfig: yarn x2048 from 512): for them "no scaling" has to be written as
# {"rope_type": "default"}, not left out
SCALED_BY_DEFAULT_TYPES = frozenset({"gpt_oss", "ministral3", "mistral4", "mistral_large4", "mistral_large4_text"})
# Keys a family's config class keeps in its RoPE parameters for the attention code, not the rotary (transformers'
# ignore_keys_at_rope_validation): the query temperature of Ministral 3 and Mistral Small 4 (llama_4_scaling_beta,
# read by posenc.rope.layers; Mistral4Attention applies it as Ministral3Attention does) and a copy of
# max_position_embeddings. The frequency reader leaves them out of params.
_QUERY_TEMPERATURE_KEYS = frozenset({"llama_4_scaling_beta", "max_position_embeddings"})
ATTENTION_ROPE_KEYS = {"ministral3": _QUERY_TEMPERATURE_KEYS, "mistral4": _QUERY_TEMPERATURE_KEYS}
# Vision towers whose 2-D RoPE transformers calls "axial" (their config classes default to it), and the posenc
# type that reproduces their frequencies; old checkpoints name the vision part after the parent model.
AXIAL_VISION_TYPES = {
    "qwen2_vl_vision": "axial", "qwen2_5_vl_vision": "axial", "qwen3_vl_vision": "axial",
    "qwen3_vl_moe_vision": "axial", "glm4v_vision": "axial", "glm4v_moe_vision": "axial",
    "paddleocr_vl_vision": "axial", "pixtral": "axial_pixtral",
    "llama4_vision_model": "axial",   # interleaved pairs (rope_layout); positions: llama4_vision_position_ids
}
# model types whose transformers config class reads the base from another key before a top-level rope_theta
# (GPTNeoXConfig: rotary_emb_base)
BASE_KEY_TYPES = {"gpt_neox": "rotary_emb_base", "gpt_neox_japanese": "rotary_emb_base"}
# parent model_type -> model_type of its vision tower (read when the vision_config does not say)
VISION_TOWER_OF = {
    "qwen2_vl": "qwen2_vl_vision", "qwen2_5_vl": "qwen2_5_vl_vision", "qwen3_vl": "qwen3_vl_vision",
    "qwen3_vl_moe": "qwen3_vl_moe_vision", "glm4v": "glm4v_vision", "glm4v_moe": "glm4v_moe_vision",
    "paddleocr_vl": "paddleocr_vl_vision", "llama4": "llama4_vision_model",
}
# model types whose vision config sizes heads by embed_dim (Qwen2-VL's hidden_size is the merger's output width)
EMBED_DIM_HEADS = {"qwen2_vl_vision"}
# parent model_type -> its text config's model_type, where family rules (local/global theta) key on the latter
TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "llama4": "llama4_text",
                    "qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text",
                    "mistral_large4": "mistral_large4_text"}
# what the transformers config classes (5.x) put in place of an absent key (an explicit null stays null): Llama 4
# chunks its RoPE layers' attention by default, the local/global families have a window, the Qwen family's window
# is off unless use_sliding_window says otherwise, and Falcon's context is 2048 (Falcon-7B/40B's files omit it)
_QWEN_WINDOW_OFF = {"use_sliding_window": False}
CONFIG_DEFAULTS = {"llama4": {"attention_chunk_size": 8192}, "llama4_text": {"attention_chunk_size": 8192},
                   "gemma2": {"sliding_window": 4096}, "gemma3": {"sliding_window": 4096},
                   "gemma3_text": {"sliding_window": 4096}, "gemma3n": {"sliding_window": 512},
                   "gemma3n_text": {"sliding_window": 512}, "cohere2": {"sliding_window": 4096},
                   "olmo3": {"sliding_window": 4096}, "mistral": {"sliding_window": 4096},
                   "gpt_oss": {"sliding_window": 128}, "falcon": {"max_position_embeddings": 2048},
                   **{t: _QWEN_WINDOW_OFF for t in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen3",
                                                    "qwen3_moe", "smollm3")}}


def config_value(cfg: Mapping, key: str):
    """cfg[key], or the model family's default when the key is absent (``CONFIG_DEFAULTS``), else None."""
    if key in cfg:
        return cfg[key]
    return CONFIG_DEFAULTS.get(model_type_of(cfg), {}).get(key)


def model_type_of(cfg: Mapping) -> str | None:
    """cfg["model_type"] when it is a string (junk values read as absent), else None."""
    model_type = cfg.get("model_type")
    return model_type if isinstance(model_type, str) else None
