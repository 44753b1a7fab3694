"""The lab on torch.distributed: data-parallel training (DDP) and split evaluation, launched by torchrun.

    torchrun --nproc_per_node 4 -m posenc lab ...    # one process per GPU (NCCL) or per CPU share (gloo)
    posenc lab --nproc 4 ...                         # the same on one machine: re-launches itself via torchrun

How the pieces fit (docs/distributed.md has the launch recipes):
- ``init_distributed`` joins the process group torchrun describes in the environment (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL for CUDA, gloo for the CPU, with a timeout on every collective so a
  stuck peer ends the job instead of hanging it. Without torchrun it is a no-op (one process, rank 0).
- Data: the samplers' ``batch(step, rank, world_size)`` give rank r the rows r::world_size of the global batch
  of step ``step``: the ranks' shards are disjoint and together are exactly the single-process batch.
- ``ddp_wrap`` checks that every rank resumed from the same checkpoint step with the same settings and data,
  then wraps the model in DDP, which averages gradients across ranks during backward.
- ``sharded_lm_loss`` makes that average the gradient of the *global* batch's mean loss, even when ranks score
  different numbers of tokens (copy and passkey rows score different counts), so N processes reproduce one.
- ``map_across_ranks`` splits evaluation items (lengths, methods) across ranks and gathers the results;
  ``broadcast_object`` hands rank 0's next items to the others (posenc tune's rounds).
- Only rank 0 writes anything (``is_main_process``).
- Launching (``posenc lab --nproc N`` re-running itself under torchrun) lives in ``posenc.lab.launch``.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from posenc._internal.validate import check_float
from posenc._internal.devices import check_device
from posenc._internal.errors import CheckpointError, ConfigError, DataError, PosencError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENV = "POSENC_DIST_TIMEOUT"  # seconds a rank may be silent (or a collective wait) before the job ends
# A stopped or dead rank is noticed after this long, and torchrun takes up to 30 s more to stop the rest: the job
# ends within 2 minutes. Busy ranks are not silent (a heartbeat thread), and the split evaluation's gather waits
# through the store for as long as the peers' heartbeats go on, so a long evaluation on one rank is not a hang.
DEFAULT_TIMEOUT_S = 60.0
HEARTBEAT_S = 1.0  # how often each rank says it is alive


class PeerError(PosencError):
    """Another rank failed during a collective step (its message is included), or stopped responding."""


# communication failures torch raises as RuntimeError: a peer died, closed its socket, or a collective timed out
_PEER_FAILURE_WORDS = ("Connection closed by peer", "Connection reset", "Broken pipe", "Timed out", "timed out",
                       "gloo", "Gloo", "NCCL", "ProcessGroup", "Socket")


def as_peer_error(exc: BaseException, timeout_s: float | None = None) -> BaseException:
    """A communication failure (torch's DistError or a RuntimeError from gloo/NCCL) as one clear PeerError; any
    other exception unchanged."""
    dist_error = getattr(dist, "DistError", ())
    text = str(exc)
    if isinstance(exc, PosencError) or not isinstance(exc, RuntimeError):
        return exc
    if not (isinstance(exc, dist_error) or any(w in text for w in _PEER_FAILURE_WORDS)):
        return exc
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    limit = f" (--dist-timeout {timeout_s:g} s)" if timeout_s else ""
    return PeerError(f"lost contact with another rank{limit}: it died, was stopped or hangs; the job ends "
                     f"({first[:200]})")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. A plain single-process run is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # "nccl", "gloo" or None when not distributed

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# ---------------------------------------------------------------- joining and leaving the process group

def under_torchrun() -> bool:
    """True when this process was started by torchrun (its rendezvous variables are in the environment)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised (and this rank is not working ``alone``)."""
    return not _ALONE[0] and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_ALONE = [0]  # depth of ``alone`` blocks


@contextlib.contextmanager
def alone():
    """Inside: this rank works by itself, whatever the group: ``map_across_ranks``, ``barrier`` and
    ``broadcast_object`` are one process's (posenc tune hands each rank whole evaluations, whose own split over
    ranks would otherwise wait for peers busy with other work)."""
    _ALONE[0] += 1
    try:
        yield
    finally:
        _ALONE[0] -= 1


def current() -> DistInfo:
    """DistInfo of the initialised process group (rank 0 of 1 when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(), env_int("LOCAL_RANK", dist.get_rank()),
                    dist.get_backend())


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ConfigError(f"environment variable {name}: not set (expected torchrun to set it)")
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}: expected an integer, got {value!r}") from None


