"""`posenc lab --nproc N`: the torchrun command, the workers' environment and when to re-launch (no processes)."""

from __future__ import annotations

import os
import sys

import pytest

from posenc.errors import ConfigError
from posenc.lab import launch as L


def test_torchrun_command_is_single_node_loopback():
    cmd = L.torchrun_command(3, ["-m", "posenc", "lab", "--steps", "5"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "3"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"
    assert cmd[-5:] == ["-m", "posenc", "lab", "--steps", "5"]
    with pytest.raises(ConfigError, match="--nproc"):
        L.torchrun_command(0, ["x.py"])


def test_strip_nproc_and_thread_split():
    assert L.strip_nproc(["lab", "--nproc", "2", "--steps", "5", "--nproc=4"]) == ["lab", "--steps", "5"]
    assert L.worker_env(2, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    cores = len(os.sched_getaffinity(0))
    assert L.worker_env(2, {})["OMP_NUM_THREADS"] == str(max(1, cores // 2))


def test_relaunch_decisions(monkeypatch):
    class Args:
        nproc = 1

    assert L.relaunch(Args()) is None  # one process: do the work here
    Args.nproc = 0
    with pytest.raises(ConfigError, match="--nproc"):
        L.relaunch(Args())
    Args.nproc = 2
    with pytest.raises(ConfigError, match="does not start with 'lab'"):
        L.relaunch(Args(), ["check"])
    for name, value in dict(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="WORLD_SIZE=4"):
        L.relaunch(Args(), ["lab"])
    Args.nproc = 4
    assert L.relaunch(Args(), ["lab"]) is None  # already a torchrun worker
