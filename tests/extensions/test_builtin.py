"""The built-in extension methods: the configs they write, checked through the rope-type registry against the
closed forms (PI, NTK), the published Llama 3.1 bands, and transformers' own reading of the transformers form."""

from __future__ import annotations

import pytest
import torch

from posenc import default_inv_freq, frequency_bands, rope_parameters
from posenc.extensions import (METHODS, ExtensionSpec, longrope_initial_factors, method_config, method_names,
                               transformers_config)

SPEC = ExtensionSpec(original=128, factor=8.0, rotary_dim=32, theta=10000.0)


def _freqs(config, spec=SPEC, seq_len=None):
    mapping = {"head_dim": spec.head_dim, "max_position_embeddings": config.max_position_embeddings,
               "rope_parameters": {"rope_theta": spec.theta, **config.scaling}}
    return rope_parameters(mapping, seq_len=seq_len)


def test_builtins_in_order_with_labels():
    assert method_names()[:6] == ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
    assert [METHODS[m].label for m in method_names()[:6]] == ["PI", "NTK-aware", "dynamic NTK", "YaRN", "Llama 3",
                                                              "LongRoPE"]
    assert METHODS["linear"].expects_finetune and not METHODS["ntk"].expects_finetune


def test_pi_divides_every_frequency_and_ntk_keeps_the_highest():
    base = default_inv_freq(32, 10000.0)
    pi, _ = _freqs(method_config("linear", SPEC))
    torch.testing.assert_close(pi, base / 8)
    ntk, _ = _freqs(method_config("ntk", SPEC))
    assert ntk[0] == base[0]
    torch.testing.assert_close(ntk[-1], base[-1] / 8, rtol=1e-5, atol=0)  # the lowest frequency divided by s


def test_ntk_for_transformers_is_the_equivalent_base_change():
    posenc_form = method_config("ntk", SPEC)
    hf = transformers_config("ntk", posenc_form, SPEC)
    assert hf.scaling["rope_type"] == "default" and hf.scaling["rope_theta"] == pytest.approx(10000 * 8 ** (32 / 30))
    mapping = {"head_dim": 32, "rope_parameters": hf.scaling}
    torch.testing.assert_close(rope_parameters(mapping)[0], _freqs(posenc_form)[0])
    assert any("no 'ntk' rope_type" in n for n in hf.notes)


def test_lengths_written():
    assert method_config("yarn", SPEC).max_position_embeddings == 1024
    assert method_config("yarn", SPEC).scaling["original_max_position_embeddings"] == 128
    dyn = method_config("dynamic", SPEC)
    assert dyn.max_position_embeddings == 128 and METHODS["dynamic"].lab_factor == 1.0
    # dynamic at L = 1024 with s = 8: theta * (8 * 1024 / 128 - 7)^(d/(d-2)), transformers' formula
    inv, _ = _freqs(dyn, seq_len=1024)
    torch.testing.assert_close(inv, default_inv_freq(32, 10000.0 * 57 ** (32 / 30)))


def test_llama3_writes_its_published_defaults_once_and_gives_llama_31_bands():
    spec = ExtensionSpec(original=8192, factor=8.0, rotary_dim=128, theta=500000.0)
    written = method_config("llama3", spec)
    assert written.scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}
    mapping = {"head_dim": 128, "max_position_embeddings": written.max_position_embeddings,
               "rope_parameters": {"rope_theta": 500000.0, **written.scaling}}
    bands = frequency_bands(mapping)
    assert (bands["kept"], bands["blended"], bands["interpolated"]) == (29, 6, 29)  # Llama 3.1 under the llama3 rule


def test_longrope_initialisation_is_yarn_per_pair_ratio_and_lists_are_checked(tmp_path):
    written = method_config("longrope", SPEC)
    assert written.scaling["short_factor"] == [1.0] * 16 and written.notes
    yarn, _ = _freqs(method_config("yarn", SPEC))
    ratio = (default_inv_freq(32, 10000.0).double() / yarn.double()).tolist()
    assert written.scaling["long_factor"] == pytest.approx(ratio, rel=1e-5)
    assert longrope_initial_factors(SPEC) == written.scaling["long_factor"]
    searched = method_config("longrope", SPEC, short_factor=[1.0] * 16, long_factor=[2.0] * 16)
    assert searched.scaling["long_factor"] == [2.0] * 16 and not searched.notes
    with pytest.raises(ValueError, match="long_factor must have rotary_dim // 2 = 16"):
        method_config("longrope", SPEC, short_factor=[1.0] * 16, long_factor=[2.0] * 3)
    with pytest.raises(ValueError, match=r"long_factor\[15\] must be a positive"):
        method_config("longrope", SPEC, short_factor=[1.0] * 16, long_factor=[2.0] * 15 + [-1.0])
    with pytest.raises(ValueError, match="both short_factor and long_factor"):
        method_config("longrope", SPEC, short_factor=[1.0] * 16)
