"""torch.compile(fullgraph=True) and torch.export of a tiny random transformers Llama patched with posenc.patch: no
graph break (posenc's RoPE runs as its custom op, posenc.kernels.ops), and transformers' own logits and gradients
(the unpatched model is the oracle)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 builds the model")

import posenc  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def patched_llama():
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                                      max_position_embeddings=32)
    torch.manual_seed(0)
    plain = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    patched = posenc.patch(transformers.LlamaForCausalLM(config))
    return plain, patched


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids).logits


def test_patched_llama_compiles_fullgraph_and_exports():
    plain, patched = patched_llama()
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(5))
    want = Logits(plain)(ids)                                    # transformers' own RoPE
    want_grads = torch.autograd.grad(want.square().mean(), list(plain.parameters()))
    compiled = torch.compile(Logits(patched), backend="aot_eager", fullgraph=True)
    got = compiled(ids)
    assert torch.allclose(got, want, atol=1e-5)
    got_grads = torch.autograd.grad(got.square().mean(), list(patched.parameters()))
    for a, b in zip(got_grads, want_grads):
        assert torch.allclose(a, b, atol=1e-5)
    program = torch.export.export(Logits(patched).eval(), (ids,))
    assert "posenc.rope.default" in {str(n.target) for n in program.graph.nodes}
    with torch.no_grad():
        assert torch.allclose(program.module()(ids), want, atol=1e-5)
    # the compiled and exported graphs hold the model: release the family's dispatcher for the tests that follow
    posenc.unpatch(patched)
