"""Training loop and checkpoints: schedule, resume == uninterrupted, safe loading and its errors."""

from __future__ import annotations

import math

import pytest
import torch

from posenc._internal.errors import CheckpointError
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


def test_training_to_a_criterion_stops_at_the_first_check_that_holds(tmp_path):
    sampler = CopySampler(16, 4, seed=1)
    s = TrainSettings(steps=30, warmup=2, lr=1e-2, ckpt_every=7)
    checks: list[int] = []

    def until_step(n, model):
        def until():
            assert not model.training and not torch.is_grad_enabled()  # checked like an evaluation
            checks.append(len(checks))
            return len(checks) * 5 >= n
        return until

    ckpt = tmp_path / "u.safetensors"
    stopped = _model()
    r = train(stopped, sampler, s, ckpt_path=ckpt, until=until_step(15, stopped), check_every=5, progress=False)
    assert r["step"] == 15 and r["criterion_met"] and len(r["losses"]) == 15 and len(checks) == 3
    assert stopped.training is False and read_checkpoint(ckpt)[1]["step"] == 15
    # the steps before the stop are an uninterrupted run's (same schedule: steps stays the cap)
    plain = _model()
    r_plain = train(plain, sampler, s, stop_after=15, progress=False)
    assert r_plain["losses"] == r["losses"] and not r_plain["criterion_met"]
    assert all(torch.equal(v, stopped.state_dict()[k]) for k, v in plain.state_dict().items())
    # resuming a run that met its criterion checks once and trains nothing
    checks.clear()
    again = _model(seed=3)
    r2 = train(again, sampler, s, ckpt_path=ckpt, resume=True, until=lambda: True, check_every=5, progress=False)
    assert r2["step"] == 15 and r2["losses"] == [] and r2["criterion_met"]
    # a criterion never met: the cap
    r3 = train(_model(), sampler, s, until=lambda: False, check_every=5, progress=False)
    assert r3["step"] == 30 and not r3["criterion_met"]


def test_a_resume_between_checks_makes_no_check_the_uninterrupted_run_did_not(tmp_path):
    """Checkpoints every 7 steps, checks every 5: a run killed after its step-7 checkpoint resumes without checking
    at step 7 (an uninterrupted run checks at 5 and 10 only), so it stops where the uninterrupted run stops."""
    sampler = CopySampler(16, 4, seed=1)
    s = TrainSettings(steps=30, warmup=2, lr=1e-2, ckpt_every=7)
    ckpt = tmp_path / "k.safetensors"
    first = train(_model(), sampler, s, ckpt_path=ckpt, stop_after=7, progress=False)
    assert first["step"] == 7
    checked_at: list[int] = []
    model = _model()

    def until():
        checked_at.append(1)
        return True

    r = train(model, sampler, s, ckpt_path=ckpt, resume=True, until=until, check_every=5, progress=False)
    assert r["resumed_from"] == 7 and r["step"] == 10 and len(checked_at) == 1
    reference = train(_model(), sampler, s, until=lambda: True, check_every=5, check_from=5, progress=False)
    assert reference["step"] == 10


def test_no_check_before_check_from():
    # a length warmup's steps cannot pass the criterion: the first check comes after check_from, also on resume
    sampler = CopySampler(16, 4, seed=1)
    s = TrainSettings(steps=30, warmup=2, lr=1e-2)
    calls: list[int] = []

    def until():
        calls.append(1)
        return True

    r = train(_model(), sampler, s, until=until, check_every=5, check_from=10, progress=False)
    assert r["step"] == 15 and r["criterion_met"] and len(calls) == 1
    with pytest.raises(Exception, match="check_from"):
        train(_model(), sampler, s, until=until, check_from=-1, progress=False)


