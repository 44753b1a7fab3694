"""Mistral Small 4 and Mistral Large 4 against transformers' own model code, on tiny random models (no download).

Each test runs the transformers model with a capturing attention function (registered with ``AttentionInterface``)
and rebuilds, from the raw projections, the q and k that reach the softmax with posenc alone (``Rotary.from_config``,
``layer_schedule``, ``posenc.temperature``), plus the softmax scale the attention is handed, in one prefill and in
a second chunk read through the KV cache:

    Mistral Small 4 (mistral4)   DeepSeek-V3's MLA (``Mistral4Attention`` is ``DeepseekV3Attention``'s): yarn over
                                 the qk_rope_head_dim part of each head, interleaved pairs (rope_interleave),
                                 softmax scale qk_head_dim^-0.5 x g(factor, mscale_all_dim)^2 (yarn_apply_mscale),
                                 and Ministral 3's query temperature 1 + beta ln(1 + floor(p / L0)) on every layer
                                 (get_llama_4_attn_scale): Mistral Large 3's RoPE
    Mistral Large 4              MLA with yarn (attention_factor 1), interleaved pairs, every 4th layer NoPE
    (mistral_large4_text)        (no_rope_layers), LeRoPE's learned exp(alpha) per pair on the frequencies, and a
                                 learned per-head query scale scale_h ln(p + 1) + bias_h on every layer

transformers' interleaved apply (``apply_rotary_pos_emb_interleave``) writes the rotated pairs back de-interleaved
(the even members, then the odd ones); posenc's interleaved Rotary keeps them in place. Both q and k get the same
permutation, so q.k is unchanged; the tests permute posenc's output the same way before comparing.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers builds the reference models")
transformers.logging.set_verbosity_error()
pytest.importorskip("transformers.models.mistral4", reason="transformers too old for Mistral 4")

from posenc import Rotary  # noqa: E402
from posenc.rope.layers import layer_schedule  # noqa: E402
from posenc.temperature import log_position_scale  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 97
ORIGINAL = 8          # L0: the query temperature steps at p = 8, 16, 24, 32
MLA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
           initializer_range=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2, kv_lora_rank=16,
           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
           n_group=1, topk_group=1, moe_intermediate_size=32, max_position_embeddings=16 * ORIGINAL)
ROPE, NOPE = 8, 8


def run_chunks(model, layers, chunks: list[int], hooks: tuple[str, ...]):
    """Run ``model`` on random tokens in chunks of the given lengths through one KV cache; -> ({layer: the last
    chunk's attention call}, {(layer, name): [output of the attention's submodule ``name``, per chunk]})."""
    from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache
    from transformers.masking_utils import eager_mask

    calls, outputs = {}, {}
    module = __import__(type(model).__module__, fromlist=["eager_attention_forward"])

    def capture(attn, query, key, value, attention_mask, scaling=None, **kwargs):
        calls[attn.layer_idx] = dict(query=query, key=key, scaling=scaling)
        return module.eager_attention_forward(attn, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register("posenc_capture", capture)
    AttentionMaskInterface.register("posenc_capture", eager_mask)      # the eager masks: DSA's indexer reads them
    model.config._attn_implementation = "posenc_capture"
    for i, layer in enumerate(layers):
        for name in hooks:
            getattr(layer.self_attn, name).register_forward_hook(
                lambda mod, inp, out, i=i, name=name: outputs.setdefault((i, name), []).append(out))
    tokens = torch.randint(3, VOCAB, (2, sum(chunks)), generator=torch.Generator().manual_seed(1))
    cache, start = DynamicCache(config=model.config), 0
    with torch.no_grad():
        for n in chunks:
            model(input_ids=tokens[:, start:start + n], position_ids=torch.arange(start, start + n)[None].expand(2, n),
                  cache=cache, use_cache=True)
            start += n
    return calls, outputs


def heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[B, T, H * D] -> [B, H, T, D]."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """transformers' order after an interleaved rotation: pairs' first members, then their second ones."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def rope_parts(outputs, i: int, q_name: str, head_dim: int, chunk: int):
    """(q of the last chunk as [B, H, T, qk_head_dim], the RoPE part of k over every chunk as [B, 1, T, ROPE])."""
    q = heads(outputs[i, q_name][-1], head_dim)
    k_rot = torch.cat([o[..., -ROPE:] for o in outputs[i, "kv_a_proj_with_mqa"]], dim=1)[:, None]
    return q, k_rot


# --------------------------------------------------------------------------------------------- Mistral Small 4

