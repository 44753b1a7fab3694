"""A lab run never loses finished work and never ends in a traceback: diverged models are recorded as such (rows and
curves, strict JSON), a failure keeps the rows finished before it, internal errors are called bugs, the --out folder
is locked, non-text data and malformed flags are refused in one line."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc._internal.errors import DataError
from posenc.lab import lock as L
from posenc.lab.checkpoint import load_checkpoint, save_checkpoint
from posenc.lab.data import check_text, load_corpus
from posenc.lab.presets import get_preset
from posenc.lab.run import checkpoint_path, finite_json, run_lab, training
from posenc.lab.train import make_optimizer
from posenc.nn.model import TinyLM

# a model small enough to train in well under a second
TINY = ["--tasks", "lm", "--schemes", "rope,learned", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--train-len", "16", "--batch-size", "4", "--steps", "3", "--warmup", "1", "--eval-lens", "16,32",
        "--eval-tokens", "128", "--sliding-stride", "0", "--extensions", "linear", "--threads", "1", "--quiet"]


def strict_json(path: Path) -> dict:
    """JSON as the standard defines it: NaN / Infinity are not JSON."""
    def refuse(token):
        raise AssertionError(f"{path} holds {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posenc {command}: error:") and "\n" not in err, err
    return err


def test_diverged_run_is_written_and_marked(tmp_path, capsys):
    assert main(["lab", *TINY, "--lr", "1e30", "--out", str(tmp_path)]) == 0
    doc = strict_json(tmp_path / "results.json")
    assert doc["results"] and all(r["value"] is None for r in doc["results"])
    for r in doc["results"]:
        assert r["note"] == ("n/a (table = 16)" if r["scheme"] == "learned" and r["eval_len"] > 16
                             else "diverged (non-finite)")
    assert doc["curves"] and all(v is None for curve in doc["curves"].values() for v in curve)
    assert "rope" in doc["meta"]["diverged"] and "learned" in doc["meta"]["diverged"]
    report = (tmp_path / "report.md").read_text()
    assert "diverged (non-finite)" in report and "(1 thread)" in report
    assert (tmp_path / "ppl_vs_length.png").exists()
    assert not (tmp_path / L.LOCK_NAME).exists()  # released


def test_resuming_a_checkpoint_holding_nan_reports_diverged(tmp_path):
    cfg = get_preset("default", tasks=["lm"], schemes=["rope"], d_model=16, n_layers=1, n_heads=2, train_len=16,
                     batch_size=4, steps=3, warmup=1, eval_lens=[16, 32], eval_tokens=128, sliding_stride=0,
                     extensions=[], threads=1, out=str(tmp_path))
    good = run_lab(cfg, progress=False, log=lambda *_: None)
    assert all(r["value"] is not None for r in good["results"])
    ckpt = checkpoint_path(tmp_path, "lm", "rope", 0)
    model = TinyLM(cfg.model_config("rope"))
    opt = make_optimizer(model, training(cfg))
    meta = load_checkpoint(ckpt, model, opt)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    save_checkpoint(ckpt, model, opt, meta["step"], meta["settings"])  # a valid checkpoint of a blown-up model
    doc = run_lab(cfg, resume=True, progress=False, log=lambda *_: None)
    assert all(r["value"] is None and r["note"] == "diverged (non-finite)" for r in doc["results"])
    strict_json(tmp_path / "results.json")


def test_finite_json_replaces_every_non_finite_number():
    doc, n = finite_json({"a": [1.0, float("nan"), {"b": float("inf")}], "c": (float("-inf"), 2)})
    assert doc == {"a": [1.0, None, {"b": None}], "c": [None, 2]} and n == 3


def test_a_failure_keeps_the_finished_rows_and_is_reported_as_a_bug(tmp_path, capsys, monkeypatch):
    from posenc.lab import run as R

    real = R.evaluate_extensions

    def broken(*args, **kwargs):  # the rope model is trained and evaluated, then an internal error
        raise KeyError("internal slip")

    monkeypatch.setattr(R, "evaluate_extensions", broken)
    assert main(["lab", *TINY, "--schemes", "learned,rope", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: internal error (a bug in posenc, not in your input): KeyError")
    assert "report" in err and "traceback saved to " in err and "\n" not in err
    saved = Path(err.split("traceback saved to ")[1].split(";")[0])
    assert "KeyError" in saved.read_text()
    saved.unlink()
    doc = strict_json(tmp_path / "results.json")
    assert "KeyError" in doc["meta"]["incomplete"]
    assert {r["scheme"] for r in doc["results"]} == {"learned", "rope"}  # learned finished; rope evaluated
    assert (tmp_path / "report.md").exists() and not (tmp_path / L.LOCK_NAME).exists()
    assert "**Incomplete run** (ended early by KeyError" in (tmp_path / "report.md").read_text()
    monkeypatch.setattr(R, "evaluate_extensions", real)


def test_a_corrupt_checkpoint_says_how_to_restart_that_model(tmp_path, capsys):
    assert main(["lab", *TINY, "--schemes", "rope", "--out", str(tmp_path)]) == 0
    ckpt = checkpoint_path(tmp_path, "lm", "rope", 0)
    data = bytearray(ckpt.read_bytes())
    data[-100] ^= 0xFF
    ckpt.write_bytes(bytes(data))
    assert main(["lab", *TINY, "--schemes", "rope", "--out", str(tmp_path), "--resume"]) == 2
    err = one_line_error(capsys, "lab")
    assert str(ckpt) in err and "delete" in err and "--resume" in err


# ---- the --out lock

def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_second_run_into_a_locked_out_is_refused_naming_the_holder(tmp_path, capsys):
    holder = _sleeper()
    try:
        (tmp_path / L.LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                        "command": "posenc lab --preset ntk", "started": "t0"}))
        assert main(["lab", *TINY, "--out", str(tmp_path)]) == 2
        err = one_line_error(capsys, "lab")
        assert f"pid {holder.pid}" in err and "posenc lab --preset ntk" in err and "in use" in err
        assert not (tmp_path / "results.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = _sleeper()
    dead.kill()
    dead.wait()
    (tmp_path / L.LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                    "command": "old", "started": "t0"}))
    with L.out_lock(tmp_path, "new run") as path:
        info = json.loads(path.read_text())
        assert info["pid"] == os.getpid() and info["command"] == "new run"
        with pytest.raises(L.LockError, match="in use by another posenc run"):  # held: a second taker is refused
            L.acquire(tmp_path, "other")  # (same pid would be ours; the holder's entry decides)
    assert not path.exists() and not list(tmp_path.glob(".posenc-lock*"))


def test_a_lock_from_another_host_is_never_guessed_stale(tmp_path):
    (tmp_path / L.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "command": "c", "started": "t"}))
    with pytest.raises(L.LockError, match="elsewhere"):
        L.acquire(tmp_path, "mine")


# ---- data

def test_binary_data_is_refused_naming_the_file(tmp_path, capsys):
    junk = tmp_path / "random.bin"
    junk.write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(DataError, match="random.bin is not text: not valid UTF-8 at byte"):
        load_corpus(str(junk))
    controls = tmp_path / "controls.txt"
    controls.write_bytes(b"text\x00\x01\x02" * 100)
    with pytest.raises(DataError, match="control characters"):
        check_text(controls.read_bytes(), controls)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world\n" * 200)
    (folder / "logo.png").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DataError, match="logo.png is not text"):
        load_corpus(str(folder))
    assert check_text("naïve café — ok\n".encode(), "x")  # UTF-8 text passes
    assert main(["lab", *TINY, "--data", str(junk), "--out", str(tmp_path / "o")]) == 2
    assert "--data" in one_line_error(capsys, "lab")


# ---- flags refused before anything runs

@pytest.mark.parametrize("argv,word", [
    (["--eval-lens", "96,,192"], "--eval-lens"),
    (["--eval-lens", "16,"], "--eval-lens"),
    (["--train-len", "1"], "--train-len"),
    (["--ckpt-every", "-1"], "--ckpt-every"),
    (["--threads", "-3"], "--threads"),
    (["--device", "junk"], "--device"),
    (["--lr", "nan"], "--lr"),
    (["--dist-timeout", "0"], "--dist-timeout"),
    (["--dist-timeout", "inf"], "--dist-timeout"),
    (["--steps", "1e3"], "--steps"),
])
def test_bad_flags_fail_in_one_line(tmp_path, capsys, argv, word):
    assert main(["lab", *TINY, "--out", str(tmp_path / "o"), *argv]) == 2
    assert word in one_line_error(capsys, "lab")
    assert not (tmp_path / "o").exists()  # nothing created


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_impossible_out_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "sub"
    assert main(["lab", *TINY, "--out", str(out)]) == 2
    err = one_line_error(capsys, "lab")
    assert "cannot create the output folder" in err and str(out) in err


def test_validation_happens_before_relaunch(tmp_path, capsys, monkeypatch):
    from posenc.lab import launch

    def no_relaunch(*a, **k):
        raise AssertionError("relaunched before validating")

    monkeypatch.setattr(launch, "launch", no_relaunch)
    for bad in (["--steps", "-1"], ["--data", str(tmp_path / "missing")], ["--dist-timeout", "-5"]):
        assert main(["lab", *TINY, "--nproc", "2", "--out", str(tmp_path / "o"), *bad]) == 2
        one_line_error(capsys, "lab")



@pytest.mark.parametrize("argv,word", [(["--d-model", str(2**20)], "--d-model must be at most"),
                                       (["--eval-lens", f"16,{2**30}"], "--eval-lens must be at most"),
                                       (["--threads", "2147483648"], "--threads must be at most"),
                                       (["--steps", str(2**40)], "--steps must be at most"),
                                       (["--randomized-positions", str(2**40)],
                                        "--randomized-positions must be at most")])
def test_sizes_that_would_exhaust_memory_are_refused(tmp_path, capsys, argv, word):
    assert main(["lab", *TINY, "--out", str(tmp_path / "o"), *argv]) == 2
    assert word in one_line_error(capsys, "lab")


@pytest.mark.parametrize("flags, match", [
    (["--seeds", "0,0"], "--seeds: 0 appears more than once"),
    (["--schemes", "rope,rope"], "--schemes: 'rope' appears more than once"),
    (["--mlp-ratio", "100000"], "--mlp-ratio must be at most 256"),
    (["--d-model", "65536", "--heads", "4"], "GiB for weights, gradients and Adam state"),
    (["--device", "mps"], "--device: expected auto, cpu, cuda or cuda:N"),
    (["--device", "cpu:5"], "--device: expected auto, cpu, cuda or cuda:N"),
    (["--rope-base", "1e39"], "--rope-base must be at most"),
    (["--schemes", "t5", "--scheme-options", "t5_max_distance=8"],
     "t5_max_distance must exceed the 16 exact buckets (t5_buckets // 2), got 8"),
    (["--schemes", "t5", "--scheme-options", "t5_buckets=1"], "t5_buckets must be >= 2"),
])
def test_settings_that_cannot_run_are_refused_before_any_work(flags, match, tmp_path, capsys):
    assert main(["lab", *TINY, *flags, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_unreadable_data_is_named(tmp_path, capsys):
    assert main(["lab", *TINY, "--data", "/proc/self/mem", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--data: cannot read /proc/self/mem" in err, err


def test_a_suspicious_base_warns_in_one_line(tmp_path, capsys):
    assert main(["lab", *TINY, "--schemes", "rope", "--rope-base", "0.5", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning:" in line]
    assert len(warned) == 1 and warned[0].startswith("posenc lab: warning: rope_theta 0.5 <= 1"), err


def test_a_seed_that_diverged_is_named_in_the_merged_row():
    """Seed 0 fine, seed 1 diverged: the merged cell says so (and which seed), not "n/a" (no encoding)."""
    from posenc.lab.context import DIVERGED
    from posenc.lab.run import aggregate
    from posenc.lab.tables import fmt

    base = {"task": "lm", "scheme": "rope", "method": "none", "eval_len": 64, "metric": "ppl"}
    for order in ((0, 1), (1, 0)):
        rows = [{**base, "seed": s, "value": 9.1 if s == 0 else None, **({"note": DIVERGED} if s else {})}
                for s in order]
        (merged,) = aggregate(rows)
        assert merged["value"] is None and merged["note"] == f"{DIVERGED} on seed 1"
        assert fmt(merged) == f"{DIVERGED} on seed 1"


def test_the_sliding_protocol_follows_eval_tokens_and_the_report_counts_whole_windows():
    from posenc.lab.presets import get_preset
    from posenc.lab.tasks.lm import scored_tokens

    assert get_preset("default", eval_tokens=8192).sliding_tokens == 8192
    assert get_preset("default", eval_tokens=8192, sliding_tokens=4096).sliding_tokens == 4096
    assert scored_tokens(1024, 96) == 960 and scored_tokens(1024, 128) == 1024 and scored_tokens(10, 96) == 96


@pytest.mark.parametrize("overrides, message", [
    ({"schemes": ["rope", "alibi"], "extended_schemes": ["rope", "alibi"], "extensions": ["yarn"]},
     "extended_schemes: the alibi scheme has no RoPE that an extension method can rescale"),
    ({"tasks": ["copy"], "extensions": ["longrope-search"], "eval_lens": [128, 256]},
     "extensions: longrope-search is fitted on the text corpus, which none of the tasks (copy) loads"),
])
def test_extension_settings_that_would_fail_after_training_are_refused_first(overrides, message):
    from posenc._internal.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_preset("default", threads=1, **overrides)
    # a non-RoPE scheme listed but not trained is not refused (nothing would run it); no extensions: nothing to check
    get_preset("default", threads=1, schemes=["rope"], extended_schemes=["rope", "alibi"], extensions=["yarn"])
    get_preset("default", threads=1, schemes=["alibi"], extended_schemes=["alibi"], extensions=[])


def test_an_interrupt_while_a_finished_unit_is_logged_writes_its_rows_once(tmp_path):
    """Ctrl-C arriving while the lab prints a finished model's line: that model's rows are in the partial results
    once (not twice, which would merge into a two-seed mean of one seed)."""
    cfg = get_preset("default", tasks=["lm"], schemes=["rope", "alibi"], d_model=16, n_layers=1, n_heads=2,
                     train_len=16, batch_size=4, steps=3, warmup=1, eval_lens=[16, 32], eval_tokens=128,
                     sliding_stride=0, extensions=[], threads=1, jobs=1, out=str(tmp_path))

    def log(line, *_):
        if "seed 0: train" in str(line):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_lab(cfg, progress=True, log=log)
    doc = strict_json(tmp_path / "results.json")
    assert doc["meta"]["incomplete"] and doc["results"]
    assert all(r["seed"] == 0 and r["std"] is None for r in doc["results"])


def test_an_interrupt_during_the_extensions_keeps_the_rows_already_evaluated(tmp_path, monkeypatch):
    """The unit in progress: its base rows and the extension rows finished before the interrupt are written."""
    import posenc.lab.run as R

    cfg = get_preset("default", tasks=["lm"], schemes=["rope"], d_model=16, n_layers=1, n_heads=2, train_len=16,
                     batch_size=4, steps=3, warmup=1, eval_lens=[16, 32], eval_tokens=128, sliding_stride=0,
                     extensions=["linear", "yarn"], threads=1, out=str(tmp_path))
    real, calls = R.evaluate, []

    def interrupt_third(run, ev):
        calls.append(ev.scaling)
        if len(calls) == 3:               # base, linear, then yarn is interrupted
            raise KeyboardInterrupt
        return real(run, ev)

    monkeypatch.setattr(R, "evaluate", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        run_lab(cfg, progress=False, log=lambda *_: None)
    doc = strict_json(tmp_path / "results.json")
    assert doc["meta"]["incomplete"] and {r["scaling"] for r in doc["results"]} == {"none", "linear"}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_jobs_run_leaves_no_worker_behind(tmp_path, how):
    """--jobs 2, the parent killed mid-training: with SIGTERM it ends its workers and exits 143 (one line); with
    kill -9 the workers end with it (parent-death signal) instead of training on into a folder a new run may take."""
    import signal
    import time

    argv = [sys.executable, "-m", "posenc", "lab", *TINY, "--steps", "100000", "--ckpt-every", "0", "--jobs", "2",
            "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and len(_children(proc.pid)) < 3:     # two workers and the resource tracker
        time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()
    time.sleep(3.0)                                        # training under way in both workers
    workers = _children(proc.pid)
    assert len(workers) >= 2
    proc.send_signal(getattr(signal, how))
    code = proc.wait(timeout=60)
    if how == "SIGTERM":
        err = proc.stderr.read().strip()
        assert code == 143 and err == "posenc lab: terminated", (code, err)
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "a worker outlived the run"


def test_a_new_run_sets_the_earlier_results_aside_and_a_report_drops_plots_it_no_longer_makes(tmp_path):
    cfg = get_preset("default", tasks=["lm"], schemes=["rope"], d_model=16, n_layers=1, n_heads=2, train_len=16,
                     batch_size=4, steps=3, warmup=1, eval_lens=[16, 32], eval_tokens=128, sliding_stride=0,
                     extensions=[], threads=1, out=str(tmp_path))
    first = run_lab(cfg, progress=False, log=lambda *_: None)
    # an earlier run's plot of a task this run lacks, shown by its report
    (tmp_path / "copy_accuracy.png").write_bytes(b"png")
    report = tmp_path / "report.md"
    report.write_text(report.read_text() + "\n![copy_accuracy.png](copy_accuracy.png)\n")
    again = run_lab(cfg, resume=True, progress=False, log=lambda *_: None)
    assert not (tmp_path / "copy_accuracy.png").exists() and (tmp_path / "ppl_vs_length.png").exists()
    assert not (tmp_path / "results.previous.json").exists()
    assert [r["value"] for r in again["results"]] == [r["value"] for r in first["results"]]
    # a fresh run (no --resume) into the folder: the earlier results are kept aside, not shown as this run's
    cfg.train.steps = 4
    logged: list[str] = []
    run_lab(cfg, progress=False, log=lambda *a: logged.append(str(a[0])))
    assert strict_json(tmp_path / "results.previous.json")["meta"]["settings"]["train"]["steps"] == 3
    assert strict_json(tmp_path / "results.json")["meta"]["settings"]["train"]["steps"] == 4
    assert (tmp_path / "report.previous.md").exists() and any("results.previous.json" in line for line in logged)


@pytest.mark.parametrize("flags, match", [
    (["--jobs", "2"], "--jobs: 2 worker processes and --nproc 2 do not combine"),
    (["--batch-size", "1"], "--batch-size: a training batch of 1 rows cannot be split across 2 processes"),
    (["--batch-size", "2", "--finetune-steps", "2", "--schemes", "rope", "--eval-lens", "16,64"],
     "a fine-tune at 64 tokens takes --batch-size x --train-len // 64 = 0 rows per step, fewer than the 2"),
])
def test_settings_nproc_cannot_take_are_refused_before_any_process_starts(flags, match, tmp_path, capsys,
                                                                         monkeypatch):
    from posenc.lab import launch

    monkeypatch.setattr(launch, "relaunch", lambda args: pytest.fail("relaunched before the check"))
    assert main(["lab", *TINY, *flags, "--nproc", "2", "--out", str(tmp_path / "run")]) == 2
    assert match in one_line_error(capsys, "lab")


def test_a_criterion_run_records_its_bar_in_the_checkpoint_settings(tmp_path, monkeypatch):
    """--train-until and --check-every decide where training stops, so a checkpoint carries them: a --resume with
    another bar is refused instead of reporting the old bar's model under the new one."""
    import posenc.lab.run as R

    seen = []
    real = R.train

    def spy(model, sampler, settings, job, **kw):
        seen.append(job.run_settings)
        return real(model, sampler, settings, job, **kw)

    monkeypatch.setattr(R, "train", spy)
    base = dict(tasks=["copy"], schemes=["rope"], d_model=16, n_layers=1, n_heads=2, steps=4, warmup=1,
                threads=1, extensions=[], out=str(tmp_path), copy_examples=8)
    run_lab(get_preset("copy", **base, train_until=0.9, check_every=2), progress=False, log=lambda *_: None)
    assert seen[-1]["train_until"] == 0.9 and seen[-1]["check_every"] == 2
    from posenc._internal.errors import CheckpointError
    with pytest.raises(CheckpointError, match="was written with different settings"):
        run_lab(get_preset("copy", **base, train_until=0.5, check_every=2), resume=True, progress=False,
                log=lambda *_: None)
    seen.clear()
    run_lab(get_preset("copy", **base, train_until=0.0), progress=False, log=lambda *_: None)
    assert "train_until" not in seen[-1]          # off: absent, so checkpoints from before the setting resume