def test_check_every_must_be_positive():
    from posenc._internal.errors import ConfigError

    with pytest.raises(ConfigError, match="check_every"):
        train(_model(), CopySampler(16, 2, seed=0), TrainSettings(steps=2, warmup=1), until=lambda: True,
              check_every=0, progress=False)


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_bias_lr_scale_multiplies_the_step_of_learned_logit_biases_only(scale):
    # Adam's first step moves every weight with a gradient by lr * g / (|g| + eps) ~ lr: the scheme's own weights
    # (T5's bias table) by lr * scale, all others by lr; decay lr * weight_decay per step either way
    from posenc.lab.train import train_step

    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="t5", **CFG))
    s = TrainSettings(steps=10, warmup=1, lr=1e-3, weight_decay=0.0, bias_lr_scale=scale)
    opt = make_optimizer(model, s)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_step(model, model, opt, CopySampler(16, 4, seed=0).batch(0), 0, s)
    moved = {k: (v - before[k]).abs() for k, v in model.state_dict().items()}
    table = moved["scheme.table.weight"]
    assert table.max() == pytest.approx(1e-3 * scale, rel=1e-3)
    assert moved["blocks.0.attn.qkv.weight"].max() == pytest.approx(1e-3, rel=1e-3)
    if scale != 1:  # the scaled groups keep lr * weight_decay: weight decay divided by the scale
        decayed = make_optimizer(model, TrainSettings(weight_decay=0.1, bias_lr_scale=scale)).param_groups
        assert [g["weight_decay"] * g.get("lr_scale", 1) for g in decayed] == pytest.approx([0.1, 0, 0.1, 0])
    else:
        assert len(opt.param_groups) == 2  # unchanged optimizer (older checkpoints load)
    # only logit biases are scaled: CoPE's embeddings enter through q . e, like a key
    torch.manual_seed(0)
    cope = TinyLM(ModelConfig(scheme="cope", **CFG))
    assert not cope.scheme.learned_bias and len(make_optimizer(cope, s).param_groups) == 2


# ---- what posenc finetune adds to this loop (posenc.finetune.loop runs it): held-out loss, history, finite ----

def test_validation_and_history_resume_as_an_uninterrupted_run(tmp_path):
    """A held-out loss after every 3rd step and the last, the run's losses kept in history.json beside the
    checkpoint: a run stopped at step 4 (checkpoint at 4, history.json reaching it) resumes to the uninterrupted
    run's losses, held-out losses and weights; validation runs in eval mode without grad and is not training
    time."""
    import json
    import time

    sampler = CopySampler(16, 4, seed=1)
    s = TrainSettings(steps=7, warmup=2, lr=1e-2, ckpt_every=2)
    val = CopySampler(16, 4, seed=99).batch(0)

    def held_out(model):
        def validate():
            assert not model.training and not torch.is_grad_enabled()
            time.sleep(0.02)
            return float(torch.nn.functional.cross_entropy(model(val[0]).transpose(1, 2), val[1]))
        return validate

    def run(model, folder, **extra):
        return train(model, sampler, s, ckpt_path=folder / "state.safetensors", history_path=folder / "h.json",
                     validate=held_out(model), validate_every=3, progress=False, **extra)

    whole = _model()
    r = run(whole, tmp_path / "whole")
    assert [step for step, _ in r["validation"]] == [3, 6, 7] and [step for step, _ in r["train"]] == list(range(1, 8))
    assert [loss for _, loss in r["train"]] == r["losses"]
    assert r["wall_s"] >= r["train_s"] + 3 * 0.02            # the held-out losses' time is not training time
    part = tmp_path / "part"
    assert run(_model(), part, stop_after=4)["step"] == 4
    assert len(json.loads((part / "h.json").read_text())["train"]) == 4
    resumed = _model(seed=5)
    r2 = run(resumed, part, resume=True)
    assert r2["resumed_from"] == 4 and r2["train"] == r["train"] and r2["validation"] == r["validation"]
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in whole.state_dict().items())
    # the same run without validation or history trains the same weights: validation changes nothing
    plain = _model()
    assert train(plain, sampler, s, progress=False)["losses"] == r["losses"]
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in whole.state_dict().items())
    # a history that does not reach its checkpoint's step is refused, naming the folder to delete
    (part / "h.json").write_text(json.dumps({"train": [[1, 1.0]], "validation": []}))
    with pytest.raises(CheckpointError, match="holds 1 steps' losses, the checkpoint 7; delete"):
        run(_model(), part, resume=True)


def test_a_non_finite_loss_stops_training_with_the_step():
    model = _model()
    with torch.no_grad():
        model.tok_emb.weight.fill_(float("nan"))   # every logit NaN, so the first step's loss is
    with pytest.raises(FloatingPointError, match="demo: the training loss is nan at step 1; lower --lr"):
        train(model, CopySampler(16, 2, seed=0), TrainSettings(steps=3, warmup=1), finite=True, desc="demo",
              progress=False)
