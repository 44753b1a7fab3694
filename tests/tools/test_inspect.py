"""posenc inspect on hand-written published configs; numbers checked against closed forms and published counts."""

import json
import math
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc.cli import main
from posenc._internal.errors import ConfigError
from posenc.tools.inspect import detect_scheme, format_report, inspect_config

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"


def load(name):
    return json.loads((CONFIGS / name).read_text())


def test_llama31_published_band_counts():
    report = inspect_config(CONFIGS / "llama-3.1-8b.json")
    assert report["scheme"] == "rope" and report["warnings"] == []
    (e,) = report["rope"]
    assert (e["rope_type"], e["rope_theta"], e["head_dim"], e["rotary_dim"]) == ("llama3", 500000.0, 128, 128)
    assert e["bands"] == {"kept": 29, "blended": 6, "interpolated": 29, "removed": 0}  # Llama 3.1 (published config)
    # the same counts from Llama 3's wavelength thresholds L0/high = 2048 and L0/low = 8192, computed here
    wl = [2 * math.pi * 500000.0 ** (2 * j / 128) for j in range(64)]
    assert sum(w < 2048 for w in wl) == 29 and sum(w > 8192 for w in wl) == 29
    assert (e["original_context"], e["claimed_context"], e["attention_scaling"]) == (8192, 131072, 1.0)
    assert e["longest_wavelength_unscaled"] == pytest.approx(wl[-1], rel=1e-6)
    assert e["longest_wavelength"] == pytest.approx(8 * wl[-1], rel=1e-6)   # lowest pair divided by s = 8


def test_qwen25_yarn_bands_and_temperature():
    report = inspect_config(CONFIGS / "qwen2.5-7b-instruct-yarn.json")
    (e,) = report["rope"]
    d, theta, l0, s = 128, 1e6, 32768, 4.0
    # YaRN's ramp bounds from the paper's formula, computed here: c(r) = d ln(L0 / (2 pi r)) / (2 ln theta)
    low = math.floor(d * math.log(l0 / (2 * math.pi * 32)) / (2 * math.log(theta)))
    high = math.ceil(d * math.log(l0 / (2 * math.pi * 1)) / (2 * math.log(theta)))
    assert e["bands"]["kept"] == low + 1 and e["bands"]["interpolated"] == d // 2 - high
    assert (e["bands"]["kept"], e["bands"]["blended"], e["bands"]["interpolated"]) == (24, 16, 24)
    assert e["attention_scaling"] == pytest.approx(0.1 * math.log(s) + 1)
    assert e["claimed_context"] == 131072 and e["original_context"] == 32768
    # Qwen's documented block keeps max_position_embeddings at 32768: flagged
    assert any("equals the original context" in w for w in report["warnings"])


