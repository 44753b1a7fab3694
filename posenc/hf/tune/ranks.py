"""``posenc tune --nproc N`` (or under torchrun): the measurements spread over ranks, one device each.

Launching and joining are the lab's (one owner): posenc.lab.launch re-runs the command under torchrun, and
posenc.lab.distributed.session joins the group (gloo on the CPU; NCCL with cuda:LOCAL_RANK per rank), its
watchdog ending the job when a rank goes silent.

Rank 0 runs the tune exactly as one process does: the plan, the race's rule in the same order, every file. Where
it needs measurements (the trained-length check, each race round, the survivors' passkey and RULER), the Tune
hands the missing ones to ``Pool.run`` as ``Job``s: rank 0 sends them to every rank (``broadcast_object``),
``map_across_ranks`` splits them by rank 0's cost estimates (the same split on every rank) and gathers the values,
and rank 0 keeps them in its store by key. The other ranks only measure (``serve``). Rank 0 reads the values back
from the store, so the race decides on the same numbers in the same order as one process.

A lost rank: each rank keeps what it finished as it lands, rank 0 in results.json and rank r in
``measurements.rank<r>.json`` in --out (a folder every node shares). When a rank raises or dies, the job ends
(torch.distributed does not go on without it); ``--resume``, with any --nproc, reads both and measures only what
is missing. A measurement is kept by its key, so none counts twice.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from posenc._internal.errors import ConfigError
from posenc.hf.tune import measure
from posenc.hf.tune.plan import Candidate

RANK_FILE = "measurements.rank{}.json"      # rank r's finished measurements of the run in progress


@dataclass(frozen=True)
class Job:
    """One measurement for some rank: ``candidate`` at ``length`` on ``window`` (``tasks`` lm), or its retrieval at
    the target (passkey; or the RULER tasks it lacks, in one eval call), kept under ``keys`` (one per task)."""

    keys: tuple[str, ...]
    candidate: Candidate
    length: int
    window: int = 0
    tasks: tuple[str, ...] = ("lm",)
    cost: float = 1.0                # rank 0's estimate in seconds: how the work is split


def execute(job: Job, args, trained: int) -> dict:
    """Measure ``job`` on this rank's device (``args.device``), by this rank alone -> {key: value}."""
    from posenc.lab.distributed import alone

    with alone():          # eval's loop would split the job's lengths over the ranks, busy with their own jobs
        return _measure(job, args, trained)


def _measure(job: Job, args, trained: int) -> dict:
    """The EvalSettings and the measuring function the Tune itself uses for that kind of measurement."""
    settings = measure.eval_settings(job.candidate, length=job.length, trained=trained, target=args.target_length,
                                     window=job.window, data=args.data, dtype=args.dtype, device=args.device,
                                     tasks=job.tasks, band=not getattr(args, "no_band_attention", False))
    if job.tasks == ("lm",):
        return {job.keys[0]: measure.window_loss(args.model, settings)}
    if job.tasks == ("passkey",):
        return {job.keys[0]: measure.passkey_rate(args.model, settings)}
    settings.options["ruler_samples"] = args.ruler_samples
    scores = measure.ruler_scores(args.model, settings)
    return {key: scores[task] for key, task in zip(job.keys, job.tasks)}


def check(args) -> int:
    """--nproc and what it needs of --device, checked before any process starts -> the processes to launch."""
    from posenc.lab.distributed import timeout_seconds

    n = args.nproc
    timeout_seconds(args.dist_timeout)              # a bad --dist-timeout is one line here, not one per rank
    if n == 1:
        return 1
    if n < 1:
        raise ConfigError(f"--nproc: expected a positive number of processes, got {n}")
    device = str(args.device)
    if device.startswith("cuda"):
        if ":" in device:
            raise ConfigError(f"--nproc: --device {device} pins one GPU, but each of the {n} processes takes its "
                              "own (cuda:LOCAL_RANK); use --device cuda (CUDA_VISIBLE_DEVICES chooses the GPUs)")
        import torch

        have = torch.cuda.device_count()
        if n > have:
            raise ConfigError(f"--nproc: {n} processes on --device cuda need {n} GPUs, one each; this machine "
                              f"has {have}")
    elif device not in ("cpu", "auto"):
        raise ConfigError(f"--nproc: several processes run on --device cpu (gloo) or cuda (NCCL), not {device}")
    return n


def relaunch(args) -> int | None:
    """--nproc N: this command again under torchrun (posenc.lab.launch) -> its exit status; None where this
    process does the work (one process, or already a torchrun worker)."""
    from posenc.lab import launch

    status = launch.relaunch(args, command="tune")
    if status and args.out:
        print(f"posenc tune: the measurements finished so far are kept in {args.out}: the same command with "
              "--resume measures only the missing ones", file=sys.stderr)
    return status


