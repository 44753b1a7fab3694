"""A task registered from a plug-in file runs in `posenc lab` and in `posenc eval` with no edit of posenc: its
declared setting is validated and reaches it in both, and `posenc eval` on the exported lab model reproduces the
lab's own numbers (the same task code scoring the same weights, once as a TinyLM, once as a transformers model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.cli import main

pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 runs the exported model")

PLUGIN = str(Path(__file__).resolve().parents[2] / "fixtures" / "repeat_task_plugin.py")
LENS = [16, 32]


@pytest.fixture(scope="module", autouse=True)
def registry_restored(module_task_registry_restored):
    """The plug-in's task leaves the registry as it found it, for the whole module (its lab run is shared)."""
    yield


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    status = main(["lab", "--plugin", PLUGIN, "--tasks", "repeat", "--schemes", "rope", "--d-model", "32",
                   "--layers", "1", "--heads", "2", "--train-len", "16", "--batch-size", "4", "--steps", "6",
                   "--warmup", "1", "--eval-lens", ",".join(map(str, LENS)), "--extensions", "none",
                   "--sliding-stride", "0", "--threads", "1", "--jobs", "1", "--ckpt-every", "0",
                   "--repeat-rows", "3", "--out", str(out), "--quiet"])
    assert status == 0
    return out, json.loads((out / "results.json").read_text())


def test_the_plugin_task_runs_in_the_lab_with_its_declared_setting(lab_run):
    _, doc = lab_run
    rows = [r for r in doc["results"] if r["task"] == "repeat"]
    assert sorted(r["eval_len"] for r in rows) == LENS
    assert all(r["metric"] == "nll" and r["value"] > 0 for r in rows)
    assert doc["meta"]["settings"]["repeat_rows"] == 3          # flat beside the lab's own, as copy_examples


def test_the_plugin_task_runs_in_eval_and_matches_the_lab(lab_run, tmp_path):
    from posenc.hf.export import export_lab_model
    from posenc.hf.lab_bridge import find_run_checkpoint

    out, doc = lab_run
    folder = tmp_path / "hf"
    export_lab_model(find_run_checkpoint(out, "rope", task="repeat"), folder)
    status = main(["eval", str(folder), "--plugin", PLUGIN, "--tasks", "repeat", "--eval-lens",
                   ",".join(map(str, LENS)), "--task-options", "repeat_rows=3", "--threads", "1",
                   "--out", str(tmp_path / "eval"), "--no-progress"])
    assert status == 0
    got = json.loads((tmp_path / "eval" / "results.json").read_text())
    lab = {r["eval_len"]: r["value"] for r in doc["results"] if r["task"] == "repeat"}
    ev = {r["eval_len"]: r["value"] for r in got["results"] if r["task"] == "repeat"}
    assert set(ev) == set(LENS)
    for length in LENS:
        assert ev[length] == pytest.approx(lab[length], rel=1e-4, abs=1e-5)
    assert got["meta"]["settings"]["repeat_rows"] == 3


def test_a_bad_value_of_the_declared_setting_is_one_line_naming_it(capsys):
    status = main(["eval", "/nonexistent", "--plugin", PLUGIN, "--tasks", "repeat", "--task-options",
                   "repeat_rows=0"])
    assert status == 2
    assert re.search("repeat[-_]rows", capsys.readouterr().err)


def test_a_plugin_setting_has_its_own_flag_in_both_commands(capsys):
    # the plug-in is imported before the parser is built, so its declared setting is a flag like a built-in one
    for command in (["lab", "--schemes", "rope"], ["eval", "/nonexistent"]):
        status = main([*command, "--plugin", PLUGIN, "--tasks", "repeat", "--repeat-rows", "0"])
        assert status == 2
        err = capsys.readouterr().err
        assert "--repeat-rows" in err and "unrecognized" not in err, err
