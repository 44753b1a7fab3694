"""extend --replace (and pick --config) over a scaling that only raised the base -- Hunyuan's NTK-alpha, posenc's
static ntk, vLLM's dynamic-alpha -- scale from the base the model trained with: the written frequencies at the
original context are the trained ones (for the methods that keep the high-frequency pairs), never the unraised
base's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from posenc.rope.config import load_rope_config
from posenc.rope.scaling import ntk_theta, rope_parameters
from posenc.tools.extend import extend_config
from posenc.tools.pick import pick

HUNYUAN = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "hunyuan-7b-instruct.json"


def config(rope_type: str, value: float) -> dict:
    key = "factor" if rope_type == "ntk" else "alpha"
    return {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, key: value}}


def trained_inv_freq(cfg) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rope_parameters(load_rope_config(cfg))[0]


@pytest.mark.parametrize("rope_type, value", [("ntk_alpha", 1000.0), ("ntk_alpha", 4.0), ("ntk", 8.0),
                                              ("vllm_dynamic_alpha", 50.0)])
@pytest.mark.parametrize("method", ["yarn", "llama3", "linear", "ntk", "dynamic"])
def test_replace_scales_from_the_trained_base(rope_type, value, method):
    cfg = config(rope_type, value)
    trained = trained_inv_freq(cfg)
    want_theta = ntk_theta(10000.0, value, 128)                        # the closed form of the trained base
    assert torch.allclose(trained, 1.0 / want_theta ** (torch.arange(0, 128, 2) / 128), rtol=1e-5)
    res = extend_config(cfg, 16384, method, replace=True)
    written = res.config["rope_parameters"]
    base = written["rope_theta"]
    if method == "ntk":      # written as a raised base: the trained base raised again by the new factor
        assert base == pytest.approx(ntk_theta(want_theta, 4.0, 128), rel=1e-9)
    else:
        assert base == pytest.approx(want_theta, rel=1e-9)
    new = trained_inv_freq(res.config)
    # the highest-frequency pair is kept by every method but PI (which divides it by s): it is the trained one
    top = trained[0] / (4.0 if method == "linear" else 1.0)
    assert float(new[0]) == pytest.approx(float(top), rel=1e-5)
    assert any("trained with it" in n for n in res.notes)


def test_hunyuan_yarn_replace_and_pick_keep_the_ntk_alpha_base():
    raw = json.loads(HUNYUAN.read_text())
    trained = trained_inv_freq(raw)
    res = extend_config(raw, 131072, "yarn", replace=True)
    new = trained_inv_freq(res.config)
    # YaRN keeps the high-frequency pairs: they are the NTK-alpha model's, not 33-100x off as before
    assert torch.allclose(new[:8], trained[:8], rtol=1e-5)
    rec = pick(131072, budget="finetune", config=str(HUNYUAN))
    assert rec.config_snippet["rope_parameters"]["rope_theta"] == pytest.approx(
        res.config["rope_parameters"]["rope_theta"], rel=1e-12)
