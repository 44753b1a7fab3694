"""posenc tune on a GGUF file (a tiny Llama written by the tests): when a frequency method llama.cpp runs wins, tune
also writes the GGUF file and prints the llama.cpp flags, through posenc extend's own code (the same bytes as
`posenc extend MODEL.gguf --out NEW.gguf`); when llama.cpp cannot run the winner (dynamic NTK), it says so and
writes no GGUF. A synthetic scorer decides the winner (no model run)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc.cli import main  # noqa: E402
from posenc.gguf import read_gguf  # noqa: E402
from posenc.hf.tune import measure  # noqa: E402
from posenc_gguf_files import tiny_llama_gguf  # noqa: E402

TRAINED, TARGET = 64, 128


def _scorer(best: str):
    """Window losses where ``best`` is clearly lowest at the target and nothing moves at the trained length."""
    def loss(model_dir, s):
        if s.eval_lens[0] == TRAINED:
            return 3.0
        return (1.0 if s.methods[0] == best else 2.0) + 0.01 * (s.eval_offset // s.eval_lens[0])
    return loss


def tune(path, out, methods) -> int:
    return main(["tune", str(path), "--target-length", str(TARGET), "--methods", methods, "--threads", "1",
                 "--no-progress", "--out", str(out)])


def test_yarn_winner_writes_the_gguf_posenc_extend_writes(tmp_path, monkeypatch, capsys):
    src = tiny_llama_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(measure, "window_loss", _scorer("yarn"))
    out = tmp_path / "o"
    assert tune(src, out, "linear,yarn") == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    assert doc["answer"]["winner"] == "yarn" and doc["gguf"]["file"] == "extended.gguf"
    written = read_gguf(out / "extended.gguf")
    assert written.metadata["llama.rope.scaling.type"] == "yarn"
    assert written.metadata["llama.rope.scaling.factor"] == pytest.approx(2.0)
    assert written.metadata["llama.context_length"] == TARGET
    assert f"llama.cpp: llama-cli -m {out / 'extended.gguf'} {' '.join(doc['gguf']['flags'])}" in printed
    assert "## llama.cpp" in (out / "report.md").read_text()
    # the file posenc extend writes for the same input, method and length, byte for byte
    assert main(["extend", str(src), "--method", "yarn", "--target-length", str(TARGET), "--out",
                 str(tmp_path / "e.gguf")]) == 0
    assert (tmp_path / "e.gguf").read_bytes() == (out / "extended.gguf").read_bytes()
    # posenc pick --config MODEL.gguf --evidence reads the GGUF's identity as tune recorded it, and recommends yarn
    from posenc.tools.pick import pick

    assert pick(TARGET, budget="none", config=str(src), evidence=str(out)).method.startswith("yarn (the best")


def test_a_winner_llama_cpp_cannot_run_writes_no_gguf(tmp_path, monkeypatch, capsys):
    src = tiny_llama_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(measure, "window_loss", _scorer("dynamic"))
    out = tmp_path / "o"
    assert tune(src, out, "dynamic,yarn") == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["answer"]["winner"] == "dynamic" and not (out / "extended.gguf").exists()
    assert "dynamic" in doc["gguf"]["refused"] and "no GGUF written" in capsys.readouterr().out
    assert (out / "config.json").is_file()
