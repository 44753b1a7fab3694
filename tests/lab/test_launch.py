"""`posenc lab --nproc N`: the torchrun command, the workers' environment and when to re-launch (no processes)."""

from __future__ import annotations

import os
import sys

import pytest

from posenc._internal.errors import ConfigError
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


def test_torchrun_summary_keeps_worker_lines_and_drops_the_traceback_wall():
    from posenc.lab.launch import TorchrunSummary

    s = TorchrunSummary()
    stream = [
        "posenc lab: error: rank 1 of 2: --steps must be a positive integer, got -1\n",
        "E1130 20:00:00.123000 4321 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 2)\n",
        "Traceback (most recent call last):\n",
        '  File "/x/torch/distributed/run.py", line 1, in <module>\n',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
        "============================================================\n",
        "  rank      : 1 (local_rank: 1)\n",
        "  exitcode  : 2 (pid: 99)\n",
    ]
    shown = [line for line in map(s.feed, stream) if line is not None]
    assert shown == [stream[0]]
    assert s.describe(1) == "rank 1 exited with status 2"
    assert TorchrunSummary().describe(3) == "torchrun exited with status 3"


def test_communication_failures_become_one_peer_error():
    from posenc.lab import distributed as D

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[127.0.0.1]:5555\nmore detail")
    err = D.as_peer_error(gloo, 60)
    assert isinstance(err, D.PeerError) and "lost contact with another rank (--dist-timeout 60 s)" in str(err)
    assert "\n" not in str(err)
    plain = RuntimeError("shape mismatch in matmul")  # a bug stays a bug
    assert D.as_peer_error(plain) is plain
