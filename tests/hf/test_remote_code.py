"""posenc never runs code from a model folder: a config.json or tokenizer_config.json whose auto_map names the
folder's own Python file is either loaded with transformers' own code (a model_type transformers has) or refused in
one line, never imported, never asked about on a terminal -- in eval, search and every loader they use."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers loads the models)")

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.hf.evaluate import eval_main, load_causal_lm, load_tokenizer, read_config  # noqa: E402
from posenc.hf.search import search_main  # noqa: E402
from posenc_hf_folders import fails, tiny_llama  # noqa: E402

EVIL = '''
from pathlib import Path
Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM
class EvilConfig(LlamaConfig):
    model_type = "evil"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
'''


@pytest.fixture
def no_prompt(monkeypatch):
    """transformers' "[y/N]" question would read stdin: answering it fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"posenc let transformers ask: {args[:1]}")

    monkeypatch.setattr(builtins, "input", refuse)


def evil_folder(folder: Path, model_type: str, where: str = "config") -> Path:
    tiny_llama(folder)
    marker = folder / "RAN"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    if where == "config":
        data = json.loads((folder / "config.json").read_text())
        data.update(model_type=model_type, auto_map={"AutoConfig": "evil.EvilConfig",
                                                     "AutoModelForCausalLM": "evil.EvilModel"})
        (folder / "config.json").write_text(json.dumps(data))
    else:
        data = json.loads((folder / "tokenizer_config.json").read_text())
        data.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
        (folder / "tokenizer_config.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("model_type", ["evil", "not-a-type", ""])
def test_a_config_that_needs_the_folders_code_is_refused_in_one_line(tmp_path, capsys, no_prompt, model_type):
    folder = evil_folder(tmp_path / "m", model_type)
    for call in (lambda: read_config(folder), lambda: load_causal_lm(str(folder)),
                 lambda: read_config(tmp_path, folder / "config.json")):
        with pytest.raises(ConfigError, match="posenc never runs code from a model folder") as info:
            call()
        assert "trust_remote_code=True" not in str(info.value) and "\n" not in str(info.value)
    for main, argv in ((eval_main, [str(folder), "--eval-lens", "32", "--eval-tokens", "64", "--no-progress",
                                    "--out", str(tmp_path / "out")]),
                       (search_main, [str(folder), "--target-length", "64", "--out-config",
                                      str(tmp_path / "c.json")])):
        err = fails(capsys, main, "eval" if main is eval_main else "search", argv)
        assert "never runs code from a model folder" in err and "trust_remote_code" not in err
    assert not (folder / "RAN").exists()


def test_a_known_architecture_with_an_auto_map_loads_with_transformers_own_code(tmp_path, no_prompt):
    folder = evil_folder(tmp_path / "m", "llama")
    model, config, _ = load_causal_lm(str(folder))
    assert type(model) is transformers.LlamaForCausalLM and type(config) is transformers.LlamaConfig
    assert not (folder / "RAN").exists()


def test_a_tokenizer_that_needs_the_folders_code_is_refused(tmp_path, no_prompt):
    folder = evil_folder(tmp_path / "m", "llama", where="tokenizer")
    with pytest.raises(ConfigError, match="never runs code from a model folder"):
        load_tokenizer(str(folder))
    assert not (folder / "RAN").exists()


def test_every_loader_in_posenc_passes_trust_remote_code_false():
    """The source law: each from_pretrained / from_config call in the package names NO_REMOTE_CODE or
    trust_remote_code=False (a new loader without it fails here)."""
    import re

    root = Path(__file__).resolve().parents[2] / "posenc"
    calls = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"Auto\w+\.(from_pretrained|from_config)\(", text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start:m.start()].lstrip().startswith((">>>", "#")) or "``" in text[line_start:m.end()]:
                continue
            end = text.find(")\n", m.end())
            calls.append((path.name, text[m.start():end]))
    assert calls
    for name, call in calls:
        assert "NO_REMOTE_CODE" in call or "trust_remote_code=False" in call, (name, call)


class _Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        import os

        return (os.system, (self.cmd,))


@pytest.mark.parametrize("payload", ["tensor-wrapped", "top-level", "nested"])
def test_a_malicious_pickle_is_refused_as_unsafe_without_advising_unsafe_loading(tmp_path, capsys, payload):
    import torch

    folder = tiny_llama(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "RAN"
    evil = _Evil(f"touch {marker}")
    obj = {"tensor-wrapped": {"model.embed_tokens.weight": evil}, "top-level": evil,
           "nested": {"a": [1, {"b": evil}]}}[payload]
    torch.save(obj, folder / "pytorch_model.bin")
    with pytest.raises(ConfigError) as info:
        load_causal_lm(str(folder))
    msg = str(info.value)
    assert "unsafe to load" in msg and "\n" not in msg
    assert "weights_only" not in msg and "trusted source" not in msg and "False" not in msg
    err = fails(capsys, eval_main, "eval", [str(folder), "--eval-lens", "32", "--eval-tokens", "64", "--no-progress",
                                    "--out", str(tmp_path / "out")])
    assert "unsafe to load" in err and "weights_only" not in err
    assert not marker.exists()
