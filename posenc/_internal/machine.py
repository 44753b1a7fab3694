"""What this machine offers and how busy it is: the one owner of the CPU probes (the lab's thread and job choices,
and the CPU model recorded beside every timing in results.json, lab and eval alike, so a reader can repeat it)."""

from __future__ import annotations

import os
import platform
import time


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_jiffies() -> int | None:
    """The machine's non-idle CPU time so far, in clock ticks (Linux /proc/stat: all but idle and iowait), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]) - fields[3] - fields[4]


def busy_cores(window: float = 0.1) -> float | None:
    """Cores other processes keep busy now: the machine's non-idle CPU time over ``window`` seconds, less this
    process's own, per second. None where /proc/stat cannot be read."""
    before, own_before, t0 = busy_jiffies(), time.process_time(), time.perf_counter()
    if before is None:
        return None
    time.sleep(window)
    after, own_after, t1 = busy_jiffies(), time.process_time(), time.perf_counter()
    others = (after - before) / os.sysconf("SC_CLK_TCK") - (own_after - own_before)
    return max(0.0, others / (t1 - t0))


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC 7763 64-Core Processor"): what a reader needs to repeat a timing. From
    /proc/cpuinfo on Linux, else the platform's processor string, else "unknown"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
