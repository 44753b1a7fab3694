"""One fine-tuning core (issue 50): ``posenc finetune``'s loop is the lab's training loop (posenc.lab.train.train,
which the lab's fine-tuned rows run), so the same model, batches and settings train the same weights through
either; and PoSE's position ids are one function's (posenc.pose.pose_position_ids) in the lab's PoSE methods and in
``posenc finetune``'s batches."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.extensions import ExtensionSpec, get_method  # noqa: E402
from posenc.finetune import loop  # noqa: E402
from posenc.finetune.adapters import TrainableView  # noqa: E402
from posenc.finetune.data import PoseSampler  # noqa: E402
from posenc.lab import run as lab_run  # noqa: E402
from posenc.lab import train as lab_train  # noqa: E402
from posenc.lab.data import batch_generator  # noqa: E402
from posenc.lab.train import TrainSettings  # noqa: E402


def llama() -> torch.nn.Module:
    """A random 1-layer LlamaForCausalLM, vocabulary 256, trained context 16, every weight trainable."""
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=16, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_posenc_finetune_trains_what_the_lab_loop_trains(tmp_path, monkeypatch):
    """The same Llama, PoSE batches and settings: ``posenc finetune``'s loop (with its held-out loss, history and
    checkpoints) and the lab's loop as the lab's fine-tunes call it give the same losses and weights, and the
    first goes through the second (one call)."""
    tokens = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(1))
    sampler = PoseSampler(tokens, 12, 64, batch_size=2, seed=3)
    settings = TrainSettings(steps=5, lr=1e-2, warmup=2, weight_decay=0.0, ckpt_every=2)
    windows = tokens[:2 * 33].reshape(2, 33)
    calls = []
    real = lab_train.train

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    tuned = llama()
    monkeypatch.setattr(lab_train, "train", counted)
    got = loop.train_model(tuned, sampler, settings, validate=lambda: loop.validation_loss(tuned, windows),
                           eval_every=2, checkpoint=tmp_path / "ck", run_settings={"any": 1}, progress=False)
    monkeypatch.undo()
    assert len(calls) == 1 and [s for s, _ in got["validation"]] == [2, 4, 5]
    lab = llama()
    assert lab_run.train is lab_train.train           # the lab's fine-tuned rows call this same function
    ref = lab_run.train(TrainableView(lab), sampler, settings, lab_train.TrainJob(progress=False))
    assert [loss for _, loss in got["train"]] == ref["losses"] and len(ref["losses"]) == 5
    a, b = tuned.state_dict(), lab.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pose_ids_are_one_function_in_the_lab_and_in_posenc_finetune():
    """``posenc finetune``'s batch ids at step k are the lab PoSE method's hook (pose-yarn's train_positions) drawn
    from the same generator state: both are posenc.pose.pose_position_ids (the lab draws from torch's global RNG,
    seeded per fine-tune; posenc finetune from a generator per step)."""
    tokens = torch.arange(500) % 256
    window, target, batch = 16, 128, 3
    sampler = PoseSampler(tokens, window, target, chunks=2, batch_size=batch, seed=7)
    hook = get_method("pose-yarn").train_positions
    spec = ExtensionSpec(original=window, factor=target / window, rotary_dim=8)
    for step in (0, 5):
        g = batch_generator(7, step)
        torch.randint(0, len(tokens) - window, (batch,), generator=g)     # the windows' starts, drawn first
        assert torch.equal(sampler.batch(step)[0][:, 1], hook(batch, window, spec, generator=g))
    # the lab's call (no generator: torch's RNG, which its checkpoints restore) draws the same ids from that state
    torch.manual_seed(11)
    lab_ids = hook(batch, window, spec)
    assert torch.equal(lab_ids, hook(batch, window, spec, generator=torch.Generator().manual_seed(11)))
