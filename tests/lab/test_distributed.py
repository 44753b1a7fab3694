"""The lab on torch.distributed: 2 gloo processes reproduce 1 process, an error on one rank ends the job.

The equivalence test forks two workers from this process (fast: torch is already imported) that join a gloo
group on loopback; the failure test runs this file as a script under a real torchrun, exactly as
`posenc lab --nproc 2` does. Oracle: the same training in one process, with the same global batches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from posenc._internal.errors import CheckpointError, ConfigError, DataError
from posenc.lab import distributed as D
from posenc.lab import launch
from posenc.lab.data import IGNORE
from posenc.lab.tasks.copy import CopySampler
from posenc.lab.tasks.copy import copy_eval
from posenc.lab.train import TrainSettings, train
from posenc.nn.model import ModelConfig, TinyLM

CFG = dict(scheme="rope", d_model=32, n_layers=1, n_heads=2, max_len=16)
TRAIN = dict(steps=6, warmup=2, lr=1e-2)
BATCH, SEQ, SEED = 5, 16, 3  # 5 rows: ranks get 3 and 2 rows, each scoring a different number of tokens
EVAL_LENGTHS = [8, 16, 24, 32]
ROOT = Path(__file__).resolve().parents[2]


def _model(seed: int) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(ModelConfig(**CFG))


def _eval(model, length):
    return copy_eval(model, length, n_examples=8, seed=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_group(rank: int, world_size: int, port: int) -> D.DistInfo:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    info, _ = D.init_distributed("cpu", timeout_s=60)
    return info


def _equivalence_worker(rank: int, world_size: int, port: int, out: str) -> None:
    """Train 3 steps (rank 0 checkpoints), resume in a fresh model to 6, evaluate split across ranks."""
    info = _join_group(rank, world_size, port)
    ckpt = Path(out) / "ckpt.safetensors"
    sampler = CopySampler(SEQ, BATCH, SEED)
    settings_ = TrainSettings(**TRAIN)
    # rank 1 starts from different weights: DDP must broadcast rank 0's
    first = train(_model(0 if rank == 0 else 99), sampler, settings_, ckpt_path=ckpt, stop_after=3,
                  progress=False, rank=info.rank, world_size=info.world_size)
    D.barrier()  # rank 0 has written the checkpoint
    model = _model(1234)  # garbage: every rank must load the checkpoint
    second = train(model, sampler, settings_, ckpt_path=ckpt, resume=True, progress=False)  # rank: the group's
    rows = D.map_across_ranks(lambda n: (D.current().rank, _eval(model, n)), EVAL_LENGTHS, cost=lambda n: n)
    def fragile(n):
        if D.current().rank == 1:
            raise DataError(f"length {n} is unreadable")
        return n

    try:  # a failure inside the split evaluation reaches every rank, none waits forever
        D.map_across_ranks(fragile, [1, 2])
    except D.PeerError as exc:
        assert info.rank == 0, "only the other ranks see PeerError"
        peer_error = str(exc)
    except DataError:
        assert info.rank == 1, "the failing rank raises its own error"
    refusals = []  # ranks that disagree on where they resume, or on their data, must refuse to train
    for start, run_settings in [(info.rank, {"data": "a"}), (3, {"data": "abc"[info.rank]})]:
        try:
            D.ddp_wrap(model, start, run_settings)
        except (ConfigError, CheckpointError) as exc:
            refusals.append(str(exc))
    if info.is_main:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(Path(out) / "weights.safetensors"))
        (Path(out) / "result.json").write_text(json.dumps(
            {"losses": first["losses"] + second["losses"], "resumed_from": second["resumed_from"], "rows": rows,
             "refusals": refusals, "peer_error": peer_error}))
    D.shutdown()


def test_two_gloo_processes_match_one_process(tmp_path):
    sampler = CopySampler(SEQ, BATCH, SEED)
    rows0, rows1 = sampler.batch(0, 0, 2)[1], sampler.batch(0, 1, 2)[1]
    assert (rows0 != IGNORE).sum() != (rows1 != IGNORE).sum()  # a plain mean of per-rank means would be wrong

    torch.multiprocessing.start_processes(_equivalence_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2,
                                          start_method="fork")
    got = json.loads((tmp_path / "result.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors", "result.json", "weights.safetensors"]

    single = _model(0)
    ref = train(single, sampler, TrainSettings(**TRAIN), progress=False)
    assert got["resumed_from"] == 3
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=1e-5, atol=1e-6)
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "weights.safetensors"))
    for name, value in single.state_dict().items():
        # atol: 1/500 of one Adam step (lr 1e-2). Adam divides each gradient by its own running size, so an element
        # whose gradient is near zero turns the all-reduce's other summation order into a few 1e-6 of weight
        # (measured 3.4e-6 on 4 of 3072 elements); a wrong mean over the ranks is off by whole steps
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=2e-5, msg=name)
    # evaluation: split across both ranks, gathered in order, same numbers as one process on those weights
    assert {owner for owner, _ in got["rows"]} == {0, 1}
    dist_model = _model(0)
    dist_model.load_state_dict(weights)
    dist_model.eval()
    assert [r for _, r in got["rows"]] == [_eval(dist_model, n) for n in EVAL_LENGTHS]
    assert got["peer_error"] == "evaluation failed on rank 1: DataError: length 2 is unreadable"
    assert len(got["refusals"]) == 2, got["refusals"]
    assert "rank 1 resumed from step 1 but rank 0 from step 0" in got["refusals"][0]
    assert "run settings differ between rank 1 and rank 0 (keys ['data'])" in got["refusals"][1]


class _FailingSampler(CopySampler):
    stamp: Path  # where rank 1 notes the time it fails

    def batch(self, step, rank=0, world_size=1):
        if rank == 1 and step == 2:
            self.stamp.write_text(repr(time.time()))
            raise DataError("injected failure: rank 1 cannot read its shard")
        return super().batch(step, rank, world_size)


def _failing_job(out: str) -> None:
    """Run by torchrun (see the test below): rank 1 raises at step 2 while rank 0 waits in DDP's all-reduce."""
    sampler = _FailingSampler(SEQ, BATCH, SEED)
    sampler.stamp = Path(out) / "failed_at"
    with D.session("cpu", timeout_s=120) as (info, device):
        train(_model(0), sampler, TrainSettings(steps=200, warmup=2),
              ckpt_path=Path(out) / "ckpt.safetensors", progress=False, rank=info.rank, world_size=info.world_size)