def test_phi35_longrope():
    cfg = load("phi-3.5-mini-instruct.json")
    (e,) = inspect_config(cfg)["rope"]
    assert (e["rope_type"], e["head_dim"], e["rotary_dim"], e["pairs"]) == ("longrope", 96, 96, 48)
    assert e["attention_scaling"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert (e["original_context"], e["claimed_context"]) == (4096, 131072)
    longest = 2 * math.pi * 10000.0 ** (94 / 96) * cfg["rope_scaling"]["long_factor"][-1]
    assert e["longest_wavelength"] == pytest.approx(longest, rel=1e-5)
    short = inspect_config(cfg, seq_len=4096)["rope"][0]     # at L0 the short factors apply
    long_last, short_last = cfg["rope_scaling"]["long_factor"][-1], cfg["rope_scaling"]["short_factor"][-1]
    assert short["longest_wavelength"] == pytest.approx(longest / long_last * short_last, rel=1e-5)


def test_deepseek_v3_yarn_with_mscale_matches_transformers():
    report = inspect_config(CONFIGS / "deepseek-v3.json")
    assert report["warnings"] == []
    (e,) = report["rope"]
    assert (e["head_dim"], e["rotary_dim"]) == (64, 64)          # qk_rope_head_dim, not hidden / heads = 56
    # mscale == mscale_all_dim: the temperatures cancel (DeepSeek scales the softmax itself)
    assert e["attention_scaling"] == 1.0
    low = math.floor(64 * math.log(4096 / (2 * math.pi * 32)) / (2 * math.log(1e4)))
    high = math.ceil(64 * math.log(4096 / (2 * math.pi)) / (2 * math.log(1e4)))
    assert (e["bands"]["kept"], e["bands"]["interpolated"]) == (low + 1, 32 - high) == (11, 9)
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = {k: v for k, v in load("deepseek-v3.json").items() if not k.startswith("_")}
    inv_hf, att_hf = ROPE_INIT_FUNCTIONS["yarn"](DeepseekV3Config(**cfg), None, 163840)
    assert att_hf == pytest.approx(e["attention_scaling"])
    assert e["longest_wavelength"] == pytest.approx(2 * math.pi / float(inv_hf.min()), rel=1e-6)


def test_qwen25_plain():
    report = inspect_config(CONFIGS / "qwen2.5-7b-instruct.json")
    (e,) = report["rope"]
    assert e["rope_type"] == "default" and e["bands"]["kept"] == 64 and e["attention_scaling"] == 1.0
    assert e["claimed_context"] == 32768 and report["warnings"] == []
    assert e["longest_wavelength"] == pytest.approx(2 * math.pi * 1e6 ** (126 / 128), rel=1e-6)


def test_gpt2_learned():
    report = inspect_config(CONFIGS / "gpt2.json")
    assert report["scheme"] == "learned" and report["learned"]["table_size"] == 1024
    assert "1024" in format_report(report)


@pytest.mark.parametrize("name,heads", [("bloom-560m.json", 16), ("mpt-7b.json", 32)])
def test_alibi_models(name, heads):
    report = inspect_config(CONFIGS / name)
    assert report["scheme"] == "alibi" and report["alibi"]["n_heads"] == heads
    assert report["alibi"]["slopes"] == pytest.approx(reference.alibi_slopes(heads))   # the lesson's loop


@pytest.mark.parametrize("cfg,scheme", [
    ({"model_type": "falcon", "alibi": True, "hidden_size": 64, "num_attention_heads": 4}, "alibi"),
    ({"model_type": "falcon", "alibi": False, "hidden_size": 64, "num_attention_heads": 4}, "rope"),
    ({"model_type": "baichuan", "hidden_size": 5120, "num_attention_heads": 40}, "alibi"),
    ({"model_type": "baichuan", "hidden_size": 4096, "num_attention_heads": 32}, "rope"),
    ({"model_type": "opt", "max_position_embeddings": 2048}, "learned"),
    ({"model_type": "bert", "position_embedding_type": "absolute", "max_position_embeddings": 512}, "learned"),
    ({"model_type": "t5", "relative_attention_num_buckets": 32}, "relative_bias"),
    ({"model_type": "marian", "max_position_embeddings": 512}, "sinusoidal"),
    ({"model_type": "mystery"}, "unknown"),
    # posenc export's NoPE model: GPT-NeoX rotating zero dims (5.x rope dict, 4.x top-level keys)
    ({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.0}}, "nope"),
    ({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0}, "nope"),
    ({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0.25}, "rope"),
])
def test_detect_scheme(cfg, scheme):
    assert detect_scheme(cfg)[0] == scheme
    assert inspect_config(cfg)["scheme"] == scheme


def test_gptj_style_keys_and_partial_rotary():
    report = inspect_config({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64,
                             "n_positions": 2048})
    (e,) = report["rope"]
    assert (e["head_dim"], e["rotary_dim"], e["claimed_context"]) == (256, 64, 2048)