def _mistral4(interleave: bool = True):
    from transformers import Mistral4Config

    # Mistral Small 4's shape in small (the config class's defaults scaled down): yarn from L0 with DeepSeek's
    # mscale pair (mscale_all_dim 0.8 here so the rotary's attention factor is not 1), the query temperature,
    # the RoPE part a half of each 16-dim q/k head
    raw = dict(MLA, num_hidden_layers=2, q_lora_rank=None, first_k_dense_replace=1, rope_interleave=interleave,
               rope_parameters={"type": "yarn", "rope_theta": 1e4, "factor": 16.0,
                                "original_max_position_embeddings": ORIGINAL,
                                "max_position_embeddings": 16 * ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0,
                                "mscale_all_dim": 0.8, "mscale": 1.0, "llama_4_scaling_beta": 0.5,
                                "partial_rotary_factor": 0.5})
    return {**raw, "model_type": "mistral4"}, Mistral4Config(**raw)


@pytest.mark.parametrize("chunks", [[40], [30, 10]], ids=["prefill", "kv-cache"])
@pytest.mark.parametrize("interleave", [True, False])
def test_mistral4_mla_yarn_temperature_and_softmax_scale_match_transformers(chunks, interleave):
    """q = temperature(p) x [q_nope, RoPE(q_rope)], k's RoPE part = RoPE(k_rope), scale = qk_head_dim^-0.5 x
    g(16, 0.8)^2: posenc's Rotary and schedule give what transformers' Mistral 4 attention hands the softmax, at
    positions inside and past L0, in a prefill and in a chunk read through the cache (positions 30-39)."""
    from transformers import Mistral4ForCausalLM

    raw, config = _mistral4(interleave)
    torch.manual_seed(0)
    model = Mistral4ForCausalLM(config).eval()
    calls, outputs = run_chunks(model, model.model.layers, chunks, ("q_proj", "kv_a_proj_with_mqa"))
    schedule = layer_schedule(raw)
    rot = Rotary.from_config(raw)
    assert (rot.config.rotary_dim, rot.config.head_dim, rot.config.rope_type) == (ROPE, ROPE, "yarn")
    assert rot.layout == schedule.layout == ("interleaved" if interleave else "half")
    assert rot.attention_scaling != 1 and schedule.softmax_scale_multiplier > 1
    assert torch.equal(rot.inv_freq, model.model.rotary_emb.inv_freq)
    order = deinterleave if interleave else (lambda x: x)
    positions, total = torch.arange(sum(chunks) - chunks[-1], sum(chunks)), torch.arange(sum(chunks))
    temperature = schedule.query_temperature.query_scale(positions)
    assert temperature[-1] > temperature[0] >= 1           # it steps up inside the positions compared
    for i in range(config.num_hidden_layers):
        q, k_rot = rope_parts(outputs, i, "q_proj", NOPE + ROPE, chunks[-1])
        q_rot, _ = rot(q[..., NOPE:], q[..., NOPE:], positions)
        _, k_rot = rot(k_rot, k_rot, total)
        q = torch.cat([q[..., :NOPE], order(q_rot)], dim=-1) * temperature[:, None]
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(order(k_rot).expand(-1, 4, -1, -1), calls[i]["key"][..., NOPE:], rtol=1e-5,
                                   atol=1e-5)
        assert calls[i]["scaling"] == pytest.approx(schedule.softmax_scale(NOPE + ROPE), rel=1e-12)


def test_mistral4_config_reads_as_transformers():
    """The temperature keys are the attention's (no unknown-key warning, not frequency parameters), the rotary
    dim is qk_rope_head_dim, the defaults' layout interleaved, and the multiplier DeepSeek's g(128, 1)^2."""
    import warnings

    from transformers import Mistral4Config

    from posenc.rope.config import load_rope_config

    default = {**Mistral4Config().to_dict(), "model_type": "mistral4"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc = load_rope_config(default)
        schedule = layer_schedule(default)
    assert "llama_4_scaling_beta" not in rc.params and (rc.rotary_dim, rc.rope_type) == (64, "yarn")
    assert (schedule.query_temperature.beta, schedule.query_temperature.original) == (0.1, 8192)
    assert schedule.layout == "interleaved" and schedule.softmax_scale_multiplier == pytest.approx(
        (0.1 * torch.log(torch.tensor(128.0)).item() + 1) ** 2)


# --------------------------------------------------------------------------------------------- Mistral Large 4

def _mistral_large4():
    from transformers.models.mistral_large4.configuration_mistral_large4 import MistralLarge4TextConfig

    # Mistral Large 4's text model in small: yarn from L0 with attention_factor 1 (the config class's default
    # form), 4 layers so the default no_rope_layer_interval 4 makes layer 3 NoPE, an indexer that keeps every key
    raw = dict(MLA, num_hidden_layers=4, head_dim=ROPE, first_k_dense_replace=1, index_topk=64, index_head_dim=16,
               index_n_heads=2,
               rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 16.0,
                                "original_max_position_embeddings": ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0,
                                "attention_factor": 1.0})
    return {**raw, "model_type": "mistral_large4_text"}, MistralLarge4TextConfig(**raw)


