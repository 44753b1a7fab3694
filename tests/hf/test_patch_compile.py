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


def test_self_extend_patched_llama_compiles_fullgraph_and_gives_the_eager_logits():
    """An attention-method patch under torch.compile(fullgraph=True): the rule's kernel (key bands read on the
    host) runs as one custom op, so no data-dependent int() breaks the graph; logits equal the eager patched model's,
    at a length past the window (real remapping) and again at a second length."""
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                                      max_position_embeddings=32)
    torch.manual_seed(0)
    model = posenc.patch(transformers.LlamaForCausalLM(config).eval(), method="self-extend", group_size=3, window=8)
    compiled = torch.compile(Logits(model), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        for length in (40, 24):
            ids = torch.randint(0, 97, (2, length), generator=torch.Generator().manual_seed(length))
            want = Logits(model)(ids)
            torch.testing.assert_close(compiled(ids), want, rtol=0, atol=1e-6)
    posenc.unpatch(model)


def test_a_copy_of_an_attention_patched_model_compiles_with_its_own_rule():
    """A deep copy names its own rule in the compiled graph: it still runs after the original is gone."""
    import copy
    import gc

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                                      max_position_embeddings=32)
    torch.manual_seed(0)
    original = posenc.patch(transformers.LlamaForCausalLM(config).eval(), method="rerope", window=8)
    model = copy.deepcopy(original)
    del original
    gc.collect()
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = Logits(model)(ids)
        got = torch.compile(Logits(model), backend="aot_eager", fullgraph=True)(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    posenc.unpatch(model)


def test_rule_attention_op_passes_opcheck():
    """posenc::rule_attention: schema, fake against real output, AOT dispatch with dynamic shapes."""
    from posenc.attention import attention_rule
    from posenc.extensions import ExtensionSpec
    from posenc.hf import attention_patch

    spec = ExtensionSpec(original=32, factor=4.0, rotary_dim=None, target=128)
    attention_patch._RULES[-1] = attention_rule("self-extend", spec, group_size=3, window=8)
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, 40, 16, generator=g) for h in (4, 2, 2))
        inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
        args = (q, k, v, torch.arange(40)[None], None, -1, inv_freq, 1.0, None, None)
        result = torch.library.opcheck(attention_patch.rule_attention_op, args)
        assert set(result.values()) == {"SUCCESS"}, result
    finally:
        del attention_patch._RULES[-1]
