"""The training loop: AdamW, linear warmup + cosine decay, gradient clipping, checkpoints, resume.

``train(model, sampler, settings)`` is deliberately plain so a distributed wrapper can reuse it: batches come
from ``sampler.batch(step, rank, world_size)`` (a pure function of the global step), the gradient sync is the
wrapper's business (DDP), and only the main process writes checkpoints (``posenc.lab.distributed.is_main_process``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from posenc._internal.validate import check_choice, check_int
from posenc._internal.errors import CheckpointError, ConfigError
from posenc.lab.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from posenc.lab.data import IGNORE
from posenc.lab.distributed import check_batch_size, current, ddp_wrap, is_main_process, sharded_lm_loss
from posenc.lab.precision import autocast


@dataclass
class TrainSettings:
    steps: int = 800
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 50
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    ckpt_every: int = 0  # 0: only at the end
    # learning-rate multiplier for a scheme's learned attention-logit biases (``Scheme.learned_bias``: T5's table,
    # KERPLE's r1/r2, FIRE's MLP). Adam moves every weight by about lr per step whatever its gradient, so a bias
    # that must reach a logit of ~5 needs ~5 / lr steps (1700 at 3e-3), while a projection's many weights shift a
    # logit together. Weight decay keeps its per-step strength.
    bias_lr_scale: float = 1.0


def lr_at(step: int, s: TrainSettings) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine to lr * min_lr_ratio."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, s: TrainSettings, **options) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases or 1-D tables). ``options`` go to AdamW
    (``foreach=True``, ``fused=True``: benchmarks/lab_throughput.py compares them).

    With ``s.bias_lr_scale`` != 1 and a scheme whose parameters are logit biases (``model.scheme.learned_bias``),
    those parameters form two more groups whose ``lr_scale`` multiplies the schedule's rate (``train_step``) and
    whose weight decay is divided by it (AdamW decays by lr * weight_decay per step, kept as for every other weight).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    scale = s.bias_lr_scale
    scaled = scale != 1 and getattr(getattr(model, "scheme", None), "learned_bias", False)
    own = {n for n, _ in params if n.startswith("scheme.")} if scaled else set()

    def decay_split(names_in_own: bool, weight_decay: float, **extra) -> list[dict]:  # matrices decay, the rest not
        chosen = [(n, p) for n, p in params if (n in own) == names_in_own]
        return [{"params": [p for _, p in chosen if p.dim() >= 2], "weight_decay": weight_decay, **extra},
                {"params": [p for _, p in chosen if p.dim() < 2], "weight_decay": 0.0, **extra}]

    groups = decay_split(False, s.weight_decay)
    if own:
        groups += decay_split(True, s.weight_decay / scale, lr_scale=scale)
    return torch.optim.AdamW(groups, lr=s.lr, betas=tuple(s.betas), **options)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over targets != IGNORE. logits [B, T, V], targets [B, T]."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE)


def train_step(net: torch.nn.Module, model: torch.nn.Module, opt: torch.optim.Optimizer, batch, step: int,
               settings: TrainSettings, *, device: str | torch.device = "cpu", precision: str = "fp32",
               world_size: int = 1):
    """One optimizer step at the learning rate of ``step``: forward and loss of ``batch`` = (inputs [B, T],
    targets [B, T]) under ``precision`` ("fp32" or "bf16", posenc.lab.precision), backward, gradient clip, AdamW.

    ``net`` runs the batch (``model`` itself, or its DDP wrapper); ``model`` owns the parameters that are clipped.
    -> the loss: a detached 0-d tensor (read it when needed: no device sync per step), or under DDP
    (``world_size`` > 1) the global batch's mean as a float.
    """
    lr = lr_at(step, settings)
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    inputs, targets = batch[0].to(device), batch[1].to(device)
    with autocast(precision, device):
        if world_size > 1:  # this rank's share of the global batch's mean loss; `shown` is that global mean
            loss, shown = sharded_lm_loss(net(inputs), targets, IGNORE)
        else:
            loss, shown = lm_loss(net(inputs), targets), None
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    opt.step()
    # a fresh 0-d copy: on the CPU (torch 2.13) each kept ``loss.detach()`` held on to about one logits-sized block
    # of memory (2 MB per step at 16 x 128 x 256; 4 GB of RSS after a 2000-step copy-cpu model), clone() does not
    return loss.detach().clone() if shown is None else shown


@dataclass
class TrainJob:
    """How one ``train`` call runs (``TrainSettings`` says what it trains): where, with which checkpoint and
    progress, and when it may stop early. The fields are ``train``'s keyword options of the same names."""

    device: str | torch.device = "cpu"
    ckpt_path: str | Path | None = None
    resume: bool = False
    run_settings: dict | None = None
    stop_after: int | None = None
    desc: str = "train"
    progress: bool = True
    rank: int | None = None
    world_size: int | None = None
    precision: str = "fp32"
    until: Callable[[], bool] | None = None
    check_every: int = 100
    check_from: int = 0