def timeout_seconds(timeout_s: float | None = None) -> float:
    """The liveness/collective timeout: the argument (--dist-timeout), else $POSENC_DIST_TIMEOUT, else
    DEFAULT_TIMEOUT_S; a positive finite number of seconds."""
    name = "dist_timeout"
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_TIMEOUT_S
        name = TIMEOUT_ENV
        try:
            timeout_s = float(raw)
        except ValueError:
            raise ConfigError(f"{TIMEOUT_ENV}: expected a number of seconds, got {raw!r}") from None
    return check_float(timeout_s, f"{name} (seconds)", positive=True, error=ConfigError)


def resolve_device(device: str | torch.device) -> torch.device:
    """The device to run on: "auto" -> CUDA when present, else the CPU; a CUDA device must be available.

    The one place the lab turns its device setting into a torch.device (``init_distributed`` calls it).
    """
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    expected = f"device: expected auto, cpu, cuda or cuda:N (the lab runs on CPUs and CUDA GPUs), got {name!r}"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(expected) from None
    if dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise ConfigError(expected)
    return check_device(dev)        # present on this machine (CUDA available, index in range)


def is_main_process() -> bool:
    """True unless this process is a rank other than 0 of an initialised process group: only it writes files."""
    return current().is_main


def init_distributed(device: str | torch.device = "cpu", *,
                     timeout_s: float | None = None) -> tuple[DistInfo, torch.device]:
    """Join torchrun's process group, if this process was launched by torchrun; -> (info, device to use).

    ``device`` is what the user asked for ("auto", "cpu", "cuda", "cuda:N"). Under torchrun each process takes
    one GPU, cuda:LOCAL_RANK, with NCCL; on the CPU the backend is gloo. Every collective times out after
    ``timeout_seconds(timeout_s)`` so a peer that hangs ends the job. Without torchrun (or with one process) no
    group is created and ``resolve_device(device)`` is returned. Idempotent: an existing group is reused.
    """
    device = resolve_device(device)
    if dist.is_available() and dist.is_initialized():
        info = current()
        return info, (_rank_device(device, info.local_rank) if info.distributed else device)
    if not under_torchrun():
        return DistInfo(), device
    rank, world_size, local_rank = env_int("RANK"), env_int("WORLD_SIZE"), env_int("LOCAL_RANK")
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ConfigError(f"torchrun environment: inconsistent RANK={rank}, WORLD_SIZE={world_size}, "
                          f"LOCAL_RANK={local_rank}")
    if world_size == 1:
        return DistInfo(0, 1, local_rank, None), device
    device = _rank_device(device, local_rank)
    if not dist.is_available():
        raise ConfigError("nproc: this PyTorch build has no torch.distributed support")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise ConfigError(f"device: distributed runs support 'cpu' (gloo) and 'cuda' (NCCL), got {str(device)!r}")
    bind = {"device_id": device} if device.type == "cuda" else {}  # NCCL: this process's GPU, known up front
    timeout = timeout_seconds(timeout_s)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **bind)
    start_watchdog(rank, world_size, timeout)
    return DistInfo(rank, world_size, local_rank, backend), device