@pytest.mark.slow
def test_error_on_one_rank_ends_the_job_with_its_message(tmp_path):
    # rank 0 is blocked in DDP's all-reduce when rank 1 fails; its collective timeout (120 s) is far above the
    # bound, so only torchrun tearing the job down can pass this
    proc = subprocess.run(launch.torchrun_command(2, [__file__, "fail", str(tmp_path)]), env=launch.worker_env(2),
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    ended = time.time()
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "rank 1 of 2: injected failure: rank 1 cannot read its shard" in output, output
    teardown = ended - float((tmp_path / "failed_at").read_text())
    assert teardown < 30, f"the job took {teardown:.0f} s to end after rank 1 failed"
    assert not (tmp_path / "ckpt.safetensors").exists()  # the run never finished


LAB_ARGS = ["--tasks", "copy", "--schemes", "rope", "--steps", "4", "--warmup", "1", "--train-len", "16",
            "--batch-size", "5", "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-lens", "16,32",
            "--extensions", "none", "--copy-examples", "4", "--quiet"]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL)")])])
def test_posenc_lab_nproc_2_trains_like_one_process(tmp_path, device):
    from safetensors.torch import load_file

    from posenc.cli import main

    args = [*LAB_ARGS, "--device", device]
    proc = subprocess.run([sys.executable, "-m", "posenc", "lab", *args, "--out", str(tmp_path / "two"),
                           "--nproc", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert main(["lab", *args, "--out", str(tmp_path / "one")]) == 0
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert [r["eval_len"] for r in two["results"]] == [r["eval_len"] for r in one["results"]]
    assert proc.stdout.count("wrote ") == 1  # only rank 0 reports and writes
    ckpt = "checkpoints/copy-rope-seed0.safetensors"
    a, b = load_file(str(tmp_path / "one" / ckpt)), load_file(str(tmp_path / "two" / ckpt))
    for name in a:
        if name.startswith("model."):
            torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6, msg=name)


# ---- validation (no processes) ----

def test_bad_environment_and_settings_are_named(monkeypatch):
    for name, value in dict(RANK="x", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="RANK: expected an integer, got 'x'"):
        D.init_distributed("cpu")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="inconsistent RANK=2, WORLD_SIZE=2"):
        D.init_distributed("cpu")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv(D.TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=D.TIMEOUT_ENV):
        D.init_distributed("cpu")
    with pytest.raises(ConfigError, match="positive"):
        D.timeout_seconds(0)
    with pytest.raises(ConfigError, match="batch_size: a training batch of 1 rows cannot be split across 2"):
        D.check_batch_size(1, 2)
    with pytest.raises(ConfigError, match="process group"):
        D.ddp_wrap(_model(0))
    with pytest.raises(ConfigError, match="device: cuda:1 pins one GPU"):
        D._rank_device(torch.device("cuda:1"), 0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device: cuda was requested but no CUDA device"):
            D._rank_device(torch.device("cuda"), 0)


def test_without_torchrun_everything_is_one_process(monkeypatch):
    for name in D.TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    info, device = D.init_distributed("cpu")
    assert info == D.DistInfo() and info.is_main and not info.distributed and device == torch.device("cpu")
    assert D.map_across_ranks(lambda x: x * x, [1, 2, 3]) == [1, 4, 9]
    exc = D.label_error(ValueError("bad"), D.DistInfo(1, 2))
    assert exc.args == ("rank 1 of 2: bad",)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10_000), max_size=30), st.integers(1, 8))
