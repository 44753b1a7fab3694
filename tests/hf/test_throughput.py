"""posenc.hf.throughput: model FLOPs against a count by hand."""

from __future__ import annotations

from posenc.hf.throughput import linear_weights, model_flops


def test_model_flops_counts_linear_weights_and_causal_attention():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = LlamaForCausalLM(config)
    # per layer: q 32x32, k and v 32x16 each, o 32x32, gate/up/down 32x48 each; the head 32x100
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 48
    assert linear_weights(model) == 3 * per_layer + 32 * 100
    L = 10
    attention = 2 * 2 * 3 * (4 * 8) * L * (L + 1) / 2      # q.k and p.v over the keys at or before each query
    assert model_flops(model, L) == 2 * linear_weights(model) * L + attention
    assert model_flops(model, L, windows=3) == 3 * model_flops(model, L)
