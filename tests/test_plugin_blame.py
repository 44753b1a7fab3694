"""A plug-in's bug is reported as the plug-in's: the file, the registered name and the hook, one line, exit 2 --
never "internal error (a bug in posenc)". Each hook a plug-in can supply is tried with a raising and a malformed
version."""

from __future__ import annotations


import pytest
from posenc_plugin_fixtures import registries_restored

from posenc.cli import main

TINY = ["--preset", "smoke", "--seeds", "0", "--threads", "1", "--jobs", "1", "--quiet", "--steps", "2",
        "--eval-lens", "96", "--sliding-stride", "0", "--extensions", "none", "--randomized-positions", "0",
        "--finetune-steps", "0"]

HEADER = '''
import random, sys
import torch
import posenc
from posenc.schemes import Scheme
from posenc.lab.tasks import Task
'''

SCHEME = HEADER + '''
@posenc.register_scheme("bad")
class Bad(Scheme):
    biases = True

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def bias(self, q, k, ctx):
        {body}
'''

TASK = HEADER + '''
class Sampler:
    def __init__(self, seq_len, batch_size):
        self.seq_len, self.batch_size = seq_len, batch_size

    def batch(self, step, rank=0, world_size=1):
        x = torch.randint(0, 256, (self.batch_size, self.seq_len))
        y = torch.randint(0, 256, (self.batch_size, self.seq_len))
        {batch}
        return x, y


@posenc.register_task("bad")
class Bad(Task):
    metrics = ("exact_match",)

    def sampler(self, run, seq_len, batch_size, seed):
        return Sampler(seq_len, batch_size)

    def evaluate(self, ev):
        {evaluate}
'''

METHOD = HEADER + '''
@posenc.register_method("bad", label="bad")
def bad_write(spec):
    {body}
'''

GOOD_EVAL = "return [ev.row(L, 'exact_match', 0.5) for L in ev.cfg.eval_lens]"



@pytest.fixture
def clean_registries():
    """Plug-ins register into the process-wide registries: remove what a test added."""
    with registries_restored():
        yield


def blamed(tmp_path, capsys, source: str, argv: list[str]) -> str:
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(source)
    status = main(["lab", *TINY, "--plugin", str(plugin), *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert err.startswith("posenc lab: error: ") and err.count("\n") == 0, err
    assert "internal error" not in err and "a bug in posenc" not in err, err
    assert "bad_plugin.py" in err and "'bad'" in err, err
    return err


@pytest.mark.parametrize("body, words", [
    ("raise ValueError('boom')", ["scheme 'bad', hook bias() raised ValueError: boom", "line "]),
    ("return torch.zeros(3, 3)", ["scheme 'bad' (registered by", "bias() returned a torch.float32 tensor of shape "
                                  "[3, 3]; expected a float tensor of shape"]),
    ("return torch.zeros(self.n_heads, 5, q.shape[-2], k.shape[-2])", ["bias() returned"]),
    ("return [[0.0]]", ["bias() returned list"]),
    ("return torch.zeros(q.shape[-2], k.shape[-2], dtype=torch.long)", ["bias() returned a torch.int64"]),
    ("sys.exit(0)", ["scheme 'bad', hook bias() called sys.exit(0)"]),
    ("return torch.zeros(1, 2, 3) @ torch.zeros(4, 5)", ["hook bias() raised RuntimeError"]),
])
def test_a_schemes_hook(tmp_path, capsys, clean_registries, body, words):
    err = blamed(tmp_path, capsys, SCHEME.format(body=body), ["--tasks", "lm", "--schemes", "bad"])
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("batch, evaluate, words", [
    ("x = x.float()", GOOD_EVAL, ["sampler().batch(step=", "inputs of dtype torch.float32"]),
    ("y = y.float()", GOOD_EVAL, ["targets of dtype torch.float32"]),
    ("x = x + 1000", GOOD_EVAL, ["input ids in [", "expected ids in [0, 255]"]),
    ("y = y - 1000", GOOD_EVAL, ["target ids in ["]),
    ("y = torch.full_like(y, -100)", GOOD_EVAL, ["all -100 (nothing to score: the loss would be NaN)"]),
    ("x, y = x[:, :-1], y[:, :-1]", GOOD_EVAL, ["expected [rows, 96]"]),
    ("x = torch.cat([x, x])", GOOD_EVAL, ["rows (the length and batch asked)"]),
    ("raise KeyError('no data')", GOOD_EVAL, ["Sampler.batch() raised KeyError", "registers task 'bad'"]),
    ("", "return {'eval_len': 96}", ["evaluate() returned dict; expected a list of rows"]),
    ("", "return [42]", ["evaluate() returned row 0 as int"]),
    ("", "return [ev.row(12345, 'exact_match', 0.5)]", ["a row for eval_len 12345, which the run did not ask"]),
    ("", "return [ev.row(96, 'exact_match', -7)]", ["exact_match = -7 at length 96; expected a value in [0, 1]"]),
    ("", "return [ev.row(96, 'token_accuracy', float('inf'))]", ["a non-finite token_accuracy at length 96 for a model whose weights are finite"]),
    ("", "return [ev.row(96, 'exact_match', float('nan'))]", ["a non-finite exact_match"]),
    ("", "raise ZeroDivisionError('x')", ["task 'bad', hook evaluate() raised ZeroDivisionError"]),
])
def test_a_tasks_sampler_and_rows(tmp_path, capsys, clean_registries, batch, evaluate, words):
    err = blamed(tmp_path, capsys, TASK.format(batch=batch or "pass", evaluate=evaluate),
                 ["--tasks", "bad", "--schemes", "rope"])
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("body, words", [
    ("raise RuntimeError('no scaling')", ["extension method 'bad', hook write() raised RuntimeError: no scaling"]),
    ("return 1 / 0", ["hook write() raised ZeroDivisionError"]),
])
def test_a_methods_write(tmp_path, capsys, clean_registries, body, words):
    err = blamed(tmp_path, capsys, METHOD.format(body=body),
                 ["--tasks", "lm", "--schemes", "rope", "--extensions", "bad"])
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("code", ["sys.exit(0)", "sys.exit(3)", "raise SystemExit", "exit()"])
def test_sys_exit_at_import_is_a_plugin_error(tmp_path, capsys, clean_registries, code):
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(f"import sys\n{code}\n")
    assert main(["lab", *TINY, "--plugin", str(plugin), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin " in err and "bad_plugin.py: called sys.exit(" in err and "while being imported" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("body, words", [
    ("raise ValueError('boom')", ["scheme 'bad', hook bias() raised ValueError: boom"]),
    ("sys.exit(0)", ["scheme 'bad', hook bias() called sys.exit(0)"]),
])
def test_a_plugins_fault_in_a_worker_process_is_named_too(tmp_path, capsys, clean_registries, body, words):
    """--jobs 2: the hook runs in a spawned worker; the fault is still the plug-in's, by name."""
    argv = ["--tasks", "lm", "--schemes", "bad,rope", "--jobs", "2"]
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(SCHEME.format(body=body))
    tiny = [a for i, a in enumerate(TINY) if a != "--jobs" and not (i and TINY[i - 1] == "--jobs")]
    status = main(["lab", *tiny, "--plugin", str(plugin), *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2, err
    assert "internal error" not in err and "bad_plugin.py" in err, err
    for w in words:
        assert w in err, err
