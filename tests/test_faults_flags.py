"""posenc._internal.faults' flag naming: a bad-input message from the library names settings ("eval_tokens"); on the command
line it names the flags that set them ("--eval-tokens"), without touching ordinary words, paths or identifiers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from posenc._internal.faults import Parser, flag_names, to_flags


def parser() -> Parser:
    p = Parser(prog="posenc demo")
    p.add_argument("model")
    p.add_argument("--eval-tokens", type=int)
    p.add_argument("--tasks")
    p.add_argument("--replace", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    return p


NAMES = flag_names(parser(), {"replace_scaling": "--replace"})


def test_flag_names_maps_each_long_option_by_its_destination():
    assert NAMES == {"eval_tokens": "--eval-tokens", "tasks": "--tasks", "replace": "--replace",
                     "quiet": "--quiet", "replace_scaling": "--replace"}


def test_setting_names_become_flags_and_other_text_stays():
    assert to_flags("eval_tokens must be a positive integer, got 0", NAMES) == \
        "--eval-tokens must be a positive integer, got 0"
    assert to_flags("tasks: expected one of lm, passkey", NAMES) == "--tasks: expected one of lm, passkey"
    # a plain word is a setting only where it opens the message
    assert to_flags("the tasks given were none", NAMES) == "the tasks given were none"
    assert to_flags("with replace_scaling off", NAMES) == "with --replace off"
    # paths, attributes, calls and unknown names stay
    for text in ("cannot read /tmp/eval_tokens.txt", "cfg.eval_tokens is 3", "eval_tokens() failed",
                 "rope_scaling is absent"):
        assert to_flags(text, NAMES) == text
    # a name the message follows with its flag stays; the flag elsewhere in the message does not stop a swap
    assert to_flags("eval_tokens 5 (--eval-tokens): too many", NAMES) == "eval_tokens 5 (--eval-tokens): too many"
    assert to_flags("tasks: 2 and --tasks 1 disagree", NAMES) == "--tasks: 2 and --tasks 1 disagree"


WORDS = st.sampled_from(["eval_tokens", "tasks", "replace_scaling", "quiet", "must", "be", "got", "0", ":", "/",
                         "(--tasks)", "path/eval_tokens", "x.tasks", "the"])


@given(st.lists(WORDS, min_size=1, max_size=8))
def test_naming_flags_is_idempotent(words):
    message = " ".join(words)
    once = to_flags(message, NAMES)
    assert to_flags(once, NAMES) == once