@pytest.mark.parametrize("cfg,needle", [
    ({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 65536,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}},
     "does not match"),
    ({"hidden_size": 960, "num_attention_heads": 10, "partial_rotary_factor": 0.3, "max_position_embeddings": 2048,
      "rope_theta": 1e4}, "not an integer"),
    ({"hidden_size": 4096, "num_attention_heads": 16, "partial_rotary_factor": 0.5, "rotary_dim": 64,
      "max_position_embeddings": 2048}, "disagrees"),
    ({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 100.0, "max_position_embeddings": 4096},
     "wraps around"),
    ({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 1e4, "max_position_embeddings": 4096,
      "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "inside rope_parameters"),
])
def test_inconsistent_settings_warn(cfg, needle):
    assert any(needle in w for w in inspect_config(cfg)["warnings"]), inspect_config(cfg)["warnings"]


def test_per_layer_type_config():
    cfg = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 2560, "num_attention_heads": 8,
           "max_position_embeddings": 131072, "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    entries = {e["layer_type"]: e for e in inspect_config(cfg)["rope"]}
    assert entries["full_attention"]["bands"]["interpolated"] == 128
    assert entries["sliding_attention"]["bands"]["kept"] == 128


def test_cli_text_and_json(capsys):
    assert main(["inspect", str(CONFIGS / "llama-3.1-8b.json")]) == 0
    assert "29 kept / 6 blended / 29 interpolated" in capsys.readouterr().out
    assert main(["inspect", str(CONFIGS / "phi-3.5-mini-instruct.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rope"][0]["rope_type"] == "longrope"


@pytest.mark.parametrize("content,needle", [
    (None, "not found"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {"rope_type": "warp", "factor": 2}}',
     "unknown rope_type"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {"rope_type": "yarn"}}', "missing"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {"rope_type": ["yarn"]}}', "must be a string"),
])
def test_bad_input_is_one_line_error(tmp_path, capsys, content, needle):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("posenc inspect: error:") and needle in err[0]


def test_python_api_errors():
    with pytest.raises(ConfigError, match="seq_len"):
        inspect_config(CONFIGS / "gpt2.json", seq_len=0)


# Arbitrary JSON built from the keys these tools read: the only failures allowed are the one-line kinds cli.main
# reports (ValueError / KeyError), never a TypeError traceback.
_KEYS = ["hidden_size", "num_attention_heads", "head_dim", "rope_theta", "max_position_embeddings",
         "original_max_position_embeddings", "partial_rotary_factor", "rotary_dim", "model_type", "n_head", "n_embd",
         "n_positions", "attn_config", "alibi", "rope_scaling", "rope_parameters", "qk_rope_head_dim", "rope_type",
         "type", "factor", "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "mscale",
         "mscale_all_dim", "beta_fast", "attention_factor"]
_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2, 200000), st.floats(allow_nan=True),
                    st.sampled_from(["llama", "yarn", "linear", "llama3", "longrope", "dynamic", "bloom", "gpt2"]))
_JSON = st.recursive(_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.sampled_from(_KEYS), inner, max_size=6)),
                     max_leaves=12)


def _yarn_cfg(factor):
    return {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 16384,
            "rope_scaling": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096}}


_BAD_FACTORS = ["x", [4.0], {"a": 1}, True]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=8))
@example(cfg=_yarn_cfg("x"))
@example(cfg=_yarn_cfg([4.0]))
@example(cfg={"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 4096,
              "rope_scaling": {"rope_type": "linear", "factor": "x"}})
@example(cfg={"model_type": "gpt2", "n_positions": [1]})     # the text form once crashed formatting it
def test_malformed_configs_fail_cleanly(cfg):
    import warnings

    from posenc.tools.extend import extend_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in (lambda: format_report(inspect_config(cfg)), lambda: extend_config(cfg, 1 << 22, "yarn")):
            try:
                call()
            except (ValueError, KeyError):
                pass


@pytest.mark.parametrize("factor", _BAD_FACTORS)
@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], ["plot", "rope", "--config"],
                                     ["plot", "scaling", "--config"]])
def test_non_numeric_factor_is_one_line_error(tmp_path, capsys, command, factor):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_yarn_cfg(factor)))
    args = [*command, str(path)] + (["--out", str(tmp_path / "p.png")] if command[0] == "plot" else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the loader warns that the factor disagrees with the lengths
        assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "factor" in err[0], err
    assert not (tmp_path / "p.png").exists()


# Gemma 4 style proportional RoPE: transformers returns head_dim // 2 frequencies, zeros past the rotated pairs
_GEMMA4 = {"model_type": "gemma4_text", "head_dim": 256, "hidden_size": 2560, "num_attention_heads": 8,
           "max_position_embeddings": 131072,
           "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6,
                               "factor": 2.0}}


