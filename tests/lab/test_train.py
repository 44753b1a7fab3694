"""Training loop and checkpoints: schedule, resume == uninterrupted, safe loading and its errors."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.errors import CheckpointError
from posenc.lab.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from posenc.lab.data import LMSampler
from posenc.lab.tasks.copy import CopySampler
from posenc.lab.train import TrainSettings, lr_at, make_optimizer, train
from posenc.nn.model import ModelConfig, TinyLM

CFG = dict(d_model=32, n_layers=1, n_heads=2, max_len=16)


def _model(scheme="rope", seed=0):
    torch.manual_seed(seed)
    return TinyLM(ModelConfig(scheme=scheme, **CFG))


def test_lr_schedule_warmup_then_cosine():
    s = TrainSettings(steps=110, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, s) == pytest.approx(0.1) and lr_at(9, s) == pytest.approx(1.0)
    assert lr_at(10, s) == pytest.approx(1.0)
    assert lr_at(60, s) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, s) == pytest.approx(0.1)


def test_training_reduces_the_loss():
    tokens = torch.tensor(list(b"abcdefgh" * 400), dtype=torch.uint8)
    r = train(_model(), LMSampler(tokens, 16, 8, 0), TrainSettings(steps=40, warmup=4, lr=1e-2), progress=False)
    assert r["losses"][-1] < 0.5 * r["losses"][0]


@pytest.mark.parametrize("scheme", ["learned", "rope+alibi"])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, scheme):
    sampler = CopySampler(16, 4, seed=1)
    s = TrainSettings(steps=8, warmup=2, lr=1e-2, ckpt_every=3)
    full = _model(scheme)
    r_full = train(full, sampler, s, ckpt_path=tmp_path / "a.safetensors", progress=False)

    ckpt = tmp_path / "b.safetensors"
    first = _model(scheme)
    train(first, sampler, s, ckpt_path=ckpt, stop_after=5, progress=False)  # "interrupted" after 5 steps
    assert read_checkpoint(ckpt)[1]["step"] == 5
    resumed = _model(scheme, seed=123)  # different init: everything must come from the checkpoint
    r2 = train(resumed, sampler, s, ckpt_path=ckpt, resume=True, progress=False)
    assert r2["resumed_from"] == 5 and len(r2["losses"]) == 3
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    assert r2["losses"] == r_full["losses"][5:]
    # resuming a finished run trains nothing and keeps the weights
    again = _model(scheme, seed=7)
    assert train(again, sampler, s, ckpt_path=ckpt, resume=True, progress=False)["losses"] == []
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in full.state_dict().items())


def test_resume_with_other_settings_is_refused(tmp_path):
    ckpt = tmp_path / "c.safetensors"
    sampler = CopySampler(16, 2, seed=0)
    train(_model(), sampler, TrainSettings(steps=2, warmup=1), ckpt_path=ckpt, progress=False)
    with pytest.raises(CheckpointError, match="different settings"):
        train(_model(), sampler, TrainSettings(steps=2, warmup=1, lr=0.5), ckpt_path=ckpt, resume=True,
              progress=False)


def test_checkpoint_roundtrip_restores_optimizer_and_rng(tmp_path):
    model = _model()
    opt = make_optimizer(model, TrainSettings())
    model(torch.randint(0, 256, (2, 8))).sum().backward()
    opt.step()
    save_checkpoint(tmp_path / "x.safetensors", model, opt, 17, {"a": 1})
    expected_rand = torch.rand(3)
    other = _model(seed=5)
    opt2 = make_optimizer(other, TrainSettings())
    meta = load_checkpoint(tmp_path / "x.safetensors", other, opt2)
    assert meta["step"] == 17 and meta["settings"] == {"a": 1}
    assert torch.equal(torch.rand(3), expected_rand)  # RNG state restored to the save point
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i][k], s2[i][k]) for i in s1 for k in s1[i])


def test_corrupt_foreign_and_mismatched_checkpoints_raise(tmp_path):
    model = _model()
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, None, 1)
    data = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="trunc.safetensors: unreadable or corrupt"):
        load_checkpoint(tmp_path / "trunc.safetensors", model)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="unreadable or corrupt"):
        load_checkpoint(tmp_path / "junk.safetensors", model)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(CheckpointError, match="not a posenc lab checkpoint"):
        load_checkpoint(tmp_path / "foreign.safetensors", model)
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_checkpoint(path, _model("learned"))
    wider = TinyLM(ModelConfig(scheme="rope", d_model=64, n_layers=1, n_heads=2, max_len=16))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_checkpoint(path, wider)
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "missing.safetensors", model)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads Linux /proc")
def test_training_memory_does_not_grow_with_the_steps():
    # regression: the kept per-step losses once held ~2 MB each (a 2000-step model grew to 4 GB of RSS)
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="nope", d_model=32, n_layers=1, n_heads=2, max_len=128))
    sampler = CopySampler(128, 16, 0)
    train(model, sampler, TrainSettings(steps=50, warmup=5), progress=False)          # allocator warm-up
    before = _rss_mb()
    result = train(model, sampler, TrainSettings(steps=250, warmup=5), progress=False)
    assert len(result["losses"]) == 250
    assert _rss_mb() - before < 150, "RSS grew with the steps (the leak: ~+500 MB at these settings)"
