"""Registered names stay plain: every registry refuses a name with a separator, dot, space or other character that
could take a path built from it out of its folder, and every such path is checked to stay under its folder."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from posenc._internal.registry import NAME_PATTERN, check_name, path_under
from posenc._internal.errors import ConfigError
from posenc.extensions import METHODS, register_method
from posenc.lab.run import checkpoint_path
from posenc.lab.tasks import TASKS, Task, register_task
from posenc.rope.registry import ROPE_SCALING_FUNCTIONS, register_rope_type
from posenc.schemes import SCHEMES, register_scheme
from posenc.schemes.builtin import NoPEScheme

BAD = ["x/../../../../escaped", "../escaped2", "..", ".", "a/b", "a\\b", "a.b", " a", "a b", "a,b", "", "-a",
       "a-", "a--b", "a\0b", "é", "1abc", "a" * 65, "a:b", "a*", "~", "$HOME"]
GOOD = ["t-rope", "x+alibi", "pose-yarn2", "vllm_dynamic9", "my-scheme2", "A_b-c+d"]


def _registrars():
    """(register one entry under name, its table) for every registry."""
    def scheme(name):
        register_scheme(name)(NoPEScheme)

    def method(name):
        register_method(name, label="x")(lambda spec: {"rope_type": "linear", "factor": spec.factor})

    def task(name):
        class T(Task):
            def sampler(self, run, seq_len, batch_size, seed):
                return None

            def evaluate(self, ev):
                return []
        register_task(name)(T)

    def rope_type(name):
        register_rope_type(name, required=())(lambda config, head_dim: None)

    return [(scheme, SCHEMES), (method, METHODS), (task, TASKS), (rope_type, ROPE_SCALING_FUNCTIONS)]


@pytest.mark.parametrize("name", BAD)
def test_every_registry_refuses_a_name_that_is_not_plain(name):
    for register, table in _registrars():
        before = dict(table)
        with pytest.raises(ConfigError, match="name must be letters"):
            register(name)
        assert table == before


@pytest.mark.parametrize("name", GOOD)
def test_every_registry_takes_a_plain_name(name):
    for register, table in _registrars():
        assert name not in table
        try:
            register(name)
            assert name in table
        finally:
            table.pop(name, None)


_SAFE = re.compile(r"[A-Za-z0-9_+-]+")


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=80))
def test_any_name_the_check_takes_is_a_plain_file_name_part(name):
    """The law: an accepted name has no separator, dot or space, so a path part built from it cannot leave its
    folder; a refused one is refused with a ConfigError, never another exception."""
    try:
        check_name("scheme", name)
    except ConfigError:
        assert not (NAME_PATTERN.fullmatch(name) and len(name) <= 64)
        return
    assert _SAFE.fullmatch(name) and name[0].isalpha() and name.isascii()


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_checkpoint_paths_stay_under_out_whatever_a_table_holds(tmp_path_factory, name):
    """A plug-in may write a registry table directly; the path built from the name is still checked."""
    import os

    out = tmp_path_factory.mktemp("out")
    try:
        path = checkpoint_path(out, "lm", name, 0)
    except ConfigError:
        return
    real_out = os.path.realpath(out)
    assert os.path.commonpath([real_out, os.path.realpath(path)]) == real_out
    assert path.parent == out / "checkpoints"


@pytest.mark.parametrize("part", ["../x", "a/../../b", "..", "/abs", "x/y"])
def test_path_under_refuses_parts_that_leave_the_folder(tmp_path, part):
    with pytest.raises(ConfigError, match="leave"):
        path_under(tmp_path, part, what="plot")
