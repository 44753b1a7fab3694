"""posenc.patch / posenc.unpatch on tiny random transformers models (no download): the patched model runs posenc's
kernel (counted), gives transformers' logits for every family and rope type (dynamic and longrope included), and
unpatch gives the original objects back."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers builds the models)")

import posenc  # noqa: E402
import posenc.rope.apply as rope_apply  # noqa: E402
from posenc._internal.errors import PosencError  # noqa: E402

transformers.logging.set_verbosity_error()

from posenc_tiny_hf import LMAX, TINY, build, close, logits  # noqa: E402


@pytest.fixture
def kernel_calls(monkeypatch):
    """Count calls of posenc.apply_rope_table (what a patched model's attention must go through)."""
    calls = []
    original = rope_apply.apply_rope_table

    def counting(x, cos, sin, **kw):
        calls.append(tuple(x.shape))
        return original(x, cos, sin, **kw)

    monkeypatch.setattr(rope_apply, "apply_rope_table", counting)
    return calls


FAMILIES = ["llama", "qwen2", "mistral", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "mixtral", "gpt_neox",
            "qwen2_moe", "qwen3_moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_gives_transformers_logits_through_posenc(family, kernel_calls):
    reference = build(family)
    model = posenc.patch(copy.deepcopy(reference))
    close(logits(model, 40), logits(reference, 40))
    assert len(kernel_calls) == 2 * TINY["num_hidden_layers"]  # q and k in every layer went through posenc
    posenc.unpatch(model)


ROPE_TYPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("name", sorted(ROPE_TYPES))
def test_scaled_rope_types_keep_transformers_frequencies(name):
    reference = build("llama", ROPE_TYPES[name])
    model = posenc.patch(copy.deepcopy(reference))
    plain = build("llama")
    for n in (12, LMAX + 24):
        want = logits(reference, n)
        close(logits(model, n), want)
    assert (want - logits(plain, LMAX + 24)).abs().max() > 1e-3  # the scaling really changes these logits


def test_qwen2_yarn_with_attention_scaling():
    reference = build("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    assert reference.model.rotary_emb.attention_scaling > 1.0
    model = posenc.patch(copy.deepcopy(reference))
    for n in (6, LMAX + 16):
        close(logits(model, n), logits(reference, n))


def test_dynamic_ntk_follows_transformers_growth_and_reset():
    """transformers' stateful rule: grow past Lmax, keep a larger scale in between, restore below Lmax."""
    reference = build("llama", {"rope_type": "dynamic", "factor": 4.0})
    model = posenc.patch(copy.deepcopy(reference))
    for n in (20, 48, 64, 40, LMAX, 10, 50):
        close(logits(model, n), logits(reference, n))
        assert model.model.rotary_emb.original.max_seq_len_cached == reference.model.rotary_emb.max_seq_len_cached


def test_phi3_longrope_partial_rotary_switches_short_long():
    gen = torch.Generator().manual_seed(1)
    rotary = 8  # partial_rotary_factor 0.5 of head_dim 16
    rope = {"rope_type": "longrope", "short_factor": (1 + torch.rand(rotary // 2, generator=gen)).tolist(),
            "long_factor": (1 + 7 * torch.rand(rotary // 2, generator=gen)).tolist()}
    reference = build("phi3", rope, original_max_position_embeddings=16, partial_rotary_factor=0.5,
                      max_position_embeddings=64)
    model = posenc.patch(copy.deepcopy(reference))
    for n in (10, 16, 17, 40, 12):  # short, == L0, L0 + 1 (long), long, back to short
        close(logits(model, n), logits(reference, n))


def test_greedy_generation_with_kv_cache_is_unchanged():
    reference = build("qwen2")
    model = posenc.patch(copy.deepcopy(reference))
    prompt = torch.randint(0, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
        got = model.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


def test_patch_twice_is_harmless_and_unpatch_restores_exactly(kernel_calls):
    module = importlib.import_module("transformers.models.llama.modeling_llama")
    transformers_apply = module.apply_rotary_pos_emb
    model = build("llama")
    rotary = model.model.rotary_emb
    before = logits(model, 30)
    assert posenc.patch(model) is model
    wrapper = model.model.rotary_emb
    posenc.patch(model)
    assert model.model.rotary_emb is wrapper and wrapper.original is rotary
    logits(model, 30)
    assert len(kernel_calls) == 2 * TINY["num_hidden_layers"]  # one routing, not two stacked
    posenc.unpatch(model)
    assert model.model.rotary_emb is rotary
    assert module.apply_rotary_pos_emb is transformers_apply
    assert torch.equal(logits(model, 30), before)  # transformers' own code path again, bit for bit
    posenc.unpatch(model)  # unpatching an unpatched model does nothing
    assert model.model.rotary_emb is rotary


def test_unpatched_models_of_the_family_keep_transformers_path(kernel_calls):
    plain = build("llama")
    want = logits(plain, 20)  # before any dispatcher exists
    patched = posenc.patch(build("llama"))
    before = len(kernel_calls)
    got = logits(plain, 20)
    assert len(kernel_calls) == before  # the dispatcher passed the plain model's (cos, sin) to transformers
    assert torch.equal(got, want)
    posenc.unpatch(patched)


def test_deep_copy_of_a_patched_model_keeps_working():
    module = importlib.import_module("transformers.models.llama.modeling_llama")
    reference = build("llama")
    model = posenc.patch(copy.deepcopy(reference))
    clone = copy.deepcopy(model)
    posenc.unpatch(model)  # releases the family's dispatcher; the clone re-installs it on its next forward
    close(logits(clone, 24), logits(reference, 24))
    posenc.unpatch(clone)
    assert not posenc.is_patched(clone) and "posenc" not in (module.apply_rotary_pos_emb.__doc__ or "")


def test_bf16_model_agrees_within_a_rounding():
    reference = build("llama").to(torch.bfloat16)
    model = posenc.patch(copy.deepcopy(reference))
    want, got = logits(reference, 40).float(), logits(model, 40).float()
    # transformers rotates in bf16 with bf16 cos/sin, posenc in fp32 rounding once: a few bf16 ulps apart
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_unsupported_models_are_refused_by_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16))
    with pytest.raises(PosencError, match="GPT2LMHeadModel .*model_type 'gpt2'.* not supported"):
        posenc.patch(model)
    with pytest.raises(PosencError, match="expected a transformers model"):
        posenc.patch("llama")


def test_negative_position_ids_rotate_by_negative_angles():
    """Explicit position_ids below 0 (a caller's own offsets): transformers rotates by the negative angle; a
    cached-table lookup would wrap to the table's end instead."""
    reference = build("llama")
    model = posenc.patch(copy.deepcopy(reference))
    ids = torch.randint(0, TINY["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(2))
    for positions in (torch.arange(-4, 4)[None], torch.stack([torch.arange(-7, 1), torch.arange(8)])):
        with torch.no_grad():
            want = reference(input_ids=ids, position_ids=positions, use_cache=False).logits
            got = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        close(got, want)