@contextlib.contextmanager
def session(device: str | torch.device = "cpu", *, timeout_s: float | None = None):
    """``with session(args.device) as (info, device): ...`` joins torchrun's process group (if any), prefixes
    any error with the failing rank ('rank 1 of 4: ...') and leaves the group after a clean exit."""
    info, device = init_distributed(device, timeout_s=timeout_s)
    try:
        yield info, device
    except BaseException as exc:
        if info.distributed:
            converted = as_peer_error(exc, timeout_seconds(timeout_s))
            if converted is not exc:
                raise label_error(converted, info) from None
        label_error(exc, info)
        if info.distributed and isinstance(exc, Exception):
            _record_for_torchrun(exc)
        raise
    if info.distributed:
        shutdown()


def _record_for_torchrun(exc: Exception) -> None:
    """Write the error where torchrun looks for it, so its end-of-job summary quotes this rank's message
    (what torch.distributed.elastic's @record does; the posenc CLI catches the exception before @record could)."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)
    except Exception:  # the summary is a courtesy; the message is on stderr anyway
        pass


def _rank_device(device: torch.device, local_rank: int) -> torch.device:
    """cuda -> cuda:LOCAL_RANK (one GPU per process); anything else unchanged."""
    if device.type != "cuda":
        return device
    if device.index is not None:  # every process would use the same GPU
        raise ConfigError(f"device: {device} pins one GPU, but each process takes its own (cuda:LOCAL_RANK); "
                          "use cuda or auto, and CUDA_VISIBLE_DEVICES to choose the GPUs")
    if not torch.cuda.is_available():
        raise ConfigError("device: cuda was requested but no CUDA device is available")
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise ConfigError(f"nproc: process with local rank {local_rank} needs a GPU, but this node has only {n}; "
                          f"use at most {n} processes per node")
    return torch.device("cuda", local_rank)


def shutdown() -> None:
    """Leave the process group (after a clean run; a failed run just exits and torchrun ends the others)."""
    stop_watchdog()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def label_error(exc: BaseException, info: DistInfo | None = None) -> BaseException:
    """Prefix the exception's message with 'rank R of W: ' so the job's output says which rank failed."""
    info = info or current()
    if info.distributed and exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith("rank "):
        exc.args = (f"rank {info.rank} of {info.world_size}: {exc.args[0]}", *exc.args[1:])
    return exc


# ---------------------------------------------------------------- liveness: heartbeats and the watchdog

class _Watchdog:
    """Each rank bumps its counter ``hb/<rank>`` in torchrun's key-value store every HEARTBEAT_S from a daemon
    thread, and checks the others' counters: one that has not moved for ``timeout`` seconds belongs to a rank that
    is stopped (SIGSTOP, swapped out), dead or cut off. The first rank to see it prints one line and exits, and
    torchrun then stops the rest. A rank that is merely busy (a long evaluation) keeps beating."""

    def __init__(self, rank: int, world_size: int, timeout: float):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        # two connections to torchrun's store: one for the heartbeat thread, one for the main thread's gathers
        self.beats, self.store = (dist.PrefixStore("posenc/", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)) for _ in range(2))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="posenc-heartbeat", daemon=True)

    def _loop(self) -> None:
        seen = {r: (-1, time.monotonic()) for r in range(self.world_size) if r != self.rank}
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.beats.add(f"hb/{self.rank}", 1)
                now = time.monotonic()
                for r, (count, since) in list(seen.items()):
                    if self.beats.check([f"done/{r}"]):  # that rank finished cleanly: silence is expected
                        del seen[r]
                        continue
                    current_count = self.beats.add(f"hb/{r}", 0)
                    if current_count != count:
                        seen[r] = (current_count, now)
                    elif now - since > self.timeout:
                        self._abort(f"rank {r} of {self.world_size} has not responded for {now - since:.0f} s "
                                    "(stopped, hung or dead)")
            except Exception:  # the store is gone (its host exited): the collective timeout still guards
                return

    def _abort(self, why: str) -> None:
        print(f"posenc lab: error: rank {self.rank} of {self.world_size}: {why}; ending the job "
              f"(--dist-timeout {self.timeout:g} s)", file=sys.stderr, flush=True)
        os._exit(3)

    def wait_for(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys`` once all are set, waiting as long as the peers are alive (the heartbeat thread
        ends the job if one stops)."""
        while not self.store.check(keys):
            time.sleep(0.05)
        return [self.store.get(k) for k in keys]


