"""posenc eval holds a plug-in task to the lab's contract (the same checks, called in one place for both commands),
gives a task --out as its folder (never the current directory), runs a plug-in's replacement of lm through that
replacement alone, lists every method for an unknown --methods entry, and never scores fewer tokens than asked
without saying so: a text too short for every length (or an --eval-offset near its end) is refused, and the help
and the report say which part of a --data file is scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 (transformers runs the models)")

from posenc.cli import main  # noqa: E402
from posenc._internal.errors import ConfigError, DataError  # noqa: E402
from posenc.hf.evaluate import EvalSettings, evaluate_model  # noqa: E402
from posenc.hf.lab_bridge import validation_bytes  # noqa: E402
from posenc_hf_folders import fails, tiny_llama  # noqa: E402
from posenc_plugin_fixtures import registries_restored  # noqa: E402

TASK = '''
import torch
import posenc
from posenc.lab.tasks import Task


@posenc.register_task("{name}"{replace})
class Bad(Task):
    metrics = ("{metric}",)
    title = "Bad task"

    def sampler(self, run, seq_len, batch_size, seed):
        return None

    def evaluate(self, ev):
        {evaluate}
'''
FAST = ["--threads", "1", "--no-progress", "--eval-lens", "16", "--sliding-stride", "0"]


@pytest.fixture
def clean_registries():
    """Plug-ins register into the process-wide registries: remove what a test added."""
    with registries_restored():
        yield


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """Real text (posenc's own sources): the lab splits a file 90/10 by bytes."""
    import posenc

    text = "".join(p.read_text() for p in sorted(Path(posenc.__file__).parent.rglob("*.py")))[:60_000]
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(text)
    return str(path)


def plugin(tmp_path, evaluate: str, name: str = "bad", metric: str = "exact_match", replace: bool = False) -> str:
    path = tmp_path / "bad_plugin.py"
    path.write_text(TASK.format(name=name, metric=metric, evaluate=evaluate,
                                replace=", replace=True" if replace else ""))
    return str(path)


# ---- item 5: one row contract for lab and eval -------------------------------------------------------------------

@pytest.mark.parametrize("evaluate, words", [
    ("return [ev.row(L, 'exact_match', float('nan')) for L in ev.cfg.eval_lens]",
     "evaluate() reported a non-finite exact_match at length 16 for a model whose weights are finite"),
    ("return [ev.row(16, 'exact_match', -7)]", "exact_match = -7 at length 16; expected a value in [0, 1]"),
    ("return [ev.row(12345, 'exact_match', 0.5)]", "a row for eval_len 12345, which the run did not ask for"),
    ("return None", "evaluate() returned NoneType; expected a list of rows"),
])
def test_a_plugin_tasks_rows_keep_the_labs_contract_in_eval(llama, tmp_path, capsys, clean_registries, evaluate,
                                                            words):
    err = fails(capsys, main, "eval", ["eval", str(llama), "--plugin", plugin(tmp_path, evaluate), "--tasks", "bad",
                                       *FAST, "--out", str(tmp_path / "out")])
    assert words in err and "bad_plugin.py" in err and "task 'bad'" in err, err
    assert "diverged" not in err and "a bug in posenc" not in err, err
    assert not (tmp_path / "out" / "results.json").exists()


WRITES = ("(ev.run.out / 'task-file.txt').write_text('x')\n        "
          "return [ev.row(L, 'exact_match', 0.5) for L in ev.cfg.eval_lens]")


def test_a_task_writes_into_out_never_the_current_directory(llama, tmp_path, monkeypatch, clean_registries):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    spec = plugin(tmp_path, WRITES)
    assert main(["eval", str(llama), "--plugin", spec, "--tasks", "bad", *FAST, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "task-file.txt").read_text() == "x"
    assert main(["eval", str(llama), "--plugin", spec, "--tasks", "bad", *FAST]) == 0    # no --out: a temporary one
    assert list(cwd.iterdir()) == []


def test_a_plugin_replacing_lm_is_applied_fully(llama, tmp_path, clean_registries):
    """Its evaluate() gives the lm rows (eval's own perplexity protocol does not run beside it)."""
    spec = plugin(tmp_path, "return [ev.row(L, 'score', 0.25) for L in ev.cfg.eval_lens]", name="lm",
                  metric="score", replace=True)
    assert main(["eval", str(llama), "--plugin", spec, "--tasks", "lm", *FAST, "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert [(r["task"], r["eval_len"], r["metric"], r["value"]) for r in rows] == [("lm", 16, "score", 0.25)]


# ---- --methods: every method is listed ---------------------------------------------------------------------------

def test_an_unknown_method_lists_every_method(llama, capsys):
    from posenc.attention import attention_method_names

    err = fails(capsys, main, "eval", ["eval", str(llama), "--methods", "bogus", *FAST])
    assert "methods: expected one of" in err and "'bogus'" in err, err
    for name in ("none", "yarn", *attention_method_names()):
        assert name in err, (name, err)


# ---- item 7: every length scores the tokens asked, and the report says which text -------------------------------

def test_an_offset_near_the_end_is_refused_not_scored_short(llama, text_file):
    val, _ = validation_bytes(text_file)
    s = EvalSettings(eval_lens=[16], data=text_file, eval_tokens=256, eval_offset=len(val) - 100, sliding_stride=0)
    with pytest.raises(DataError, match=rf"eval_offset: .*has {len(val)} tokens; skipping {len(val) - 100} leaves "
                                        r"100, fewer than the 257 that eval_tokens 256 reads at length 16"):
        evaluate_model(str(llama), s, progress=False, log=lambda *a: None)


def test_a_short_text_is_refused_naming_the_length_it_cannot_fill(llama, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("x = 1\n" * 300)        # 1800 bytes: a validation split of 180
    err = fails(capsys, main, "eval", ["eval", str(llama), "--data", str(short), "--eval-tokens", "400",
                                       "--threads", "1", "--no-progress", "--eval-lens", "16,64",
                                       "--sliding-stride", "0"])
    assert err.startswith("posenc eval: error: --data: the text") and "has 180 tokens, fewer than the 401 that " \
        "--eval-tokens 400 reads at length 16" in err, err
    assert "--data-split all" in err, err


def test_a_text_too_short_for_a_haystack_names_the_task_not_a_budget(llama, tmp_path, capsys):
    """A RULER task needs a haystack as long as the length: the refusal names the task and the length, not
    --eval-tokens, which that task does not read."""
    short = tmp_path / "short.txt"
    short.write_text("x = 1\n" * 300)        # 1800 bytes: a validation split of 180
    err = fails(capsys, main, "eval", ["eval", str(llama), "--data", str(short), "--tasks", "niah_single_2",
                                       "--threads", "1", "--no-progress", "--eval-lens", "256"])
    assert "has 180 tokens, fewer than the 256 that task niah_single_2 reads at length 256" in err, err
    assert "eval-tokens" not in err and "lower the length" in err, err


def test_data_split_all_scores_the_whole_file(llama, text_file, tmp_path):
    raw = Path(text_file).read_bytes()
    s = EvalSettings(eval_lens=[16], data=text_file, eval_tokens=len(raw) - 17, sliding_stride=0, data_split="all")
    doc = evaluate_model(str(llama), s, progress=False, log=lambda *a: None)
    assert doc["results"][0]["n_scored"] == (len(raw) - 17) // 16 * 16
    with pytest.raises(DataError, match="data: the text"):         # the validation split is a tenth of it
        evaluate_model(str(llama), EvalSettings(eval_lens=[16], data=text_file, eval_tokens=len(raw) - 17,
                                                sliding_stride=0), progress=False, log=lambda *a: None)
    with pytest.raises(ConfigError, match="data_split: expected one of"):
        EvalSettings(data_split="train").validate()


def test_help_and_report_say_which_part_of_the_file_is_scored(llama, text_file, tmp_path, capsys):
    assert main(["eval", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "last 10% of bytes" in help_text and "--data-split" in help_text
    assert main(["eval", str(llama), "--data", text_file, "--eval-tokens", "64", *FAST, "--out",
                 str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    val, _ = validation_bytes(text_file)
    assert f"scored: its validation split (the last 10% of its bytes), {len(val)} bytes" in report, report
    assert main(["eval", str(llama), "--data", text_file, "--eval-tokens", "64", "--data-split", "all", *FAST,
                 "--out", str(tmp_path / "all")]) == 0
    report = (tmp_path / "all" / "report.md").read_text()
    assert f"scored: all of it, {len(Path(text_file).read_bytes())} bytes" in report, report



def test_resume_reads_an_eval_from_before_data_split_as_the_validation_split():
    """An interrupted eval's results.json written before --data-split existed lacks the setting: it scored the
    validation split, so it resumes under the default and is refused under --data-split all."""
    from posenc.hf.evaluate import check_resumable

    now = EvalSettings(eval_lens=[16]).validate().to_dict()
    before = {k: v for k, v in now.items() if k != "data_split"}
    doc = {"results": [], "curves": {}, "meta": {"timings_s": {}, "methods": {}, "started": "then",
                                                 "incomplete": ["none"], "settings": before, "model_files": [],
                                                 "data": {}}}
    check_resumable(doc, {"settings": now, "model_files": [], "data": {}, "model": "m"})
    with pytest.raises(ConfigError, match="data_split: 'validation' then, 'all' now"):
        check_resumable(doc, {"settings": {**now, "data_split": "all"}, "model_files": [], "data": {}, "model": "m"})