def train(model: torch.nn.Module, sampler, settings: TrainSettings, job: TrainJob | None = None, **options) -> dict:
    """Train ``model`` in place for ``settings.steps`` steps as ``job`` says (``options``: TrainJob fields given
    by name instead, or on top of ``job``); returns {"step", "losses", "wall_s", "resumed_from", "criterion_met"}.

    ``sampler.batch(step, rank, world_size)`` -> (inputs [B, T], targets [B, T]). With ``resume`` and an existing
    ``ckpt_path``, continues from its step (its ``run_settings`` must match). ``stop_after`` ends the call early
    after that many total steps (used to test interruption); a checkpoint is written then and at the end.
    ``precision``: "fp32" or "bf16" (autocast of the forward pass and loss; recorded in the run settings).

    ``until``: a training criterion, called (model in eval mode, no grad) every ``check_every`` steps (on resuming
    at such a step too), after step ``check_from`` only (earlier steps cannot pass: a length warmup trains on shorter
    sequences than the criterion scores); training ends at the first check that returns True
    (``settings.steps`` stays the cap and the learning-rate schedule's length, so the steps before a stop are
    those of an uninterrupted run). A resumed run
    that had stopped there stops again at once: the check of the same weights gives the same answer. Under
    several processes rank 0's answer is everyone's.
    """
    from dataclasses import replace

    from tqdm.auto import tqdm

    job = replace(job or TrainJob(), **options)
    device, ckpt_path, resume, run_settings = job.device, job.ckpt_path, job.resume, job.run_settings
    stop_after, desc, progress, rank, world_size = job.stop_after, job.desc, job.progress, job.rank, job.world_size
    precision, until, check_every, check_from = job.precision, job.until, job.check_every, job.check_from
    if rank is None or world_size is None:  # default: this process's place in torch.distributed's group (0 of 1)
        rank = current().rank if rank is None else rank
        world_size = current().world_size if world_size is None else world_size
    model.to(device).train()
    opt = make_optimizer(model, settings)
    start = 0
    check_choice(precision, "precision", ("fp32", "bf16"), error=ConfigError)
    run_settings = _checkpoint_settings(settings, run_settings, precision)
    if resume and ckpt_path is not None and Path(ckpt_path).exists():
        start = _resume(ckpt_path, model, opt, run_settings)
    net = model  # what the loop runs; several processes: DDP around it (posenc.lab.distributed)
    if world_size > 1:
        check_batch_size(sampler.batch_size, world_size)
        net = ddp_wrap(model, start, run_settings)
    end = settings.steps if stop_after is None else min(settings.steps, stop_after)
    if until is not None:
        check_int(check_every, "check_every", min=1, error=ConfigError)
        check_int(check_from, "check_from", min=0, error=ConfigError)
    # on resuming, the check an uninterrupted run made at this step (a checkpoint between checks makes none)
    met = until is not None and check_from < start < end and start % check_every == 0 \
        and _criterion(model, until, world_size)
    if met:
        end = start
    losses: list = []  # 0-d tensors (floats under DDP), read every 10 steps for the bar and once at the end
    t0 = time.perf_counter()
    bar = tqdm(range(start, end), desc=desc, initial=start, total=settings.steps, leave=False,
               disable=not progress or not is_main_process(), dynamic_ncols=True, mininterval=0.5)
    for step in bar:
        losses.append(train_step(net, model, opt, sampler.batch(step, rank, world_size), step, settings,
                                 device=device, precision=precision, world_size=world_size))
        if step % 10 == 0 or step == end - 1:
            recent = [float(x) for x in losses[-10:]]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", refresh=False)
        done = step + 1
        if until is not None and done % check_every == 0 and check_from < done < end \
                and _criterion(model, until, world_size):
            met, end = True, done
            break
        if ckpt_path is not None and settings.ckpt_every and done % settings.ckpt_every == 0 and done < end:
            _save(ckpt_path, model, opt, done, run_settings)
    bar.close()
    if ckpt_path is not None and end > start:
        _save(ckpt_path, model, opt, end, run_settings)
    model.eval()
    return {"step": end, "losses": [float(x) for x in losses], "wall_s": time.perf_counter() - t0,
            "resumed_from": start, "criterion_met": met}


