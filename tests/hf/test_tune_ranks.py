"""posenc tune over several ranks (--nproc, torchrun) on a tiny random Llama (trained at 32 tokens, tuned for 64):
`--nproc 2` on the CPU (gloo, through torchrun) writes the report one process writes, value for value; a run whose
rank fails keeps every finished measurement, and --resume measures only the missing ones, once each; a bad --nproc
is one line.

The resume test forks its two ranks from this process (torch is already imported: fast) with a synthetic scorer,
each joining a gloo group on loopback as torchrun's workers do; the equivalence test runs the real command.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the models")

from posenc._internal.errors import DataError  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.hf.tune import measure, plan as planning, ranks  # noqa: E402
from posenc.lab.distributed import DistInfo  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, fails  # noqa: E402
from posenc_hf_folders import tune_model_fixture, tune_text_fixture  # noqa: E402,F401 (fixtures model, text)

transformers.logging.set_verbosity_error()
ROOT = Path(__file__).resolve().parents[2]
TARGET = 2 * TRAIN_LEN
# what the race decided and wrote: every one of these is the same with one process and with two
RACED = ("measurements", "race", "trained_check", "flagged", "answer", "answer_row", "deploy")


def argv(model, text, out, methods: str, *extra) -> list[str]:
    return ["tune", model, "--target-length", str(TARGET), "--data", text, "--threads", "1", "--no-progress",
            "--methods", methods, "--out", str(out), *extra]


def results(out) -> dict:
    return json.loads((Path(out) / "results.json").read_text())


@pytest.mark.slow
def test_two_cpu_ranks_write_the_one_process_report(model, text, tmp_path):
    """The real command: torchrun, gloo, the model measured on each rank; four candidates (linear, rerope's three
    windows), the better half out after window 1."""
    two = subprocess.run([sys.executable, "-m", "posenc", *argv(model, text, tmp_path / "two", "linear,rerope"),
                          "--nproc", "2"], capture_output=True, text=True, timeout=400, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert two.returncode == 0, two.stdout + two.stderr
    assert main(argv(model, text, tmp_path / "one", "linear,rerope")) == 0
    one, got = results(tmp_path / "one"), results(tmp_path / "two")
    for key in RACED:
        assert got[key] == one[key], key
    rounds = got["race"]["rounds"]
    assert len(rounds[0]) == 4 and len(rounds[1]) == 2          # eliminations, decided as one process decides
    assert two.stdout.count("winner:") == 1 and "measuring on 2 processes (gloo; rank 0 on cpu)" in two.stdout
    # only rank 0 writes the report; the ranks' own files are gone once results.json holds their measurements
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    assert (tmp_path / "two" / "config.json").read_text() == (tmp_path / "one" / "config.json").read_text()


# ---- a rank that fails, and --resume (two ranks forked from this process, a synthetic scorer)

AT_TARGET = {"yarn": 1.0, "linear": 1.5, "rerope": 2.0}


def _scorer(calls: Path, fail_at: int | None):
    """window_loss with a known answer (yarn best, linear flagged at the trained length); each finished call noted
    in ``calls`` by its key; rank 1 raises on its ``fail_at``-th call."""
    count = [0]

    def loss(model_dir, s):
        options = {k.split(".", 1)[1]: v for k, v in s.method_options.items()}
        method, length, window = s.methods[0], s.eval_lens[0], s.eval_offset // s.eval_lens[0]
        count[0] += 1
        if os.environ.get("RANK") == "1" and count[0] == fail_at:
            raise DataError("injected failure: rank 1 lost its device")
        with open(calls, "a") as f:     # one short line per call, appended: the ranks' lines do not mix
            f.write(planning.Candidate(method, "config", options).name + f"@{length}#{window}\n")
        if length == TRAIN_LEN:
            return 3.0 + (0.1 if method == "linear" else 0.0)
        return AT_TARGET[method] + 0.01 * window * (1 if method == "yarn" else -1) + 0.001 * (window % 2)

    return loss


def _rank(rank: int, world_size: int, port: int, command: list[str], where: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    Path(where, f"status{rank}").write_text(str(main(command)))


def two_ranks(command: list[str], where: Path) -> list[int]:
    """Run ``command`` as ranks 0 and 1 of a gloo group on loopback -> their exit statuses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_rank, args=(2, port, command, str(where)), nprocs=2, start_method="fork")
    return [int((where / f"status{r}").read_text()) for r in range(2)]


