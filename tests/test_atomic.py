"""posenc._internal.atomic: writes replace a regular file whole, follow symlinks, and refuse nodes that are not files."""

from __future__ import annotations

import os
import stat

import pytest

from posenc._internal.atomic import atomic_write_json, atomic_write_text
from posenc.cli import main


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write_json(target, {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_fifo_or_a_folder_is_refused_and_left_alone(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="it is a FIFO, not a regular file"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        atomic_write_text(tmp_path, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]          # no temporaries either


def test_the_cli_reports_a_fifo_out_in_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, '
                      '"max_position_embeddings": 4096, "rope_theta": 10000.0}')
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    status = main(["extend", str(config), "--target-length", "16384", "--method", "yarn", "--out", str(fifo)])
    err = capsys.readouterr().err
    assert status == 2 and "not a regular file" in err and err.count("\n") == 1
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_write_gets_the_mode_a_plain_open_would_give(tmp_path):
    """mkstemp makes its temporaries 0600: what lands honours the umask as open() does (0666 less the umask)."""
    previous = os.umask(0o002)
    try:
        (tmp_path / "plain.txt").write_text("x")
        atomic_write_text(tmp_path / "atomic.txt", "x")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "atomic.txt").st_mode & 0o777 == os.stat(tmp_path / "plain.txt").st_mode & 0o777 \
        == 0o664


def test_a_folder_write_lands_whole_or_not_at_all(tmp_path):
    from posenc._internal.atomic import atomic_folder

    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_folder(out) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"] and (out / "old.txt").read_text() == "old"
    previous = os.umask(0o027)
    try:
        with atomic_folder(out) as tmp:
            (tmp / "sub").mkdir()
            fd = os.open(tmp / "sub" / "w.bin", os.O_CREAT | os.O_WRONLY, 0o600)   # as save_pretrained leaves it
            os.close(fd)
    finally:
        os.umask(previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"] and [p.name for p in out.iterdir()] == ["sub"]
    assert [oct(p.stat().st_mode & 0o777) for p in (out, out / "sub", out / "sub" / "w.bin")] == \
        [oct(0o750), oct(0o750), oct(0o640)]


def test_temporaries_in_progress_are_registered_and_a_killed_writers_are_removed(tmp_path):
    """What posenc._internal.faults' watcher deletes before it ends a process stuck in a C call; and a folder left by a
    SIGKILLed writer (its pid gone) is removed by the next write to the same path."""
    import subprocess
    import sys

    from posenc._internal.atomic import atomic_folder, pending_temporaries, remove_pending_temporaries

    with pytest.raises(FileNotFoundError):
        with atomic_folder(tmp_path / "out") as tmp:
            (tmp / "weights").write_bytes(b"x" * 1000)
            assert pending_temporaries() == [tmp]
            remove_pending_temporaries()
            assert not tmp.exists() and pending_temporaries() == []
    assert list(tmp_path.iterdir()) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".out.{dead}.abc123.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    with atomic_folder(tmp_path / "out") as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
