"""Differential suite: posenc.rope_parameters vs transformers' own ROPE_INIT_FUNCTIONS on random valid configs.

Each test draws configs in raw config.json form (4.x ``rope_scaling`` or 5.x ``rope_parameters``, ``type`` or
``rope_type``), feeds the same dict to posenc and to a transformers config class, and requires inv_freq and
attention_scaling to agree to a relative error of 1e-6. seq_len is drawn on both sides of Lmax / L0.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is the oracle of the parity suite; install posenc[test] to run it")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

from posenc import rope_parameters  # noqa: E402

transformers.logging.set_verbosity_error()  # transformers logs its own warnings for the odd values we draw

N = 400  # examples per rope type: ~3,000 drawn configs in total
SETTINGS = settings(max_examples=N, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# ------------------------------------------------------------------------------------------- strategies

head_dims = st.one_of(st.sampled_from([64, 80, 96, 128, 256]), st.integers(2, 128).map(lambda h: 2 * h))
thetas = st.one_of(st.sampled_from([10000.0, 500000.0, 1e6, 1e7, 5e6]), st.floats(2.0, 2e7))
factors = st.one_of(st.sampled_from([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 40.0]), st.floats(1.0, 64.0),
                    st.floats(0.25, 1.0))  # below 1 is suspicious but legal: both warn and compute
prfs = st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.25, 0.75, 0.4])
lengths = st.one_of(st.sampled_from([2048, 4096, 8192, 32768, 131072]), st.integers(8, 300000))


@st.composite
def base_config(draw, *, needs_min_dim=2):
    """Raw config.json keys shared by every type; returns (raw dict without the rope dict, rotary dim)."""
    head_dim, prf = draw(head_dims), draw(prfs)
    rotary = int(head_dim * prf)
    assume(rotary % 2 == 0 and rotary > needs_min_dim)
    heads = draw(st.integers(1, 8))
    raw = {"hidden_size": head_dim * heads, "num_attention_heads": heads, "vocab_size": 32,
           "max_position_embeddings": draw(lengths)}
    if draw(st.booleans()):
        raw["head_dim"] = head_dim            # else derived from hidden_size // num_attention_heads
    return raw, prf, rotary


def attach(draw, raw: dict, rope: dict, theta: float, prf: float) -> dict:
    """Put the rope dict in 4.x or 5.x form (and partial_rotary_factor at the top or inside)."""
    rope = dict(rope)
    if draw(st.booleans()):
        rope["type"] = rope.pop("rope_type")  # legacy key
    if draw(st.booleans()):                   # transformers 5.x
        raw["rope_parameters"] = {**rope, "rope_theta": theta}
    else:                                     # transformers 4.x
        raw["rope_scaling"], raw["rope_theta"] = rope, theta
    if prf != 1.0:
        if draw(st.booleans()):
            raw["partial_rotary_factor"] = prf
        else:
            raw.setdefault("rope_parameters", raw.get("rope_scaling"))["partial_rotary_factor"] = prf
    return raw


def seq_lens(draw, *anchors: int):
    """None, or a length on either side of one of the anchors (Lmax, L0), or anywhere up to 4x the largest."""
    anchor = draw(st.sampled_from(anchors))
    return draw(st.one_of(st.none(), st.sampled_from([max(1, anchor - 1), anchor, anchor + 1]),
                          st.integers(1, 4 * max(anchors))))


# ------------------------------------------------------------------------------------------------- oracle

def transformers_params(rope_type: str, raw: dict, seq_len, config_class=LlamaConfig, layer_type=None):
    config = config_class(**copy.deepcopy(raw))
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type == "default":  # not in ROPE_INIT_FUNCTIONS: each model computes it; Phi-3's honours partial rotary
        return Phi3RotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len, **kwargs)


def assert_same(raw: dict, rope_type: str, seq_len, config_class=LlamaConfig, layer_type=None):
    expected_inv, expected_scaling = transformers_params(rope_type, raw, seq_len, config_class, layer_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the suspicious-value warnings are tested in test_config.py
        inv, scaling = rope_parameters(copy.deepcopy(raw), seq_len, layer_type=layer_type)
    assert inv.dtype == torch.float32
    assert inv.shape == expected_inv.shape, (inv.shape, expected_inv.shape)
    torch.testing.assert_close(inv, expected_inv.float(), rtol=0, atol=0)
    assert math.isclose(scaling, float(expected_scaling), rel_tol=1e-6), (scaling, expected_scaling)


# ------------------------------------------------------------------------------------------------- tests

@SETTINGS
@given(st.data())
def test_default_matches_transformers(data):
    raw, prf, _ = data.draw(base_config())
    raw = attach(data.draw, raw, {"rope_type": "default"}, data.draw(thetas), prf)
    assert_same(raw, "default", None)


@SETTINGS
@given(st.data())
def test_linear_matches_transformers(data):
    raw, prf, _ = data.draw(base_config())
    raw = attach(data.draw, raw, {"rope_type": "linear", "factor": data.draw(factors)}, data.draw(thetas), prf)
    assert_same(raw, "linear", data.draw(st.one_of(st.none(), st.integers(1, 10**6))))


@SETTINGS
@given(st.data())
def test_dynamic_matches_transformers(data):
    raw, prf, _ = data.draw(base_config(needs_min_dim=2))
    raw = attach(data.draw, raw, {"rope_type": "dynamic", "factor": data.draw(factors)}, data.draw(thetas), prf)
    assert_same(raw, "dynamic", seq_lens(data.draw, raw["max_position_embeddings"]))


@SETTINGS
@given(st.data())
def test_dynamic_at_run_time_matches_transformers(data):
    """A tensor length (how transformers' dynamic_rope_update passes it during a forward) forms the base in float32;
    posenc's rope_parameters follows the same semantics for a tensor, bit for bit."""
    raw, prf, _ = data.draw(base_config(needs_min_dim=2))
    raw = attach(data.draw, raw, {"rope_type": "dynamic", "factor": data.draw(factors)}, data.draw(thetas), prf)
    seq_len = data.draw(st.integers(1, 8 * raw["max_position_embeddings"]))
    assert_same(raw, "dynamic", torch.tensor(seq_len))


@SETTINGS
@given(st.data())
def test_yarn_matches_transformers(data):
    raw, prf, rotary = data.draw(base_config())
    lmax = raw["max_position_embeddings"]
    orig = data.draw(st.one_of(st.integers(4, lmax), st.just(lmax)))
    optional = st.one_of(st.none(), st.floats(0.05, 4.0))
    rope = {"rope_type": "yarn", "factor": data.draw(st.one_of(factors, st.none())),
            "original_max_position_embeddings": orig,
            # 0 means the default in transformers (`x or 32`), as null does
            "beta_fast": data.draw(st.one_of(st.none(), st.just(0), st.floats(1.0, 128.0), st.integers(1, 64))),
            "beta_slow": data.draw(st.one_of(st.none(), st.just(0.0), st.floats(0.01, 4.0), st.integers(1, 3))),
            "mscale": data.draw(optional), "mscale_all_dim": data.draw(optional),
            "attention_factor": data.draw(st.one_of(st.none(), st.none(), st.floats(0.5, 2.0))),
            "truncate": data.draw(st.sampled_from([None, True, False]))}
    rope = {k: v for k, v in rope.items() if v is not None or (k == "factor" and data.draw(st.booleans()))}
    assume("factor" in rope)  # transformers requires the key (a null value means Lmax / L0)
    raw = attach(data.draw, raw, rope, data.draw(st.one_of(thetas.filter(lambda t: t > 1.5))), prf)
    assert_same(raw, "yarn", seq_lens(data.draw, lmax, orig))


@SETTINGS
@given(st.data())
def test_longrope_matches_transformers(data):
    raw, prf, rotary = data.draw(base_config())
    lmax = raw["max_position_embeddings"]
    orig = data.draw(st.integers(2, lmax))
    ext = st.lists(st.floats(1.0, 100.0), min_size=rotary // 2, max_size=rotary // 2)
    rope = {"rope_type": "longrope", "short_factor": data.draw(ext), "long_factor": data.draw(ext)}
    if data.draw(st.booleans()):
        rope["factor"] = data.draw(factors)
    if data.draw(st.booleans()):
        rope["attention_factor"] = data.draw(st.floats(0.5, 2.0))
    phi3_form = data.draw(st.booleans())  # Phi-3: original_max_position_embeddings at the top level
    if phi3_form:
        raw["original_max_position_embeddings"] = orig
    else:
        rope["original_max_position_embeddings"] = orig
    raw = attach(data.draw, raw, rope, data.draw(thetas), prf)
    config_class = Phi3Config if phi3_form else LlamaConfig
    if phi3_form and prf != 1.0:  # Phi3Config reads partial_rotary_factor only from the top level
        raw["partial_rotary_factor"] = prf
        raw.get("rope_parameters", raw.get("rope_scaling")).pop("partial_rotary_factor", None)
    assert_same(raw, "longrope", seq_lens(data.draw, lmax, orig), config_class)


@SETTINGS
@given(st.data())
def test_llama3_matches_transformers(data):
    raw, prf, _ = data.draw(base_config())
    lmax = raw["max_position_embeddings"]
    low = data.draw(st.one_of(st.sampled_from([1.0, 2.0]), st.floats(0.25, 8.0)))
    high = low + data.draw(st.one_of(st.sampled_from([3.0, 1.0]), st.floats(0.01, 16.0)))
    rope = {"rope_type": "llama3", "factor": data.draw(factors), "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": data.draw(st.integers(8, 2 * lmax))}
    raw = attach(data.draw, raw, rope, data.draw(thetas), prf)
    assert_same(raw, "llama3", data.draw(st.one_of(st.none(), st.integers(1, 10**6))))


@SETTINGS
@given(st.data())
def test_proportional_matches_transformers(data):
    raw, _, _ = data.draw(base_config())
    # any fraction: int(head_dim * prf) may be odd (head_dim 64, prf 0.3: 9 rotated pairs), which only this type allows
    prf = data.draw(st.one_of(st.sampled_from([1.0, 0.5, 0.25, 0.75, 0.125, 0.3]), st.floats(0.05, 1.0)))
    head_dim = raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
    assume(int(prf * head_dim // 2) > 0)
    rope = {"rope_type": "proportional"}
    if data.draw(st.booleans()):
        rope["factor"] = data.draw(factors)
    raw = attach(data.draw, raw, rope, data.draw(thetas), prf)
    assert_same(raw, "proportional", None)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_per_layer_type_config_matches_transformers(data):
    """Gemma 3 style: rope_parameters keyed by layer type; each layer type selects its own entry."""
    head_dim = data.draw(st.sampled_from([32, 64, 128, 256]))
    full = data.draw(st.sampled_from([
        {"rope_type": "linear", "factor": data.draw(factors)},
        {"rope_type": "default"},
        {"rope_type": "dynamic", "factor": data.draw(factors)},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": data.draw(st.integers(16, 4096))},
    ]))
    raw = {"hidden_size": 64, "num_attention_heads": 2, "head_dim": head_dim, "vocab_size": 32,
           "max_position_embeddings": data.draw(lengths),
           "rope_parameters": {"full_attention": {**full, "rope_theta": data.draw(thetas)},
                               "sliding_attention": {"rope_type": "default", "rope_theta": data.draw(thetas)}}}
    layer_type = data.draw(st.sampled_from(["full_attention", "sliding_attention"]))
    rope_type = raw["rope_parameters"][layer_type]["rope_type"]
    if rope_type == "default":  # Gemma 3's own default computation, per layer type
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
        config = Gemma3TextConfig(**copy.deepcopy(raw))
        expected, _ = Gemma3RotaryEmbedding.compute_default_rope_parameters(config, layer_type=layer_type)
        inv, scaling = rope_parameters(raw, layer_type=layer_type)
        torch.testing.assert_close(inv, expected, rtol=0, atol=0)
        assert scaling == 1.0
    else:
        assert_same(raw, rope_type, seq_lens(data.draw, raw["max_position_embeddings"]), Gemma3TextConfig,
                    layer_type)


def test_transformers_config_object_is_accepted():
    """A transformers config instance (what users hold after from_pretrained) reads the same as its dict."""
    raw = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 8192,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
           "rope_theta": 1e6}
    config = LlamaConfig(**copy.deepcopy(raw))
    inv, scaling = rope_parameters(config)
    expected, expected_scaling = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    torch.testing.assert_close(inv, expected, rtol=0, atol=0)
    assert math.isclose(scaling, expected_scaling, rel_tol=1e-6)
