"""The fine-tuning loop: the lab's training loop itself (posenc.lab.train.train: AdamW with weight decay on
matrices, linear warmup then cosine decay, gradient clipping, bf16 autocast, checkpoints; the lab's fine-tuned rows
run it too) on PoSE batches, with a held-out loss every ``eval_every`` steps.

A checkpoint is the lab's safetensors file (posenc.lab.checkpoint: the trainable weights, AdamW's state, torch's
RNG, the step and the run's settings, written atomically with a checksum) plus history.json beside it (the losses
so far, written atomically just before the checkpoint, so it always reaches at least the checkpoint's step; on
resume the entries past that step are dropped). Batches are a function of the step alone, so a resumed run
trains on what an uninterrupted one trains on, and its losses and weights are the same step for step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from posenc._internal.errors import CheckpointError
from posenc.finetune.adapters import TrainableView

CHECKPOINT_FILE = "state.safetensors"
HISTORY_FILE = "history.json"


def validation_loss(model: torch.nn.Module, windows: torch.Tensor, *, precision: str = "fp32") -> float:
    """Mean next-token loss (nats) of ``model`` over ``windows`` LongTensor [n, L + 1] at positions 0 .. L - 1.
    The output head runs a block of positions at a time where the model allows it (posenc eval's
    chunked_losses), so [L, vocab] logits never exist at once at long L. Eval mode, no grad; training mode after."""
    from posenc.hf.eval.adapter import chunked_losses
    from posenc.lab.precision import autocast

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad(), autocast(precision, "cpu"):
            losses = chunked_losses(model)
            for row in windows:
                ids, targets = row[None, :-1], row[None, 1:]
                if losses is not None:
                    per_token = losses(ids, targets)                                     # [1, L]
                else:
                    logits = model(input_ids=ids, use_cache=False).logits.float()         # [1, L, V]
                    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
                total += float(per_token.sum())
                count += per_token.numel()
    finally:
        model.train(was_training)
    return total / count


def _settings_of(path: Path):
    """The run settings a checkpoint's header records (None when unreadable: load_checkpoint then says why), read
    without its tensors, so a run with other settings is named as such before any shape differs."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["settings"])
    except Exception:  # safetensors' own error types for a damaged header; load_checkpoint reports them
        return None


def train_model(model: torch.nn.Module, sampler, settings, *, validate: Callable[[], float], eval_every: int,
                checkpoint: Path, run_settings: dict, resume: bool = False, precision: str = "fp32",
                stop_after: int | None = None, progress: bool = True) -> dict:
    """Train ``model`` (its trainable parameters) for ``settings.steps`` steps (posenc.lab.train.TrainSettings) on
    ``sampler.batch(step)`` (posenc.finetune.data.PoseSampler), calling ``validate()`` after every ``eval_every``
    steps and after the last; checkpoints in the folder ``checkpoint`` every ``settings.ckpt_every`` steps and at
    the end. ``resume``: continue from the checkpoint there (its settings must equal ``run_settings``).
    ``stop_after``: end after that many steps in all (an interruption, for tests).

    The loop is the lab's (posenc.lab.train.train, which the lab's fine-tuned rows run too); this says what a
    fine-tune adds to it: the held-out loss, history.json, a stop at a non-finite loss, its checkpoint record.

    -> {"step", "resumed_from", "train": [[step, loss]...], "validation": [[step, loss]...], "train_s" (the
    optimizer steps' seconds, earlier calls' included), "wall_s" (this call's, validation included)}.
    """
    from posenc.lab.train import TrainJob, train

    path = checkpoint / CHECKPOINT_FILE
    recorded = _settings_of(path) if resume and path.exists() else None
    if recorded is not None and recorded != run_settings:
        raise CheckpointError(f"checkpoint {path}: was written by a run with other settings; resume with the same "
                              "flags, or use a new --out (or --overwrite) to start over")
    # one process on the CPU (rank 0 of 1 whatever torch.distributed says); the record is run_settings as given
    # (it holds the TrainSettings and bf16 itself), so checkpoints written before the loop was shared resume
    job = TrainJob(device="cpu", ckpt_path=path, resume=resume, run_settings=run_settings, stop_after=stop_after,
                   desc="finetune", progress=progress, rank=0, world_size=1, precision=precision,
                   validate=validate, validate_every=eval_every, history_path=checkpoint / HISTORY_FILE,
                   finite=True, settings_as_given=True, restart=f"Delete {checkpoint} to start over",
                   tokens_per_step=sampler.batch_size * sampler.window)
    out = train(TrainableView(model), sampler, settings, job)
    # a resume of a run already past stop_after trains nothing: its step is the checkpoint's
    return {"step": max(out["resumed_from"], out["step"]), "resumed_from": out["resumed_from"],
            "train": out["train"], "validation": out["validation"], "train_s": out["train_s"],
            "wall_s": out["wall_s"]}
