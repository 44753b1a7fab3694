"""--jobs: several models at once, one spawned process each. The plan (how many jobs and threads), which runs may
use workers (names a fresh process can import), and that the results equal one model at a time."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.cli import main
from posenc._internal.errors import ConfigError
from posenc.lab.jobs import Unit, plan, units_of, worker_plugins
from posenc.lab.presets import get_preset

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_units_follow_the_report_order():
    cfg = get_preset("smoke", tasks=["lm", "copy"], schemes=["rope", "alibi"], seeds=[0, 1], randomized_positions=0)
    units = units_of(cfg)
    assert len(units) == 8 and units[0] == Unit("lm", "rope", 0, 0) and units[1] == Unit("lm", "rope", 0, 1)
    assert units[-1] == Unit("copy", "alibi", 0, 1)


@pytest.mark.parametrize("jobs,threads,idle,n_units,device,distributed,want", [
    (0, 0, 2, 5, CPU, False, (2, 1)),    # idle 2-core machine, five models: two at once, a thread each
    (0, 0, 1, 5, CPU, False, (1, 1)),    # one core busy elsewhere: one at a time
    (0, 0, 8, 5, CPU, False, (5, 1)),    # no more jobs than models
    (0, 0, 8, 2, CPU, False, (2, 4)),    # idle cores shared by the jobs
    (0, 0, 2, 1, CPU, False, (1, 2)),    # one model: threads, not jobs
    (0, 3, 2, 5, CPU, False, (1, 3)),    # fixed --threads: one at a time with those threads
    (0, 0, 2, 5, CUDA, False, (1, 2)),   # a GPU: one process
    (0, 0, 2, 5, CPU, True, (1, 2)),     # under torchrun: one unit at a time per rank
    (3, 0, 2, 5, CPU, False, (3, 1)),    # explicit jobs
    (2, 2, 2, 5, CPU, False, (2, 2)),    # explicit both
])
def test_plan(jobs, threads, idle, n_units, device, distributed, want):
    cfg = get_preset("smoke", jobs=jobs, threads=threads, device="cpu")
    assert plan(cfg, device, n_units, lambda: idle, distributed) == want


@pytest.mark.parametrize("device,distributed", [(CUDA, False), (CPU, True)])
def test_explicit_jobs_need_one_cpu_process(device, distributed):
    cfg = get_preset("smoke", jobs=2, device="cpu")
    with pytest.raises(ConfigError, match="jobs: 2 processes need the CPU and a single lab process"):
        plan(cfg, device, 5, lambda: 2, distributed)


def test_names_registered_in_this_process_only_keep_one_job():
    from posenc.schemes import NoPEScheme, register_scheme
    from posenc.schemes.registry import SCHEMES

    @register_scheme("test-local-scheme")
    class Local(NoPEScheme):
        name = "test-local-scheme"

    try:
        cfg = get_preset("smoke", schemes=["rope", "test-local-scheme"], device="cpu")
        reason = worker_plugins(cfg)
        assert isinstance(reason, str) and "scheme test-local-scheme is registered by" in reason
        assert plan(cfg, CPU, 4, lambda: 2, False) == (1, 2)  # auto: stays in this process
        assert worker_plugins(get_preset("default")) == []  # built-ins need nothing
    finally:
        del SCHEMES["test-local-scheme"]


def test_bad_jobs_is_named(tmp_path, capsys):
    assert main(["lab", "--preset", "smoke", "--out", str(tmp_path), "--quiet", "--jobs", "-1"]) == 2
    assert "--jobs must be a non-negative integer, got -1" in capsys.readouterr().err


@pytest.mark.slow
def test_two_jobs_give_the_results_of_one(tmp_path):
    """Spawned workers, two models at once: the same rows, curves and timing keys as one process. LongRoPE's
    search scores on the text corpus, for the copy task's models too: a worker must load what the run loads."""
    docs = []
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        assert main(["lab", "--preset", "smoke", "--tasks", "lm,copy", "--schemes", "rope,alibi", "--extensions",
                     "yarn,longrope-search", "--threads", "1", "--jobs", str(jobs), "--out", str(out),
                     "--quiet"]) == 0
        docs.append(json.loads((out / "results.json").read_text()))
    one, two = docs
    assert two["meta"]["jobs"] == 2 and one["meta"]["jobs"] == 1
    assert two["results"] == one["results"] and two["curves"] == one["curves"]
    assert list(two["meta"]["timings_s"]) == list(one["meta"]["timings_s"])
    assert two["meta"]["extensions"].keys() == one["meta"]["extensions"].keys()


@pytest.mark.slow
def test_workers_load_the_plugins_that_registered_the_run_s_names(tmp_path):
    import sys
    from pathlib import Path

    from posenc._internal.plugins import LOADED
    from posenc.schemes.registry import SCHEMES

    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_scheme.py"
    out = tmp_path / "run"
    try:
        assert main(["lab", "--preset", "smoke", "--plugin", str(example), "--tasks", "lm", "--schemes", "rope,mine",
                     "--extensions", "none", "--sliding-stride", "0", "--threads", "1", "--jobs", "2",
                     "--out", str(out), "--quiet"]) == 0
        assert str(example) in LOADED.values()
    finally:  # forget the plug-in, so that another test can load it again
        SCHEMES.pop("mine", None)
        for name in [n for n, spec in LOADED.items() if spec == str(example)]:
            del LOADED[name]
            sys.modules.pop(name, None)
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["jobs"] == 2 and {r["scheme"] for r in doc["results"]} == {"rope", "mine"}
