"""Several lab models at once (``--jobs``): each unit -- one (task, scheme, positions, seed) model, trained and then
evaluated with its extension methods -- runs in its own process.

Why processes: the lab's models are small, and a second OpenMP thread speeds one up little (the default preset's
training step: 1.13x at 2 threads on this project's 2-core CPU) while a second process training another model
uses the second core fully. Units are independent (each seeds its own initial weights and data stream), so the
numbers are bit-identical to one unit at a time (tested). Workers are spawned, not forked (a fresh interpreter, no
inherited OpenMP state); each sets its thread count, loads the plug-ins that registered the run's names, loads
the corpus and returns its unit's rows, curves and timings. Only the parent writes results.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError


@dataclass(frozen=True)
class Unit:
    """One model of a lab run: randomized = 0 for plain positions, else the randomized-positions N."""

    task: str
    scheme: str
    randomized: int
    seed: int


def units_of(cfg) -> list[Unit]:
    """Every unit of ``cfg``, in the order the lab reports them."""
    return [Unit(task, scheme, randomized, seed) for task in cfg.tasks for scheme in cfg.schemes
            for randomized in cfg.position_variants(scheme) for seed in cfg.seeds]


def registration_modules(cfg) -> dict[str, str]:
    """Module of every registry entry the run uses: {"scheme rope": "posenc.schemes.builtin", ...}."""
    from posenc.extensions.catalogue import method_origin
    from posenc.lab.tasks.registry import TASKS
    from posenc.schemes.registry import SCHEMES

    found = {f"task {t}": type(TASKS[t]).__module__ for t in cfg.tasks}
    found.update({f"scheme {s}": SCHEMES[s].factory.__module__ for s in set(cfg.schemes) | set(cfg.extended_schemes)})
    found.update({f"extension method {m}": method_origin(m) for m in cfg.extensions})
    return found


def worker_plugins(cfg) -> list[str] | str:
    """The plug-in specs a fresh process must load to know the run's names, or (a str) why it cannot: a name
    registered in this process by code other than posenc or a ``--plugin``."""
    from posenc._internal.plugins import LOADED

    specs: list[str] = []
    for what, module in registration_modules(cfg).items():
        if module == "posenc" or module.startswith("posenc."):
            continue
        if module not in LOADED:
            return f"{what} is registered by {module}, which a worker process cannot import (use --plugin)"
        if LOADED[module] not in specs:
            specs.append(LOADED[module])
    return specs


def plan(cfg, device: torch.device, n_units: int, idle_cores: Callable[[], int], distributed: bool) -> tuple[int, int]:
    """-> (jobs, threads per job) for ``cfg.jobs`` and ``cfg.threads`` (0: auto).

    jobs auto: on the CPU, with several units, no fixed --threads and no process group, one job per idle core
    (``idle_cores()``, the lab's auto thread count), else 1. threads auto: the idle cores shared by the jobs.
    """
    jobs = check_int(cfg.jobs, "jobs", min=0, error=ConfigError)
    if jobs > 1 and (device.type != "cpu" or distributed):
        raise ConfigError(f"jobs: {jobs} processes need the CPU and a single lab process (got device {device}"
                          f"{', under torchrun' if distributed else ''}); use --jobs 1")
    if cfg.threads and jobs == 0:
        return 1, cfg.threads
    idle = idle_cores() if not cfg.threads else cfg.threads
    if jobs == 0:
        spawnable = device.type == "cpu" and not distributed and not isinstance(worker_plugins(cfg), str)
        jobs = idle if spawnable else 1
    jobs = max(1, min(jobs, n_units))
    return jobs, cfg.threads or max(1, idle // jobs)


def run_units(run, units: list[Unit], jobs: int, threads: int, run_unit: Callable, partial: dict | None = None
              ) -> Iterator[tuple[int, dict]]:
    """Yield (index, ``run_unit(run, unit, rows, curves)``) for every unit, as each finishes: in this process when
    ``jobs`` is 1, else in ``jobs`` spawned workers (``threads`` each). ``run_unit`` must be a module-level function
    (workers import it by name). A worker's exception is raised here when it arrives.

    ``partial`` (one process only): holds the "rows" and "curves" of the unit in progress, for the partial results
    written when a unit fails; a failed worker's unit contributes nothing.
    """
    partial = {} if partial is None else partial
    if jobs == 1:
        for i, unit in enumerate(units):
            partial.update(rows=[], curves={})
            result = run_unit(run, unit, partial["rows"], partial["curves"])
            partial.clear()     # before the yield: the finished unit's rows are the caller's now, not in progress
            yield i, result
        return
    plugins = worker_plugins(run.cfg)
    if isinstance(plugins, str):
        raise ConfigError(f"jobs: {plugins}")
    settings = dict(cfg=run.cfg, out=run.out, resume=run.resume, precision=run.precision, threads=threads,
                    plugins=plugins, run_unit=run_unit)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        pending = {pool.submit(_worker, settings, unit): i for i, unit in enumerate(units)}
        finished = False
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=pending.get):
                    i = pending.pop(future)
                    yield i, future.result()
            finished = True
        finally:
            if not finished:      # an error, an interrupt or a termination: stop the workers now, not after their
                _stop(pool)       # units (their checkpoints are what --resume continues from)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued units and end the running workers (the executor keeps them in ``_processes``, which
    shutdown clears: read it first)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)
    if manager is not None:      # it sees the ended workers, releases the queues (no semaphore left behind)
        manager.join(timeout=10)


def _die_with_parent(parent: int) -> None:
    """Worker initializer: a worker whose parent dies (kill -9, a crash) ends too, instead of training on and
    writing checkpoints into a folder another run may have taken over. Linux: the kernel's parent-death signal;
    elsewhere: a thread watching the parent's pid."""
    import signal
    import threading
    import time

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:      # the parent died before the signal was armed
        os._exit(1)
    try:      # tqdm would make a multiprocessing lock (a semaphore the resource tracker reports as leaked when
        from tqdm import tqdm         # a stopped worker cannot release it); a worker's bars are its own
        tqdm.set_lock(threading.RLock())
    except ImportError:
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker(settings: dict, unit: Unit) -> dict:
    """One unit in a worker process (module-level: spawn pickles it by name)."""
    import warnings

    from posenc._internal.faults import one_line_warnings
    from posenc.lab.context import Run
    from posenc.lab.data import load_corpus
    from posenc.lab.tasks import needs_corpus
    from posenc._internal.plugins import load_plugins

    warnings.showwarning = one_line_warnings("posenc lab")      # as the parent shows them: one line each
    torch.set_num_threads(settings["threads"])
    load_plugins(settings["plugins"])
    cfg = settings["cfg"]
    corpus = load_corpus(cfg.data) if needs_corpus(cfg.tasks) else None     # what the parent run loads
    run = Run(cfg, corpus, torch.device("cpu"), settings["out"], resume=settings["resume"], progress=False,
              log=lambda *args: None, precision=settings["precision"])
    try:
        return settings["run_unit"](run, unit, [], {})
    except (Exception, SystemExit) as exc:   # a plug-in's fault is named here, where its frames are: the parent
        from posenc._internal.plugins import PluginError, plugin_fault     # gets the exception without them

        blamed = plugin_fault(exc)
        if blamed is not None:
            raise PluginError(blamed) from None
        raise
