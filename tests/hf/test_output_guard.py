"""No posenc command writes over one of its inputs or over a model's files (posenc._internal.outputs), whatever the flags;
convert checks its --out before the long load; a SIGTERM during a write leaves no temporary folder behind; what
posenc writes for the user has the modes a plain open() would give.

The model files are real: a tiny Llama folder saved by transformers, a tiny Llama GGUF that transformers' GGUF
loader loads (tests/_support/posenc_hf_folders.py), a lab run; each refusal is one line naming the argument, and
every file of the folders is compared byte for byte afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers loads the models)")
pytest.importorskip("gguf", reason="the gguf package writes and reads GGUF files (pip install gguf)")
pytest.importorskip("accelerate", reason="transformers loads GGUF weights with accelerate (pip install accelerate)")

from posenc.cli import main  # noqa: E402
from posenc_hf_folders import lab_run, tiny_gguf, tiny_llama  # noqa: E402

transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parents[2]
CONFIG = '{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096, ' \
         '"rope_theta": 10000.0}'


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones too) -> its bytes; a leftover temporary shows up here."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys, argv: list[str]) -> str:
    """``posenc ARGV`` refused: exit 2 and one line "posenc CMD: error: ..." (no traceback, no internal error)."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posenc {argv[0]}: error: ") and "\n" not in err, err
    assert "internal error" not in err and ".tmp" not in err, err
    return err


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: the checks under test come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


# ---- convert: never over its GGUF file ---------------------------------------------------------------------------

