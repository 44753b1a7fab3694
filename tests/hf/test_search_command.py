"""`posenc search` on a saved lab model writes a longrope config that transformers loads with the frequencies
posenc gives the searched factors, resumes from its state, and feeds `posenc extend --longrope`."""

from __future__ import annotations

import json
import random

import pytest
import torch

from posenc import rope_parameters
from posenc.cli import main
from posenc.hf.lab_bridge import build_lab_model, save_lab_model
from posenc.rope.apply import default_inv_freq

L0, TARGET, HEAD = 32, 96, 16


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("search")
    torch.manual_seed(0)
    ckpt = save_lab_model(folder / "lm-rope-seed0.safetensors",
                          build_lab_model(scheme="rope", d_model=32, n_layers=1, n_heads=2, max_len=L0))
    rng = random.Random(0)
    text = folder / "text.txt"
    text.write_text(" ".join(rng.choice(["def", "x", "=", "1", "(", ")"]) for _ in range(8000)), encoding="utf-8")
    config = folder / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 2 * HEAD, "num_attention_heads": 2,
                                  "max_position_embeddings": L0, "rope_theta": 10000.0}))
    out = folder / "out"
    argv = ["search", str(ckpt), "--target-length", str(TARGET), "--out", str(out), "--population", "4",
            "--generations", "1", "--windows", "1", "--data", str(text), "--reserved", "10", "--quiet",
            "--config", str(config)]
    assert main(argv) == 0
    return argv, out, config


def test_written_config_loads_in_transformers_with_the_searched_frequencies(searched):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    _, out, _ = searched
    scaling = json.loads((out / "rope_scaling.json").read_text())
    state = json.loads((out / "search.json").read_text())
    assert scaling["rope_type"] == "longrope" and scaling["factor"] == TARGET / L0
    assert scaling["long_factor"] == state["result"]["factors"] == json.loads((out / "long_factor.json").read_text())
    assert scaling["short_factor"] == [1.0] * (HEAD // 2) and scaling["original_max_position_embeddings"] == L0
    config = json.loads((out / "config.json").read_text())  # --config: the Llama config extended with them
    assert config["rope_parameters"]["long_factor"] == scaling["long_factor"]
    assert config["max_position_embeddings"] == TARGET
    ours, attention = rope_parameters(config, seq_len=TARGET)
    theirs, hf_attention = ROPE_INIT_FUNCTIONS["longrope"](LlamaConfig(**config), None, seq_len=TARGET)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(ours, default_inv_freq(HEAD, 1e4) / torch.tensor(scaling["long_factor"]),
                               rtol=1e-6, atol=0)
    assert attention == pytest.approx(hf_attention)


def test_rerun_resumes_and_extend_takes_the_searched_factors(searched, tmp_path, capsys):
    argv, out, config = searched
    before = (out / "rope_scaling.json").read_text()
    capsys.readouterr()
    assert main(argv) == 0  # the finished state: same result, nothing searched again
    assert (out / "rope_scaling.json").read_text() == before
    new = tmp_path / "new.json"
    assert main(["extend", str(config), "--method", "longrope", "--longrope", str(out / "rope_scaling.json"),
                 "--target-length", str(TARGET), "--out", str(new)]) == 0
    assert json.loads(new.read_text())["rope_parameters"] == json.loads((out / "config.json").read_text())[
        "rope_parameters"]


def test_bad_input_is_one_line(searched, tmp_path, capsys):
    argv, out, config = searched
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rope_type": "yarn", "factor": 2.0}))
    assert main(["extend", str(config), "--method", "longrope", "--longrope", str(bad), "--target-length", "96",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "--longrope" in capsys.readouterr().err
    assert main(["search", argv[1], "--target-length", str(L0), "--out", str(tmp_path / "o")]) == 2
    assert f"--target-length must be an integer >= {L0 + 1}" in capsys.readouterr().err


@pytest.mark.parametrize("flags, match", [
    (["--population", "0"], "--population must be an integer >= 4, got 0"),
    (["--generations", "-1"], "--generations must be a non-negative integer, got -1"),
    (["--windows", "0"], "--windows must be a positive integer, got 0"),
    (["--reserved", "-5"], "--reserved must be a non-negative integer, got -5"),
    (["--target-length", "abc"], "argument --target-length: expected an integer, got 'abc'"),
])
def test_options_are_checked_before_the_search_and_named_as_flags(searched, tmp_path, capsys, flags, match):
    """0 is a value, not "the default"; a usage error is one line; nothing is written."""
    argv, _, _ = searched
    base = {"--target-length": str(TARGET), "--out": str(tmp_path / "o")}
    for flag, value in zip(flags[::2], flags[1::2]):
        base[flag] = value
    assert main(["search", argv[1], *[x for kv in base.items() for x in kv], "--quiet"]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
    assert not (tmp_path / "o" / "search.json").exists()


def test_a_bad_config_fails_before_the_search(searched, tmp_path, capsys):
    argv, _, _ = searched
    bad = tmp_path / "alibi.json"
    bad.write_text(json.dumps({"model_type": "mpt", "d_model": 32, "n_heads": 2}))
    assert main(["search", argv[1], "--target-length", str(TARGET), "--out", str(tmp_path / "o"), "--config",
                 str(bad), "--quiet"]) == 2
    assert "--config " in capsys.readouterr().err
    assert not (tmp_path / "o" / "search.json").exists()


def test_the_text_budget_message_names_this_commands_flags(searched, tmp_path, capsys):
    argv, _, _ = searched
    assert main(["search", argv[1], "--target-length", str(TARGET), "--out", str(tmp_path / "o"), "--data",
                 argv[argv.index("--data") + 1], "--windows", "1000", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "lower --windows or --reserved" in err, err


def test_a_transformers_model_folder_goes_to_the_hf_search(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["search", str(tmp_path), "--help"]) == 0
    assert "--heldout-windows" in capsys.readouterr().out           # posenc.hf.search's options
    assert main(["search", str(tmp_path.parent), "--help"]) == 0    # not a model folder: the lab model's options
    assert "--search-seed" in capsys.readouterr().out


def test_a_search_folder_resumes_only_its_own_model(searched, tmp_path, capsys):
    """--out of another model's search: refused (its record would be written as this model's factors)."""
    argv, out, _ = searched
    torch.manual_seed(1)
    other = save_lab_model(tmp_path / "lm-rope-seed1.safetensors",
                           build_lab_model(scheme="rope", d_model=32, n_layers=1, n_heads=2, max_len=L0))
    before = (out / "search.json").read_bytes()
    assert main(["search", str(other), *argv[2:]]) == 2
    err = capsys.readouterr().err
    assert "was written by a search with other arguments" in err and "(--fresh)" in err, err
    assert (out / "search.json").read_bytes() == before
    assert main(argv) == 0                                # its own model resumes the finished record


def test_a_missing_source_is_named(tmp_path, capsys):
    assert main(["search", str(tmp_path / "nowhere"), "--target-length", "64", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"source {tmp_path / 'nowhere'}: no such file or folder" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
