"""load_rope_config: every Hugging Face config form, and the errors / warnings for bad ones."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.rope.config import RopeConfig, load_rope_config

FIXTURES = "tests/fixtures/configs"


def no_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


# ------------------------------------------------------------------------------------------------- forms

def test_transformers_4x_and_5x_forms_agree():
    v4 = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 5e5,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}
    v5 = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
          "rope_parameters": {**v4["rope_scaling"], "rope_theta": 5e5}}
    a, b = no_warnings(load_rope_config, v4), no_warnings(load_rope_config, v5)
    assert a == b
    assert (a.rope_type, a.theta, a.head_dim, a.rotary_dim, a.max_position_embeddings,
            a.original_max_position_embeddings) == ("llama3", 5e5, 128, 128, 131072, 8192)
    assert a.params == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert a.factor == 8.0


def test_legacy_type_key_and_su_alias():
    cfg = load_rope_config({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert cfg.rope_type == "linear" and cfg.params == {"factor": 2.0}
    su = load_rope_config({"head_dim": 8, "max_position_embeddings": 4096, "original_max_position_embeddings": 1024,
                           "rope_scaling": {"type": "su", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}})
    assert su.rope_type == "longrope"


def test_mrope_reads_as_default_frequencies():
    cfg = no_warnings(load_rope_config, {"hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1e6,
                                         "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})
    assert cfg.rope_type == "default" and cfg.params == {"mrope_section": [16, 24, 24]}


def test_rope_type_wins_over_type():
    cfg = load_rope_config({"head_dim": 64, "rope_scaling": {"type": "dynamic", "rope_type": "linear", "factor": 2}})
    assert cfg.rope_type == "linear"


def test_no_rope_keys_is_default_rope():
    cfg = load_rope_config({"hidden_size": 768, "num_attention_heads": 12})
    assert (cfg.rope_type, cfg.theta, cfg.head_dim, cfg.rotary_dim) == ("default", 10000.0, 64, 64)


def test_head_dim_wins_over_hidden_size_ratio():
    cfg = load_rope_config({"hidden_size": 2048, "num_attention_heads": 8, "head_dim": 128})  # Gemma-like
    assert cfg.head_dim == 128


@pytest.mark.parametrize("where", ["top", "inside"])
def test_partial_rotary_factor(where):
    raw = {"hidden_size": 2560, "num_attention_heads": 32, "rope_parameters": {"rope_type": "default"}}
    if where == "top":
        raw["partial_rotary_factor"] = 0.4
    else:
        raw["rope_parameters"]["partial_rotary_factor"] = 0.4
    cfg = load_rope_config(raw)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.partial_rotary_factor) == (80, 32, 0.4)


def test_gpt_neox_rotary_pct_and_base():
    cfg = load_rope_config({"hidden_size": 512, "num_attention_heads": 8, "rotary_pct": 0.25,
                            "rotary_emb_base": 10000})
    assert cfg.rotary_dim == 16 and cfg.theta == 10000.0


def test_phi3_fixture_top_level_original_length():
    cfg = no_warnings(load_rope_config, f"{FIXTURES}/phi-3.5-mini-instruct.json")
    assert cfg.rope_type == "longrope"
    assert (cfg.head_dim, cfg.max_position_embeddings, cfg.original_max_position_embeddings) == (96, 131072, 4096)
    assert len(cfg.params["short_factor"]) == 48


def test_top_level_original_length_wins_and_warns_on_conflict():
    raw = {"head_dim": 8, "max_position_embeddings": 4096, "original_max_position_embeddings": 1024,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                            "original_max_position_embeddings": 2048}}
    with pytest.warns(UserWarning, match="using the top-level 1024"):
        assert load_rope_config(raw).original_max_position_embeddings == 1024


def test_original_length_defaults_to_max_position_embeddings():
    """transformers' standardisation: yarn / llama3 / longrope without L0 use max_position_embeddings."""
    cfg = load_rope_config({"head_dim": 64, "max_position_embeddings": 32768,
                            "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert cfg.original_max_position_embeddings == 32768


def test_qwen_yarn_fixture():
    cfg = no_warnings(load_rope_config, f"{FIXTURES}/qwen2.5-7b-instruct-yarn.json")
    assert (cfg.rope_type, cfg.theta, cfg.head_dim, cfg.params["factor"]) == ("yarn", 1e6, 128, 4.0)


def test_per_layer_type_selection():
    raw = {"head_dim": 256, "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    full = load_rope_config(raw, layer_type="full_attention")
    sliding = load_rope_config(raw, "sliding_attention")
    assert (full.rope_type, full.theta, full.params) == ("linear", 1e6, {"factor": 8.0})
    assert (sliding.rope_type, sliding.theta) == ("default", 1e4)
    with pytest.raises(ConfigError, match=r"per-layer-type.*\['full_attention', 'sliding_attention'\].*layer_type"):
        load_rope_config(raw)
    with pytest.raises(ConfigError, match=r"layer_type 'global' not in .*available: \['full_attention'"):
        load_rope_config(raw, layer_type="global")


def test_per_layer_type_null_entry_is_nope():
    raw = {"head_dim": 64, "rope_parameters": {"full_attention": None, "sliding_attention": {"rope_type": "default"}}}
    with pytest.raises(ConfigError, match="'full_attention' has no RoPE"):
        load_rope_config(raw, layer_type="full_attention")


def test_gemma3_transformers_4x_form_local_base():
    raw = {"head_dim": 256, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "layer_types": ["sliding_attention", "full_attention"],
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert load_rope_config(raw, "full_attention").rope_type == "linear"
    sliding = load_rope_config(raw, "sliding_attention")
    assert (sliding.rope_type, sliding.theta) == ("default", 1e4)


def test_text_config_of_multimodal_config():
    raw = {"model_type": "gemma3", "text_config": {"head_dim": 128, "rope_theta": 5e5}}
    assert load_rope_config(raw).theta == 5e5


def test_ropeconfig_passthrough_and_direct_construction():
    cfg = RopeConfig(rope_type="yarn", head_dim=64, original_max_position_embeddings=256, params={"factor": 4.0})
    assert load_rope_config(cfg) is cfg and cfg.rotary_dim == 64
    assert dataclasses.replace(cfg, theta=5e5).theta == 5e5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.theta = 3.0


# ------------------------------------------------------------------------------------------------ errors

def test_missing_required_keys_named_with_type():
    with pytest.raises(ConfigError,
                       match=r"'llama3' is missing required keys \['high_freq_factor', 'low_freq_factor'\]"):
        load_rope_config({"head_dim": 64, "max_position_embeddings": 8192,
                          "rope_scaling": {"type": "llama3", "factor": 8.0}})
    with pytest.raises(ConfigError, match=r"'linear' is missing required keys \['factor'\]"):
        load_rope_config({"head_dim": 64, "rope_scaling": {"type": "linear"}})
    with pytest.raises(ConfigError, match=r"'dynamic' is missing required keys \['max_position_embeddings'\]"):
        load_rope_config({"head_dim": 64, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ConfigError, match=r"'yarn' is missing required keys \['original_max_position_embeddings'\]"):
        load_rope_config({"head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}})


def test_unknown_rope_type_lists_known():
    with pytest.raises(ConfigError, match=r"unknown rope_type 'ntk-by-parts'; known types: \[.*'dynamic'.*'yarn'"):
        load_rope_config({"head_dim": 64, "rope_scaling": {"type": "ntk-by-parts", "factor": 2.0}})


def test_odd_rotary_dim_is_an_error():
    with pytest.raises(ConfigError, match="rotary dim must be a positive even number"):
        load_rope_config({"hidden_size": 90, "num_attention_heads": 2})          # head_dim 45
    with pytest.raises(ConfigError, match=r"int\(64 \* 0.3\) = 19"):
        load_rope_config({"head_dim": 64, "partial_rotary_factor": 0.3})


@pytest.mark.parametrize("raw, match", [
    ({"num_attention_heads": 8}, r"head_dim, or hidden_size and num_attention_heads; missing \['hidden_size'\]"),
    ({"head_dim": 64, "rope_theta": -1.0}, "rope_theta must be a positive finite number"),
    ({"head_dim": 64, "rope_theta": "big"}, "rope_theta must be a number"),
    ({"head_dim": 64, "partial_rotary_factor": 1.5}, r"partial_rotary_factor must be a positive finite number <= 1"),
    ({"head_dim": 64, "max_position_embeddings": -5}, "max_position_embeddings must be a positive integer"),
    ({"head_dim": 64, "rope_scaling": [1, 2]}, "rope_parameters / rope_scaling must be a JSON object"),
])
def test_bad_values(raw, match):
    with pytest.raises(ConfigError, match=match):
        load_rope_config(raw)


def test_bad_config_argument_type():
    with pytest.raises(ConfigError, match="config must be a mapping in config.json form, a path"):
        load_rope_config(42)


def test_missing_file_names_path(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"config file not found: .*nope.json"):
        load_rope_config(path)
    with pytest.raises(ConfigError, match=r"config file not found: .*config.json"):
        load_rope_config(tmp_path)  # a folder without config.json


def test_bad_json_names_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"head_dim": 64,')
    with pytest.raises(ConfigError, match=r"config.json' is not valid JSON"):
        load_rope_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        load_rope_config(path)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        load_rope_config({"head_dim": 64, "rope_scaling": {"type": "nope"}})


# ---------------------------------------------------------------------------------------------- warnings

@pytest.mark.parametrize("scaling, extra, match", [
    ({"type": "linear", "factor": 0.5}, {}, r"factor should be >= 1, got 0.5"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 8.0}, {"max_position_embeddings": 8192},
     r"beta_fast \(1.0\) should be >= beta_slow \(8.0\)"),
    ({"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048}, {"max_position_embeddings": 8192},
     r"factor 8.0 differs from max_position_embeddings / original_max_position_embeddings = 8192 / 2048 = 4"),
    ({"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32,
      "original_max_position_embeddings": 1024}, {"max_position_embeddings": 4096},
     r"short_factor should be a list of rotary_dim // 2 = 32 numbers, got 3"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 1024}, {"max_position_embeddings": 8192},
     r"high_freq_factor \(1.0\) should be > low_freq_factor \(4.0\)"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, {"max_position_embeddings": 8192},
     r"original_max_position_embeddings \(8192\) should be < max_position_embeddings"),
    ({"type": "linear", "factor": 2.0, "beta_fast": 32}, {}, r"unrecognised keys \['beta_fast'\]"),
])
def test_suspicious_values_warn_with_reason(scaling, extra, match):
    with pytest.warns(UserWarning, match=match):
        load_rope_config({"head_dim": 64, **extra, "rope_scaling": scaling})


def test_consistent_yarn_does_not_warn():
    no_warnings(load_rope_config, {"head_dim": 64, "max_position_embeddings": 8192,
                                   "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 2048}})


def test_path_and_mapping_read_the_same(tmp_path):
    raw = json.load(open(f"{FIXTURES}/llama-3.1-8b.json"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_rope_config(raw) == load_rope_config(tmp_path / "config.json") == load_rope_config(tmp_path)


# ----------------------------------------------------------------------------- rope_type of the wrong kind

@pytest.mark.parametrize("key", ["rope_type", "type"])
@pytest.mark.parametrize("value", [["yarn"], {"name": "yarn"}, 3])
def test_non_string_rope_type_is_a_named_config_error(key, value):
    with pytest.raises(ConfigError, match=rf"^{key} must be a string naming a rope type"):
        load_rope_config({"head_dim": 64, "rope_scaling": {key: value, "factor": 2.0}})


def test_null_rope_type_falls_back_to_type_then_default():
    assert load_rope_config({"head_dim": 64, "rope_scaling": {"rope_type": None, "type": "linear",
                                                              "factor": 2.0}}).rope_type == "linear"
    assert load_rope_config({"head_dim": 64, "rope_scaling": {"rope_type": None}}).rope_type == "default"


# ---------------------------------------------------------------------------------- GPT-J / CodeGen keys

GPTJ = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_positions": 2048, "rotary_dim": 64}


def test_gptj_keys_match_transformers():
    from transformers import GPTJConfig
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    from posenc.rope.scaling import rope_parameters

    cfg = no_warnings(load_rope_config, GPTJ)
    hf = GPTJConfig(**GPTJ)
    assert cfg.head_dim == hf.hidden_size // hf.num_attention_heads == 256
    assert cfg.rotary_dim == hf.rotary_dim == 64 and cfg.partial_rotary_factor == 0.25
    assert cfg.max_position_embeddings == hf.max_position_embeddings == 2048
    assert (cfg.rope_type, cfg.theta) == ("default", 10000.0)
    # transformers' GPT-J table: [sin | cos] of position * inv_freq over the first rotary_dim dims
    inv, _ = rope_parameters(GPTJ)
    table = create_sinusoidal_positions(2048, hf.rotary_dim)
    angles = torch.arange(2048, dtype=torch.float32)[:, None] * inv
    torch.testing.assert_close(torch.sin(angles), table[:, :32], rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cos(angles), table[:, 32:], rtol=0, atol=1e-6)


def test_usual_key_wins_over_gptj_alias_as_in_transformers():
    from transformers import GPTJConfig

    raw = {**GPTJ, "max_position_embeddings": 4096}
    assert load_rope_config(raw).max_position_embeddings == GPTJConfig(**raw).max_position_embeddings == 4096


def test_codegen_style_rotary_dim_without_head_keys_uses_hidden_ratio():
    cfg = load_rope_config({"n_embd": 1024, "n_head": 16, "rotary_dim": 32, "n_positions": 2048})
    assert (cfg.head_dim, cfg.rotary_dim, cfg.partial_rotary_factor) == (64, 32, 0.5)


def test_rotary_dim_wins_over_partial_rotary_factor_and_warns():
    raw = {"hidden_size": 4096, "num_attention_heads": 16, "partial_rotary_factor": 0.5, "rotary_dim": 64}
    with pytest.warns(UserWarning, match=r"rotary_dim 64 disagrees with partial_rotary_factor 0.5 x head_dim 256 "
                                         r"= 128; using rotary_dim"):
        assert load_rope_config(raw).rotary_dim == 64
    no_warnings(load_rope_config, {**raw, "partial_rotary_factor": 0.25})   # consistent: silent


@pytest.mark.parametrize("key", ["rotary_dim", "qk_rope_head_dim"])
@pytest.mark.parametrize("value, match", [
    ("64", "must be a positive integer"), (0, "must be a positive integer"), (64.0, "must be a positive integer"),
    (True, "must be a positive integer"), (63, "positive even number"),
])
def test_bad_rotary_dims(key, value, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_rope_config({"hidden_size": 4096, "num_attention_heads": 16, key: value})
    if "an integer" in match:
        assert key in str(info.value)


def test_rotary_dim_larger_than_head_dim():
    with pytest.raises(ConfigError, match=r"rotary_dim must be <= head_dim=256, got 512"):
        load_rope_config({**GPTJ, "rotary_dim": 512})


def test_bad_alias_values_are_named():
    with pytest.raises(ConfigError, match="hidden_size must be a positive integer"):
        load_rope_config({"n_embd": "4096", "n_head": 16})
    with pytest.raises(ConfigError, match="max_position_embeddings must be a positive integer"):
        load_rope_config({**GPTJ, "n_positions": -1})


# ------------------------------------------------------------------------------------- DeepSeek MLA keys

def _deepseek_raw():
    return {k: v for k, v in json.load(open(f"{FIXTURES}/deepseek-v3.json")).items() if not k.startswith("_")}


def test_deepseek_v3_rotary_head_is_qk_rope_head_dim_as_in_transformers():
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from posenc.rope.scaling import rope_parameters

    raw = _deepseek_raw()
    cfg = no_warnings(load_rope_config, raw)
    hf = DeepseekV3Config(**raw)
    assert cfg.head_dim == hf.head_dim == 64 and cfg.rotary_dim == 64          # not hidden / heads = 56
    assert (cfg.rope_type, cfg.factor, cfg.original_max_position_embeddings) == ("yarn", 40, 4096)
    for seq_len in (None, 4096, 163840):
        inv, att = rope_parameters(raw, seq_len)
        inv_hf, att_hf = ROPE_INIT_FUNCTIONS["yarn"](hf, None, seq_len)
        torch.testing.assert_close(inv, inv_hf.float(), rtol=2e-6, atol=0)
        assert att == pytest.approx(att_hf, rel=1e-12)


def test_qk_rope_head_dim_wins_over_a_disagreeing_head_dim_with_a_warning():
    # (transformers would take the file's head_dim here and build 96 frequencies for a 64-dim RoPE part)
    raw = {**_deepseek_raw(), "head_dim": 192}
    with pytest.warns(UserWarning, match=r"qk_rope_head_dim 64 disagrees with partial_rotary_factor 1 x head_dim "
                                         r"192 = 192; using qk_rope_head_dim"):
        cfg = load_rope_config(raw)
    assert (cfg.head_dim, cfg.rotary_dim) == (64, 64)
    no_warnings(load_rope_config, {**raw, "head_dim": 64})     # transformers 5 saves head_dim = qk_rope_head_dim


def test_mistral4_style_partial_factor_agrees_with_qk_rope_head_dim():
    # Mistral 4 keeps head_dim = nope + rope and partial_rotary_factor = rope / head_dim: same rotary dim, silent
    raw = {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 64, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}
    assert no_warnings(load_rope_config, raw).rotary_dim == 64
    raw["rope_parameters"]["partial_rotary_factor"] = 0.25
    with pytest.warns(UserWarning, match="qk_rope_head_dim 64 disagrees"):
        assert load_rope_config(raw).rotary_dim == 64


# ----------------------------------------------------------------------------- sections and layer types

def test_rope_section_and_layer_types():
    from posenc.rope.config import rope_layer_types, rope_section

    text = {"head_dim": 256, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                 "sliding_attention": {"rope_type": "default"}, "nope": None}}
    outer = {"model_type": "gemma3", "text_config": text}
    # the text part, read with its family's rules (transformers builds Gemma3TextConfig from it)
    assert rope_section(outer) == {**text, "model_type": "gemma3_text"} and rope_section(text) is text
    assert rope_layer_types(outer) == ["full_attention", "sliding_attention"]
    assert rope_layer_types({"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}) is None
    assert rope_layer_types({"head_dim": 64}) is None
    for layer_type in rope_layer_types(outer):
        assert load_rope_config(outer, layer_type).head_dim == 256


def test_junk_layer_types_list_is_not_a_type_error():
    cfg = load_rope_config({"head_dim": 64, "layer_types": 5}, layer_type="full_attention")
    assert cfg.rope_type == "default"
    with pytest.raises(ConfigError, match="not among the config's layer_types"):
        load_rope_config({"head_dim": 64, "layer_types": [["x"], "a"]}, layer_type="b")