@pytest.mark.parametrize("chunks", [[40], [30, 10]], ids=["prefill", "kv-cache"])
def test_mistral_large4_lerope_learned_query_scale_and_nope_layer_match_transformers(chunks):
    """With learned weights that act (alpha, scale and bias random, not their identity init): q = (scale_h ln(p + 1)
    + bias_h) x [q_nope, RoPE(q_rope)] on RoPE layers, q x the same scale unrotated on the NoPE layer, k's RoPE
    part = RoPE(k_rope), with posenc's yarn frequencies times exp(alpha) (LeRoPE) and scale qk_head_dim^-0.5."""
    from transformers.models.mistral_large4.modeling_mistral_large4 import MistralLarge4TextModel

    raw, config = _mistral_large4()
    torch.manual_seed(0)
    model = MistralLarge4TextModel(config).eval()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        model.rotary_emb.alpha.copy_(0.3 * torch.randn(ROPE // 2, generator=generator))
        for layer in model.layers:
            layer.self_attn.softmax_scaling.scale.copy_(0.2 * torch.randn(4, generator=generator))
            layer.self_attn.softmax_scaling.bias.copy_(1 + 0.1 * torch.randn(4, generator=generator))
    calls, outputs = run_chunks(model, model.layers, chunks, ("q_proj", "kv_a_proj_with_mqa"))
    schedule = layer_schedule(raw)
    assert schedule.nope_layers == [3] == [i for i, layer in enumerate(model.layers) if not layer.self_attn.use_rope]
    assert schedule.learned_frequency_scale and schedule.learned_query_scale and schedule.layout == "interleaved"
    rot = Rotary.from_config(raw)
    assert torch.equal(rot.inv_freq, model.rotary_emb.inv_freq) and rot.attention_scaling == 1
    rot.inv_freq = rot.inv_freq * model.rotary_emb.alpha.detach().exp()        # LeRoPE, from the checkpoint
    positions, total = torch.arange(sum(chunks) - chunks[-1], sum(chunks)), torch.arange(sum(chunks))
    for i, layer in enumerate(model.layers):
        weights = layer.self_attn.softmax_scaling
        scale = log_position_scale(positions, weights.scale.detach(), weights.bias.detach())[..., None]
        if i in schedule.nope_layers:
            q = heads(outputs[i, "q_proj"][-1], NOPE + ROPE)
        else:
            q, k_rot = rope_parts(outputs, i, "q_proj", NOPE + ROPE, chunks[-1])
            q_rot, _ = rot(q[..., NOPE:], q[..., NOPE:], positions)
            _, k_rot = rot(k_rot, k_rot, total)
            q = torch.cat([q[..., :NOPE], deinterleave(q_rot)], dim=-1)
            torch.testing.assert_close(deinterleave(k_rot).expand(-1, 4, -1, -1), calls[i]["key"][..., NOPE:],
                                       rtol=1e-4, atol=5e-5)
        # the scaled frequencies' angles round differently from transformers' float32 product: a few 1e-5
        torch.testing.assert_close(q * scale, calls[i]["query"], rtol=1e-4, atol=5e-5)
        assert calls[i]["scaling"] == pytest.approx(schedule.softmax_scale(NOPE + ROPE), rel=1e-12)


def test_mistral_large4_defaults_schedule_and_nested_config():
    """The config class's defaults: every 4th of 72 layers NoPE (18), read the same from the multimodal parent
    (mistral_large4 with its text_config) as from the text config; a longer no_rope_layers list is cut to the layers,
    as the attention indexes it."""
    from transformers.models.mistral_large4.configuration_mistral_large4 import (MistralLarge4Config,
                                                                                 MistralLarge4TextConfig)

    text = {**MistralLarge4TextConfig().to_dict(), "model_type": "mistral_large4_text"}
    parent = {**MistralLarge4Config().to_dict(), "model_type": "mistral_large4"}
    for cfg in (text, parent):
        schedule = layer_schedule(cfg)
        assert schedule.nope_layers == list(range(3, 72, 4)) and schedule.learned_query_scale
    longer = dict(text, num_hidden_layers=8, layer_types=None)
    assert layer_schedule(longer).nope_layers == [3, 7]
