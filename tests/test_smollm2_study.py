"""scripts/smollm2_study.py refuses bad input in one line (exit 2) before any part runs: an unknown or repeated
part name in ``run --parts`` (or a part a tune run measures now), an unknown tune run, and a damaged part file (not
JSON, or without what run / collect read), which the line names. No model runs here: ``posenc eval`` and ``posenc
tune`` are replaced by a stub that fails the test if a part starts. The study's tune runs are checked against the
parts they stand for (tests/test_smollm2_study_tune.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "smollm2_study.py"


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The script as a module, its parts folder in tmp_path, and no part allowed to run."""
    spec = importlib.util.spec_from_file_location("smollm2_study_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    monkeypatch.setattr(module, "MODEL_DIR", tmp_path / "no-model")

    def no_eval(*args, **kwargs):
        raise AssertionError(f"a part ran before the input was checked: posenc {' '.join(args[:1])}")
    monkeypatch.setattr(module, "posenc", no_eval)
    return module


def _finished_part(study, part: str) -> Path:
    path = study.OUT / "parts" / part / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"meta": {"methods": {"none": {}}, "timings_s": {"none": 1.0}},
                                "results": [{"task": "ppl", "scaling": "none", "eval_len": 8192, "value": 3.0}]}))
    return path


def _one_error_line(capsys) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    return lines[0]


@pytest.mark.parametrize("parts, expected", [
    ("cpython-8k,cpython-99k", "unknown part 'cpython-99k'; the parts are cpython-8k, passkey-8k, "),
    ("cpython-8k,cpython-16k-w2", "part 'cpython-16k-w2' is measured by the tune run 'cpython-16k' now: python "
                                  "scripts/smollm2_study.py tune --runs cpython-16k"),
    ("cpython-8k,,prose-8k", "unknown part ''"),
    ("cpython-8k,prose-8k,cpython-8k", "'cpython-8k' given more than once"),
])
def test_the_part_list_is_checked_before_any_part_runs(study, capsys, parts, expected):
    with pytest.raises(SystemExit) as info:
        study.main(["run", "--parts", parts])          # (cpython-8k, first, has not run: it would start)
    assert info.value.code == 2
    line = _one_error_line(capsys)
    assert line.startswith("smollm2_study.py run: error: argument --parts: ") and expected in line


DAMAGED = {
    "not-json": '{"meta": {"methods": {}',
    "a-list": "[]",
    "no-meta": '{"results": []}',
    "no-timings": '{"meta": {"methods": {}}, "results": []}',
    "methods-not-object": '{"meta": {"methods": [], "timings_s": {}}, "results": []}',
    "no-results": '{"meta": {"methods": {}, "timings_s": {}}}',
    "row-without-value": '{"meta": {"methods": {}, "timings_s": {}}, "results": [{"task": "ppl", "scaling": "none", '
                         '"eval_len": 8192}]}',
    "row-not-object": '{"meta": {"methods": {}, "timings_s": {}}, "results": [3]}',
}


@pytest.mark.parametrize("damage", DAMAGED, ids=list(DAMAGED))
@pytest.mark.parametrize("command", ["run", "collect"])
def test_a_damaged_part_file_is_one_line_naming_it(study, capsys, damage, command):
    path = study.OUT / "parts" / "prose-8k" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(DAMAGED[damage])
    argv = ["run", "--parts", "cpython-8k,prose-8k"] if command == "run" else ["collect"]
    assert study.main(argv) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"smollm2_study.py {command}: error: part file {path}")
    assert ("is not valid JSON" if damage == "not-json" else "a damaged file") in line


def test_finished_parts_are_skipped_and_every_real_part_file_reads(study, capsys):
    _finished_part(study, "cpython-8k")
    assert study.main(["run", "--parts", "cpython-8k"]) == 0
    assert capsys.readouterr().out.strip() == "cpython-8k: finished, skipped"
    study.OUT = ROOT / "docs" / "results" / "smollm2"          # the study's own part files pass the check
    assert all(study.read_part(part) is not None for part in study.PARTS)


def test_an_unknown_tune_run_is_one_line(study, capsys):
    with pytest.raises(SystemExit) as info:
        study.main(["tune", "--runs", "cpython-16k,cpython-64k"])
    assert info.value.code == 2
    assert "argument --runs: unknown tune run 'cpython-64k'; the runs are cpython-16k, " in _one_error_line(capsys)


def test_the_command_line_gives_one_line_and_exit_2():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--parts", "cpython-8k,nope"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "unknown part 'nope'" in done.stderr
