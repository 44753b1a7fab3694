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

from posenc._internal.atomic import atomic_write_json
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
    progress, and when it may stop early. The fields are ``train``'s keyword options of the same names.

    The last fields serve ``posenc finetune`` (posenc.finetune.loop), which runs this same loop: a held-out loss,
    the run's losses kept beside the checkpoint, a stop at a non-finite loss, its own checkpoint record."""

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
    validate: Callable[[], float] | None = None   # a held-out loss, after every validate_every steps and the last
    validate_every: int = 0
    history_path: str | Path | None = None        # the run's losses (history.json), written before each checkpoint
    finite: bool = False                          # FloatingPointError at a non-finite loss (reads it every step)
    settings_as_given: bool = False               # run_settings is the whole checkpoint record (see train)
    restart: str | None = None                    # how to start over, in a refused resume's error (lab's: None)
    tokens_per_step: int = 0                      # > 0: the bar shows tokens per second of training


def train(model: torch.nn.Module, sampler, settings: TrainSettings, job: TrainJob | None = None, **options) -> dict:
    """Train ``model`` in place for ``settings.steps`` steps as ``job`` says (``options``: TrainJob fields given
    by name instead, or on top of ``job``); returns {"step", "losses" (this call's, floats), "wall_s",
    "resumed_from", "criterion_met", "train" ([[step, loss]...], 1-based steps; earlier calls' too with a
    ``history_path``), "validation" ([[step, loss]...], likewise), "train_s" (seconds in optimizer steps alone,
    neither validation nor checkpoints; earlier calls' too with a ``history_path``)}.

    ``sampler.batch(step, rank, world_size)`` -> (inputs [B, T], targets [B, T]). With ``resume`` and an existing
    ``ckpt_path``, continues from its step (its ``run_settings`` must match). ``stop_after`` ends the call early
    after that many total steps (used to test interruption); a checkpoint is written then and at the end.
    ``precision``: "fp32" or "bf16" (autocast of the forward pass and loss; recorded in the run settings).
    The checkpoint records ``run_settings`` with the TrainSettings (under "train") and a non-fp32 precision added,
    or with ``settings_as_given`` exactly as given (the caller records those itself).

    ``until``: a training criterion, called (model in eval mode, no grad) every ``check_every`` steps (on resuming
    at such a step too), after step ``check_from`` only (earlier steps cannot pass: a length warmup trains on shorter
    sequences than the criterion scores); training ends at the first check that returns True
    (``settings.steps`` stays the cap and the learning-rate schedule's length, so the steps before a stop are
    those of an uninterrupted run). A resumed run
    that had stopped there stops again at once: the check of the same weights gives the same answer. Under
    several processes rank 0's answer is everyone's.

    ``validate``: a held-out loss, called (model in eval mode, no grad) after every ``validate_every`` steps and
    after step ``settings.steps``. ``history_path``: {"train", "validation", "train_s"} written there (atomically)
    before each checkpoint, and read back on resuming, cut at the checkpoint's step, so a resumed run reports the
    whole run's losses as an uninterrupted one does.
    """
    from dataclasses import replace

    job = replace(job or TrainJob(), **options)
    rank, world_size = _place(job)
    model.to(job.device).train()
    opt = make_optimizer(model, settings)
    check_choice(job.precision, "precision", ("fp32", "bf16"), error=ConfigError)
    run_settings = _jsonable(job.run_settings) if job.settings_as_given else \
        _checkpoint_settings(settings, job.run_settings, job.precision)
    start, history = _start(job, model, opt, run_settings)
    net = model  # what the loop runs; several processes: DDP around it (posenc.lab.distributed)
    if world_size > 1:
        check_batch_size(sampler.batch_size, world_size)
        net = ddp_wrap(model, start, run_settings)
    end = settings.steps if job.stop_after is None else min(settings.steps, job.stop_after)
    until = _checked(job).until
    # on resuming, the check an uninterrupted run made at this step (a checkpoint between checks makes none)
    met = until is not None and job.check_from < start < end and start % job.check_every == 0 \
        and _criterion(model, until, world_size)
    if met:
        end = start
    losses: list = []  # 0-d tensors (floats under DDP), read every 10 steps for the bar and once at the end
    t0 = time.perf_counter()
    bar = _bar(job, start, end, settings.steps)
    for step in bar:
        t_step = time.perf_counter()
        loss = train_step(net, model, opt, sampler.batch(step, rank, world_size), step, settings,
                          device=job.device, precision=job.precision, world_size=world_size)
        if job.finite:
            loss = _finite(loss, job.desc, step + 1)
        history["train_s"] += time.perf_counter() - t_step
        losses.append(loss)
        done = step + 1
        if step % 10 == 0 or step == end - 1 or job.finite:  # finite: the loss is read anyway, show each
            _show(bar, losses, job, done, history["train_s"])
        if job.validate is not None and (done % job.validate_every == 0 or done == settings.steps):
            history["validation"].append([done, _in_eval(model, job.validate)])
        if until is not None and done % job.check_every == 0 and job.check_from < done < end \
                and _criterion(model, until, world_size):
            met, end = True, done
            break
        if job.ckpt_path is not None and settings.ckpt_every and done % settings.ckpt_every == 0 and done < end:
            _save(job, model, opt, done, run_settings, history, losses, start)
    bar.close()
    if job.ckpt_path is not None and end > start:
        _save(job, model, opt, end, run_settings, history, losses, start)
    model.eval()
    return {"step": end, "losses": [float(x) for x in losses], "wall_s": time.perf_counter() - t0,
            "resumed_from": start, "criterion_met": met, **_whole(history, losses, start)}


