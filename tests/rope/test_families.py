"""Family rules read as transformers' config classes and rotary / attention modules read them: Hunyuan alpha,
ModernBERT and Gemma 3 local / global bases, per-layer schedules (NoPE layers, layer types, temperature tuning),
DeepSeek's softmax multiplier, rotation layouts, and posenc's tables of family defaults."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the oracle here")
transformers.logging.set_verbosity_error()

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from posenc import Rotary, rope_parameters  # noqa: E402
from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.rope import config as rope_config  # noqa: E402
from posenc.rope.config import load_rope_config, rope_layer_types  # noqa: E402
from posenc.rope.layers import (LAYER_PATTERNS, TemperatureTuning, layer_schedule, rope_layout,  # noqa: E402
                                softmax_scale_multiplier)

FIXTURES = "tests/fixtures/configs"


def fixture(name):
    return {k: v for k, v in json.load(open(f"{FIXTURES}/{name}.json")).items() if not k.startswith("_")}


# ------------------------------------------------------------------------------------- tables of defaults

def _hf_text_rope(model_type: str, **kwargs) -> dict:
    """rope_parameters of transformers' config class for model_type (its text config for multimodal parents)."""
    config = CONFIG_MAPPING[model_type](**kwargs)
    config = getattr(config, "text_config", None) or config
    return config.rope_parameters


@pytest.mark.parametrize("model_type", sorted(rope_config.DEFAULT_THETA_BY_MODEL_TYPE))
def test_default_theta_table_matches_transformers(model_type):
    want = rope_config.DEFAULT_THETA_BY_MODEL_TYPE[model_type]
    params = _hf_text_rope(model_type)
    if isinstance(want, tuple):
        assert (params["full_attention"]["rope_theta"], params["sliding_attention"]["rope_theta"]) == want
    else:
        assert params["rope_theta"] == want
    # and posenc uses it when a config names the family but gives no base
    raw = {"model_type": model_type, "head_dim": 64}
    if isinstance(want, tuple):
        assert load_rope_config(raw, "sliding_attention").theta == want[1]
        want = want[0]
    assert load_rope_config(raw, "full_attention" if rope_layer_types(raw) else None).theta == want


@pytest.mark.parametrize("model_type", sorted(rope_config.DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE))
def test_default_partial_rotary_table_matches_transformers(model_type):
    params = _hf_text_rope(model_type)
    want = rope_config.DEFAULT_PARTIAL_ROTARY_BY_MODEL_TYPE[model_type]
    assert params.get("partial_rotary_factor") == want
    assert load_rope_config({"model_type": model_type, "head_dim": 128}).rotary_dim == int(128 * want)


