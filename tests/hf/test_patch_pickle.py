"""While one model of a family is patched, every other model of the family still pickles and unpickles
(torch.save / torch.load), before, during and after the patch, and runs as transformers' own."""

from __future__ import annotations

import io

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5")

from posenc.hf.patch import is_patched, patch, unpatch  # noqa: E402

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, num_key_value_heads=2)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, num_key_value_heads=2)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, num_key_value_heads=2)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
        max_position_embeddings=64)),
}
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
              max_position_embeddings=64)


def roundtrip(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


def load(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_unrelated_models_pickle_while_one_is_patched(family):
    torch.manual_seed(0)
    make = FAMILIES[family]
    patched, other = make().eval(), make().eval()
    x = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        want = other(x).logits
    before = roundtrip(other)                # pickled before any patch
    patch(patched)
    try:
        assert is_patched(patched) and not is_patched(other)
        during = roundtrip(other)            # pickled while another model is patched
        for data in (before, during):
            loaded = load(data).eval()       # unpickled while another model is patched
            with torch.no_grad():
                assert torch.equal(loaded(x).logits, want)
        patched_copy = load(roundtrip(patched)).eval()   # the patched model itself pickles too
        with torch.no_grad():
            assert torch.allclose(patched_copy(x).logits, patched(x).logits, atol=1e-5)
    finally:
        unpatch(patched)
    for data in (before, during):            # and after the patch is gone
        loaded = load(data).eval()
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, want)
