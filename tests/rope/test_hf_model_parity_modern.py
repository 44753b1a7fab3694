"""Tiny random-weight transformers models of today's RoPE variants (no download) against posenc.

Each test builds the model in transformers, swaps its rotary embedding for posenc's Rotary (the modelling file's
apply function hands q and k to ``Rotary.forward``) and compares outputs with the untouched model, or compares
q / k after rotation and the softmax scale where the effect lives inside the attention code (Llama 4's temperature
tuning, DeepSeek's softmax multiplier):

    Qwen2-VL / Qwen3-VL text   3-row M-RoPE positions from ``mrope_position_ids`` (chunked / interleaved)
    Llama 4 text               NoPE layers, chunked attention, temperature tuning, llama3 scaling, interleaved
    DeepSeek-V3                yarn with mscale / mscale_all_dim, softmax scale x mscale(factor, mscale_all_dim)^2
    Hunyuan                    "dynamic" + alpha read as static NTK-alpha
    ModernBERT                 global_rope_theta / local_rope_theta by layer type (4.x flat config form)
    Gemma 3                    rope_theta + rope_local_base_freq, linear x8 on global layers only (4.x form)
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers builds the reference models")
transformers.logging.set_verbosity_error()

from posenc import Rotary  # noqa: E402
from posenc.rope.layers import layer_schedule  # noqa: E402
from posenc.rope.mm_positions import mrope_position_ids  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 97
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, initializer_range=0.5, attn_implementation="eager")


class PosencRotary(torch.nn.Module):
    """Stands in for a transformers rotary embedding: passes the position ids and posenc's module (per layer type
    for local / global models) to the patched apply function."""

    def __init__(self, rotary):
        super().__init__()
        self.rotary = rotary          # a Rotary, or {layer_type: Rotary}

    def forward(self, x, position_ids, layer_type=None):
        rotary = self.rotary if layer_type is None else self.rotary[layer_type]
        return _Handle(position_ids, rotary)


class _Handle(tuple):
    """(position ids, Rotary), with the .to() transformers calls on Llama 4's complex table."""

    def __new__(cls, positions, rotary):
        return super().__new__(cls, (positions, rotary))

    def to(self, *args, **kwargs):
        return self


def patch_apply(monkeypatch, module_name: str, function: str = "apply_rotary_pos_emb", layout: str = "bhtd"):
    """Route the modelling file's apply function to posenc when given a _Handle; transformers' code otherwise."""
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    original = getattr(module, function)

    def apply(q, k, *args, **kwargs):
        if args and isinstance(args[0], _Handle):          # Llama 4 passes the table as one argument
            positions, rotary = args[0]
        elif len(args) >= 2 and isinstance(args[1], Rotary):   # the others unpack it as (cos, sin)
            positions, rotary = args[0], args[1]
        else:
            return original(q, k, *args, **kwargs)
        if layout == "bthd":                       # Llama 4 rotates before the heads / seq transpose
            q2, k2 = rotary(q.transpose(1, 2), k.transpose(1, 2), positions)
            return q2.transpose(1, 2), k2.transpose(1, 2)
        return rotary(q, k, positions)

    monkeypatch.setattr(module, function, apply)


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def twins(model_cls, config):
    torch.manual_seed(0)
    reference = model_cls(config).eval()
    return reference, copy.deepcopy(reference)


# ------------------------------------------------------------------------------------------------ M-RoPE

@pytest.mark.parametrize("family,section", [("qwen2_vl", [2, 3, 3]), ("qwen3_vl", [2, 3, 3])])
def test_qwen_vl_text_model_with_three_row_positions(monkeypatch, family, section):
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    conf = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    config_cls = conf.Qwen2VLTextConfig if family == "qwen2_vl" else conf.Qwen3VLTextConfig
    model_cls = module.Qwen2VLTextModel if family == "qwen2_vl" else module.Qwen3VLTextModel
    scaling = {"type": "mrope", "mrope_section": section} if family == "qwen2_vl" else \
        {"rope_type": "default", "mrope_section": section, "mrope_interleaved": True}
    raw = {**TINY, "head_dim": 16, "max_position_embeddings": 64, "rope_theta": 1e4, "rope_scaling": scaling}
    config = config_cls(**raw)
    reference, ours = twins(model_cls, config)
    ours.rotary_emb = PosencRotary(Rotary.from_config({**raw, "model_type": config.model_type}))
    patch_apply(monkeypatch, family)
    # text, a 4x6 image merged 2x2 (6 tokens), text, a 2-frame 2x4 video (4 tokens), text
    types_ = torch.tensor([[0, 0, 0] + [1] * 6 + [0, 0] + [2] * 4 + [0, 0, 0]] * 2)
    video = [[2, 2, 4]] if family == "qwen2_vl" else None
    if family == "qwen3_vl":                       # Qwen3-VL: one grid per frame, timestamps in between
        types_ = torch.tensor([[0, 0, 0] + [1] * 6 + [0, 0] + [2] * 2 + [0] + [2] * 2 + [0, 0]] * 2)
        video = [[2, 2, 4]]
    positions, _ = mrope_position_ids(types_, torch.tensor([[1, 4, 6]] * 2), torch.tensor(video * 2),
                                      spatial_merge_size=2, split_video_frames=family == "qwen3_vl")
    assert not torch.equal(positions[0], positions[1])         # really three different rows
    tokens = ids(2, types_.shape[1])
    with torch.no_grad():
        want = reference(input_ids=tokens, position_ids=positions, use_cache=False).last_hidden_state
        got = ours(input_ids=tokens, position_ids=positions, use_cache=False).last_hidden_state
        text_only = reference(input_ids=tokens, position_ids=positions[0:1].expand(3, -1, -1),
                              use_cache=False).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-4)
    assert (want - text_only).abs().max() > 1e-2                # the 3-row positions change the model


