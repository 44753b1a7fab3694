"""Checkpoints detect damage: payload bytes, edited metadata and impossible steps are named errors, not silent
resumes; a killed writer's temporary is cleaned by the next write."""

import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from posenc._internal.atomic import atomic_write_text
from posenc._internal.errors import CheckpointError
from posenc.lab.checkpoint import load_checkpoint, payload_sha256, read_checkpoint, save_checkpoint


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))


def _save(path, step=5, steps=10):
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    save_checkpoint(path, model, opt, step, {"train": {"steps": steps}})
    return model


def _header(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8:8 + n])


def _rewrite_metadata(path, **changes):
    """Edit metadata strings in place (same header length is not needed: rewrite the whole file)."""
    raw, n, header = _header(path)
    header["__metadata__"].update(changes)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_round_trip_and_checksum_present(tmp_path):
    path = tmp_path / "c.safetensors"
    model = _save(path)
    tensors, meta = read_checkpoint(path)
    assert meta["step"] == 5 and len(meta["sha256"]) == 64
    other = _model()
    load_checkpoint(path, other)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


def test_overwritten_payload_is_detected(tmp_path):
    path = tmp_path / "c.safetensors"
    _save(path)
    raw, n, _ = _header(path)
    start = 8 + n + (len(raw) - 8 - n) // 3
    damaged = bytearray(raw)
    damaged[start:start + 4096] = os.urandom(min(4096, len(raw) - start))
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match=r"c\.safetensors.*checksum"):
        load_checkpoint(path, _model())


@pytest.mark.parametrize("step", ["999999", "-50", "3"])
def test_edited_metadata_is_detected(tmp_path, step):
    path = tmp_path / "c.safetensors"
    _save(path)
    _rewrite_metadata(path, step=step)
    with pytest.raises(CheckpointError, match="checksum"):
        read_checkpoint(path)


@pytest.mark.parametrize("step", [999999, -50])
def test_step_outside_the_run_is_refused_even_with_a_valid_checksum(tmp_path, step):
    path = tmp_path / "c.safetensors"
    _save(path)
    _, _, header = _header(path)
    meta = dict(header["__metadata__"], step=str(step))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta.pop("sha256")
    _rewrite_metadata(path, step=str(step), sha256=payload_sha256(tensors, meta))
    with pytest.raises(CheckpointError, match=rf"invalid metadata step={step}"):
        read_checkpoint(path)


def test_killed_writer_temporary_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "results.json"
    # a writer killed between creating its temporary and the rename leaves '.results.json.<pid>.<rand>.tmp.json'
    code = ("import os, tempfile, sys; d = sys.argv[1]; "
            "fd, p = tempfile.mkstemp(dir=d, prefix=f'.results.json.{os.getpid()}.', suffix='.tmp.json'); "
            "os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)])
    assert len(list(tmp_path.glob(".results.json.*.tmp*"))) == 1
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}" and not list(tmp_path.glob(".results.json.*"))


def _resave(path, edit):
    """Rewrite a checkpoint with ``edit(tensors, meta)`` applied and a valid checksum (a crafted, not damaged,
    file: the checks below must not rely on the checksum)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors, meta)
    meta["sha256"] = payload_sha256(tensors, meta)
    save_file(tensors, str(path), metadata=meta)


@pytest.mark.parametrize("edit, message", [
    (lambda t, m: t.__setitem__("rng.torch", t["rng.torch"].float()), "invalid RNG state"),
    (lambda t, m: t.__setitem__("optim.x.exp_avg", t.pop("optim.0.exp_avg")), "invalid optimizer entry 'optim.x"),
    (lambda t, m: m.__setitem__("param_groups", m["param_groups"].replace('"eps": 1e-08', '"eps": 0.5')),
     r"optimizer hyperparameters \['eps'\] differ"),
])
def test_crafted_metadata_is_refused_by_name(tmp_path, edit, message):
    path = tmp_path / "c.safetensors"
    _save(path)
    _resave(path, edit)
    model = _model()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, model, torch.optim.AdamW(model.parameters()))