_WATCHDOG: _Watchdog | None = None


def start_watchdog(rank: int, world_size: int, timeout: float) -> None:
    """Start this rank's heartbeat and watchdog thread (init_distributed does it after joining the group)."""
    global _WATCHDOG
    stop_watchdog()
    _WATCHDOG = _Watchdog(rank, world_size, timeout)
    _WATCHDOG.thread.start()


def stop_watchdog() -> None:
    """Stop this rank's heartbeat, telling the others that it finished (its silence is then no alarm)."""
    global _WATCHDOG
    if _WATCHDOG is not None:
        _WATCHDOG.stop.set()
        _WATCHDOG.thread.join(timeout=5)
        with contextlib.suppress(Exception):
            _WATCHDOG.store.set(f"done/{_WATCHDOG.rank}", b"1")
        _WATCHDOG = None


# ---------------------------------------------------------------- training

def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def ddp_wrap(model: torch.nn.Module, start_step: int = 0, run_settings: dict | None = None) -> torch.nn.Module:
    """Wrap ``model`` (already on its device, checkpoint already loaded) in DistributedDataParallel.

    First checks that every rank resumed from the same step with the same ``run_settings`` (data hash, model,
    seed, ...): a checkpoint on a disk the ranks do not share, or a different corpus on another node, would
    otherwise train from different states or data without a word. DDP then broadcasts rank 0's weights, so
    all ranks start identical, and averages gradients across ranks in backward. Keep using the unwrapped
    ``model`` for checkpoints and evaluation (DDP's state_dict keys carry a 'module.' prefix).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not is_distributed():
        raise ConfigError("world_size > 1 needs an initialised process group: launch with torchrun or "
                          "`posenc lab --nproc N` (posenc.lab.distributed.init_distributed joins it)")
    mine = {"step": int(start_step), "settings": run_settings}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for rank, theirs in enumerate(every):
        if theirs["step"] != every[0]["step"]:
            raise CheckpointError(f"resume: rank {rank} resumed from step {theirs['step']} but rank 0 from step "
                                  f"{every[0]['step']}; every rank must read the same checkpoint (put the output folder on a "
                                  "filesystem that all nodes share)")
        if theirs["settings"] != every[0]["settings"]:
            keys = sorted(k for k in set(theirs["settings"] or {}) | set(every[0]["settings"] or {})
                          if (theirs["settings"] or {}).get(k) != (every[0]["settings"] or {}).get(k))
            raise ConfigError(f"run settings differ between rank {rank} and rank 0 (keys {keys}); every rank "
                              "must train on the same data and settings (same data and Python version per node)")
    device = next(model.parameters()).device
    # the models' buffers are constants (ALiBi slopes, sin/cos tables): no need to re-sync them every forward
    no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else {"broadcast_buffers": False})  # renamed in recent PyTorch
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync)


def sharded_lm_loss(logits: torch.Tensor, targets: torch.Tensor,
                    ignore_index: int = -100) -> tuple[torch.Tensor, float]:
    """This rank's part of the global batch's mean token loss -> (loss to backpropagate, global mean loss).

    logits [B_r, T, V], targets [B_r, T] are this rank's rows. With S_r the sum of its token losses, n_r its
    scored tokens (targets != ignore_index), N = sum_r n_r and W ranks, the global mean is sum_r S_r / N. DDP
    averages gradients over W ranks, so each rank backpropagates W * S_r / N: the average is then exactly the
    gradient of the global mean, also when the ranks score different numbers of tokens. One all_reduce of
    (n_r, S_r) per step; the returned float is the global mean for logging, the same on every rank.
    """
    token_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                ignore_index=ignore_index, reduction="sum")
    stats = torch.stack([(targets != ignore_index).sum().double(), token_sum.detach().double()])
    stats = stats.to(_collective_device())
    dist.all_reduce(stats)
    n, total = stats.tolist()
    if n == 0:
        raise DataError("training batch: no rank has a scored target token (every target is ignored)")
    return token_sum * (dist.get_world_size() / n), total / n


def check_batch_size(batch_size: int, world_size: int) -> None:
    """Every rank needs at least one row of the global batch (rank r takes rows r::world_size)."""
    if batch_size < world_size:
        raise ConfigError(f"batch_size: a training batch of {batch_size} rows cannot be split across {world_size} "
                          f"processes; use at least {world_size} rows per step (ideally a multiple of {world_size})")


# ---------------------------------------------------------------- evaluation

def assign(costs: Sequence[float], world_size: int) -> list[int]:
    """Owner rank of each item: longest first, each to the least-loaded rank (ties: lowest rank).

    Deterministic, so every rank computes the same assignment without talking. The busiest rank's load is at
    most sum(costs) / world_size + max(costs).
    """
    if world_size < 1:
        raise ConfigError(f"world_size: expected a positive integer, got {world_size!r}")
    load = [0.0] * world_size
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


def map_across_ranks(fn: Callable, items: Iterable, *, cost: Callable | None = None) -> list:
    """[fn(item) for item in items], each item computed by one rank, results gathered on every rank.

    ``cost(item)`` (default 1) balances the split: for evaluation at length L a good cost is L (tokens scored
    x attention span per token). Results must be picklable. If ``fn`` raises on some rank, every rank raises
    (the failing one its own exception, the others PeerError with its message): no rank waits for a result
    that will never come. Without a process group this is a plain loop.
    """
    items = list(items)
    if not is_distributed():
        return [fn(item) for item in items]
    info = current()
    costs = [float(cost(item)) if cost else 1.0 for item in items]
    owner = assign(costs, info.world_size)
    mine: dict[int, object] = {}
    failure: BaseException | None = None
    for i, item in enumerate(items):
        if owner[i] != info.rank:
            continue
        try:
            mine[i] = fn(item)
        except Exception as exc:  # report it to the others before raising
            failure = exc
            break
    report = ({"error": f"{type(failure).__name__}: {failure}"} if failure is not None else {"results": mine})
    gathered = _gather(report, info)
    if failure is not None:
        raise failure
    for rank, part in enumerate(gathered):
        if "error" in part:
            raise PeerError(f"evaluation failed on rank {rank}: {part['error']}")
    merged: dict[int, object] = {}
    for part in gathered:
        merged.update(part["results"])
    return [merged[i] for i in range(len(items))]


_GATHERS = [0]


def _gather(obj, info: DistInfo) -> list:
    """all_gather_object, but through the store when the watchdog runs: a rank still evaluating keeps the others
    waiting as long as it is alive, not just until the collective timeout."""
    if _WATCHDOG is None:
        gathered: list = [None] * info.world_size
        dist.all_gather_object(gathered, obj)
        return gathered
    _GATHERS[0] += 1  # every rank calls map_across_ranks in the same order: the same key on every rank
    keys = [f"gather/{_GATHERS[0]}/{r}" for r in range(info.world_size)]
    _WATCHDOG.store.set(keys[info.rank], pickle.dumps(obj))
    return [pickle.loads(v) for v in _WATCHDOG.wait_for(keys)]


def broadcast_object(obj=None):
    """Rank 0's ``obj`` on every rank (picklable; the others pass anything). Through the store while the watchdog
    runs, as ``_gather``: a rank waiting for rank 0's next piece of work waits as long as rank 0 is alive, not just
    until the collective timeout. Without a process group: ``obj``."""
    if not is_distributed():
        return obj
    info = current()
    if _WATCHDOG is None:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    _GATHERS[0] += 1  # shared with _gather: every rank makes the same calls in the same order
    key = f"broadcast/{_GATHERS[0]}"
    if info.is_main:
        _WATCHDOG.store.set(key, pickle.dumps(obj))
        return obj
    return pickle.loads(_WATCHDOG.wait_for([key])[0])


def barrier() -> None:
    """Wait for every rank (no-op without a process group), e.g. before reading what rank 0 wrote."""
    if is_distributed():
        dist.barrier()
