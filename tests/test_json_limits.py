"""Every JSON file posenc reads (configs, search checkpoints, run results, checkpoint metadata, factor files) is
refused in one line when it is deeply nested, holds a 5000-digit number or is not JSON -- never a RecursionError or
ValueError reported as a bug in posenc."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from posenc._internal.json_io import MAX_DEPTH, loads
from posenc.cli import main
from posenc._internal.errors import PosencError

HOSTILE = {
    "deep list": "[" * 200_000 + "]" * 200_000,
    "deep object": '{"a":' * 5000 + "1" + "}" * 5000,
    "just past the limit": "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "5000-digit number": '{"model_type": "llama", "rope_theta": ' + "9" * 5000 + "}",
    "5000-digit in a list": "[" + "1" * 5000 + "]",
    "not JSON": "{'a': 1}",
    "truncated": '{"a": [1, 2',
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE)
def test_the_reader_refuses_each_in_one_line(text):
    with pytest.raises(PosencError) as info:
        loads(text, "config file 'x.json'")
    msg = str(info.value)
    assert msg.startswith("config file 'x.json'") and "\n" not in msg and len(msg) < 300


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                    max_leaves=20))
def test_ordinary_json_reads_as_json_does(value):
    text = json.dumps(value)
    assert loads(text, "x") == json.loads(text)


@pytest.mark.parametrize("name", HOSTILE)
def test_every_command_that_reads_a_json_file_names_it(tmp_path, capsys, name):
    text = HOSTILE[name]
    bad = tmp_path / "config.json"
    bad.write_text(text)
    ckpt = tmp_path / "search.json"
    ckpt.write_text(text)
    for argv in (["inspect", str(bad)], ["extend", str(bad), "--method", "linear", "--target-length", "8192",
                                          "--out", str(tmp_path / "o.json")],
                 ["pick", "--config", str(bad), "--target-context", "4096"],
                 ["eval", str(tmp_path), "--out", str(tmp_path / "e")]):
        status = main(argv)
        err = capsys.readouterr().err.strip()
        assert status == 2 and err.count("\n") == 0 and "internal error" not in err, (argv, err)
        assert str(bad) in err or "config.json" in err, (argv, err)


def test_a_tampered_search_checkpoint_is_a_checkpoint_error(tmp_path):
    from posenc._internal.errors import CheckpointError
    from posenc.search.longrope import is_search_checkpoint

    for name, text in HOSTILE.items():
        path = tmp_path / f"{len(name)}.json"
        path.write_text(text)
        assert not is_search_checkpoint(path)
        with pytest.raises(CheckpointError, match="search checkpoint"):
            from posenc.search.longrope import _Search
            _Search.__new__(_Search)._load(path)