def _checked(job: TrainJob) -> TrainJob:
    """``job``, its check and validation intervals checked where they are used; ConfigError naming the field."""
    if job.until is not None:
        check_int(job.check_every, "check_every", min=1, error=ConfigError)
        check_int(job.check_from, "check_from", min=0, error=ConfigError)
    if job.validate is not None:
        check_int(job.validate_every, "validate_every", min=1, error=ConfigError)
    return job


def _place(job: TrainJob) -> tuple[int, int]:
    """(rank, world_size): the job's, by default this process's place in torch.distributed's group (0 of 1)."""
    rank = current().rank if job.rank is None else job.rank
    world_size = current().world_size if job.world_size is None else job.world_size
    return rank, world_size


def _start(job: TrainJob, model: torch.nn.Module, opt, run_settings: dict) -> tuple[int, dict]:
    """-> (the step training starts at, the history so far): 0 and an empty one, or on resuming the checkpoint's
    step (its weights, optimizer state and RNG loaded) and, with a ``history_path``, the history up to it."""
    history = {"train": [], "validation": [], "train_s": 0.0}
    if not (job.resume and job.ckpt_path is not None and Path(job.ckpt_path).exists()):
        return 0, history
    start = _resume(job.ckpt_path, model, opt, run_settings, job.restart)
    if job.history_path is not None:
        history = read_history(Path(job.history_path), start)
    return start, history


def _bar(job: TrainJob, start: int, end: int, total: int):
    from tqdm.auto import tqdm

    return tqdm(range(start, end), desc=job.desc, initial=start, total=total, leave=False,
                disable=not job.progress or not is_main_process(), dynamic_ncols=True, mininterval=0.5)


def _show(bar, losses: list, job: TrainJob, done: int, train_s: float) -> None:
    """The bar's postfix: the mean of the last 10 losses, and tokens per second of training when known."""
    recent = [float(x) for x in losses[-10:]]
    shown = {"loss": f"{sum(recent) / len(recent):.3f}"}
    if job.tokens_per_step:
        shown["tokens_s"] = f"{done * job.tokens_per_step / max(train_s, 1e-9):.0f}"
    bar.set_postfix(shown, refresh=False)


def _finite(loss, desc: str, done: int) -> float:
    """The loss as a float; FloatingPointError when it is not finite (training on would only spread NaNs)."""
    value = float(loss)
    if not math.isfinite(value):
        raise FloatingPointError(f"{desc}: the training loss is {value} at step {done}; lower --lr")
    return value


def _in_eval(model: torch.nn.Module, fn: Callable):
    """``fn()`` with ``model`` in eval mode and no autograd; training mode after."""
    model.eval()
    try:
        with torch.no_grad():
            return fn()
    finally:
        model.train()


def _whole(history: dict, losses: list, start: int) -> dict:
    """``history`` with this call's ``losses`` (those of steps start + 1, ...) added to its "train" entries."""
    return {**history, "train": history["train"] + [[start + i + 1, float(x)] for i, x in enumerate(losses)]}


def read_history(path: Path, step: int) -> dict:
    """The history at ``path`` cut at ``step``; CheckpointError when it is missing or does not reach the step."""
    import json

    try:
        doc = json.loads(path.read_text())
        losses = [entry for entry in doc["train"] if entry[0] <= step]
        validation = [entry for entry in doc["validation"] if entry[0] <= step]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise CheckpointError(f"checkpoint {path}: missing or unreadable; delete {path.parent} to start "
                              "over") from None
    if len(losses) != step:
        raise CheckpointError(f"checkpoint {path}: holds {len(losses)} steps' losses, the checkpoint {step}; "
                              f"delete {path.parent} to start over")
    return {"train": losses, "validation": validation, "train_s": float(doc.get("train_s", 0.0))}


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


def _resume(ckpt_path, model: torch.nn.Module, opt: torch.optim.Optimizer, run_settings: dict,
            restart: str | None = None) -> int:
    """Load the checkpoint at ``ckpt_path`` into ``model`` and ``opt`` -> its step; CheckpointError (with how to
    start over: ``restart``, by default the lab's ``restart_hint``) when it cannot be read or was written with
    other settings."""
    restart = restart or restart_hint(ckpt_path)
    try:
        meta = load_checkpoint(ckpt_path, model, opt)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. {restart}") from None
    if meta["settings"] != run_settings:
        raise CheckpointError(f"checkpoint {ckpt_path}: was written with different settings; use a new out folder, "
                              f"or {restart[0].lower() + restart[1:]}")
    return meta["step"]


def _criterion(model: torch.nn.Module, until: Callable[[], bool], world_size: int) -> bool:
    """``until()`` with the model in eval mode and no autograd; rank 0's answer under several processes."""
    met = bool(_in_eval(model, until))
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


def _save(job: TrainJob, model, opt, step: int, run_settings: dict, history: dict, losses: list,
          start: int) -> None:
    """The checkpoint of ``step`` (main process only), with a ``history_path`` the history (``history`` and this
    call's ``losses`` from step ``start`` + 1) written before it: it then always reaches at least the checkpoint's
    step (an interruption between the two leaves a longer one, cut on resuming)."""
    if not is_main_process():
        return
    if job.history_path is not None:
        atomic_write_json(job.history_path, _whole(history, losses, start))
    save_checkpoint(job.ckpt_path, model, opt, step, run_settings)


def _jsonable(obj):
    """Round-trip through JSON so that tuples/lists compare equal after a checkpoint reload."""
    import json

    return json.loads(json.dumps(obj, sort_keys=True))


def checkpoint_step(path: str | Path) -> int | None:
    """Step stored in a checkpoint, or None if there is none."""
    if not Path(path).exists():
        return None
    return read_checkpoint(path)[1]["step"]
