"""posenc._internal.outputs.check_output, the one rule for what a command may write: never a model's file (weights,
tokenizer, a model folder's config), never one of its inputs, never a folder it replaces that holds an input, never
a path through a loop of symbolic links; a new path inside an input folder is fine. The commands' own use of it is
tested in tests/hf/test_output_guard.py (convert, export, eval, search) and here (extend, plot, lab)."""

from __future__ import annotations

import json

import pytest

from posenc._internal.outputs import check_output, model_file
from posenc.cli import main
from posenc._internal.errors import ConfigError

CONFIG = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096,
          "rope_theta": 10000.0}


@pytest.fixture
def model(tmp_path):
    """A model folder's files (contents do not matter: names and company decide)."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "special_tokens_map.json"):
        (folder / name).write_bytes(b"x")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def test_model_files_are_recognised_by_name_content_and_company(tmp_path, model):
    assert model_file(model / "model.safetensors") == "a model's weights file"
    assert model_file(model / "tokenizer.json") == "a model's tokenizer file"
    assert "config.json of the model folder" in model_file(model / "config.json")
    assert "special_tokens_map.json of the model folder" in model_file(model / "special_tokens_map.json")
    (tmp_path / "renamed.dat").write_bytes(b"GGUF\x03\x00\x00\x00")        # a GGUF file by its magic
    assert model_file(tmp_path / "renamed.dat") == "a model's weights file"
    (tmp_path / "shard-00001.bin").write_bytes(b"x")
    assert model_file(tmp_path / "shard-00001.bin") == "a model's weights file"
    # a config.json without weights beside it (posenc extend's output, a GGUF's sibling) is an ordinary file
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    (plain / "m.gguf").write_bytes(b"GGUF")
    assert model_file(plain / "config.json") is None
    assert model_file(tmp_path / "missing.safetensors") is None and model_file(model) is None


def test_check_output_refuses_model_files_inputs_and_loops(tmp_path, model):
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        with pytest.raises(ConfigError, match=r"^--out .*: is a model's .* even with --overwrite: give a new path$|"
                                              r"^--out .*: is the config.json of the model folder"):
            check_output(model / name, f"--out {model / name}")
    link = tmp_path / "link.json"
    link.symlink_to(model / "model.safetensors")
    with pytest.raises(ConfigError, match=r"is a model's weights file \(through a link: .*model.safetensors\)"):
        check_output(link, "--out x")
    data = tmp_path / "data.txt"
    data.write_text("text")
    with pytest.raises(ConfigError, match=r"^out o \(--out\): is the --data .*data.txt, which this command reads"):
        check_output(data, "out o (--out)", inputs=[("--data", data)])
    # a folder replaced as a whole may not hold an input; a folder written into may, and a new path inside
    # an input folder is fine
    with pytest.raises(ConfigError, match="holds the --data .*data.txt; the command replaces its output folder"):
        check_output(tmp_path, "out o (--out)", inputs=[("--data", data)], replaces_folder=True)
    assert check_output(tmp_path, "out", inputs=[("--data", data)]) == tmp_path
    assert check_output(model / "exported", "out", inputs=[("model", model)], replaces_folder=True)
    assert check_output(model / "config.longrope-64.json", "out", inputs=[("model", model), ("--data", None)])
    with pytest.raises(ConfigError, match="its file data.txt: is the --data"):
        check_output(tmp_path, "out", inputs=[("--data", data)], writes=["data.txt"])
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for path in (loop, loop / "x.json"):
        with pytest.raises(ConfigError, match=r"^--out .*: the path runs into a loop of symbolic links"):
            check_output(path, f"--out {path}")


def test_extend_never_writes_over_a_model_file_or_its_factor_files(tmp_path, model, capsys):
    """`posenc extend --out MODEL/model.safetensors` replaced the weights with a JSON config, with no flag."""
    source = tmp_path / "source.json"
    source.write_text(json.dumps(CONFIG))
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    argv = ["extend", str(source), "--target-length", "16384", "--method", "yarn", "--out"]
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        capsys.readouterr()
        assert main([*argv, str(model / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"posenc extend: error: --out {model / name}: is ") and "\n" not in err, err
    factors = tmp_path / "factors.json"
    factors.write_text(json.dumps({"short_factor": [1.0] * 32, "long_factor": [2.0] * 32}))
    capsys.readouterr()
    assert main(["extend", str(source), "--target-length", "16384", "--method", "longrope", "--longrope",
                 str(factors), "--out", str(factors)]) == 2
    assert "is the --longrope file" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert main([*argv, str(tmp_path / "new.json")]) == 0      # a new file is what extend is for


def test_plot_and_lab_name_a_symlink_loop_out(tmp_path, capsys):
    loop = tmp_path / "loop.png"
    loop.symlink_to(loop)
    for argv in (["plot", "alibi", "--out", str(loop)],
                 ["lab", "--preset", "smoke", "--out", str(tmp_path / "loop.png" / "run")]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "loop of symbolic links" in err and "\n" not in err and "internal error" not in err, err
