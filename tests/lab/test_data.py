"""Lab data: the stdlib corpus and its split, user data errors, and the samplers' determinism and sharding."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from posenc._internal.errors import DataError
from posenc.lab import data as D


def test_stdlib_file_list_is_sorted_and_excludes_tests():
    root, files = D.stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert not any({"test", "tests", "site-packages", "__pycache__"} & set(f.parts[:-1]) for f in files)
    assert all(f.suffix == ".py" for f in files)


def test_default_corpus_split_and_provenance():
    corpus = D.load_corpus()
    root, files = D.stdlib_files()
    val = [f for f in files if hashlib.sha256(f.as_posix().encode()).digest()[0] < D.VAL_HASH_THRESHOLD]
    assert corpus.meta["n_files"] == len(files) and corpus.meta["n_val_files"] == len(val)
    assert 0.03 < len(val) / len(files) < 0.2
    assert corpus.meta["python_version"] and len(corpus.meta["files_sha256"]) == 16
    assert corpus.train.dtype == torch.uint8 and corpus.val.dtype == torch.uint8
    first_val = (root / val[0]).read_bytes()
    assert bytes(corpus.val[:len(first_val)].tolist()) == first_val


def test_user_folder_and_file(tmp_path):
    for i in range(40):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"document {i} " * 20)
    (tmp_path / ".hidden").write_text("never read")
    c = D.load_corpus(str(tmp_path))
    assert c.meta["n_files"] == 40 and len(c.train) + len(c.val) > 40 * 200
    assert b"never" not in bytes(c.train.tolist()) + bytes(c.val.tolist())
    one = tmp_path / "doc00.txt"
    c1 = D.load_corpus(str(one))
    assert len(c1.train) + len(c1.val) == len(one.read_bytes()) and c1.meta["split"] == "last 10% of bytes"


def test_missing_and_empty_data_raise_naming_the_path(tmp_path):
    with pytest.raises(DataError, match="nope.txt does not exist"):
        D.load_corpus(str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(DataError, match="empty.txt is empty"):
        D.load_corpus(str(empty))
    folder = tmp_path / "void"
    folder.mkdir()
    with pytest.raises(DataError, match="void holds no files"):
        D.load_corpus(str(folder))


def test_lm_sampler_is_a_function_of_seed_and_step_and_shards_by_rank():
    tokens = torch.arange(5000) % 251
    s = D.LMSampler(tokens.to(torch.uint8), 16, 6, seed=3)
    x, y = s.batch(7)
    assert torch.equal(x, D.LMSampler(tokens.to(torch.uint8), 16, 6, seed=3).batch(7)[0])
    assert not torch.equal(x, s.batch(8)[0]) and not torch.equal(x, D.LMSampler(tokens.to(torch.uint8), 16, 6, 4).batch(7)[0])
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next bytes
    shards = [s.batch(7, rank=r, world_size=3)[0] for r in range(3)]
    assert torch.equal(torch.stack([shards[r][i] for i in range(2) for r in range(3)]), x)
    with pytest.raises(DataError, match="seq_len"):
        D.LMSampler(tokens[:10].to(torch.uint8), 16, 2, 0)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_or_a_pipe_as_data_is_refused_as_such(tmp_path, capsys):
    """Not "a folder with no files": /dev/zero is a device (reading it would never end), a FIFO a pipe."""
    import os

    from posenc.cli import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        with pytest.raises(DataError, match=f"data: {path} is not a regular file or a folder"):
            D.load_corpus(path)
    assert main(["lab", "--preset", "smoke", "--data", "/dev/zero", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("posenc lab: error: --data: /dev/zero is not a regular file or a folder (a device, a pipe or a "
                   "socket); expected a text file or a folder of text files"), err