# ------------------------------------------------------------------------------------------------ Llama 4

def _llama4_config(**overrides):
    from transformers import Llama4TextConfig

    raw = dict(TINY, num_hidden_layers=4, head_dim=16, intermediate_size_mlp=128, num_local_experts=2,
               num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=8,
               attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5, use_qk_norm=True,
               max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16}, rope_theta=100.0)
    raw.update(overrides)
    return raw, Llama4TextConfig(**raw)


def test_llama4_rope_layers_match_transformers_logits(monkeypatch):
    from transformers import Llama4ForCausalLM

    raw, config = _llama4_config()
    reference, ours = twins(Llama4ForCausalLM, config)
    rot = Rotary.from_config({**raw, "model_type": "llama4_text"})
    assert rot.layout == "interleaved"                   # Llama 4 rotates (2j, 2j+1) pairs as complex numbers
    ours.model.rotary_emb = PosencRotary(rot)
    patch_apply(monkeypatch, "llama4", "apply_rotary_emb", layout="bthd")
    tokens = ids(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=tokens).logits, reference(input_ids=tokens).logits,
                                   rtol=1e-4, atol=5e-4)


def test_llama4_nope_layers_temperature_and_scale_match_transformers_qk():
    """q and k as transformers' Llama 4 attention hands them to the softmax, rebuilt with posenc: Rotary on the RoPE
    layers (+ transformers' L2 qk-norm), the schedule's temperature on NoPE layers, the schedule's softmax scale."""
    from transformers import AttentionInterface, Llama4ForCausalLM
    from transformers.models.llama4 import modeling_llama4

    raw, config = _llama4_config()
    schedule = layer_schedule({**raw, "model_type": "llama4_text"})
    assert list(schedule.layer_types) == config.layer_types and schedule.nope_layers == [1, 3]
    captured, raw_qk = {}, {}

    def capture(module, query, key, value, attention_mask, scaling=None, **kwargs):
        captured[module.layer_idx] = (query, key, scaling)
        return modeling_llama4.eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                                       **kwargs)

    AttentionInterface.register("posenc_capture", capture)
    config._attn_implementation = "posenc_capture"
    torch.manual_seed(0)
    model = Llama4ForCausalLM(config).eval()
    for i, layer in enumerate(model.model.layers):
        for name in ("q_proj", "k_proj"):
            getattr(layer.self_attn, name).register_forward_hook(
                lambda mod, inp, out, i=i, name=name: raw_qk.__setitem__((i, name), out))
    tokens = ids(2, 24)
    with torch.no_grad():
        model(input_ids=tokens)
    rot = Rotary.from_config({**raw, "model_type": "llama4_text"})
    positions = torch.arange(24)
    for i in range(config.num_hidden_layers):
        q = raw_qk[i, "q_proj"].view(2, 24, -1, 16).transpose(1, 2)
        k = raw_qk[i, "k_proj"].view(2, 24, -1, 16).transpose(1, 2)
        if schedule.rope[i]:
            q, k = rot(q, k, positions)
            q, k = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) for x in (q, k))
        else:
            q = q * schedule.temperature_tuning.query_scale(positions)[:, None]
        want_q, want_k, scaling = captured[i]
        torch.testing.assert_close(q, want_q, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(k, want_k, rtol=1e-4, atol=1e-4)
        assert scaling == pytest.approx(schedule.softmax_scale(16))
    assert float(schedule.temperature_tuning.query_scale(positions).max()) > 1.5   # the temperature really acts


# ----------------------------------------------------------------------------------------------- DeepSeek

def test_deepseek_v3_yarn_and_softmax_multiplier_match_transformers(monkeypatch):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    raw = dict(TINY, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
               qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               first_k_dense_replace=1, moe_intermediate_size=32, max_position_embeddings=160, rope_theta=1e4,
               rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4,
                             "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1})
    config = DeepseekV3Config(**raw)
    reference, ours = twins(DeepseekV3ForCausalLM, config)
    rot = Rotary.from_config({**raw, "model_type": "deepseek_v3"})
    assert rot.layout == "interleaved" and rot.attention_scaling != 1 and rot.softmax_scale_multiplier > 1.5
    ours.model.rotary_emb = PosencRotary(rot)
    # transformers de-interleaves after rotating; q.k over the rope dims is the same either way
    patch_apply(monkeypatch, "deepseek_v3", "apply_rotary_pos_emb_interleave")
    tokens = ids(2, 20)
    for layer in ours.model.layers:                           # drop the multiplier: the logits must then differ
        layer.self_attn.scaling = 16 ** -0.5
    with torch.no_grad():
        want = reference(input_ids=tokens).logits
        assert (ours(input_ids=tokens).logits - want).abs().max() > 1e-2
        for layer in ours.model.layers:
            layer.self_attn.scaling = rot.softmax_scale(config.qk_nope_head_dim + config.qk_rope_head_dim)
        torch.testing.assert_close(ours(input_ids=tokens).logits, want, rtol=1e-4, atol=5e-4)


# ------------------------------------------------------------------------------------------------ Hunyuan

def test_hunyuan_alpha_model(monkeypatch):
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    raw = dict(TINY, head_dim=16, max_position_embeddings=32, rope_theta=1e4,
               rope_scaling={"type": "dynamic", "alpha": 50.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                             "mscale": 1.0, "mscale_all_dim": 1.0})
    config = HunYuanDenseV1Config(**raw)
    reference, ours = twins(HunYuanDenseV1ForCausalLM, config)
    rot = Rotary.from_config({**raw, "model_type": "hunyuan_v1_dense"})
    assert rot.config.rope_type == "ntk_alpha"
    ours.model.rotary_emb = PosencRotary(rot)
    patch_apply(monkeypatch, "hunyuan_v1_dense")
    with torch.no_grad():
        for length in (12, 48):                              # static: no change past max_position_embeddings
            tokens = ids(2, length)
            torch.testing.assert_close(ours(input_ids=tokens).logits, reference(input_ids=tokens).logits,
                                       rtol=1e-4, atol=5e-4)


# ------------------------------------------------------------------------------- local / global layer types

def test_modernbert_global_and_local_theta(monkeypatch):
    from transformers import ModernBertConfig, ModernBertModel

    raw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, vocab_size=VOCAB,
               max_position_embeddings=64, global_rope_theta=160000.0, local_rope_theta=50.0,
               global_attn_every_n_layers=3, local_attention=16, initializer_range=0.5, attn_implementation="eager",
               pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    config = ModernBertConfig(**raw)
    reference, ours = twins(ModernBertModel, config)
    flat = {**raw, "model_type": "modernbert"}
    ours.rotary_emb = PosencRotary({t: Rotary.from_config(flat, t) for t in ("full_attention", "sliding_attention")})
    assert ours.rotary_emb.rotary["full_attention"].config.theta == 160000.0
    patch_apply(monkeypatch, "modernbert")
    tokens = ids(2, 40)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=tokens).last_hidden_state,
                                   reference(input_ids=tokens).last_hidden_state, rtol=1e-4, atol=5e-4)
        # reading the local theta as the global one (what posenc once did) changes the model
        ours.rotary_emb.rotary["sliding_attention"] = Rotary(16, 160000.0, layout="half")
        assert (ours(input_ids=tokens).last_hidden_state - reference(input_ids=tokens).last_hidden_state
                ).abs().max() > 1e-2


def test_gemma3_local_global_with_linear_on_global_layers(monkeypatch):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    raw = dict(TINY, head_dim=16, max_position_embeddings=64, rope_theta=1e6, rope_local_base_freq=100.0,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=8, sliding_window_pattern=2,
               query_pre_attn_scalar=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = Gemma3TextConfig(**raw)
    reference, ours = twins(Gemma3ForCausalLM, config)
    flat = {**raw, "model_type": "gemma3_text"}
    rotaries = {t: Rotary.from_config(flat, t) for t in ("full_attention", "sliding_attention")}
    assert rotaries["full_attention"].config.rope_type == "linear"
    assert rotaries["sliding_attention"].config.rope_type == "default"
    ours.model.rotary_emb = PosencRotary(rotaries)
    patch_apply(monkeypatch, "gemma3")
    tokens = ids(2, 30)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=tokens).logits, reference(input_ids=tokens).logits,
                                   rtol=1e-4, atol=5e-4)
