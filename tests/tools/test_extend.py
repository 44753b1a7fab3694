"""posenc extend: configs written for transformers 4.x / 5.x, checked by transformers itself and the registry."""

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

import posenc
from posenc.cli import main
from posenc._internal.errors import ConfigError
from posenc.extensions import METHODS as REGISTRY, method_names
from posenc.tools.extend import extend_config

METHODS = [m for m in method_names()                   # every config-writing method (DroPE needs training first)
           if REGISTRY[m].fit is None and not REGISTRY[m].recalibrates]

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
QWEN = CONFIGS / "qwen2.5-7b-instruct.json"
ROPE_KEYS = {"rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings",
             "original_max_position_embeddings"}


def hf_frequencies(path: Path, seq_len: int):
    """transformers' own (inv_freq, attention scaling) for a written config.json."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    folder = path.parent / f"hf_{path.stem}"
    folder.mkdir()
    shutil.copy(path, folder / "config.json")
    cfg = AutoConfig.from_pretrained(folder)
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        theta = cfg.rope_parameters["rope_theta"]
        return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim), 1.0, cfg
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, None, seq_len)
    return inv, scaling, cfg


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("method", METHODS)
def test_round_trip_through_transformers(tmp_path, method, version):
    out = tmp_path / "config.json"
    assert main(["extend", str(QWEN), "--target-length", "131072", "--method", method,
                 "--transformers-version", str(version), "--out", str(out)]) == 0
    old, new = json.loads(QWEN.read_text()), json.loads(out.read_text())
    # every key that is not about RoPE / length is untouched
    assert {k: v for k, v in old.items() if k not in ROPE_KEYS} == {k: v for k, v in new.items() if k not in ROPE_KEYS}
    if version == 5:
        assert "rope_scaling" not in new and "rope_theta" not in new and "rope_theta" in new["rope_parameters"]
    else:
        assert "rope_parameters" not in new and "rope_theta" in new
    inv_hf, att_hf, hf_cfg = hf_frequencies(out, 131072)
    inv, att = posenc.rope_parameters(out, 131072)
    assert inv.double().tolist() == pytest.approx(inv_hf.double().tolist(), rel=2e-6)
    assert att == pytest.approx(att_hf)
    expected_lmax = 32768 if REGISTRY[method].keeps_original_length else 131072
    assert hf_cfg.max_position_embeddings == expected_lmax


def test_ntk_theta_is_the_closed_form(tmp_path):
    result = extend_config(QWEN, 131072, "ntk")
    d, s = 128, 4.0
    theta = result.config["rope_parameters"]["rope_theta"]
    assert theta == pytest.approx(1e6 * s ** (d / (d - 2)), rel=1e-6)     # lesson: base * s^(d/(d-2))
    assert result.config["rope_parameters"]["rope_type"] == "default"
    assert any("no 'ntk' rope_type" in n for n in result.notes)
    # the check's bands are NTK's against the original base (as `posenc plot scaling` counts them), not the written
    # default type's against its own raised base (which would call every pair kept)
    from posenc.rope.scaling import frequency_bands

    want = frequency_bands({"head_dim": d, "rope_theta": 1e6, "max_position_embeddings": 131072,
                            "rope_parameters": {"rope_type": "ntk", "factor": s, "rope_theta": 1e6}}, 131072)
    assert {k: result.check["bands"][k] for k in ("kept", "blended", "interpolated")} == \
        {k: want[k] for k in ("kept", "blended", "interpolated")} and want["kept"] < d // 2


def test_yarn_parameters():
    result = extend_config(QWEN, 131072, "yarn")
    assert result.config["rope_parameters"] == {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    assert result.check["bands"]["kept"] == 24 and result.check["attention_scaling"] == pytest.approx(
        0.1 * math.log(4) + 1)
    assert any("fine-tune" in n for n in result.notes)


def test_llama3_uses_published_low_high():
    rp = extend_config(QWEN, 65536, "llama3").config["rope_parameters"]
    assert (rp["low_freq_factor"], rp["high_freq_factor"], rp["factor"]) == (1.0, 4.0, 2.0)


def test_derived_longrope_keeps_short_context_and_interpolates_low_frequencies():
    result = extend_config(QWEN, 131072, "longrope")
    rp = result.config["rope_parameters"]
    assert rp["short_factor"] == [1.0] * 64
    long = rp["long_factor"]
    assert long[0] == 1.0 and long[-1] == pytest.approx(4.0)
    assert all(a <= b + 1e-6 for a, b in zip(long, long[1:]))
    # inside the original context the model sees its own frequencies exactly
    inv_short, _ = posenc.rope_parameters(result.config, 32768)
    assert torch.equal(inv_short, posenc.default_inv_freq(128, 1e6))
    assert any("NOT searched" in n for n in result.notes)


def test_longrope_with_given_factors_matches_transformers_phi3(tmp_path):
    phi = json.loads((CONFIGS / "phi-3.5-mini-instruct.json").read_text())
    (tmp_path / "short.json").write_text(json.dumps(phi["rope_scaling"]["short_factor"]))
    (tmp_path / "long.json").write_text(json.dumps(phi["rope_scaling"]["long_factor"]))
    base = {k: v for k, v in phi.items() if k not in ("rope_scaling", "original_max_position_embeddings")}
    base["max_position_embeddings"] = 4096
    (tmp_path / "in.json").write_text(json.dumps(base))
    out = tmp_path / "config.json"
    assert main(["extend", str(tmp_path / "in.json"), "--target-length", "131072", "--method", "longrope",
                 "--short-factor", str(tmp_path / "short.json"), "--long-factor", str(tmp_path / "long.json"),
                 "--out", str(out)]) == 0
    inv_hf, att_hf, _ = hf_frequencies(out, 131072)
    inv_pub, att_pub = posenc.rope_parameters(CONFIGS / "phi-3.5-mini-instruct.json", 131072)
    inv, att = posenc.rope_parameters(out, 131072)
    assert inv.tolist() == pytest.approx(inv_hf.tolist(), rel=1e-6)
    assert inv.tolist() == pytest.approx(inv_pub.tolist(), rel=1e-6)      # same as the published config
    assert att == pytest.approx(att_pub) == pytest.approx(att_hf)


def test_input_untouched_unless_in_place(tmp_path, capsys):
    src = tmp_path / "config.json"
    shutil.copy(QWEN, src)
    before = src.read_bytes()
    assert main(["extend", str(src), "--target-length", "65536", "--method", "yarn",
                 "--out", str(tmp_path / "new.json")]) == 0
    assert src.read_bytes() == before
    assert "max_position_embeddings: 32768 -> 65536" in capsys.readouterr().out
    assert main(["extend", str(src), "--target-length", "65536", "--method", "yarn", "--out", str(src)]) == 2
    assert "--in-place" in capsys.readouterr().err and src.read_bytes() == before
    assert main(["extend", str(tmp_path), "--target-length", "65536", "--method", "yarn", "--in-place"]) == 0
    assert json.loads(src.read_text())["rope_parameters"]["rope_type"] == "yarn"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "new.json"]   # no temp files left


def test_out_dash_prints_config(capsys):
    assert main(["extend", str(QWEN), "--target-length", "65536", "--method", "linear", "--out", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["rope_parameters"]["rope_type"] == "linear"


def test_existing_scaling_needs_replace():
    with pytest.raises(ConfigError, match="--replace"):
        extend_config(CONFIGS / "llama-3.1-8b.json", 262144, "yarn")
    result = extend_config(CONFIGS / "llama-3.1-8b.json", 262144, "yarn", replace=True, transformers_version=4)
    assert result.config["rope_scaling"] == {"rope_type": "yarn", "factor": 32.0,
                                             "original_max_position_embeddings": 8192}
    assert result.config["rope_theta"] == 500000.0


@pytest.mark.parametrize("args,needle", [
    (["--target-length", "1024", "--method", "yarn"], "must be longer than the original context (32768)"),
    (["--target-length", "65536", "--method", "yarn", "--factor", "0.5"], "factor"),
    (["--target-length", "65536", "--method", "yarn", "--short-factor", "x.json"], "only apply"),
])
def test_bad_arguments_one_line(tmp_path, capsys, args, needle):
    assert main(["extend", str(QWEN), *args, "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("posenc extend: error:") and needle in err[0]


@pytest.mark.parametrize("name,content,needle", [
    ("missing.json", None, "not found"),
    ("bad.json", "{oops", "not valid JSON"),
    ("gpt2.json", (CONFIGS / "gpt2.json").read_text(), "learned"),
    ("bloom.json", (CONFIGS / "bloom-560m.json").read_text(), "ALiBi runs past"),
    ("warp.json", '{"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 512, '
                  '"rope_scaling": {"rope_type": "warp"}}', "unknown rope_type"),
])
def test_bad_configs_one_line(tmp_path, capsys, name, content, needle):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["extend", str(path), "--target-length", "65536", "--method", "yarn",
                 "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and not (tmp_path / "o.json").exists()


def test_bad_longrope_factor_file(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps([1.0] * 10))
    with pytest.raises(ConfigError, match="64 numbers"):
        extend_config(QWEN, 65536, "longrope", short_factor=tmp_path / "s.json", long_factor=tmp_path / "s.json")


GPTJ = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_positions": 2048, "rotary_dim": 64}


def test_gptj_keys_extend_the_key_the_file_uses():
    from transformers import GPTJConfig

    result = extend_config(GPTJ, 8192, "linear")
    assert result.config["n_positions"] == 8192 and "max_position_embeddings" not in result.config
    assert GPTJConfig(**result.config).max_position_embeddings == 8192
    assert result.config["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    assert result.check["bands"]["interpolated"] == 32            # rotary_dim 64 -> 32 pairs, all divided by 4
    assert result.notes[0].startswith("WARNING: transformers' gptj code reads no rope_theta")


def test_ntk_uses_the_rotary_dim_not_the_head_dim():
    from posenc.rope.scaling import ntk_theta

    theta = extend_config(GPTJ, 8192, "ntk").config["rope_parameters"]["rope_theta"]
    assert theta == ntk_theta(1e4, 4.0, 64) == pytest.approx(1e4 * 4 ** (64 / 62), rel=1e-12)


def test_dynamic_note_gives_the_base_at_the_target():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    result = extend_config(QWEN, 131072, "dynamic")
    hf = LlamaConfig(**{k: v for k, v in result.config.items() if k != "architectures"})
    inv_hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, None, 131072)
    base_hf = float(inv_hf[-1].double()) ** (-128 / 126)          # lowest frequency = base^(-(d-2)/d)
    note = next(n for n in result.notes if "stays 32768" in n)
    base, static = (float(x) for x in re.search(r"its base is (\S+) .* would use (\S+)\.", note).groups())
    assert base == pytest.approx(base_hf, rel=1e-5)                  # fp32 frequencies: ~6 digits
    assert static == pytest.approx(1e6 * 4 ** (128 / 126), rel=1e-6)  # static NTK at s = 131072 / 32768


def test_readme_example_on_llama31_needs_and_names_replace(tmp_path, capsys):
    """README: on Llama 3.1 (llama3 scaling already), the plain example is refused naming --replace, and the
    README's --replace form works and reads back as YaRN from the original 8k context."""
    src = CONFIGS / "llama-3.1-8b.json"
    argv = ["extend", str(src), "--target-length", "131072", "--method", "yarn", "--out", str(tmp_path / "new.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--replace" in err and "\n" not in err
    assert main([*argv, "--replace"]) == 0
    new = json.loads((tmp_path / "new.json").read_text())
    assert new["rope_parameters"]["rope_type"] == "yarn"
    assert new["rope_parameters"]["factor"] == 16.0 and new["rope_parameters"]["original_max_position_embeddings"] == 8192
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "--replace --out new.json" in readme


@pytest.mark.parametrize("target,factor,word", [(10**30, None, "target_length"), (2**30 + 1, None, "target_length"),
                                                (65536, 1e300, "factor")])
def test_absurd_targets_and_factors_are_refused(target, factor, word):
    with pytest.raises(ConfigError, match=word):
        extend_config(CONFIGS / "qwen2.5-7b-instruct.json", target, "ntk", factor=factor)


@pytest.mark.parametrize("out", ["{file}/x.json", "/proc/posenc-test/x.json"])
def test_impossible_out_paths_are_one_line(tmp_path, capsys, out):
    (tmp_path / "file").write_text("")
    out = out.format(file=tmp_path / "file")
    assert main(["extend", str(CONFIGS / "qwen2.5-7b-instruct.json"), "--target-length", "65536", "--method",
                 "yarn", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc extend: error:") and "\n" not in err and ("x.json" in err or "posenc-test" in err)


# ---------------------------------------------------------------------------------------------------- audit

@pytest.mark.parametrize("method", [m for m in METHODS if not REGISTRY[m].keeps_original_length])
def test_factor_one_is_refused_where_it_would_only_relabel_the_context(tmp_path, capsys, method):
    """factor 1 changes no frequency; writing max_position_embeddings = target would claim 4x the context for free."""
    out = tmp_path / "o.json"
    assert main(["extend", str(QWEN), "--method", method, "--factor", "1", "--target-length", "131072",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc extend: error: factor must be > 1") and "\n" not in err and not out.exists()
    # dynamic keeps max_position_embeddings at L0 and still rescales past it: factor 1 is its gentlest setting
    result = extend_config(QWEN, 131072, "dynamic", factor=1.0)
    assert result.config["max_position_embeddings"] == 32768 and result.factor == 1.0


def test_longrope_file_errors_name_the_flag(tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1]")
    for where in (str(tmp_path), str(tmp_path / "list.json")):
        assert main(["extend", str(QWEN), "--target-length", "65536", "--method", "longrope", "--longrope", where,
                     "--out", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"posenc extend: error: --longrope {where}:") and "\n" not in err


def test_drope_is_refused_because_a_config_cannot_recalibrate(tmp_path):
    """DroPE's dropped RoPE only works after the model is trained again at its length: extend says so instead of
    writing a config whose model has lost its position signal."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                  "max_position_embeddings": 2048, "rope_theta": 10000.0}))
    with pytest.raises(ConfigError, match="'drope' needs the model trained again at its trained length"):
        extend_config(config, target_length=8192, method="drope")