def test_proportional_partial_rotary(capsys, tmp_path):
    (e,) = inspect_config(_GEMMA4)["rope"]
    assert (e["head_dim"], e["rotary_dim"], e["pairs"]) == (256, 64, 32)
    n, theta, s = 32, 1e6, 2.0       # closed form: pair j < n has theta^(-2j/head_dim) / s, the rest 0
    unscaled = 2 * math.pi * theta ** (2 * (n - 1) / 256)
    assert e["longest_wavelength_unscaled"] == pytest.approx(unscaled, rel=1e-6)
    assert e["longest_wavelength"] == pytest.approx(s * unscaled, rel=1e-6)
    assert e["shortest_wavelength"] == pytest.approx(2 * math.pi * s, rel=1e-6)
    assert e["mean_interpolation"] == pytest.approx(s, rel=1e-6)
    assert all(math.isfinite(v) for k, v in e.items() if "wavelength" in k or k == "mean_interpolation")
    # the same rotated frequencies as transformers' proportional init
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PretrainedConfig(head_dim=256, hidden_size=2560, num_attention_heads=8, max_position_embeddings=131072,
                           rope_parameters=dict(_GEMMA4["rope_parameters"]))
    inv_hf, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, None)
    assert inv_hf.numel() == 128 and int((inv_hf > 0).sum()) == n
    assert e["longest_wavelength"] == pytest.approx(2 * math.pi / float(inv_hf[inv_hf > 0].min()), rel=1e-6)
    assert e["shortest_wavelength"] == pytest.approx(2 * math.pi / float(inv_hf.max()), rel=1e-6)
    # --json is strict JSON (no Infinity / NaN)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_GEMMA4))
    assert main(["inspect", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["rope"][0]["longest_wavelength"] == pytest.approx(s * unscaled, rel=1e-6)


# ----------------------------------------------------------------- issue 12: what today's models need reported

def test_deepseek_v3_reports_the_softmax_multiplier():
    (e,) = inspect_config(CONFIGS / "deepseek-v3.json")["rope"]
    assert e["softmax_scale_multiplier"] == pytest.approx((0.1 * math.log(40) + 1) ** 2)    # 1.874
    assert e["effective_logit_scale"] == pytest.approx(1.874, abs=5e-4)
    assert "softmax scale        x1.87385" in format_report(inspect_config(CONFIGS / "deepseek-v3.json"))


def test_llama4_reports_nope_layers_temperature_and_chunks():
    report = inspect_config(CONFIGS / "llama-4-scout.json")
    layers = report["layers"]
    assert layers["nope_layers"] == list(range(3, 48, 4)) and layers["attention_chunk_size"] == 8192
    assert layers["temperature_tuning"]["floor_scale"] == 8192 and layers["temperature_tuning"]["attn_scale"] == 0.1
    text = format_report(report)
    assert "NoPE layers 3, 7, 11" in text and "temperature tuning" in text and "layout interleaved" in text
    assert "12 of 48 layers use no positional encoding" in report["description"]


def test_null_per_layer_entry_is_a_nope_layer_type_not_an_error():
    cfg = {"model_type": "custom", "head_dim": 64, "num_hidden_layers": 4, "max_position_embeddings": 4096,
           "layer_types": ["full_attention", "nope", "full_attention", "nope"],
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}, "nope": None}}
    report = inspect_config(cfg)
    assert [e["layer_type"] for e in report["rope"]] == ["full_attention"]
    assert report["layers"]["nope_layers"] == [1, 3] and report["warnings"] == []