def _checkpoint_settings(settings: TrainSettings, run_settings: dict | None, precision: str) -> dict:
    """The settings a checkpoint records and a resume must match: ``settings`` under "train", the caller's
    ``run_settings`` beside it, the precision when it is not fp32; as plain JSON values."""
    train_settings = asdict(settings)
    if train_settings["bias_lr_scale"] == 1.0:  # absent at its default: older checkpoints still resume
        del train_settings["bias_lr_scale"]
    run_settings = {"train": train_settings, **(run_settings or {})}
    if precision != "fp32":  # absent for fp32, so checkpoints written before the setting existed still resume
        run_settings["precision"] = precision
    return _jsonable(run_settings)


def _resume(ckpt_path, model: torch.nn.Module, opt: torch.optim.Optimizer, run_settings: dict) -> int:
    """Load the checkpoint at ``ckpt_path`` into ``model`` and ``opt`` -> its step; CheckpointError (with how to
    start over) when it cannot be read or was written with other settings."""
    try:
        meta = load_checkpoint(ckpt_path, model, opt)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. {restart_hint(ckpt_path)}") from None
    if meta["settings"] != run_settings:
        raise CheckpointError(f"checkpoint {ckpt_path}: was written with different settings; use a new out folder, "
                              f"or {restart_hint(ckpt_path, lower=True)}")
    return meta["step"]


def _criterion(model: torch.nn.Module, until: Callable[[], bool], world_size: int) -> bool:
    """``until()`` with the model in eval mode and no autograd; rank 0's answer under several processes."""
    model.eval()
    try:
        with torch.no_grad():
            met = bool(until())
    finally:
        model.train()
    if world_size > 1:
        flag = torch.tensor([float(met)], device=next(model.parameters()).device)
        torch.distributed.broadcast(flag, src=0)
        met = bool(flag.item())
    return met


def restart_hint(path, lower: bool = False) -> str:
    """How to restart one model whose checkpoint cannot be resumed, keeping the others."""
    text = (f"To restart that model from scratch, delete {path} and resume again (posenc lab "
            "--resume; the other models resume from their checkpoints)")
    return text[0].lower() + text[1:] if lower else text


def _save(path, model, opt, step, run_settings):
    if is_main_process():
        save_checkpoint(path, model, opt, step, run_settings)


def _jsonable(obj):
    """Round-trip through JSON so that tuples/lists compare equal after a checkpoint reload."""
    import json

    return json.loads(json.dumps(obj, sort_keys=True))


def checkpoint_step(path: str | Path) -> int | None:
    """Step stored in a checkpoint, or None if there is none."""
    if not Path(path).exists():
        return None
    return read_checkpoint(path)[1]["step"]
