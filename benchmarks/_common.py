"""Shared helpers for the benchmark scripts: timing, environment record, table printing, atomic JSON save.

Used by benchmarks/rope.py and benchmarks/alibi.py. Scripts, not tests: run them as
``python benchmarks/rope.py --quick``.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Callable, Sequence

import torch
import torch.utils.benchmark as benchmark

from posenc._internal.atomic import atomic_write_json

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _sync(device: str | torch.device | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], *, warmup: int = 3, min_run_time: float = 0.5,
            device: str | torch.device | None = None) -> float:
    """Median seconds per call of ``fn()`` (no arguments), after ``warmup`` untimed calls.

    torch.utils.benchmark.Timer.blocked_autorange picks the number of calls per measurement so each block is long
    enough to time reliably and keeps sampling for ``min_run_time`` seconds; the median over blocks is returned.
    Timer synchronises CUDA itself; ``device`` only matters for the warm-up.
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average (Unix), or None: benchmarks record it beside each number on a shared machine."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def status_kib(key: str) -> int | None:
    """A kB field of /proc/self/status (VmRSS, VmHWM): the process's resident memory now and its high-water mark
    (Linux; None elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def environment(device: str | torch.device = "cpu") -> dict:
    """What the numbers were measured on: machine, library versions, thread count, load average at the start."""
    env = {
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "load_average_start": load_average(),
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def device_tag(device: str | torch.device) -> str:
    """Short name for result files: 'cpu' or 'cuda'."""
    return torch.device(device).type


def format_table(rows: Sequence[dict], columns: Sequence[str], floatfmt: str = "{:.3g}",
                 markdown: bool = False) -> str:
    """Plain-text (or Markdown) table of ``rows`` (dicts) restricted to ``columns``; None shows as '-'."""
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return floatfmt.format(v)
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def print_table(rows: Sequence[dict], columns: Sequence[str], title: str | None = None,
                file=sys.stdout, markdown: bool = False) -> None:
    if title:
        print(f"\n{'#### ' if markdown else ''}{title}\n" if markdown else f"\n{title}", file=file)
    print(format_table(rows, columns, markdown=markdown), file=file, flush=True)


def save_json(obj: object, path: str) -> str:
    """Write ``obj`` as JSON atomically (posenc's shared writer: temp file + os.replace); return the path."""
    atomic_write_json(path, obj)
    return path


def gbps(n_bytes: int, seconds: float | None) -> float | None:
    """Effective bandwidth in GB/s (1e9 bytes per second)."""
    return None if not seconds else n_bytes / seconds / 1e9


def time_split(lengths: list[int], seconds: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares fit seconds = a T + b T^2 over forwards of ``lengths`` tokens (two or more
    distinct lengths): a T is the time of the per-token work at T tokens, b T^2 attention's. Used by
    benchmarks/matmul_peak.py and the SmolLM2 study's cost table (scripts/smollm2_study.py)."""
    if len(set(lengths)) < 2 or len(lengths) != len(seconds):
        raise ValueError(f"lengths: expected two or more distinct lengths with one time each, got {lengths}, {seconds}")
    scale = float(max(lengths))         # (lengths in units of the longest: the columns T and T^2 stay comparable)
    T = torch.tensor(lengths, dtype=torch.float64) / scale
    fit = torch.linalg.lstsq(torch.stack([T, T * T], 1), torch.tensor(seconds, dtype=torch.float64)[:, None])
    a, b = fit.solution.flatten().tolist()
    return a / scale, b / scale ** 2