@pytest.mark.parametrize("model_type", sorted(rope_config.LOCAL_GLOBAL_THETA))
def test_local_global_families_match_transformers(model_type):
    """The 4.x flat keys (and rope_scaling) go to the layer types transformers' config class puts them in."""
    global_key, local_key, scale_local = rope_config.LOCAL_GLOBAL_THETA[model_type]
    flat = {global_key: 123456.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    if local_key is not None:
        flat[local_key] = 2345.0
    params = _hf_text_rope(model_type, **flat)
    raw = {"model_type": model_type, "head_dim": 64, **flat}
    assert rope_layer_types(raw) == ["full_attention", "sliding_attention"]
    for layer_type in ("full_attention", "sliding_attention"):
        rc = load_rope_config(raw, layer_type)
        want = params[layer_type]
        assert rc.theta == want["rope_theta"] and rc.rope_type == want["rope_type"]
        assert rc.params.get("factor") == want.get("factor")
    assert (params["sliding_attention"]["rope_type"] == "linear") == scale_local


def test_local_global_family_found_by_keys_without_model_type():
    cfg = load_rope_config({"head_dim": 64, "global_rope_theta": 160000.0, "local_rope_theta": 1e4},
                           "sliding_attention")
    assert cfg.theta == 1e4
    gemma = {"head_dim": 64, "rope_theta": 1e6, "rope_local_base_freq": 1e4}
    assert load_rope_config(gemma).theta == 1e6                      # no layer_type: the global parameters


# ------------------------------------------------------------------------------------ rotary frequencies

def test_hunyuan_alpha_matches_transformers_rotary():
    from transformers import HunYuanDenseV1Config
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    raw = fixture("hunyuan-7b-instruct")
    rc = load_rope_config(raw)
    assert rc.rope_type == "ntk_alpha"
    emb = HunYuanDenseV1RotaryEmbedding(HunYuanDenseV1Config(**raw))
    inv, scaling = rope_parameters(raw)
    torch.testing.assert_close(inv, emb.inv_freq, rtol=2e-6, atol=0)
    assert scaling == emb.attention_scaling == 1.0
    # the formula: theta * alpha^(d/(d-2)) divides the lowest frequency by exactly alpha; read as transformers'
    # plain dynamic NTK (what posenc did before) it would be 1000x too high there
    wrong, _ = rope_parameters({**raw, "rope_scaling": {"type": "dynamic", "factor": 1.0}}, seq_len=4096)
    assert float(wrong[-1] / inv[-1]) == pytest.approx(1000.0, rel=1e-4)
    rot = Rotary.from_config(raw)
    assert rot.seq_len_rule is None and rot.softmax_scale_multiplier == 1.0   # static; Hunyuan ignores mscale


@pytest.mark.parametrize("name,module,cls", [
    ("modernbert-base", "modernbert", "ModernBertRotaryEmbedding"),
    ("gemma-3-1b-it", "gemma3", "Gemma3RotaryEmbedding"),
    ("gemma-3-4b-it", "gemma3", "Gemma3RotaryEmbedding"),
])
def test_local_global_published_configs_match_transformers_rotary(name, module, cls):
    import importlib

    raw = fixture(name)
    text = raw.get("text_config", raw)
    config = CONFIG_MAPPING[text["model_type"]](**{k: v for k, v in text.items() if k != "model_type"})
    emb = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls)(config)
    assert sorted(rope_layer_types(raw)) == sorted(emb.layer_types)
    for layer_type in emb.layer_types:
        inv, scaling = rope_parameters(raw, layer_type=layer_type)
        torch.testing.assert_close(inv, getattr(emb, f"{layer_type}_inv_freq"), rtol=2e-6, atol=0)
        assert scaling == getattr(emb, f"{layer_type}_attention_scaling")
    if name == "gemma-3-4b-it":   # linear x8 on global layers only
        assert load_rope_config(raw, "full_attention").params == {"factor": 8.0}
        assert load_rope_config(raw, "sliding_attention").rope_type == "default"


# ----------------------------------------------------------------------------------- per-layer schedules

