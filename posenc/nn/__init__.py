"""The lab's model pieces, built on the scheme registry: causal attention with a KV cache, the tiny decoder LM.

    attention.py  CausalSelfAttention, KVCache, attention_mask
    model.py      ModelConfig, TinyLM
"""
