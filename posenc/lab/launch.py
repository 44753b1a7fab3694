"""``posenc lab --nproc N`` (and ``posenc tune --nproc N``): re-run the same command under torchrun, N processes on
this machine.

The workers join the process group through ``posenc.lab.distributed.session``; this module only builds and runs
the torchrun command (docs/distributed.md has multi-node recipes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Sequence

from posenc._internal.errors import ConfigError
from posenc._internal.faults import Terminated
from posenc.lab.distributed import env_int, under_torchrun


def add_arguments(parser, nproc_help: str | None = None) -> None:
    """The --nproc and --dist-timeout flags (the shared flags' declarations) with `posenc lab`'s words, or
    ``nproc_help`` for another command's --nproc."""
    from posenc._internal.flags import add_shared
    from posenc.lab.distributed import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

    add_shared(parser, "nproc", default=1, help=nproc_help or
               "train with N processes on this machine (DDP: one per GPU with NCCL, or gloo on the CPU); "
               "re-launches through torchrun. Multi-node: see docs/distributed.md")
    add_shared(parser, "dist_timeout", default=None,
               help=f"distributed runs: a rank silent (stopped, hung, dead) this long ends the whole job "
                    f"(default ${TIMEOUT_ENV} or {DEFAULT_TIMEOUT_S:g} s; the job then ends within another ~30 s)")


def torchrun_command(nproc: int, target: Sequence[str]) -> list[str]:
    """The torchrun command that runs ``target`` (["-m", "posenc", "lab", ...] or [script, ...]) in ``nproc``
    processes on this machine. Rendezvous on loopback, port chosen by the OS (port 0), no restarts."""
    if int(nproc) < 1:
        raise ConfigError(f"--nproc: expected a positive number of processes, got {nproc!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(int(nproc)),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
            "--max-restarts", "0", *target]


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without its --nproc N / --nproc=N options (the workers must not re-launch)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def worker_env(nproc: int, env: dict | None = None) -> dict:
    """Environment for the workers: the CPU's cores shared out (OMP_NUM_THREADS), unless the user set it."""
    env = dict(os.environ if env is None else env)
    if "OMP_NUM_THREADS" not in env:
        from posenc._internal.machine import cpu_cores

        env["OMP_NUM_THREADS"] = str(max(1, cpu_cores() // int(nproc)))
    return env


def launch(nproc: int, target: Sequence[str], command: str = "lab") -> int:
    """Run ``target`` under torchrun with ``nproc`` processes; -> torchrun's exit status (``command``: the posenc
    command its failure line names).

    torchrun's agent watches the workers: when one exits with an error it stops the others and exits non-zero,
    printing which rank failed (each worker's own message is on the shared stderr above that summary).
    """
    cmd = torchrun_command(nproc, target)
    proc = subprocess.Popen(cmd, env=worker_env(nproc), stderr=subprocess.PIPE, text=True, errors="replace",
                            bufsize=1)
    summary = TorchrunSummary()
    try:
        for line in proc.stderr:  # the workers' own lines pass through; torchrun's traceback wall does not
            shown = summary.feed(line)
            if shown is not None:
                sys.stderr.write(shown)
                sys.stderr.flush()
        status = proc.wait()
    except KeyboardInterrupt as exc:  # Ctrl-C reached torchrun too (same process group); let it stop the workers
        if isinstance(exc, Terminated):   # a SIGTERM reached this process alone: pass it on
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if status != 0:
        print(f"posenc {command}: error: the distributed job failed ({summary.describe(status)}); the failing rank's "
              "message is above", file=sys.stderr)
    return status


class TorchrunSummary:
    """Filters torchrun's own stderr: its log lines ('E1130 12:00:00.123 4321 torch/distributed/...') and the
    ChildFailedError traceback are held back (posenc's workers print one line each and never a traceback, so a
    traceback here is the agent's); the failed rank and exit code are kept for one summary line."""

    LOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ .*(torch/distributed|elastic)")

    def __init__(self):
        self.in_traceback = False
        self.rank: str | None = None
        self.exitcode: str | None = None

    def feed(self, line: str) -> str | None:
        """The line to show, or None to hold it back."""
        if line.startswith("Traceback (most recent call last)"):
            self.in_traceback = True
        if self.in_traceback:
            m = re.match(r"\s*(rank|exitcode)\s*:\s*(\S+)", line)
            if m and getattr(self, m.group(1)) is None:
                setattr(self, m.group(1), m.group(2))
            return None
        return None if self.LOG.match(line) else line

    def describe(self, status: int) -> str:
        if self.rank is not None:
            return f"rank {self.rank} exited with status {self.exitcode}"
        return f"torchrun exited with status {status}"


def relaunch(args, argv: Sequence[str] | None = None, command: str = "lab") -> int | None:
    """For `posenc lab --nproc N` (``command``: "lab", or "tune"): re-run this command under torchrun and return
    its exit status; None when this process should do the work itself (N == 1, or it already is a torchrun worker).

    ``argv`` is the command line after the program name (["lab", ...]); default ``args.argv`` if the CLI
    recorded it, else sys.argv[1:].
    """
    nproc = getattr(args, "nproc", 1)
    if nproc is None or int(nproc) == 1:
        return None
    if int(nproc) < 1:
        raise ConfigError(f"--nproc: expected a positive number of processes, got {nproc!r}")
    if under_torchrun():
        world = env_int("WORLD_SIZE")
        if world != int(nproc):
            raise ConfigError(f"--nproc: {nproc} conflicts with torchrun's WORLD_SIZE={world}; under torchrun "
                              "drop --nproc (torchrun's --nproc-per-node decides)")
        return None
    argv = list(argv if argv is not None else getattr(args, "argv", None) or sys.argv[1:])
    if not argv or argv[0] != command:
        raise ConfigError(f"--nproc: cannot re-launch, the command line {argv[:3]!r} does not start with "
                          f"'{command}'")
    return launch(int(nproc), ["-m", "posenc", *strip_nproc(argv)], command)
