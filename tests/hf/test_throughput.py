"""posenc.hf.throughput: model FLOPs against a count by hand, and the time split's fit against times built from
known per-token and attention costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.hf.throughput import linear_weights, model_flops, time_split


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


@settings(max_examples=50, deadline=None)
@given(a=st.floats(1e-6, 1e-2), b=st.floats(1e-10, 1e-5),
       lengths=st.lists(st.integers(256, 65536), min_size=2, max_size=5, unique=True))
def test_time_split_recovers_the_costs_it_was_built_from(a, b, lengths):
    seconds = [a * T + b * T * T for T in lengths]
    fa, fb = time_split(lengths, seconds)
    assert fa == pytest.approx(a, rel=1e-6, abs=1e-12) and fb == pytest.approx(b, rel=1e-6, abs=1e-15)


def test_time_split_needs_two_lengths():
    with pytest.raises(ValueError, match="lengths"):
        time_split([4096, 4096], [1.0, 1.1])