def distributed() -> bool:
    """True in a torchrun job of more than one rank (``posenc tune --nproc N``'s workers, or a launch by hand)."""
    from posenc.lab.distributed import env_int, under_torchrun

    return under_torchrun() and env_int("WORLD_SIZE") > 1


def rank_files(out) -> list[Path]:
    return sorted(Path(out).glob(RANK_FILE.format("*")))


def remove_rank_files(out) -> None:
    """The ranks' files, once results.json holds what they kept."""
    for path in rank_files(out):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def kept(out, check_key) -> dict:
    """The measurements the ranks' files in ``out`` hold (an interrupted multi-rank tune), each file's key checked
    by ``check_key(key, path)`` as results.json's is."""
    from posenc._internal.json_io import loads

    found = {}
    for path in rank_files(out):
        doc = loads(path.read_text(encoding="utf-8"), f"out {out}: {path.name}")
        check_key(doc.get("key") if isinstance(doc, dict) else None, path)
        found.update(doc.get("measurements") or {})
    return found


class Pool:
    """Rank 0's side of the ranks: hands each batch of jobs to every rank and keeps the values in the store."""

    def __init__(self, args, trained: int, info):
        self.args, self.trained, self.info = args, trained, info

    def describe(self, n_candidates: int) -> str:
        """The line printed under the plan (the plan's estimates are one process's)."""
        line = (f"measuring on {self.info.world_size} processes ({self.info.backend}; rank 0 on {self.args.device}); "
                "the estimates above are one process's")
        if self.info.world_size > n_candidates:
            line += (f"; {self.info.world_size} processes are more than the {n_candidates} candidates of a window "
                     "round: some idle in every round")
        return line

    def start(self, store, save) -> None:
        """Before the first job: the ranks' files of an interrupted run, already in ``store`` on --resume, go into
        results.json (``save``), then away: each rank writes its own afresh."""
        if rank_files(self.args.out):
            save()
            remove_rank_files(self.args.out)

    def run(self, jobs: list[Job], store: measure.Measurements) -> None:
        """Measure the ``jobs`` the store lacks, split over every rank; rank 0 keeps its own values as they land
        (results.json), the others' when they are gathered."""
        from posenc.lab.distributed import broadcast_object, map_across_ranks

        pending = [j for j in jobs if any(k not in store.done for k in j.keys)]
        if not pending:
            return
        broadcast_object(pending)

        def own(job):
            values = execute(job, self.args, self.trained)
            store.put(values)
            return values

        parts = map_across_ranks(own, pending, cost=lambda j: j.cost)
        new = {k: v for part in parts for k, v in part.items() if k not in store.done}
        if new:
            store.put(new)

    def stop(self, failed: bool) -> None:
        """Tell the other ranks there is no more work (a failure: rank 0's message is the job's; they exit 1)."""
        from posenc.lab.distributed import barrier, broadcast_object

        broadcast_object("failed" if failed else None)
        if not failed:
            barrier()      # every rank has read it before rank 0 leaves (it may host the store they read from)


def serve(args, trained: int, key: dict, rank: int) -> int:
    """A rank other than 0: measure its share of each batch rank 0 sends, keeping each value in its own file as
    it lands, until rank 0 says the tune is done -> exit status."""
    from posenc._internal.atomic import atomic_write_json
    from posenc.lab.distributed import barrier, broadcast_object, map_across_ranks

    path, mine = Path(args.out) / RANK_FILE.format(rank), {}

    def own(job):
        values = execute(job, args, trained)
        mine.update(values)
        atomic_write_json(path, {"key": key, "measurements": mine})
        return values

    while True:
        jobs = broadcast_object(None)
        if jobs is None:
            barrier()                    # rank 0's stop (Pool.stop)
            return 0
        if isinstance(jobs, str):        # rank 0 failed outside a measurement; it prints why
            return 1
        map_across_ranks(own, jobs, cost=lambda j: j.cost)


def run_ranks(args, trained: int, key: dict, tune) -> int:
    """Join torchrun's group (the lab's session: device per rank, watchdog); rank 0 runs ``tune(pool)`` -- the
    whole tune, its measurements through the pool -- while the other ranks serve."""
    from posenc.lab import distributed as dist_lab

    with dist_lab.session(args.device, timeout_s=args.dist_timeout) as (info, device):
        args.device = str(device)        # cuda -> this rank's cuda:LOCAL_RANK
        if not info.is_main:
            return serve(args, trained, key, info.rank)
        pool = Pool(args, trained, info)
        try:
            status = tune(pool)
        except BaseException:
            with contextlib.suppress(Exception):    # the group may be gone already (a peer died)
                pool.stop(failed=True)
            raise
        pool.stop(failed=False)
        return status
