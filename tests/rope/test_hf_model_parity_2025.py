"""The RoPE variants of 2025-26 checkpoints against transformers' own model code, on tiny random models (no download).

Each test runs the transformers model with a capturing attention function (registered with ``AttentionInterface``)
and rebuilds, from the raw projections, the q and k that reach the softmax with posenc alone (``Rotary.from_config``
and ``layer_schedule``), plus the softmax scale, window and extra logits the attention is handed:

    Ministral 3     yarn + the query temperature 1 + beta ln(1 + floor(p / L0)) on every layer (llama_4_scaling_beta),
                    softmax scale head_dim^-0.5 (no DeepSeek multiplier, although the dict carries mscale_all_dim)
    gpt-oss         yarn with truncate false (an unrounded correction range), a window on alternate layers, learned
                    per-head sink logits handed to every softmax (s_aux); extend --replace keeps truncate false
    Phi-4-mini      LongRoPE over 3/4 of each head with its mscale, short and long factors
    OLMo 3          yarn on the full-attention layers only, plain RoPE on the sliding ones
    Qwen3.5 text    interleaved M-RoPE on a quarter of each head, with YaRN, three different position rows
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers builds the reference models")
transformers.logging.set_verbosity_error()

from posenc import Rotary  # noqa: E402
from posenc.rope.layers import layer_schedule  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 97
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, initializer_range=0.5,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)


def run_captured(model_cls, config, length: int, hooks: dict[str, str], batch: int = 2, position_ids=None):
    """Run a tiny random ``model_cls(config)`` on ``length`` tokens; -> (model, {layer: attention call},
    {(layer, name): output of the submodule ``name`` of that layer's attention}). An attention call holds the query,
    key, scaling and keyword arguments transformers' attention module hands its attention function."""
    from transformers import AttentionInterface

    calls, outputs = {}, {}
    module = __import__(model_cls.__module__, fromlist=["eager_attention_forward"])

    def capture(attn, query, key, value, attention_mask, scaling=None, **kwargs):
        calls[attn.layer_idx] = dict(query=query, key=key, scaling=scaling, kwargs=kwargs, module=attn)
        return module.eager_attention_forward(attn, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register("posenc_capture", capture)
    config._attn_implementation = "posenc_capture"
    torch.manual_seed(0)
    model = model_cls(config).eval()
    for i, layer in enumerate(model.model.layers):
        attn = getattr(layer, "self_attn", None)
        for name in hooks:
            if attn is not None and hasattr(attn, name):
                getattr(attn, name).register_forward_hook(
                    lambda mod, inp, out, i=i, name=name: outputs.__setitem__((i, name), out))
    tokens = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=tokens, position_ids=position_ids, use_cache=False)
    return model, calls, outputs


def heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[B, T, H * D] -> [B, H, T, D]."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


# ------------------------------------------------------------------------------------------------ Ministral 3

def _ministral3(beta: float = 0.5, original: int = 8):
    from transformers import Ministral3Config

    raw = dict(TINY, max_position_embeddings=16 * original, sliding_window=None,
               rope_parameters={"type": "yarn", "rope_theta": 1e4, "factor": 16.0,
                                "original_max_position_embeddings": original,
                                "max_position_embeddings": 16 * original,
                                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                                "llama_4_scaling_beta": beta})
    return {**raw, "model_type": "ministral3"}, Ministral3Config(**raw)


def test_ministral3_query_temperature_and_scale_match_transformers_qk():
    """q = temperature(p) x RoPE(q) on every layer, k = RoPE(k), softmax scale head_dim^-0.5: posenc's schedule and
    Rotary give (to float32 rounding) the q and k transformers' Ministral 3 attention hands to the softmax, past
    several multiples of the original length (the temperature steps at p = 8, 16, 24, 32)."""
    from transformers import Ministral3ForCausalLM

    raw, config = _ministral3()
    length = 40
    _, calls, outputs = run_captured(Ministral3ForCausalLM, config, length, {"q_proj": "", "k_proj": ""})
    schedule = layer_schedule(raw)
    rot = Rotary.from_config(raw)
    positions = torch.arange(length)
    temperature = schedule.query_temperature.query_scale(positions)
    assert temperature[7] == 1 and temperature[8] > 1 and temperature[39] == temperature[32] > temperature[31]
    assert schedule.softmax_scale_multiplier == 1 and schedule.rope is None     # every layer rotates
    for i in range(config.num_hidden_layers):
        q, k = rot(heads(outputs[i, "q_proj"], 16), heads(outputs[i, "k_proj"], 16), positions)
        q = q * temperature[:, None]
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, calls[i]["key"], rtol=1e-5, atol=1e-5)
        assert calls[i]["scaling"] == schedule.softmax_scale(16)
    # the multipliers themselves are transformers' bit for bit
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    assert torch.equal(temperature, get_llama_4_attn_scale(positions[None], 0.5, 8)[0, 0, :, 0])


def test_ministral3_temperature_is_not_llama4s_floor():
    """The two temperatures differ exactly where their floors do: at p = L0 - 1 Llama 4's (p + 1) / L0 has stepped,
    Ministral 3's p / L0 has not; at p = L0 both have."""
    from posenc.temperature import attention_temperature, query_temperature

    p = torch.tensor([6, 7, 8])
    assert query_temperature(p, beta=0.5, original=8).tolist() == pytest.approx([1, 1, 1 + 0.5 * torch.log(
        torch.tensor(2.0)).item()])
    assert attention_temperature(p, floor_scale=8, attn_scale=0.5)[1] > 1 == query_temperature(p, beta=0.5,
                                                                                                original=8)[1]


def test_ministral3_config_reads_without_false_warnings_or_softmax_multiplier():
    """llama_4_scaling_beta and the dict's max_position_embeddings are the attention's keys (transformers ignores
    them at rope validation): no unknown-key warning, left out of the frequency parameters, and no DeepSeek softmax
    multiplier although the dict carries mscale_all_dim."""
    import warnings

    from posenc.rope.config import load_rope_config, rope_attention_keys

    raw, _ = _ministral3(beta=0.1, original=16384)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc = load_rope_config(raw)
        schedule = layer_schedule(raw)
    assert "llama_4_scaling_beta" not in rc.params and rc.rope_type == "yarn"
    assert rope_attention_keys(raw) == {"llama_4_scaling_beta": 0.1, "max_position_embeddings": 262144}
    assert schedule.softmax_scale_multiplier == 1
    assert (schedule.query_temperature.beta, schedule.query_temperature.original) == (0.1, 16384)


# ------------------------------------------------------------------------------------------------- gpt-oss

def _gpt_oss(truncate: bool = False):
    from transformers import GptOssConfig

    raw = dict(TINY, num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=2048, sliding_window=4,
               layer_types=["sliding_attention", "full_attention"], rope_theta=100.0,
               rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": truncate, "original_max_position_embeddings": 64})
    return {**raw, "model_type": "gpt_oss"}, GptOssConfig(**raw)


def test_gpt_oss_unrounded_yarn_window_and_sink_logits_match_transformers():
    """gpt-oss: yarn with truncate false (the ramp's ends 0 and 4.03 dims, not rounded to 0 and 5), a 4-token window
    on the sliding layer only, and a learned sink logit per head handed to every softmax; posenc's Rotary gives
    the q and k its attention receives, its schedule the window per layer and the sink logits."""
    from transformers import GptOssForCausalLM

    raw, config = _gpt_oss()
    _, calls, outputs = run_captured(GptOssForCausalLM, config, 24, {"q_proj": "", "k_proj": ""})
    schedule = layer_schedule(raw)
    rot = Rotary.from_config(raw)
    rounded = Rotary.from_config(_gpt_oss(truncate=True)[0])
    assert not torch.allclose(rot.inv_freq, rounded.inv_freq)     # rounding the range would change the model
    positions = torch.arange(24)
    assert schedule.layer_types == ("sliding_attention", "full_attention") and schedule.sink_logits
    for i in range(config.num_hidden_layers):
        q, k = rot(heads(outputs[i, "q_proj"], 16), heads(outputs[i, "k_proj"], 16), positions)
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, calls[i]["key"], rtol=1e-5, atol=1e-5)
        assert calls[i]["scaling"] == schedule.softmax_scale(16)
        window = schedule.sliding_window if schedule.layer_types[i] == "sliding_attention" else None
        assert calls[i]["kwargs"]["sliding_window"] == window
        assert calls[i]["kwargs"]["s_aux"] is calls[i]["module"].sinks and calls[i]["module"].sinks.shape == (4,)


def test_gpt_oss_default_layer_pattern_is_the_config_class():
    """Without layer_types, gpt-oss alternates sliding and full layers (sliding first), as GptOssConfig fills in."""
    from transformers import GptOssConfig

    for n in (1, 4, 5):
        want = GptOssConfig(num_hidden_layers=n).layer_types
        cfg = {"model_type": "gpt_oss", "num_hidden_layers": n, "head_dim": 64}
        assert list(layer_schedule(cfg).layer_types) == want


def test_gpt_oss_extend_keeps_the_unrounded_range_and_transformers_reads_it(tmp_path):
    """``posenc extend --replace`` over gpt-oss's yarn writes truncate: false again, says so, and transformers'
    own gpt-oss rotary built from the written file has posenc's frequencies."""
    import json
    import warnings

    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    from posenc import rope_parameters
    from posenc.tools.extend import extend_config

    raw, _ = _gpt_oss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = extend_config(raw, 4096, "yarn", replace=True)
    written = result.config["rope_parameters"]
    assert written["truncate"] is False and any("truncate: false" in n for n in result.notes)
    config = GptOssConfig(**{k: v for k, v in result.config.items() if k != "model_type"})
    inv, scaling = rope_parameters(result.config)
    torch.testing.assert_close(inv, GptOssRotaryEmbedding(config).inv_freq, rtol=1e-6, atol=0)
    assert json.dumps(result.config)


# --------------------------------------------------------------------------------------------- Phi-4-mini

def _phi4_mini():
    from transformers import Phi3Config

    # Phi-4-mini's shape in small: 3/4 of each head rotates, LongRoPE lists cover the rotated pairs only, the
    # original length sits at the top level (transformers 4.x form, as the published file)
    raw = dict(TINY, num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=16,
               partial_rotary_factor=0.75, rope_theta=1e4,
               rope_scaling={"type": "longrope", "short_factor": [1.0, 1.0, 1.1, 1.3, 1.6, 2.0],
                             "long_factor": [1.0, 1.5, 2.5, 3.5, 4.0, 4.4]})
    raw.pop("head_dim")
    return {**raw, "model_type": "phi3"}, Phi3Config(**raw)


@pytest.mark.parametrize("length", [12, 40])
def test_phi4_mini_longrope_on_partial_rotary_matches_transformers_qk(length):
    """LongRoPE over 12 of 16 dims (6 pairs, partial 0.75) with the mscale sqrt(1 + ln 4 / ln 16): posenc's Rotary
    gives the q and k transformers' Phi-3 attention receives, with the short factors up to the original 16 tokens
    and the long ones past it."""
    from transformers import Phi3ForCausalLM

    raw, config = _phi4_mini()
    _, calls, outputs = run_captured(Phi3ForCausalLM, config, length, {"qkv_proj": ""})
    rot = Rotary.from_config(raw)
    assert (rot.config.rotary_dim, rot.config.head_dim) == (12, 16)
    assert rot.attention_scaling == pytest.approx((1 + torch.tensor(4.0).log() / torch.tensor(16.0).log()) ** 0.5)
    positions = torch.arange(length)
    for i in range(config.num_hidden_layers):
        qkv = outputs[i, "qkv_proj"]
        q, k = rot(heads(qkv[..., :64], 16), heads(qkv[..., 64:96], 16), positions)
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, calls[i]["key"], rtol=1e-5, atol=1e-5)
        assert torch.equal(q[..., 12:], calls[i]["query"][..., 12:])        # the last quarter passes unrotated


