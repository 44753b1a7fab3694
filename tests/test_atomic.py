"""posenc._atomic: writes replace a regular file whole, follow symlinks, and refuse nodes that are not files."""

from __future__ import annotations

import os
import stat

import pytest

from posenc._atomic import atomic_write_json, atomic_write_text
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