def test_qwen35_style_mrope_keys_do_not_warn():
    cfg = {"model_type": "qwen3_5_text", "head_dim": 256, "hidden_size": 2048, "num_attention_heads": 8,
           "max_position_embeddings": 262144,
           "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                               "rope_theta": 10000000, "partial_rotary_factor": 0.25}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = inspect_config(cfg)
    (e,) = report["rope"]
    assert report["warnings"] == [] and e["rotary_dim"] == 64
    assert e["position_axes"]["pairs_per_axis"] == [11, 11, 10] and e["position_axes"]["interleaved"]
    # mrope keys ride along with any scaling type without "unrecognised keys"
    yarn = {**cfg, "rope_parameters": {**cfg["rope_parameters"], "rope_type": "yarn", "factor": 2.0,
                                       "original_max_position_embeddings": 131072}}
    assert not any("unrecognised" in w for w in inspect_config(yarn)["warnings"])


def test_hunyuan_modernbert_and_vision_towers_are_described():
    hunyuan = inspect_config(CONFIGS / "hunyuan-7b-instruct.json")
    assert hunyuan["rope"][0]["rope_type"] == "ntk_alpha" and hunyuan["warnings"] == []
    modernbert = inspect_config(CONFIGS / "modernbert-base.json")
    assert {e["layer_type"]: e["rope_theta"] for e in modernbert["rope"]} == {"full_attention": 160000.0,
                                                                             "sliding_attention": 10000.0}
    vision = inspect_config(CONFIGS / "pixtral-12b-vision.json")
    assert vision["rope"] == [] and vision["vision"]["rope_type"] == "axial_pixtral"
    assert "Vision tower with 2-D RoPE" in vision["description"]
    assert main(["inspect", str(CONFIGS / "qwen2.5-vl-7b-instruct.json")]) == 0


def test_a_vision_tower_is_refused_by_extend_with_the_reason(capsys, tmp_path):
    assert main(["extend", str(CONFIGS / "pixtral-12b-vision.json"), "--target-length", "65536", "--method",
                 "yarn", "--out", str(tmp_path / "c.json")]) == 2
    assert "vision tower with 2-D (axial) RoPE" in capsys.readouterr().err


# ----------------------------------------------------- audit: values of the wrong type or range are named errors

@pytest.mark.parametrize("cfg,key", [
    ({"model_type": "gpt2", "n_positions": "1024"}, "n_positions"),
    ({"model_type": "gpt2", "n_positions": [1]}, "n_positions"),
    ({"model_type": "gpt2", "n_positions": -1}, "n_positions"),
    ({"model_type": "bloom", "n_head": 16, "seq_length": "2048"}, "seq_length"),
    ({"model_type": "marian", "max_position_embeddings": "512"}, "max_position_embeddings"),
    ({"model_type": "marian", "max_position_embeddings": 512, "d_model": "512"}, "d_model"),
    ({"model_type": "opt", "max_position_embeddings": 1e30}, "max_position_embeddings"),
    ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 10**30},
     "max_position_embeddings"),
    ({"model_type": "t5", "relative_attention_num_buckets": -1}, "relative_attention_num_buckets"),
    ({"model_type": "t5", "relative_attention_max_distance": "x"}, "relative_attention_max_distance"),
    ({"model_type": "bloom", "n_head": 0}, "n_head"),
    ({"model_type": "bloom", "n_head": -4}, "n_head"),
    ({"model_type": "bloom", "n_head": "16"}, "n_head"),
    ({"model_type": "mpt", "n_heads": 8, "attn_config": {"alibi": True, "alibi_bias_max": -8}},
     "attn_config.alibi_bias_max"),
    ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 0,
      "max_position_embeddings": 4096}, "head_dim"),
    ({"model_type": "deepseek_v3", "hidden_size": 4096, "num_attention_heads": 32, "qk_rope_head_dim": 64,
      "head_dim": -64, "max_position_embeddings": 4096}, "head_dim"),
])
@pytest.mark.parametrize("json_mode", [False, True])
def test_bad_values_are_one_line_errors_naming_the_key_in_text_and_json(tmp_path, capsys, cfg, key, json_mode):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["inspect", str(path), *(["--json"] if json_mode else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("posenc inspect: error:") and f"{key} must be" in err[0], err
    with pytest.raises(ConfigError, match=key):
        inspect_config(cfg)


def test_seq_len_is_capped_like_extend_targets(tmp_path, capsys):
    from posenc.tools.contexts import MAX_CONTEXT

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                "max_position_embeddings": 4096}))
    assert main(["inspect", str(path), "--seq-len", "9" * 29]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc inspect: error: seq_len") and str(MAX_CONTEXT) in err and "\n" not in err
    assert inspect_config(path, seq_len=MAX_CONTEXT)["rope"][0]["evaluated_at_length"] == MAX_CONTEXT


def test_head_dim_zero_follows_the_familys_transformers_attention():
    """Mistral's attention reads `head_dim or hidden // heads` (0 -> derived, as posenc reads it); Llama's takes
    head_dim as given, so 0 cannot build a model there (transformers fails on head_dim ** -0.5): refused."""
    from transformers import LlamaConfig, MistralConfig
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.mistral.modeling_mistral import MistralAttention

    sizes = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 0}
    assert MistralAttention(MistralConfig(**sizes), 0).head_dim == 16
    with pytest.raises(ZeroDivisionError):
        LlamaAttention(LlamaConfig(**sizes), 0)
    (e,) = inspect_config({"model_type": "mistral", "max_position_embeddings": 4096, **sizes})["rope"]
    assert (e["head_dim"], e["rotary_dim"]) == (16, 16)
    with pytest.raises(ConfigError, match="head_dim must be a positive integer, got 0"):
        inspect_config({"model_type": "llama", "max_position_embeddings": 4096, **sizes})


def test_alibi_without_a_head_count_says_so_instead_of_none(capsys, tmp_path):
    report = inspect_config({"model_type": "bloom"})
    assert report["alibi"]["n_heads"] is None and "None" not in report["description"]
    assert any("no head count" in w for w in report["warnings"])
    report = inspect_config({"model_type": "mpt", "n_heads": 8, "attn_config": {"alibi": True, "alibi_bias_max": 16}})
    assert any("2^(-16h/H)" in w for w in report["warnings"])
