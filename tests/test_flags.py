"""One flag vocabulary (posenc/_internal/flags.py): every command's --help shows the shared flags and none of the
spellings they replaced; each old spelling still parses, to the same value as the shared flag; a malformed value of
a shared flag is one line naming it; docs/tools.md's table is the declarations'."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posenc._internal.faults import Parser
from posenc._internal.flags import SHARED, shared_of
from posenc.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
OLD = {alias: f.flag for f in SHARED.values() for alias in f.aliases}
# an option of the same spelling that is another concept: posenc check --quiet prints only failures (no progress
# bars to hide)
OTHER_CONCEPT = {("check", "--quiet")}

# each parser's required arguments, so that one flag at a time can be parsed
BASE = {"lab": [], "eval": ["model"], "search RUN": ["run", "--target-length", "9", "--out", "o"],
        "search MODEL": ["model", "--target-length", "9"],
        "extend": ["c.json", "--target-length", "9", "--method", "yarn", "--out", "o"],
        "pick": ["--target-length", "9"], "export": ["src", "--out", "o"], "convert": ["m.gguf", "--out", "o"],
        "inspect": ["c.json"], "audit": ["c.json"], "check": [], "tune": ["model", "--target-length", "9"],
        "finetune": ["model", "--target-length", "9", "--out", "o"]}
VALUES = {"methods": "yarn,ntk", "method": "linear", "method_options": "dca.chunk_size=8", "factor": "4",
          "target_length": "1024", "seeds": "0,1", "seed": "3", "out": "o2", "threads": "2", "dtype": "bfloat16",
          "device": "cpu", "data": "d.txt", "plugin": "p.py", "task_options": "a=1", "nproc": "2", "dist_timeout": "9",
          "population": "8", "generations": "3"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser: posenc search's two (a lab run, a model folder), each posenc plot kind."""
    from posenc.hf import search as hf_search
    from posenc.hf.search_command import lab_arguments

    out = {}
    for name, parser in build_parser().commands.items():
        if name == "search":
            for key, add in (("search RUN", lab_arguments), ("search MODEL", hf_search.add_arguments)):
                out[key] = Parser(prog="posenc search")
                add(out[key])
        elif name == "plot":
            kinds = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            out.update({f"plot {kind}": sub for kind, sub in kinds.choices.items()})
        else:
            out[name] = parser
    return out


PARSERS = _parsers()


def _base(command: str) -> list[str]:
    return BASE.get(command, ["--out", "o.png"])    # a plot kind needs --out alone


def _aliases(parser) -> list[tuple[str, argparse.Action]]:
    """(old spelling, the action it parses to): the keys of argparse's table that the action does not show."""
    return [(k, a) for k, a in parser._option_string_actions.items() if k not in a.option_strings]


PAIRS = [(command, old, action.option_strings[0]) for command, parser in PARSERS.items()
         for old, action in _aliases(parser)]


def test_every_command_is_covered():
    assert set(PARSERS) - {k for k in PARSERS if k.startswith("plot ")} == set(BASE)


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_shows_the_shared_flags_and_no_old_spelling(command):
    parser = PARSERS[command]
    text = parser.format_help()
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    for flag in shared_of(parser):
        assert flag in shown, (command, flag)
    for old in OLD:
        assert old not in shown or (command, old) in OTHER_CONCEPT, (command, old)
    # a flag of the vocabulary is the declaration's, never declared again by hand
    options = {o for a in parser._actions for o in a.option_strings}
    hand_made = {f.flag for f in SHARED.values() if f.flag in options} - set(shared_of(parser))
    assert not hand_made, (command, hand_made)


def test_help_through_the_posenc_command():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command, shared, old in (("lab", "--methods", "--extensions"), ("pick", "--target-length", "--target-context")):
        out = subprocess.run([sys.executable, "-m", "posenc", command, "--help"], capture_output=True, text=True,
                             env=env, check=True).stdout
        assert shared in out and old not in out, command


def test_the_old_spellings_are_there():
    """The spellings the commands used before the vocabulary, each accepted where it was."""
    expected = {("lab", "--extensions", "--methods"), ("lab", "--extension-options", "--method-options"),
                ("lab", "--ext-factor", "--factor"), ("lab", "--quiet", "--no-progress"),
                ("search RUN", "--quiet", "--no-progress"), ("search MODEL", "--out-config", "--out"),
                ("pick", "--target-context", "--target-length"), ("export", "--rope-scaling", "--method")}
    assert expected <= set(PAIRS)


def _without(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        else:
            out.append(arg)
    return out


@pytest.mark.parametrize("command, old, new", PAIRS, ids=[f"{c}:{o}->{n}" for c, o, n in PAIRS])
def test_each_old_spelling_parses_as_the_shared_flag(command, old, new):
    parser = PARSERS[command]
    action = parser._option_string_actions[new]
    name = next(f.name for f in SHARED.values() if f.flag == new)
    value = [] if action.nargs == 0 else [VALUES[name]]
    base = _without(_base(command), new)
    given, given_old = parser.parse_args([*base, new, *value]), parser.parse_args([*base, old, *value])
    assert vars(given_old) == vars(given)
    assert getattr(given, action.dest) != action.default    # the flag was read, not left at its default


# a malformed value of each shared flag, on a command that takes it: one line naming the flag
BAD = {"methods": ["eval", "model", "--methods", "a,,b"], "method": ["export", "src", "--out", "o", "--method", "a,b"],
       "method_options": ["lab", "--method-options", "nokey"], "factor": ["eval", "model", "--factor", "abc"],
       "target_length": ["pick", "--target-length", "abc"], "seeds": ["lab", "--seeds", "1,x"],
       "seed": ["eval", "model", "--seed", "x"], "out": ["convert", "m.gguf", "--out", ""],
       "threads": ["eval", "model", "--threads", "x"], "dtype": ["eval", "model", "--dtype", "float64"],
       "device": ["eval", "model", "--device", "CUDA!"], "data": ["eval", "model", "--data", ""],
       "plugin": ["eval", "model", "--plugin", " "], "task_options": ["lab", "--task-options", "=1"],
       "nproc": ["tune", "model", "--target-length", "9", "--nproc", "x"],
       "dist_timeout": ["lab", "--dist-timeout", "soon"],
       "population": ["tune", "model", "--target-length", "9", "--population", "x"],
       "generations": ["tune", "model", "--target-length", "9", "--generations", "1.5"], "resume": ["eval", "model", "--resume=yes"], "overwrite": ["convert", "m.gguf", "--out", "o", "--overwrite=1"],
       "no_progress": ["lab", "--no-progress=no"], "no_band_attention": ["eval", "model", "--no-band-attention=1"]}


def test_every_shared_flag_has_a_bad_value():
    assert set(BAD) == set(SHARED)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_one_line_naming_the_flag(name, capsys):
    argv = BAD[name]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    # argparse's "argument --flag: ..." for a malformed value; a plug-in that cannot load is "--plugin: ..."
    assert "\n" not in err and re.match(rf"posenc {argv[0]}: error: (argument )?{SHARED[name].flag}\b", err), err


def test_docs_table_is_the_declarations():
    """docs/tools.md's table of shared flags: one row per declared flag, its old spellings the declaration's."""
    text = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `--") and len(cells) == 4:
            rows[cells[0].strip("`")] = set(re.findall(r"`(--[a-z-]+)`", cells[2]))
    assert rows == {f.flag: set(f.aliases) for f in SHARED.values()}
