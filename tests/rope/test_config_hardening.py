"""Bad RoPE configs get a named error or a warning that says why, consistently; a fuzz test over malformed configs
asserts a named posenc error or a finite result, never another exception or a non-finite table (issue 16)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from posenc import RopeConfig, Rotary, ntk_theta, rope_parameters
from posenc.cli import main
from posenc._internal.errors import ConfigError, PosencError
from posenc.rope.config import load_rope_config
from posenc.rope.registry import ROPE_SCALING_FUNCTIONS
from posenc.tools.inspect import inspect_config


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------- rope_theta

@pytest.mark.parametrize("make", [
    lambda t: load_rope_config({"head_dim": 64, "rope_theta": t}),
    lambda t: load_rope_config({"head_dim": 64, "rope_parameters": {"rope_type": "default", "rope_theta": t}}),
    lambda t: RopeConfig(theta=t),
    lambda t: Rotary(16, theta=t),
])
def test_theta_at_or_below_one_warns_why(make):
    with pytest.warns(UserWarning, match=r"rope_theta 0.5 <= 1: the frequencies .* do not decrease .*grow"):
        make(0.5)
    with pytest.warns(UserWarning, match=r"all equal 1"):
        make(1)
    quiet(make, 10000.0)


def test_theta_below_one_really_makes_frequencies_grow():
    with pytest.warns(UserWarning):
        inv, _ = rope_parameters({"head_dim": 8, "rope_theta": 0.5})
    assert bool((inv[1:] > inv[:-1]).all())          # the warning's claim, checked


@pytest.mark.parametrize("make", [
    lambda t: load_rope_config({"head_dim": 64, "rope_theta": t}),
    lambda t: load_rope_config({"head_dim": 64, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": t}}),
    lambda t: load_rope_config({"head_dim": 64, "layer_types": ["full_attention"],
                                "rope_parameters": {"full_attention": {"rope_theta": t}}}, "full_attention"),
    lambda t: load_rope_config({"head_dim": 64, "rotary_emb_base": t}),
    lambda t: RopeConfig(theta=t),
    lambda t: Rotary(16, theta=t),
    lambda t: rope_parameters({"head_dim": 64, "rope_theta": t}),
])
@pytest.mark.parametrize("theta", ["1e4", "10000", b"1e4"])
def test_string_theta_is_refused_everywhere_the_same_way(make, theta):
    with pytest.raises(ConfigError, match=r"^rope_theta must be a number, got "):
        make(theta)


def test_ntk_theta_refuses_strings_too():
    with pytest.raises(ConfigError, match="theta must be a number"):
        ntk_theta("1e4", 2.0, 64)


def test_theta_beyond_float32_is_refused():
    with pytest.raises(ConfigError, match=r"rope_theta must be at most 3.403e\+38 \(float32's largest value"):
        load_rope_config({"head_dim": 64, "rope_theta": 1e300})


# ------------------------------------------------------------------------------------- scaling factors

@pytest.mark.parametrize("factor", [1e300, 1e8, 1e-300])
def test_absurd_linear_factor_is_refused_with_reason(factor):
    cfg = {"head_dim": 64, "rope_scaling": {"type": "linear", "factor": factor}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # factor < 1 warns first
        with pytest.raises(ConfigError, match=r"factor must be in \[1e-07, 1e\+07\].*drives the frequencies to 0"):
            rope_parameters(cfg)
        with pytest.raises(ConfigError, match="factor must be in"):
            Rotary(64, rope_type="linear", factor=factor)


def test_the_factor_limit_is_where_frequencies_would_vanish():
    """At 1e300 float32 frequencies are all exactly 0 (what the limit prevents); at the limit they are normal."""
    from posenc import default_inv_freq

    assert bool((default_inv_freq(64, 1e4) / 1e300 == 0).all())
    inv, _ = rope_parameters({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 1e7}})
    assert bool((inv > 0).all()) and bool(inv.isfinite().all())


@pytest.mark.parametrize("attention_factor", [-1, 0, -0.5])
def test_yarn_attention_factor_must_be_positive(attention_factor):
    cfg = {"head_dim": 64, "max_position_embeddings": 8192,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
                            "attention_factor": attention_factor}}
    with pytest.raises(ConfigError, match="attention_factor must be a positive finite number"):
        rope_parameters(cfg)


# -------------------------------------------------------------------------------------------- head_dim

def test_indivisible_hidden_size_without_head_dim_is_refused():
    """transformers' Mistral / Qwen2 configs silently use 250 // 4 = 62 (Llama, Gemma 2, NeoX refuse); posenc refuses
    unless head_dim is explicit, which is the model's own choice and read as given."""
    from transformers import LlamaConfig, MistralConfig

    with pytest.raises(ConfigError, match=r"hidden_size \(250\) is not divisible by num_attention_heads \(4\).*"
                                          r"250 // 4 = 62 would silently drop 2 dims"):
        load_rope_config({"hidden_size": 250, "num_attention_heads": 4})
    assert MistralConfig(hidden_size=250, num_attention_heads=4).head_dim == 62             # the silent case
    with pytest.raises(Exception, match="not a multiple of the number of attention heads"):
        LlamaConfig(hidden_size=250, num_attention_heads=4)
    assert MistralConfig(hidden_size=250, num_attention_heads=4, head_dim=62).head_dim == 62
    assert load_rope_config({"hidden_size": 250, "num_attention_heads": 4, "head_dim": 62}).head_dim == 62