def test_convert_refuses_an_out_that_is_or_holds_the_gguf(tmp_path, capsys, monkeypatch):
    """`--out` equal to the GGUF, its folder or `.` (with --overwrite) deleted the GGUF and the files beside it."""
    models = tmp_path / "models"
    models.mkdir()
    gguf_file = tiny_gguf(models / "tiny.gguf")
    (models / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to(models, target_is_directory=True)
    before = snapshot(tmp_path)
    monkeypatch.chdir(models)
    for out, word in ((str(gguf_file), "is a model's weights file"), (str(models), "holds the input GGUF file"),
                      (".", "holds the input GGUF file"), (str(tmp_path), "holds the input GGUF file"),
                      (str(tmp_path / "link"), "holds the input GGUF file"), ("tiny.gguf", "is a model's weights")):
        err = one_line(capsys, ["convert", "tiny.gguf", "--out", out, "--overwrite", "--no-progress"])
        assert f"out {out} (--out): {word}" in err, err
    assert snapshot(tmp_path) == before
    # a new folder beside the file (or inside its folder) is what convert is for
    assert main(["convert", "tiny.gguf", "--out", "tiny", "--no-progress"]) == 0
    assert (models / "tiny" / "model.safetensors").is_file() and (models / "tiny.gguf").read_bytes() == \
        before["models/tiny.gguf"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_convert_names_an_unwritable_out_before_loading(tmp_path, capsys, no_loading):
    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    err = one_line(capsys, ["convert", str(gguf_file), "--out", "/proc/posenc-x", "--no-progress"])
    assert "out /proc/posenc-x (--out): cannot create files in /proc" in err
    (tmp_path / "file").write_text("x")
    err = one_line(capsys, ["convert", str(gguf_file), "--out", str(tmp_path / "file" / "m"), "--no-progress"])
    assert f"out {tmp_path / 'file' / 'm'} (--out): " in err


# ---- every command: never over a model file ----------------------------------------------------------------------

def test_no_command_writes_over_a_model_file(tmp_path, capsys, no_loading):
    """search --out-config (even with --overwrite), extend --out (no flag needed), convert/export --out, eval/lab
    --out: a model's weights, tokenizer or config.json, a GGUF file, and a symlink to one are refused by name."""
    model = tiny_llama(tmp_path / "model")
    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    run = lab_run(tmp_path / "run")
    (tmp_path / "cfg.json").write_text(CONFIG)
    (tmp_path / "weights-link.json").symlink_to(model / "model.safetensors")
    before = snapshot(tmp_path)
    targets = {model / "model.safetensors": "a model's weights file", model / "tokenizer.json": "a model's tokenizer",
               model / "config.json": f"the config.json of the model folder {model}, which holds weights",
               gguf_file: "a model's weights file", tmp_path / "weights-link.json": "through a link"}
    for target, words in targets.items():
        commands = {
            "search": [str(model), "--target-length", "64", "--out-config", str(target), "--overwrite"],
            "extend": [str(tmp_path / "cfg.json"), "--target-length", "16384", "--method", "yarn", "--out",
                       str(target)],
            "convert": [str(gguf_file), "--out", str(target), "--overwrite"],
            "export": [str(run), "--scheme", "rope", "--out", str(target), "--overwrite"],
        }
        for command, argv in commands.items():
            err = one_line(capsys, [command, *argv])
            assert str(target) in err and words in err and "never writes over a model's" in err, err
        err = one_line(capsys, ["search", str(model), "--target-length", "64", "--out-config",
                                str(tmp_path / "c.json"), "--checkpoint", str(target)])
        assert "(--checkpoint)" in err and ("not a LongRoPE search record" in err or words in err), err
    # a lab model's search writes config.json into --out with --config: never a model folder's own
    err = one_line(capsys, ["search", str(run), "--target-length", "64", "--out", str(model), "--config",
                            str(model / "config.json")])
    assert f"--out {model}, its file config.json: is the config.json of the model folder" in err, err
    assert snapshot(tmp_path) == before


def test_outputs_are_never_inputs(tmp_path, capsys, no_loading):
    """eval --out the model folder, or a folder whose results.json is the --data; lab --out the --data folder."""
    model = tiny_llama(tmp_path / "model")
    data = tmp_path / "texts"
    data.mkdir()
    (data / "results.json").write_text("my corpus " * 100)
    before = snapshot(tmp_path)
    err = one_line(capsys, ["eval", str(model), "--eval-lens", "32", "--out", str(model)])
    assert f"out {model} (--out): is the model {model}" in err
    err = one_line(capsys, ["eval", str(model), "--eval-lens", "32", "--data", str(data / "results.json"),
                            "--out", str(data), "--overwrite"])
    assert f"out {data} (--out), its file results.json: is the --data" in err
    err = one_line(capsys, ["lab", "--preset", "smoke", "--data", str(data), "--out", str(data)])
    assert f"--out {data}: is the --data {data}" in err
    # the lab sets an earlier results.json aside before it runs: never the text it trains on
    err = one_line(capsys, ["lab", "--preset", "smoke", "--data", str(data / "results.json"), "--out", str(data)])
    assert f"--out {data}, its file results.json: is the --data" in err
    assert snapshot(tmp_path) == before


# ---- symlink loops name the argument -----------------------------------------------------------------------------

def test_a_symlink_loop_as_output_is_one_line_naming_the_argument(tmp_path, capsys, no_loading):
    """These were "internal error (a bug in posenc)": Path.resolve raises RuntimeError on a loop."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    model = tiny_llama(tmp_path / "model")
    run = lab_run(tmp_path / "run")
    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "cfg.json").write_text(CONFIG)
    png = tmp_path / "loop.png"
    png.symlink_to(png)
    folders = (loop, loop / "x")
    cases = [
        (["extend", str(tmp_path / "cfg.json"), "--target-length", "16384", "--method", "yarn", "--out"], folders),
        (["export", str(run), "--scheme", "rope", "--out"], folders),
        (["eval", str(model), "--eval-lens", "32", "--out"], folders),
        (["convert", str(gguf_file), "--out"], folders),
        (["search", str(model), "--target-length", "64", "--out-config"], folders),
        (["search", str(model), "--target-length", "64", "--checkpoint"], folders),
        (["search", str(run), "--target-length", "64", "--out"], folders),
        (["lab", "--preset", "smoke", "--out"], folders),
        (["plot", "alibi", "--out"], (png, loop / "x.png")),
    ]
    for argv, outs in cases:
        for out in outs:
            err = one_line(capsys, [*argv, str(out)])
            assert f"{argv[-1]} {out}" in err or f"{argv[-1][2:].replace('-', '_')} {out}" in err, err
            assert "loop of symbolic links" in err, err


# ---- modes -------------------------------------------------------------------------------------------------------

def test_written_model_folders_have_the_modes_open_would_give(tmp_path):
    """transformers' save_pretrained left model.safetensors 0600 and mkdtemp the folder 0700; what lands honours
    the umask like a plain open() / mkdir."""
    from posenc.hf.export import export_lab_model
    from posenc.hf.gguf import convert_gguf

    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    run = lab_run(tmp_path / "run")
    previous = os.umask(0o027)
    try:
        convert_gguf(gguf_file, tmp_path / "converted", progress=False, log=lambda *_: None)
        export_lab_model(run, tmp_path / "exported", scheme="rope", check=False)
    finally:
        os.umask(previous)
    for folder in (tmp_path / "converted", tmp_path / "exported"):
        assert folder.stat().st_mode & 0o777 == 0o750, folder
        files = [p for p in folder.iterdir()]
        assert any(p.suffix == ".safetensors" for p in files)
        for p in files:
            assert p.stat().st_mode & 0o777 == 0o640, (p, oct(p.stat().st_mode))


# ---- SIGTERM during convert's write ------------------------------------------------------------------------------

def _convert_held_in_its_write(tmp_path: Path, hold: str, grace: float | None = None) -> subprocess.Popen:
    """``posenc convert tiny.gguf --out out`` in a child process whose save_pretrained, once the weights are
    written into the temporary folder, writes ``started`` and then runs ``hold`` (Python's sleep, or one long C
    call)."""
    code = f"""
        import sys, time
        from pathlib import Path
        import torch, transformers
        import posenc._internal.faults
        posenc._internal.faults.SIGNAL_GRACE_S = {grace if grace is not None else "posenc._internal.faults.SIGNAL_GRACE_S"}
        save = transformers.PreTrainedModel.save_pretrained
        def held(self, folder, *args, **kwargs):
            save(self, folder, *args, **kwargs)
            Path("started").write_text(str(folder))
            {hold}
        transformers.PreTrainedModel.save_pretrained = held
        from posenc.cli import main
        sys.exit(main(["convert", "tiny.gguf", "--out", "out", "--no-progress"]))
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "_support")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_the_write(tmp_path: Path, proc: subprocess.Popen) -> None:
    end = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the child never reached its write"
        time.sleep(0.05)
    time.sleep(0.3)
    temporary = tmp_path / (tmp_path / "started").read_text()      # (relative to the child's folder)
    assert temporary.parent == tmp_path and temporary.name.startswith(".out.") and temporary.is_dir()
    assert (temporary / "model.safetensors").is_file()     # the weights are being written there


@pytest.mark.parametrize("hold, grace, line", [
    ("time.sleep(120)", None, "posenc convert: terminated"),
    # one long C call: the watcher ends the process after the grace, and removes the temporary folder first
    ("torch.nn.functional.scaled_dot_product_attention(*(torch.randn(1, 1, 300_000, 32),) * 3, is_causal=True)",
     0.5, "posenc convert: terminated inside a long computation that did not return within 0.5 s; stopped at once "
          "(files written before stay; unfinished writes are removed)"),
])
def test_sigterm_during_converts_write_leaves_no_temporary_folder(tmp_path, hold, grace, line):
    tiny_gguf(tmp_path / "tiny.gguf")
    proc = _convert_held_in_its_write(tmp_path, hold, grace)
    _wait_for_the_write(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip() == line, (proc.returncode, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started", "tiny.gguf"]