# ------------------------------------------------------------------------------------------------- OLMo 3

def _olmo3():
    from transformers import Olmo3Config

    # OLMo 3's published form: top-level rope_theta and one rope_scaling (yarn with attention_factor), 3 sliding
    # layers then 1 full one; transformers applies the scaling to the full-attention layers only
    raw = dict(TINY, num_hidden_layers=4, max_position_embeddings=64, sliding_window=6, rope_theta=5e5,
               rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8,
                             "attention_factor": 1.2079441541679836, "beta_fast": 32.0, "beta_slow": 1.0})
    raw.pop("head_dim")
    return {**raw, "model_type": "olmo3"}, Olmo3Config(**raw)


def test_olmo3_scales_full_attention_layers_only_as_transformers_qk():
    """Each layer's q and k from posenc's Rotary for that layer's type (``schedule.rope_layer_types``) equal what
    transformers' OLMo 3 attention receives: yarn with its attention factor on layer 3, plain RoPE on 0-2; reading
    the yarn on every layer (the engines' bug) would not."""
    from transformers import Olmo3ForCausalLM

    raw, config = _olmo3()
    _, calls, outputs = run_captured(Olmo3ForCausalLM, config, 40, {"q_norm": "", "k_norm": ""})
    schedule = layer_schedule(raw)
    assert schedule.rope_layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert schedule.sliding_window == 6
    rotaries = {t: Rotary.from_config(raw, t) for t in ("sliding_attention", "full_attention")}
    assert rotaries["full_attention"].config.rope_type == "yarn"
    assert rotaries["sliding_attention"].config.rope_type == "default"
    positions = torch.arange(40)
    for i, layer_type in enumerate(schedule.rope_layer_types):
        q, k = rotaries[layer_type](heads(outputs[i, "q_norm"], 16), heads(outputs[i, "k_norm"], 16), positions)
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, calls[i]["key"], rtol=1e-5, atol=1e-5)
        assert calls[i]["kwargs"]["sliding_window"] == (6 if layer_type == "sliding_attention" else None)
        wrong, _ = rotaries["full_attention"](heads(outputs[i, "q_norm"], 16), heads(outputs[i, "k_norm"], 16),
                                              positions)
        assert (layer_type == "full_attention") == torch.allclose(wrong, calls[i]["query"], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- Qwen3.5 text

def _qwen3_5(rope_type: str = "yarn"):
    from transformers import Qwen3_5TextConfig

    # Qwen3.5's text model in small: a quarter of each 32-dim head rotates (8 pairs, interleaved M-RoPE sections
    # 3 / 3 / 2), YaRN x4 on top as the model card's long-context block does; full-attention layers only (the
    # linear-attention layers carry no positions)
    rope = {"rope_type": rope_type, "rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_interleaved": True,
            "mrope_section": [3, 3, 2]}
    if rope_type == "yarn":
        rope.update(factor=4.0, original_max_position_embeddings=16)
    raw = dict(TINY, head_dim=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
               layer_types=["full_attention", "full_attention"], rope_parameters=rope)
    return {**raw, "model_type": "qwen3_5_text"}, Qwen3_5TextConfig(**raw)


def test_qwen3_5_interleaved_mrope_partial_yarn_matches_transformers_qk():
    """Three different position rows (t, h, w) on 8 of 32 pairs, cycled t h w t h w ... (interleaved), YaRN's
    blended frequencies and attention factor: posenc's Rotary gives the q and k transformers' Qwen3.5 attention
    receives, and the 48 unrotated dims pass through."""
    from transformers import Qwen3_5ForCausalLM

    raw, config = _qwen3_5()
    length = 30
    t = torch.arange(length)
    positions = torch.stack([t, t // 2 + 3, t % 5 + 7])[:, None].expand(3, 2, length)     # [3, batch, seq]
    _, calls, outputs = run_captured(Qwen3_5ForCausalLM, config, length, {"q_norm": "", "k_norm": ""},
                                     position_ids=positions)
    rot = Rotary.from_config(raw)
    assert rot.config.rotary_dim == 16 and rot.config.params["mrope_interleaved"] is True
    assert rot.config.rope_type == "yarn" and rot.attention_scaling > 1
    plain = Rotary.from_config(_qwen3_5("default")[0])
    for i in range(config.num_hidden_layers):
        q_in, k_in = outputs[i, "q_norm"].transpose(1, 2), outputs[i, "k_norm"].transpose(1, 2)
        q, k = rot(q_in, k_in, positions)
        torch.testing.assert_close(q, calls[i]["query"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, calls[i]["key"], rtol=1e-5, atol=1e-5)
        assert torch.equal(q[..., 16:], calls[i]["query"][..., 16:])
        assert not torch.allclose(plain(q_in, k_in, positions)[0], calls[i]["query"], atol=1e-3)  # yarn acts
        assert not torch.allclose(rot(q_in, k_in, positions[0])[0], calls[i]["query"], atol=1e-3)  # rows act


@pytest.mark.parametrize("family", ["qwen3_5_text", "lfm2"])
def test_layers_without_qk_attention_do_not_count_as_rotating(family):
    """Qwen3.5's Gated DeltaNet layers ("linear_attention") and LFM2's short convolutions ("conv") have no q/k
    attention: the layers posenc's schedule says rotate are exactly those transformers builds an attention module
    (``self_attn``) for, and inspect says why the others do not."""
    import transformers

    from posenc.rope.describe import inspect_config
    from posenc.rope.layers import layer_schedule

    other = "linear_attention" if family == "qwen3_5_text" else "conv"
    kinds = [other, "full_attention", other, other, "full_attention"]
    if family == "qwen3_5_text":
        raw = dict(_qwen3_5("default")[0], num_hidden_layers=5, layer_types=kinds)
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**raw))
    else:
        raw = dict(TINY, model_type="lfm2", num_hidden_layers=5, layer_types=kinds, rope_parameters={
            "rope_type": "default", "rope_theta": 1e4})
        model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**{k: v for k, v in raw.items()
                                                                         if k != "model_type"}))
    rotating = [hasattr(layer, "self_attn") for layer in model.model.layers]
    assert rotating == [k == "full_attention" for k in kinds]
    schedule = layer_schedule(raw)
    assert schedule.nope_layers == [i for i, r in enumerate(rotating) if not r]
    assert inspect_config(raw)["layers"]["positionless_kinds"] == [other]