# --------------------------------------------------------------------------------- per-layer-type dicts

def test_junk_entry_in_per_layer_type_dict_is_named_not_silently_flattened():
    raw = {"head_dim": 64, "rope_theta": 1e4,
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "junk": 5}}
    with pytest.raises(ConfigError, match=r"entry 'junk' must be a JSON object of RoPE parameters or null"):
        load_rope_config(raw, "full_attention")
    with pytest.raises(ConfigError, match="entry 'junk'"):
        rope_parameters(raw, layer_type="full_attention")
    del raw["rope_parameters"]["junk"]
    assert load_rope_config(raw, "full_attention").theta == 1e6       # the layer's, not the top level's


def test_layer_types_name_the_per_layer_dict_even_without_dict_values():
    raw = {"head_dim": 64, "layer_types": ["full_attention", "sliding_attention"],
           "rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": None}}
    assert load_rope_config(raw, "full_attention").theta == 1e6
    with pytest.raises(ConfigError, match="has no RoPE"):
        load_rope_config(raw, "sliding_attention")


# -------------------------------------------------------------------------- rope_scaling vs rope_parameters

def test_conflicting_rope_scaling_and_rope_parameters_are_refused_naming_both():
    from transformers import LlamaConfig

    raw = {"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 4.0},
           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    with pytest.raises(ConfigError, match=r"both rope_parameters \{.*\"factor\": 2.0.*\} and rope_scaling "
                                          r"\{.*\"factor\": 4.0.*\} and they disagree"):
        load_rope_config(raw)
    with pytest.raises(ConfigError, match="disagree"):
        inspect_config(raw)
    # why refuse: transformers 5 silently takes rope_scaling, the opposite of what a 5.x reader expects
    hf = LlamaConfig(hidden_size=64, num_attention_heads=1, rope_scaling=raw["rope_scaling"],
                     rope_parameters=raw["rope_parameters"])
    assert hf.rope_parameters["factor"] == 4.0


def test_agreeing_rope_scaling_and_rope_parameters_are_fine():
    raw = {"head_dim": 64, "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0},
           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    assert quiet(load_rope_config, raw).factor == 2.0


# ----------------------------------------------------------------------------------------- Rotary.update

@pytest.mark.parametrize("seq_len", [-1, 0, 2.5, True, "8"])
def test_rotary_update_refuses_bad_lengths(seq_len):
    rot = Rotary(16, rope_type="dynamic", factor=2.0, max_position_embeddings=32)
    with pytest.raises(PosencError, match="seq_len must be a positive integer"):
        rot.update(seq_len)


# ----------------------------------------------------------------------------------------- deep nesting

def _deep(n: int) -> str:
    return '{"head_dim": 64, "x": ' + "[" * n + "]" * n + "}"


def test_inspect_on_deeply_nested_json_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(_deep(200_000))
    with pytest.raises(ConfigError, match="nests JSON objects / lists too deeply"):
        inspect_config(path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too deeply" in err[0]
    nested: dict = {}
    for _ in range(100_000):
        nested = {"a": nested}
    with pytest.raises(ConfigError, match="too deeply"):
        inspect_config({"head_dim": 64, "text_config": nested})


# ------------------------------------------------------------------------------------------------ fuzz

_TYPES = sorted(ROPE_SCALING_FUNCTIONS) + ["mrope", "su", "nope", ""]
_NUM = st.one_of(st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.just(1e300),
                 st.just(-0.0), st.just(1e-300))
_JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.lists(st.integers(-2, 4), max_size=3),
                  st.dictionaries(st.sampled_from(["a", "rope_type"]), st.integers(), max_size=2))
_VALUE = st.one_of(_NUM, _JUNK, st.lists(_NUM, min_size=1, max_size=40))
_SCALING_KEYS = ["rope_type", "type", "factor", "rope_theta", "original_max_position_embeddings", "beta_fast",
                 "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate", "short_factor",
                 "long_factor", "low_freq_factor", "high_freq_factor", "alpha", "mrope_section",
                 "mrope_interleaved", "partial_rotary_factor", "mixed_b"]
_TOP_KEYS = ["head_dim", "hidden_size", "num_attention_heads", "rope_theta", "max_position_embeddings",
             "original_max_position_embeddings", "partial_rotary_factor", "rotary_dim", "qk_rope_head_dim",
             "model_type", "rope_scaling", "rope_parameters", "rope_local_base_freq", "layer_types",
             "global_rope_theta", "no_rope_layers", "num_hidden_layers", "attention_chunk_size"]


@st.composite
def _plausible(draw):
    """A config that is valid or nearly so (every rope type, extreme but legal numbers), then 0-2 keys of junk at the
    top level or inside the scaling dict: most draws reach the frequency code instead of failing at the first key."""
    head_dim = draw(st.sampled_from([4, 8, 16, 64, 128]))
    pairs = head_dim // 2
    rope_type = draw(st.sampled_from(_TYPES))
    factor = draw(st.sampled_from([1.0, 2.0, 8.0, 40.0, 0.5, 1e7, 1e-7]))
    scaling = {"rope_type": rope_type, "factor": factor, "original_max_position_embeddings": draw(
        st.sampled_from([16, 2048, 1])), "low_freq_factor": 1.0, "high_freq_factor": draw(st.sampled_from([4.0, 1.0])),
        "alpha": draw(st.sampled_from([1000.0, 1.0, 1e7])),
        "short_factor": [1.0] * pairs, "long_factor": [draw(st.sampled_from([1.0, 4.0, 1e6]))] * pairs}
    if draw(st.booleans()):
        scaling.update(mscale=draw(st.sampled_from([0.0, 0.707, 1.0])), mscale_all_dim=draw(st.sampled_from([0.0, 1.0])))
    if draw(st.booleans()):
        scaling["mrope_section"] = draw(st.sampled_from([[pairs // 2, pairs - pairs // 2, 0], [1, 1, 1]]))
        scaling["mrope_interleaved"] = draw(st.booleans())
    cfg = {"head_dim": head_dim, "max_position_embeddings": draw(st.sampled_from([64, 4096, 1])),
           "rope_theta": draw(st.sampled_from([1e4, 5e5, 1e6, 0.5, 1.0, 1e38, 2.0])),
           "model_type": draw(st.sampled_from([None, "llama", "phi3", "gemma3_text", "modernbert", "qwen2_vl",
                                               "qwen3_vl_text", "pixtral", "hunyuan_v1_dense", "llama4_text",
                                               "deepseek_v3"])),
           "partial_rotary_factor": draw(st.sampled_from([1.0, 0.5, 0.25])),
           "num_hidden_layers": 4}
    cfg["rope_parameters" if draw(st.booleans()) else "rope_scaling"] = scaling
    for _ in range(draw(st.integers(0, 2))):
        target = scaling if draw(st.booleans()) else cfg
        keys = _SCALING_KEYS if target is scaling else _TOP_KEYS
        target[draw(st.sampled_from(keys))] = draw(_VALUE)
    return {k: v for k, v in cfg.items() if v is not None or k == "rope_scaling"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cfg=_plausible(), seq_len=st.one_of(st.none(), st.integers(1, 10**6)),
       layer_type=st.sampled_from([None, "full_attention", "sliding_attention"]))
@example(cfg={"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 1e300}}, seq_len=None, layer_type=None)
@example(cfg={"head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 4.0, "attention_factor": -1,
                                              "original_max_position_embeddings": 16}}, seq_len=64, layer_type=None)
@example(cfg={"head_dim": 64, "rope_theta": 1e38, "rope_scaling": {"type": "dynamic", "factor": 1e7}},
         seq_len=10**6, layer_type=None)
def test_malformed_rope_configs_give_named_errors_or_finite_tables(cfg, seq_len, layer_type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inv, scaling = rope_parameters(cfg, seq_len, layer_type=layer_type)
        except PosencError:
            pass
        else:
            assert bool(inv.isfinite().all()) and bool((inv >= 0).all())
            assert math.isfinite(scaling) and scaling > 0
        try:                                        # the module on its own path (its length rules included)
            rot = Rotary.from_config(cfg, layer_type, cache=False)
            positions = torch.arange(3) if rot.n_axes == 1 else torch.zeros(rot.n_axes, 1, 3, dtype=torch.long)
            cos, sin = rot.cos_sin(positions + (seq_len or 1) - 1)
        except PosencError:
            pass
        else:
            assert bool(cos.isfinite().all()) and bool(sin.isfinite().all())
            assert bool(rot.inv_freq.isfinite().all()) and rot.attention_scaling > 0
        try:                                        # inspect describes it (or names what is wrong)
            json.dumps(inspect_config(cfg, seq_len=seq_len))
        except PosencError:
            pass


@pytest.mark.parametrize("raw", [{"head_dim": 10**31}, {"hidden_size": 10**31, "num_attention_heads": 4}])
def test_absurd_head_widths_are_a_config_error(raw):
    with pytest.raises(ConfigError, match="head_dim must be an integer in"):
        rope_parameters({**raw, "rope_theta": 1e4})
