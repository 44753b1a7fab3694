"""Tiny random transformers models of every family posenc.patch covers (no download), built from configs, and the
logits/close helpers the patch tests share (imported by this unique top-level name; see posenc_oracles.py)."""

from __future__ import annotations

import torch

LMAX = 32
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=97, max_position_embeddings=LMAX)


def build(family: str, rope: dict | None = None, **extra):
    """A tiny random model of ``family``; rope: rope_parameters (rope_theta added)."""
    import transformers as tf

    rope = None if rope is None else {"rope_theta": 10000.0, **rope}
    kw = dict(TINY, **({"rope_parameters": rope} if rope else {}), **extra)
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {}),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 16}),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, {"head_dim": 16}),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"head_dim": 16, "sliding_window": 8}),
        "gemma3_text": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
                        {"head_dim": 16, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, {"num_local_experts": 2, "num_experts_per_tok": 1}),
        "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM, {"num_experts": 2, "num_experts_per_tok": 1,
                                                                  "moe_intermediate_size": 32,
                                                                  "shared_expert_intermediate_size": 32}),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, {"num_experts": 2, "num_experts_per_tok": 1,
                                                                  "moe_intermediate_size": 32, "head_dim": 16}),
        "gpt_neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM, {}),
    }
    config_class, model_class, defaults = classes[family]
    if family == "gpt_neox":
        kw.pop("num_key_value_heads")
    torch.manual_seed(0)
    return model_class(config_class(**{**defaults, **kw})).eval()


def logits(model, length: int, batch: int = 2) -> torch.Tensor:
    ids = torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def close(got, want):
    """fp32: transformers forms angles in float32, posenc in float64 -> ~1e-7 relative; 1e-5 leaves room."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