def noted(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


def test_a_failed_rank_loses_nothing_and_resume_measures_only_the_missing(model, text, tmp_path, monkeypatch):
    methods, out = "linear,yarn,rerope", tmp_path / "o"
    monkeypatch.setattr(measure, "window_loss", _scorer(tmp_path / "ref.calls", None))
    assert main(argv(model, text, tmp_path / "ref", methods)) == 0
    ref = results(tmp_path / "ref")
    # rank 1 fails on its 5th measurement, in window 1 (after the trained-length check and one window-1 job)
    monkeypatch.setattr(measure, "window_loss", _scorer(tmp_path / "cut.calls", 5))
    assert all(two_ranks(argv(model, text, out, methods), tmp_path))    # the job ends on both ranks
    kept = {**results(out)["measurements"], **json.loads((out / "measurements.rank1.json").read_text())["measurements"]}
    finished = noted(tmp_path / "cut.calls")
    assert sorted(kept) == sorted(finished)            # every finished measurement kept (rank 0's and rank 1's)
    assert any(k.endswith(f"@{TARGET}#0") for k in json.loads((out / "measurements.rank1.json").read_text())[
        "measurements"])                              # rank 1 kept its own window-1 measurement
    assert all(ref["measurements"][k] == v for k, v in kept.items()) and set(kept) < set(ref["measurements"])
    # the same command with --resume on two ranks: the missing measurements, each once, and the one-process report
    monkeypatch.setattr(measure, "window_loss", _scorer(tmp_path / "resume.calls", None))
    assert two_ranks(argv(model, text, out, methods, "--resume"), tmp_path) == [0, 0]
    again = noted(tmp_path / "resume.calls")
    assert sorted(again) == sorted(set(ref["measurements"]) - set(kept))
    got = results(out)
    for key in RACED:
        assert got[key] == ref[key], key
    assert got["answer"]["winner"] == "yarn" and [len(r) for r in got["race"]["rounds"]] == [5, 3]
    assert not ranks.rank_files(out)


def test_bad_nproc_is_one_line(model, text, tmp_path, capsys):
    base = argv(model, text, tmp_path / "o", "yarn")
    assert "--nproc: expected a positive number of processes, got 0" in fails(capsys, main, "tune",
                                                                              [*base, "--nproc", "0"])
    assert "--nproc: --device cuda:0 pins one GPU" in fails(capsys, main, "tune",
                                                            [*base, "--nproc", "2", "--device", "cuda:0"])
    have = torch.cuda.device_count()
    n = max(2, have + 1)
    assert f"--nproc: {n} processes on --device cuda need {n} GPUs, one each; this machine has {have}" in fails(
        capsys, main, "tune", [*base, "--nproc", str(n), "--device", "cuda"])
    assert "--nproc: several processes run on --device cpu (gloo) or cuda (NCCL), not mps" in fails(
        capsys, main, "tune", [*base, "--nproc", "2", "--device", "mps"])
    assert "dist_timeout (seconds)" in fails(capsys, main, "tune", [*base, "--nproc", "2", "--dist-timeout", "0"])
    assert not (tmp_path / "o").exists()                   # refused before any process started
    # more processes than a round has candidates is allowed, and said
    pool = ranks.Pool(type("Args", (), {"device": "cpu"})(), TRAIN_LEN, DistInfo(0, 8, 0, "gloo"))
    assert "8 processes are more than the 5 candidates of a window round" in pool.describe(5)
