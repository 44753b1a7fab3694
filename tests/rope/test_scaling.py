"""Scaling functions against closed forms and published values, independent of transformers."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc._internal.errors import ConfigError
from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS, frequency_bands, register_rope_type, rope_parameters

FAST = settings(max_examples=60, deadline=None, derandomize=True)


def default_list(d: int, theta: float) -> list[float]:
    """The plain-Python closed form theta^(-2j/d)."""
    return [theta ** (-2 * j / d) for j in range(d // 2)]


def cfg(rope_type: str = "default", head_dim: int = 128, theta: float = 10000.0, lmax: int | None = 2048,
        **scaling) -> dict:
    raw = {"head_dim": head_dim, "rope_theta": theta, "rope_scaling": {"rope_type": rope_type, **scaling}}
    if lmax is not None:
        raw["max_position_embeddings"] = lmax
    return raw


def close(actual, expected, rel=1e-6):
    actual = actual.tolist() if isinstance(actual, torch.Tensor) else list(actual)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert math.isclose(a, e, rel_tol=rel, abs_tol=0), (a, e)


# ---------------------------------------------------------------------- transformers' published regression values
# (transformers' own tests, d=128, theta=1e4, Lmax=2048)

def test_default_regression_value():
    inv, scaling = rope_parameters(cfg())
    assert inv.dtype == torch.float32 and inv.shape == (64,)
    assert inv[1].item() == pytest.approx(0.86596, abs=5e-6)
    assert scaling == 1.0
    close(inv, default_list(128, 1e4))


def test_dynamic_regression_values():
    inv, _ = rope_parameters(cfg("dynamic", factor=10.0), seq_len=16384)
    assert inv[1:4].tolist() == pytest.approx([0.80931, 0.65498, 0.53008], abs=5e-6)


def test_yarn_regression_values():
    inv, scaling = rope_parameters(cfg("yarn", factor=10.0, original_max_position_embeddings=2048))
    d = default_list(128, 1e4)
    close(inv[:17], d[:17])
    assert inv[17].item() == pytest.approx(0.083479, abs=5e-6)
    close(inv[41:], [x / 10 for x in d[41:]])
    assert scaling == pytest.approx(1.2302585, abs=1e-7)  # 0.1 ln 10 + 1


def test_llama3_regression_values():
    inv, scaling = rope_parameters(cfg("llama3", lmax=None, factor=10.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=2048))
    d = default_list(128, 1e4)
    close(inv[:31], d[:31])
    assert inv[31].item() == pytest.approx(0.010730, abs=5e-7)
    close(inv[41:], [x / 10 for x in d[41:]])
    assert scaling == 1.0


def test_longrope_attention_factor_example():
    raw = cfg("longrope", lmax=8192, factor=4.0, short_factor=[1.0] * 64, long_factor=[2.0] * 64,
              original_max_position_embeddings=2048)
    _, scaling = rope_parameters(raw)
    assert scaling == pytest.approx(1.0871146, abs=1e-7)  # sqrt(1 + ln 4 / ln 2048)
    assert scaling == pytest.approx(math.sqrt(1 + math.log(4) / math.log(2048)), rel=1e-12)


def test_llama31_bands_29_6_29():
    bands = frequency_bands(cfg("llama3", theta=5e5, lmax=131072, factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=8192))
    assert (bands["kept"], bands["blended"], bands["interpolated"], bands["removed"]) == (29, 6, 29, 0)
    assert bands["labels"] == ["kept"] * 29 + ["blended"] * 6 + ["interpolated"] * 29


def test_llama31_fixture_file_bands_and_values():
    """The real Llama 3.1 config.json: 29 pairs unchanged, 6 blended, 29 divided by 8."""
    path = "tests/fixtures/configs/llama-3.1-8b.json"
    inv, _ = rope_parameters(path)
    d = default_list(128, 5e5)
    close(inv[:29], d[:29])
    close(inv[35:], [x / 8 for x in d[35:]])
    for j in range(29, 35):  # blended strictly between
        assert d[j] / 8 < inv[j].item() < d[j]
    assert frequency_bands(path)["labels"][29:35] == ["blended"] * 6


# ---------------------------------------------------------------------------------------------- closed forms

@FAST
@given(d=st.integers(2, 128).map(lambda x: 2 * x), theta=st.floats(10.0, 1e7), s=st.floats(1.0, 64.0))
def test_linear_is_default_over_factor(d, theta, s):
    inv, _ = rope_parameters(cfg("linear", head_dim=d, theta=theta, factor=s))
    close(inv, [x / s for x in default_list(d, theta)], rel=1e-5)


def ntk_base_from(inv: torch.Tensor, d: int) -> float:
    """Recover theta' from inv[1] = theta'^(-2/d)."""
    return inv[1].double().item() ** (-d / 2)


def test_ntk_base_formula_published_values():
    for s, base in [(4, 43873), (8, 91896)]:  # 1e4 * s^(32/30): head_dim 32, theta 1e4
        inv, scaling = rope_parameters(cfg("ntk", head_dim=32, factor=float(s)))
        assert ntk_base_from(inv, 32) == pytest.approx(base, rel=1e-4)
        assert scaling == 1.0


@FAST
@given(d=st.integers(2, 128).map(lambda x: 2 * x), theta=st.floats(100.0, 1e6), s=st.floats(1.0, 64.0))
def test_ntk_keeps_highest_and_divides_lowest_by_factor(d, theta, s):
    inv, _ = rope_parameters(cfg("ntk", head_dim=d, theta=theta, factor=s))
    default = default_list(d, theta)
    ratio = [a / b for a, b in zip(inv.tolist(), default)]
    assert ratio[0] == pytest.approx(1.0, rel=1e-6)
    assert ratio[-1] == pytest.approx(1 / s, rel=1e-4)              # theta'^(-(d-2)/d) = default_last / s
    assert all(r2 <= r1 * (1 + 1e-5) for r1, r2 in zip(ratio, ratio[1:]))  # monotone: low freqs scaled more
    close(inv, [(theta * s ** (d / (d - 2))) ** (-2 * j / d) for j in range(d // 2)], rel=1e-5)


def test_vllm_variants_closed_forms():
    d, theta, s = 64, 1e4, 4.0
    default = default_list(d, theta)
    inv, _ = rope_parameters(cfg("vllm_ntk", head_dim=d, factor=s))       # (theta s)^(-2j/d) / s^(2/d)
    close(inv, [x * s ** (-(2 * j + 2) / d) for j, x in enumerate(default)], rel=1e-5)
    assert inv[-1].item() == pytest.approx(default[-1] / s, rel=1e-5)
    b = 0.75
    inv, _ = rope_parameters(cfg("vllm_ntk", head_dim=d, factor=s, mixed_b=b))
    a = math.log(s) / (d / 2) ** b
    close(inv, [x / math.exp(a * (j + 1) ** b) for j, x in enumerate(default)], rel=1e-5)
    inv, _ = rope_parameters(cfg("vllm_dynamic", head_dim=d, factor=s))   # static: (s^2 - s + 1)
    assert ntk_base_from(inv, d) == pytest.approx(theta * (s * s - s + 1) ** (d / (d - 2)), rel=1e-4)
    for seq_len in (1, 100, 10**6):  # never depends on the length
        torch.testing.assert_close(rope_parameters(cfg("vllm_dynamic", head_dim=d, factor=s), seq_len)[0], inv)
    alpha, _ = rope_parameters(cfg("vllm_dynamic_alpha", head_dim=d, alpha=s))
    torch.testing.assert_close(alpha, rope_parameters(cfg("ntk", head_dim=d, factor=s))[0])


def test_vllm_longrope_chooses_once_by_serving_length():
    d, orig, lmax = 16, 512, 4096
    short, long = [1.0 + j for j in range(8)], [2.0 + 3 * j for j in range(8)]
    raw = cfg("vllm_longrope", head_dim=d, lmax=lmax, short_factor=short, long_factor=long,
              original_max_position_embeddings=orig)
    inv, scaling = rope_parameters(raw)                    # served length defaults to Lmax > L0: long factors
    close(inv, [x / f for x, f in zip(default_list(d, 1e4), long)], rel=1e-6)
    assert scaling == pytest.approx(math.sqrt(1 + math.log(lmax / orig) / math.log(orig)))
    inv, _ = rope_parameters(raw, seq_len=orig)            # served within L0: short factors
    close(inv, [x / f for x, f in zip(default_list(d, 1e4), short)], rel=1e-6)
    raw["rope_scaling"].update(long_mscale=1.5, short_mscale=1.1)
    assert rope_parameters(raw)[1] == 1.5 and rope_parameters(raw, seq_len=10)[1] == 1.1


def test_proportional_closed_form():
    inv, _ = rope_parameters({"head_dim": 256, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6,
                                                                   "partial_rotary_factor": 0.25, "factor": 2.0}})
    assert inv.shape == (128,)                             # head_dim // 2, not rotary_dim // 2
    close(inv[:32], [1e6 ** (-2 * j / 256) / 2 for j in range(32)], rel=1e-6)
    assert inv[32:].abs().sum() == 0
    bands = frequency_bands({"head_dim": 256, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6,
                                                                  "partial_rotary_factor": 0.25}})
    assert (bands["kept"], bands["removed"]) == (32, 96)


@FAST
@given(d=st.sampled_from([32, 64, 128]), s=st.floats(1.5, 40.0), orig=st.integers(64, 8192),
       theta=st.sampled_from([1e4, 5e5, 1e6]))
def test_yarn_matches_plain_python_loop(d, s, orig, theta):
    """YaRN written out per pair in plain Python (beta 32/1, truncate): ramp between the correction dims."""
    inv, scaling = rope_parameters(cfg("yarn", head_dim=d, theta=theta, lmax=None, factor=s,
                                       original_max_position_embeddings=orig))
    low = math.floor(d * math.log(orig / (32 * 2 * math.pi)) / (2 * math.log(theta)))
    high = math.ceil(d * math.log(orig / (1 * 2 * math.pi)) / (2 * math.log(theta)))
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    expected = []
    for j, x in enumerate(default_list(d, theta)):
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        expected.append(x * (1 - ramp) + x / s * ramp)
    close(inv, expected, rel=1e-5)
    assert scaling == pytest.approx(0.1 * math.log(s) + 1)


def test_yarn_attention_factor_precedence():
    base = dict(lmax=None, factor=4.0, original_max_position_embeddings=1024)
    g = lambda s, m: 0.1 * m * math.log(s) + 1  # noqa: E731
    assert rope_parameters(cfg("yarn", **base, attention_factor=0.7))[1] == 0.7
    assert rope_parameters(cfg("yarn", **base, mscale=0.707, mscale_all_dim=0.707))[1] == pytest.approx(1.0)
    assert rope_parameters(cfg("yarn", **base, mscale=1.0, mscale_all_dim=0.5))[1] == pytest.approx(g(4, 1) / g(4, .5))
    assert rope_parameters(cfg("yarn", **base, mscale=1.0))[1] == pytest.approx(g(4, 1))  # needs both


def test_yarn_null_factor_uses_length_ratio():
    inv, scaling = rope_parameters(cfg("yarn", lmax=8192, factor=None, original_max_position_embeddings=2048))
    assert scaling == pytest.approx(0.1 * math.log(4) + 1)
    close(inv[-5:], [x / 4 for x in default_list(128, 1e4)[-5:]], rel=1e-6)


def test_yarn_tiny_head_dim_keeps_nothing():
    """head_dim 32 at L0=128: only pair 0 (frequency 1) is kept, YaRN is then almost PI.

    low = floor(32 ln(128 / (2 pi 32)) / (2 ln 1e4)) = -1 -> 0, high = ceil(32 ln(128 / (2 pi)) / (2 ln 1e4)) = 6.
    """
    bands = frequency_bands(cfg("yarn", head_dim=32, lmax=None, factor=4.0, original_max_position_embeddings=128))
    assert (bands["kept"], bands["blended"], bands["interpolated"]) == (1, 5, 10)


@FAST
@given(seq_len=st.integers(1, 2048))
def test_dynamic_is_default_within_lmax(seq_len):
    inv, _ = rope_parameters(cfg("dynamic", factor=8.0), seq_len=seq_len)
    close(inv, default_list(128, 1e4), rel=1e-6)


@FAST
@given(a=st.integers(2049, 10**6), b=st.integers(2049, 10**6))
def test_dynamic_frequencies_fall_as_length_grows(a, b):
    short, long = sorted((a, b))
    inv_short, _ = rope_parameters(cfg("dynamic", factor=4.0), seq_len=short)
    inv_long, _ = rope_parameters(cfg("dynamic", factor=4.0), seq_len=long)
    assert torch.all(inv_long <= inv_short * (1 + 1e-6))
    L = long  # closed form of the rescaled base
    base = 1e4 * (4 * L / 2048 - 3) ** (128 / 126)
    close(inv_long, default_list(128, base), rel=2e-6)


def test_longrope_switches_strictly_above_original_length():
    short, long = [1.0] * 8, [5.0] * 8
    raw = cfg("longrope", head_dim=16, lmax=4096, short_factor=short, long_factor=long,
              original_max_position_embeddings=1024)
    d = default_list(16, 1e4)
    close(rope_parameters(raw, 1024)[0], d)
    close(rope_parameters(raw, None)[0], d)
    close(rope_parameters(raw, 1025)[0], [x / 5 for x in d])


def test_bands_generic_rule():
    assert frequency_bands(cfg("linear", factor=4.0))["interpolated"] == 64
    assert frequency_bands(cfg())["kept"] == 64
    ntk = frequency_bands(cfg("ntk", factor=4.0))
    assert ntk["labels"][0] == "kept" and ntk["labels"][-1] == "interpolated" and ntk["blended"] == 62


# ------------------------------------------------------------------------------------------------ registry

def test_registry_has_every_type():
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "ntk", "vllm_dynamic",
            "vllm_dynamic_alpha", "vllm_ntk", "vllm_longrope"} <= set(ROPE_SCALING_FUNCTIONS)
    assert posenc.ROPE_SCALING_FUNCTIONS is ROPE_SCALING_FUNCTIONS
    assert posenc.rope_parameters is rope_parameters


def test_register_custom_type_is_validated_and_used():
    @register_rope_type("test_sqrt_linear", required=("factor",))
    def sqrt_linear(c, seq_len=None):
        return posenc.default_inv_freq(c.rotary_dim, c.theta) / math.sqrt(c.params["factor"]), 1.0

    try:
        inv, _ = rope_parameters(cfg("test_sqrt_linear", head_dim=8, factor=4.0))
        close(inv, [x / 2 for x in default_list(8, 1e4)])
        with pytest.raises(ConfigError, match=r"test_sqrt_linear.*missing required keys \['factor'\]"):
            rope_parameters(cfg("test_sqrt_linear", head_dim=8))
        with pytest.warns(UserWarning, match="unrecognised keys"):
            rope_parameters(cfg("test_sqrt_linear", head_dim=8, factor=4.0, beta=1))
    finally:
        del ROPE_SCALING_FUNCTIONS["test_sqrt_linear"]


def test_register_rejects_bad_rule():
    with pytest.raises(ConfigError, match="seq_len_rule"):
        register_rope_type("x", seq_len_rule="sometimes")


# ---------------------------------------------------------------------------------------------- inputs

def test_accepts_path_mapping_and_ropeconfig(tmp_path):
    raw = cfg("linear", factor=2.0)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    a, _ = rope_parameters(raw)
    b, _ = rope_parameters(str(path))
    c, _ = rope_parameters(tmp_path)          # a model folder holding config.json
    d, _ = rope_parameters(posenc.load_rope_config(raw))
    for other in (b, c, d):
        torch.testing.assert_close(a, other, rtol=0, atol=0)


@pytest.mark.parametrize("seq_len", [0, -3, 2.5, "10", True])
def test_bad_seq_len(seq_len):
    with pytest.raises(ConfigError, match="seq_len must be a positive integer"):
        rope_parameters(cfg("dynamic", factor=2.0), seq_len)


def test_bad_values_raise_named_errors():
    with pytest.raises(ConfigError, match="'linear': factor must be a number, got 'four'"):
        rope_parameters(cfg("linear", factor="four"))
    with pytest.raises(ConfigError, match=r"long_factor must be a list of rotary_dim // 2 = 64"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rope_parameters(cfg("longrope", short_factor=[1.0] * 64, long_factor=[1.0] * 3,
                                original_max_position_embeddings=1024), seq_len=4096)
    with pytest.raises(ConfigError, match="rotary_dim must be an even integer > 2"):
        rope_parameters(cfg("ntk", head_dim=2, factor=2.0))
    with pytest.raises(ConfigError, match="factor is null"):
        rope_parameters(cfg("yarn", lmax=None, factor=None, original_max_position_embeddings=1024))


# ------------------------------------------------------------------------------------------ NTK base helpers

def test_ntk_theta_published_values():
    from posenc.rope.scaling import ntk_theta

    assert ntk_theta(1e4, 4, 32) == pytest.approx(43873, abs=1)    # 1e4 * 4^(32/30), head_dim 32
    assert ntk_theta(1e4, 8, 32) == pytest.approx(91896, abs=1)
    assert ntk_theta(1e4, 1, 128) == 1e4                            # s = 1 changes nothing


@FAST
@given(d=st.integers(2, 128).map(lambda x: 2 * x), theta=st.floats(100.0, 1e6), s=st.floats(1.0, 64.0))
def test_ntk_theta_closed_form_and_registry_use_it(d, theta, s):
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import ntk_theta

    assert ntk_theta(theta, s, d) == pytest.approx(theta * s ** (d / (d - 2)), rel=1e-12)
    inv, _ = rope_parameters(cfg("ntk", head_dim=d, theta=theta, factor=s))
    torch.testing.assert_close(inv, default_inv_freq(d, ntk_theta(theta, s, d)), rtol=0, atol=0)


@pytest.mark.parametrize("args,match", [
    ((0.0, 2.0, 64), "theta must be a positive"), ((1e4, -1.0, 64), "factor must be a positive"),
    ((1e4, float("inf"), 64), "factor must be a positive"), ((1e4, "2", 64), "factor must be a number"),
    ((1e4, 2.0, 2), "rotary_dim must be an even integer > 2"), ((1e4, 2.0, 63), "rotary_dim must be even"),
    ((1e4, 2.0, 64.0), "rotary_dim must be a positive integer"),
])
def test_ntk_theta_bad_arguments(args, match):
    from posenc.rope.scaling import ntk_theta

    with pytest.raises(ConfigError, match=match):
        ntk_theta(*args)


@pytest.mark.parametrize("seq_len", [None, 100, 2048, 4096, 9999])
def test_dynamic_ntk_theta_matches_transformers(seq_len):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import dynamic_ntk_theta

    hf = LlamaConfig(hidden_size=512, num_attention_heads=8, max_position_embeddings=2048,
                     rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 1e4})
    inv_hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, None, seq_len)
    ours = default_inv_freq(64, dynamic_ntk_theta(1e4, 3.0, 64, seq_len, 2048))
    torch.testing.assert_close(ours, inv_hf.float(), rtol=2e-6, atol=0)
    if seq_len is None or seq_len <= 2048:
        assert dynamic_ntk_theta(1e4, 3.0, 64, seq_len, 2048) == 1e4   # plain RoPE up to Lmax


# ------------------------------------------------------------------------------- malformed scaling values

@pytest.mark.parametrize("rope_type,scaling,match", [
    ("yarn", {"factor": 4.0, "beta_fast": "x"}, "beta_fast must be a number"),
    ("yarn", {"factor": 4.0, "beta_slow": -1}, "beta_slow must be a positive finite number"),
    ("yarn", {"factor": 4.0, "mscale": [1], "mscale_all_dim": 1.0}, "mscale must be a number"),
    ("yarn", {"factor": 4.0, "mscale": -1.0, "mscale_all_dim": 1.0}, r"mscale must be a finite number >= 0"),
    ("yarn", {"factor": 4.0, "attention_factor": "big"}, "attention_factor must be a number"),
    ("yarn", {"factor": 4.0, "attention_factor": -1}, "attention_factor must be a positive finite number"),
    ("yarn", {"factor": 0}, "factor must be a positive finite number"),
    ("linear", {"factor": -2.0}, "factor must be a positive finite number"),
    ("linear", {"factor": float("inf")}, "factor must be a positive finite number"),
    ("linear", {"factor": 1e300}, r"factor must be in \[1e-07, 1e\+07\]"),
    ("llama3", {"factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 512}, "low_freq_factor must be a positive finite number"),
    ("longrope", {"short_factor": [1.0] * 64, "long_factor": [1.0] * 64, "original_max_position_embeddings": 1},
     "original_max_position_embeddings must be >= 2"),
    ("longrope", {"short_factor": [1.0] * 64, "long_factor": [1.0] * 64, "original_max_position_embeddings": 512,
                  "attention_factor": {}}, "attention_factor must be a number"),
    ("longrope", {"short_factor": [1.0] * 64, "long_factor": [1.0] * 64, "original_max_position_embeddings": 512,
                  "attention_factor": 0}, "attention_factor must be a positive finite number"),
    ("vllm_dynamic_alpha", {"alpha": 0.0}, "alpha must be a positive finite number"),
    ("ntk_alpha", {"alpha": 1e9}, r"alpha must be in \[1e-07, 1e\+07\]"),
])
def test_malformed_scaling_values_are_config_errors(rope_type, scaling, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match=match):
            rope_parameters(cfg(rope_type, **scaling), seq_len=4096)


_VALID = {  # one loadable entry per registered type (head_dim 16, Lmax 2048)
    "default": {}, "linear": {"factor": 2.0}, "dynamic": {"factor": 2.0}, "ntk": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 32, "beta_slow": 1,
             "mscale": 1.0, "mscale_all_dim": 1.0},
    "longrope": {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 512,
                 "factor": 4.0, "attention_factor": 1.1},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "proportional": {"factor": 1.0}, "vllm_dynamic": {"factor": 2.0}, "vllm_dynamic_alpha": {"alpha": 2.0},
    "vllm_ntk": {"factor": 2.0, "mixed_b": 0.5},
    "vllm_longrope": {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 512,
                      "short_mscale": 1.0, "long_mscale": 1.2},
}
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=3), st.lists(st.floats(-2, 4), max_size=9), st.just({}))


@settings(max_examples=250, deadline=None, derandomize=True)
@given(rope_type=st.sampled_from(sorted(_VALID)), junk=st.dictionaries(
    st.sampled_from(sorted({k for v in _VALID.values() for k in v} | {"rope_theta", "truncate"})), _JUNK,
    min_size=1, max_size=2), seq_len=st.sampled_from([None, 100, 4096]))
def test_any_malformed_value_is_a_config_error(rope_type, junk, seq_len):
    """One or two keys of a valid entry replaced by junk: it raises ConfigError, or gives finite frequencies >= 0
    and a finite attention scaling (never a TypeError, never NaN / inf passed on silently)."""
    raw = cfg(rope_type, head_dim=16, **{**_VALID[rope_type], **junk})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inv, attention = rope_parameters(raw, seq_len)
            frequency_bands(raw, seq_len)
        except ConfigError:
            return
    assert bool(inv.isfinite().all()) and bool((inv >= 0).all()) and math.isfinite(attention), (inv, attention)


def test_a_taken_rope_type_name_needs_replace():
    """As the scheme, method and task registries: a plug-in cannot silently replace "yarn"."""
    with pytest.raises(ConfigError, match="'yarn' is already registered"):
        register_rope_type("yarn")
    original = ROPE_SCALING_FUNCTIONS["linear"]
    try:
        @register_rope_type("linear", required=("factor",), replace=True)
        def halved(c, seq_len=None):
            return posenc.default_inv_freq(c.rotary_dim, c.theta) / (2 * c.params["factor"]), 1.0

        inv, _ = rope_parameters(cfg("linear", head_dim=8, factor=2.0))
        close(inv, [x / 4 for x in default_list(8, 1e4)])
    finally:
        ROPE_SCALING_FUNCTIONS["linear"] = original
    with pytest.raises(ConfigError, match="name must be letters"):
        register_rope_type("")
