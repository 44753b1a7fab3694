"""How much memory this machine has: the one owner of reading it (for checks that refuse sizes that cannot fit,
before the out-of-memory killer ends the process without a word)."""

from __future__ import annotations

import os


def physical_memory() -> int | None:
    """Total physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory() -> int | None:
    """Bytes a new allocation can take now (Linux: MemAvailable; elsewhere the physical memory), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()
