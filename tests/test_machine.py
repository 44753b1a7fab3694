"""posenc._internal.machine's CPU probes against the operating system's own accounts."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import pytest

from posenc._internal.machine import cpu_cores, cpu_model


def test_cpu_cores_is_the_affinity_mask():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cpu_cores() == expected


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's /proc/cpuinfo names the CPU")
def test_cpu_model_is_the_model_name_linux_reports():
    names = set(re.findall(r"^model name\s*:\s*(.+?)\s*$", Path("/proc/cpuinfo").read_text(errors="replace"), re.M))
    if not names:
        pytest.skip("this /proc/cpuinfo has no 'model name' line")
    assert cpu_model() in names


def test_cpu_model_is_never_empty_and_never_a_load():
    name = cpu_model()
    assert name and name.strip() == name
    assert not re.fullmatch(r"[\d.\s,\[\]]+", name)  # a name, not numbers
    assert name != "unknown" or not (platform.processor() or platform.machine())