def test_assign_covers_every_item_and_balances(costs, world_size):
    owner = D.assign(costs, world_size)
    assert len(owner) == len(costs) and all(0 <= r < world_size for r in owner)
    load = [sum(c for c, r in zip(costs, owner) if r == k) for k in range(world_size)]
    if costs:  # greedy longest-first bound
        assert max(load) <= sum(costs) / world_size + max(costs)
    assert owner == D.assign(list(costs), world_size)  # deterministic: every rank agrees without talking


if __name__ == "__main__":  # torchrun worker for test_error_on_one_rank_ends_the_job_with_its_message
    if sys.argv[1] == "fail":
        _failing_job(sys.argv[2])


# ---- a stopped or hung rank ends the whole job (posenc lab --nproc 2 with a plug-in task that stalls rank 1)

STALL_PLUGIN = ROOT / "tests" / "fixtures" / "stall_plugin.py"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stop", "sleep"])
def test_a_stopped_or_hung_rank_ends_the_job_with_one_message(tmp_path, mode):
    # SIGSTOP: rank 1's heartbeat stops, rank 0's watchdog notices after --dist-timeout. sleep: rank 1's heartbeat
    # goes on, rank 0's collective times out after --dist-timeout. Either way torchrun then stops the job.
    out = tmp_path / "out"
    args = [sys.executable, "-m", "posenc", "lab", "--plugin", str(STALL_PLUGIN), "--tasks", "stall",
            *LAB_ARGS[2:], "--steps", "50", "--batch-size", "4", "--out", str(out), "--nproc", "2",
            "--dist-timeout", "10"]
    env = {**os.environ, "POSENC_TEST_STALL": mode, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=ROOT, env=env)
        ended = time.time()
    finally:
        stalled = out / "stalled"
        if stalled.exists():  # never leave a stopped process behind
            pid = int(stalled.read_text().split()[0])
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    pid, stalled_at = stalled.read_text().split()
    assert proc.returncode != 0
    err = proc.stderr
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(line.startswith("posenc lab: error: rank 0 of 2:") for line in lines), err
    assert lines[-1].startswith("posenc lab: error: the distributed job failed"), err
    assert ended - float(stalled_at) < 120, f"the job took {ended - float(stalled_at):.0f} s to end"
    assert not (out / "results.json").exists()