@pytest.mark.parametrize("overrides", [
    {}, {"no_rope_layer_interval": 2}, {"no_rope_layers": [1, 0, 1, 1, 0, 1]}, {"attention_chunk_size": None},
    {"no_rope_layers": [0, 1, 1, 1, 1, 1], "attn_temperature_tuning": False},
])
def test_llama4_schedule_matches_transformers(overrides):
    from transformers import Llama4TextConfig

    raw = {"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "num_hidden_layers": 6, "attention_chunk_size": 16, "floor_scale": 8, "attn_scale": 0.2, **overrides}
    hf = Llama4TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    schedule = layer_schedule(raw)
    assert list(schedule.rope) == [bool(x) for x in hf.no_rope_layers]
    assert list(schedule.layer_types) == hf.layer_types
    assert schedule.attention_chunk_size == (16 if "chunked_attention" in hf.layer_types else None)
    if hf.attn_temperature_tuning and not all(schedule.rope):
        assert schedule.temperature_tuning == TemperatureTuning(floor_scale=8.0, attn_scale=0.2)
    else:
        assert schedule.temperature_tuning is None
    assert schedule.layout == "interleaved"


@pytest.mark.parametrize("overrides", [{}, {"no_rope_layers": [1, 1, 0, 0]},
                                       {"use_sliding_window": True, "sliding_window": 8}])
def test_smollm3_schedule_matches_transformers(overrides):
    from transformers import SmolLM3Config

    raw = {"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
           **overrides}
    hf = SmolLM3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    schedule = layer_schedule(raw)
    assert list(schedule.rope) == [bool(x) for x in hf.no_rope_layers]
    assert list(schedule.layer_types) == hf.layer_types
    assert schedule.temperature_tuning is None


@pytest.mark.parametrize("model_type", sorted(LAYER_PATTERNS))
@pytest.mark.parametrize("n", [1, 7, 13])
def test_layer_patterns_match_transformers(model_type, n):
    key, _ = LAYER_PATTERNS[model_type]
    kwargs = {"num_hidden_layers": n}
    if key is not None:
        kwargs[key] = 3
    hf = CONFIG_MAPPING[model_type](**kwargs)
    assert list(layer_schedule({"model_type": model_type, "head_dim": 64, **kwargs}).layer_types) == hf.layer_types


@pytest.mark.parametrize("model_type, drop", [
    ("llama4_text", "attention_chunk_size"), ("gemma3_text", "sliding_window"), ("gemma2", "sliding_window"),
    ("cohere2", "sliding_window"), ("mistral", "sliding_window"), ("qwen2", "use_sliding_window"),
    ("qwen3", "use_sliding_window")])
def test_an_absent_key_takes_the_transformers_config_class_default(model_type, drop):
    """A config.json without attention_chunk_size / sliding_window / use_sliding_window reads as transformers'
    config class fills it in (Llama 4 chunks its RoPE layers at 8192, Gemma's window is 4096, Qwen's is off),
    while an explicit null stays null."""
    raw = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "num_hidden_layers": 8, "attention_chunk_size": 16, "sliding_window": 32, "use_sliding_window": True}
    raw = {k: v for k, v in raw.items() if k != drop}
    hf = CONFIG_MAPPING[model_type](**{k: v for k, v in raw.items() if k != "model_type"})
    schedule = layer_schedule(raw)
    if drop == "attention_chunk_size":
        assert list(schedule.layer_types) == hf.layer_types and schedule.attention_chunk_size == 8192
    else:
        window = hf.sliding_window if getattr(hf, "use_sliding_window", True) else None
        assert schedule.sliding_window == window
    assert drop not in raw
    if drop != "use_sliding_window":
        assert getattr(layer_schedule({**raw, drop: None}), drop) is None


def test_published_schedules():
    scout = layer_schedule(fixture("llama-4-scout"))
    assert scout.nope_layers == list(range(3, 48, 4)) and scout.attention_chunk_size == 8192
    assert scout.temperature_tuning == TemperatureTuning(8192.0, 0.1)
    smol = layer_schedule(fixture("smollm3-3b"))
    assert smol.nope_layers == list(range(3, 36, 4)) and smol.temperature_tuning is None
    gemma = layer_schedule(fixture("gemma-3-4b-it"))
    assert gemma.layer_types.count("full_attention") == 5 and gemma.sliding_window == 1024
    assert gemma.rope_layer_types == gemma.layer_types and gemma.nope_layers == []
    qwen = layer_schedule(fixture("qwen2.5-vl-7b-instruct"))
    assert qwen.sliding_window is None                              # use_sliding_window false


def test_nope_layer_types_from_null_rope_entries():
    raw = {"head_dim": 16, "num_hidden_layers": 4, "layer_types": ["full_attention", "nope", "full_attention", "nope"],
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}, "nope": None}}
    schedule = layer_schedule(raw)
    assert schedule.nope_layers == [1, 3] and schedule.rope_layer_types == ("full_attention", None) * 2


