"""No command takes an abbreviated flag: ``posenc search MODEL --out x`` is not ``--out-config x``, whatever
subcommand or nested parser reads the line."""

from __future__ import annotations

import argparse

import pytest

from posenc.cli import build_parser, main


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_parser_refuses_abbreviations():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 10
    for p in parsers:
        assert p.allow_abbrev is False, p.prog


def _prefixes(parser):
    """Strict prefixes of each long option that are not themselves options (what argparse would have expanded)."""
    options = {o for a in parser._actions for o in a.option_strings}
    for o in sorted(options):
        if o.startswith("--") and len(o) > 4:
            for cut in (1, 2, len(o) // 2):
                prefix = o[:len(o) - cut]
                if len(prefix) > 2 and prefix not in options:
                    yield prefix


@pytest.mark.parametrize("command", ["lab", "extend", "pick", "inspect", "check", "export", "eval"])
def test_a_prefix_of_a_flag_is_an_unknown_flag(command, capsys):
    p = build_parser().commands[command]
    for prefix in list(_prefixes(p))[:25]:
        assert main([command, prefix, "1"]) == 2, prefix
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err or "required" in err or "expected one argument" not in err, err
        assert f"unrecognized arguments: {prefix}" in err or "the following arguments are required" in err, err


def test_search_check_is_not_checkpoint(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")   # a model folder: the transformers search reads the options
    assert main(["search", str(tmp_path), "--target-length", "64", "--check", str(tmp_path / "x")]) == 2
    assert "unrecognized arguments: --check" in capsys.readouterr().err
