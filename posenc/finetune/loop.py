"""The fine-tuning loop: the lab's optimizer step (posenc.lab.train: AdamW with weight decay on matrices, linear
warmup then cosine decay, gradient clipping, bf16 autocast) on PoSE batches, a held-out loss every
``eval_every`` steps, and resumable checkpoints.

A checkpoint is the lab's safetensors file (posenc.lab.checkpoint: the trainable weights, AdamW's state, torch's
RNG, the step and the run's settings, written atomically with a checksum) plus history.json beside it (the losses
so far, written atomically just before the checkpoint, so it always reaches at least the checkpoint's step; on
resume the entries past that step are dropped). Batches are a function of the step alone, so a resumed run
trains on what an uninterrupted one trains on, and its losses and weights are the same step for step.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import torch

from posenc._internal.atomic import atomic_write_json
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


def _read_history(folder: Path, step: int) -> dict:
    """history.json cut at ``step``; CheckpointError when it is missing or does not reach the step."""
    path = folder / HISTORY_FILE
    try:
        doc = json.loads(path.read_text())
        train = [entry for entry in doc["train"] if entry[0] <= step]
        validation = [entry for entry in doc["validation"] if entry[0] <= step]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise CheckpointError(f"checkpoint {path}: missing or unreadable; delete {folder} to start over") from None
    if len(train) != step:
        raise CheckpointError(f"checkpoint {path}: holds {len(train)} steps' losses, the checkpoint {step}; delete "
                              f"{folder} to start over")
    return {"train": train, "validation": validation, "train_s": float(doc.get("train_s", 0.0))}


def _save(folder: Path, view: TrainableView, opt, step: int, run_settings: dict, history: dict) -> None:
    from posenc.lab.checkpoint import save_checkpoint

    atomic_write_json(folder / HISTORY_FILE, history)
    save_checkpoint(folder / CHECKPOINT_FILE, view, opt, step, run_settings)


def _settings_of(path: Path):
    """The run settings a checkpoint's header records (None when unreadable: load_checkpoint then says why), read
    without its tensors, so a run with other settings is named as such before any shape differs."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["settings"])
    except Exception:  # safetensors' own error types for a damaged header; load_checkpoint reports them
        return None


def resume_state(folder: Path, view: TrainableView, opt, run_settings: dict) -> tuple[int, dict]:
    """Load the checkpoint in ``folder`` into ``view`` and ``opt`` -> (its step, the history up to it)."""
    from posenc.lab.checkpoint import load_checkpoint

    path = folder / CHECKPOINT_FILE
    recorded = _settings_of(path)
    if recorded is not None and recorded != run_settings:
        raise CheckpointError(f"checkpoint {path}: was written by a run with other settings; resume with the same "
                              "flags, or use a new --out (or --overwrite) to start over")
    meta = load_checkpoint(path, view, opt)
    return meta["step"], _read_history(folder, meta["step"])


def train_model(model: torch.nn.Module, sampler, settings, *, validate: Callable[[], float], eval_every: int,
                checkpoint: Path, run_settings: dict, resume: bool = False, precision: str = "fp32",
                stop_after: int | None = None, progress: bool = True) -> dict:
    """Train ``model`` (its trainable parameters) for ``settings.steps`` steps (posenc.lab.train.TrainSettings) on
    ``sampler.batch(step)`` (posenc.finetune.data.PoseSampler), calling ``validate()`` after every ``eval_every``
    steps and after the last; checkpoints in the folder ``checkpoint`` every ``settings.ckpt_every`` steps and at
    the end. ``resume``: continue from the checkpoint there (its settings must equal ``run_settings``).
    ``stop_after``: end after that many steps in all (an interruption, for tests).

    -> {"step", "resumed_from", "train": [[step, loss]...], "validation": [[step, loss]...], "train_s" (the
    optimizer steps' seconds, earlier calls' included), "wall_s" (this call's, validation included)}.
    """
    from tqdm.auto import tqdm

    from posenc.lab.train import make_optimizer, train_step

    view = TrainableView(model)
    view.train()
    opt = make_optimizer(view, settings)
    start, history = 0, {"train": [], "validation": [], "train_s": 0.0}
    if resume and (checkpoint / CHECKPOINT_FILE).exists():
        start, history = resume_state(checkpoint, view, opt, run_settings)
    end = settings.steps if stop_after is None else min(settings.steps, stop_after)
    tokens_per_step = sampler.batch_size * sampler.window
    t0 = time.perf_counter()
    bar = tqdm(range(start, end), desc="finetune", initial=start, total=settings.steps, unit="step", leave=False,
               disable=not progress, dynamic_ncols=True, mininterval=0.5)
    for step in bar:
        t_step = time.perf_counter()
        loss = float(train_step(view, view, opt, sampler.batch(step), step, settings, precision=precision))
        history["train_s"] += time.perf_counter() - t_step      # training alone: validation is not counted
        if not math.isfinite(loss):
            raise FloatingPointError(f"finetune: the training loss is {loss} at step {step + 1}; lower --lr")
        done = step + 1
        history["train"].append([done, loss])
        if done % eval_every == 0 or done == settings.steps:
            history["validation"].append([done, validate()])
            view.train()
        rate = done * tokens_per_step / max(history["train_s"], 1e-9)
        bar.set_postfix(loss=f"{loss:.3f}", tokens_s=f"{rate:.0f}", refresh=False)
        if (settings.ckpt_every and done % settings.ckpt_every == 0) or done == end:
            _save(checkpoint, view, opt, done, run_settings, history)
    bar.close()
    model.eval()
    return {"step": max(start, end), "resumed_from": start, **history, "wall_s": time.perf_counter() - t0}