def test_temperature_tuning_closed_form():
    tuning = TemperatureTuning(floor_scale=8192.0, attn_scale=0.1)
    scale = tuning.query_scale(torch.tensor([0, 8190, 8191, 16383, 10**6]))
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(1 + (10**6 + 1) // 8192)]
    torch.testing.assert_close(scale, torch.tensor(want), rtol=1e-6, atol=0)
    with pytest.raises(ConfigError, match="integers"):
        tuning.query_scale(torch.tensor([1.5]))


@pytest.mark.parametrize("bad, match", [
    ({"no_rope_layers": [1, 1]}, "no_rope_layers must list 0 / 1"),
    ({"no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers must list 0 / 1"),
    ({"attention_chunk_size": 0}, "attention_chunk_size must be a positive integer"),
    ({"floor_scale": -1}, "floor_scale must be a positive"),
    ({"layer_types": ["full_attention"]}, "layer_types must list one attention kind"),
])
def test_bad_schedule_keys(bad, match):
    raw = {"model_type": "llama4_text", "head_dim": 16, "num_hidden_layers": 4, **bad}
    with pytest.raises(ConfigError, match=match):
        layer_schedule(raw)


# ------------------------------------------------------------------------------ softmax scale and layout

@pytest.mark.parametrize("name,module,attention", [
    ("deepseek-v3", "deepseek_v3", "DeepseekV3Attention"),
    ("deepseek-v2-lite", "deepseek_v2", "DeepseekV2Attention"),
])
def test_deepseek_softmax_multiplier_matches_transformers_attention(name, module, attention):
    import importlib

    raw = fixture(name)
    small = {**raw, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16,
             "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
    config = CONFIG_MAPPING[raw["model_type"]](**{k: v for k, v in small.items() if k != "model_type"})
    attn = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), attention)(config, 0)
    multiplier = softmax_scale_multiplier(raw)
    assert attn.scaling == pytest.approx(16 ** -0.5 * multiplier, rel=1e-12)
    assert layer_schedule(raw).softmax_scale(16) == pytest.approx(attn.scaling, rel=1e-12)
    assert Rotary.from_config(raw).softmax_scale(16) == pytest.approx(attn.scaling, rel=1e-12)
    s, m = raw["rope_scaling"]["factor"], raw["rope_scaling"]["mscale_all_dim"]
    assert multiplier == pytest.approx((0.1 * m * math.log(s) + 1) ** 2)
    if name == "deepseek-v3":
        assert multiplier == pytest.approx(1.874, abs=5e-4)             # the number at factor 40


def test_softmax_multiplier_is_one_without_the_rule():
    base = fixture("deepseek-v3")
    assert softmax_scale_multiplier({**base, "rope_scaling": None}) == 1.0
    no_dim = {**base, "rope_scaling": {k: v for k, v in base["rope_scaling"].items() if k != "mscale_all_dim"}}
    assert softmax_scale_multiplier(no_dim) == 1.0
    assert softmax_scale_multiplier(fixture("llama-3.1-8b")) == 1.0
    assert softmax_scale_multiplier(fixture("hunyuan-7b-instruct")) == 1.0


@pytest.mark.parametrize("name,layout", [
    ("llama-4-scout", "interleaved"), ("gpt-j-6b", "interleaved"), ("command-r-v01", "interleaved"),
    ("glm-4-9b-chat-hf", "interleaved"), ("deepseek-v3", "interleaved"), ("kimi-k2-instruct", "interleaved"),
    ("llama-3.1-8b", "half"), ("qwen2.5-vl-7b-instruct", "half"), ("gemma-3-4b-it", "half"),
])
def test_rope_layout_of_published_configs(name, layout):
    raw = fixture(name)
    assert rope_layout(raw) == layout
    layer_type = "full_attention" if rope_layer_types(raw) else None
    assert Rotary.from_config(raw, layer_type).layout == layout
    assert rope_layout({**raw, "rope_interleave": False}) == ("half" if name == "deepseek-v3" else layout)


def test_rotary_from_ropeconfig_keeps_half_layout():
    assert Rotary.from_config(load_rope_config(fixture("llama-4-scout"))).layout == "half"
    assert Rotary.from_config(fixture("llama-4-scout"), layout="half").layout == "half"
