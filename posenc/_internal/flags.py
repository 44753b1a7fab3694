"""The flags several commands share, declared once: the flag, the spellings it replaced, its help, its argparse type
(the validation of its form: a malformed value is one line naming the flag; a value's range is the check of the library
keyword it sets, whose message the command shows with the flag) and the library keyword it sets.

A command takes a shared flag from here instead of declaring it again:

    >>> add_shared(parser, "methods", "factor", "out")               # --methods, --factor, --out as declared
    >>> add_shared(parser, "methods", dest="extensions", help="...")  # the library's keyword, the command's words

The spellings a flag replaced (``--extensions`` for ``--methods``) still parse, to the same keyword and through the
same type; ``--help`` shows only the shared name (docs/tools.md lists the old spellings). Settings a plug-in's task
or method owns are ``posenc._internal.settings.Setting``; these are the commands' own.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

from posenc._internal.argtypes import ints, items
from posenc._internal.settings import parse_options

# the weights' dtypes a command loads or writes (posenc.hf.loading maps them to torch's)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_SHORT = ("fp32", "bf16", "fp16")


def names(text: str) -> list[str]:
    """Comma-separated names, none of them empty ('' and 'a,,b' are refused)."""
    return items(text, "names")


def name(text: str) -> str:
    """One name: no comma, not empty."""
    if not text.strip() or "," in text:
        raise argparse.ArgumentTypeError(f"expected one name, got {text!r}")
    return text.strip()


def number(text: str) -> float:
    """A number (its range is the command's check, as the library's keyword has it)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def integer(text: str) -> int:
    """An integer (its range is the command's check, as the library's keyword has it)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def path(text: str) -> str:
    """A file or folder name: not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return text


def device(text: str) -> str:
    """auto or a torch device (cpu, cuda, cuda:N, mps, ...); whether it is present is the command's check."""
    import re

    if not re.fullmatch(r"auto|[a-z][a-z0-9_]*(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N, mps (or auto), got {text!r}")
    return text


def dtype(text: str) -> str:
    if text not in DTYPE_NAMES + DTYPE_SHORT:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPE_NAMES)} (or {', '.join(DTYPE_SHORT)}), "
                                         f"got {text!r}")
    return text


@dataclass(frozen=True)
class SharedFlag:
    """One shared flag. ``name`` is the concept and, unless a command passes ``dest``, the library keyword the
    value goes to; ``aliases`` are spellings that still parse (shown neither by --help nor in errors); ``action`` is argparse's
    (store_true, append) for a flag without a typed value."""

    name: str
    flag: str
    help: str
    type: Callable | None = None
    aliases: tuple[str, ...] = ()
    action: str | None = None
    metavar: str | None = None


_FLAGS = (
    SharedFlag("methods", "--methods", "extension methods, comma-separated", names, ("--extensions",),
               metavar="METHOD,..."),
    SharedFlag("method", "--method", "one extension method", name, ("--rope-scaling",), metavar="METHOD"),
    SharedFlag("method_options", "--method-options",
               "attention methods' options, method.option=value,... (e.g. self-extend.group_size=4)", parse_options,
               ("--extension-options",), metavar="METHOD.OPTION=VALUE,..."),
    SharedFlag("factor", "--factor", "extension factor (target / original context)", number,
               ("--ext-factor",)),
    SharedFlag("target_length", "--target-length", "the context to extend to, in tokens", integer,
               ("--target-context",), metavar="N"),
    SharedFlag("seeds", "--seeds", "seeds, comma-separated", ints, metavar="SEED,..."),
    SharedFlag("seed", "--seed", "one seed", integer),
    SharedFlag("out", "--out", "where the output is written", path, ("--out-config",)),
    SharedFlag("resume", "--resume", "continue an interrupted run in --out", action="store_true"),
    SharedFlag("overwrite", "--overwrite", "replace what --out already holds", action="store_true"),
    SharedFlag("no_progress", "--no-progress", "no progress bars", aliases=("--quiet",), action="store_true"),
    SharedFlag("no_band_attention", "--no-band-attention", "sliding-window layers (Gemma 3's local layers) run "
               "transformers' sdpa over the whole masked square, as before (default: only the keys inside their "
               "window, band_attention, when the mask is the plain sliding one)", action="store_true"),
    SharedFlag("threads", "--threads", "CPU threads for torch (0: torch's own)", integer, metavar="N"),
    SharedFlag("dtype", "--dtype", "weights and activations: " + ", ".join(DTYPE_NAMES), dtype),
    SharedFlag("device", "--device", "cpu, cuda, cuda:N, mps", device),
    SharedFlag("data", "--data", "a text file or folder (default: the CPython stdlib)", path),
    SharedFlag("plugin", "--plugin", "import a Python file or module that registers tasks, schemes or methods "
               "(repeatable)", path, action="append", metavar="FILE_OR_MODULE"),
    SharedFlag("nproc", "--nproc", "processes on this machine, one device each (re-launches through torchrun)",
               integer, metavar="N"),
    SharedFlag("dist_timeout", "--dist-timeout", "distributed runs: a rank silent this long ends the job", number,
               metavar="SECONDS"),
    SharedFlag("population", "--population", "LongRoPE's search: candidates per generation", integer, metavar="N"),
    SharedFlag("generations", "--generations", "LongRoPE's search: generations after the initial population",
               integer, metavar="N"),
    SharedFlag("task_options", "--task-options", "settings declared by tasks or methods, key=value,key=value "
               "(a plug-in's own too)", parse_options, metavar="KEY=VALUE,..."),
)
SHARED: dict[str, SharedFlag] = {f.name: f for f in _FLAGS}


def add_shared(parser, *flag_names: str, dest: str | None = None, help: str | None = None, **kwargs):
    """Add the shared flags ``flag_names`` to ``parser`` (an argparse parser or group), each with its declared type,
    and its old spellings as hidden aliases of the same keyword. ``dest`` (the library's keyword where it is not
    the flag's name), ``help`` (the command's own words) and argparse keywords (default, required, choices) apply
    to a single flag. -> the last flag's argparse action."""
    if len(flag_names) != 1 and (dest or help or kwargs):
        raise TypeError("add_shared: dest, help and argparse keywords apply to one flag at a time")
    action = None
    for flag_name in flag_names:
        f = SHARED[flag_name]
        spec = {"dest": dest or f.name, **kwargs}
        if f.action:
            spec["action"] = f.action
            spec.setdefault("default", [] if f.action == "append" else False)
        if f.action != "store_true":
            spec["type"] = f.type
            spec.setdefault("metavar", f.metavar or f.flag[2:].upper().replace("-", "_"))
        action = parser.add_argument(f.flag, help=help or f.help, **spec)
        # an old spelling is one more key to the same action (argparse's own table, as add_argument fills it): it
        # parses to the same keyword through the same type, counts for required and for an exclusive group, and
        # --help and error messages show the shared flag alone
        for alias in f.aliases:
            if alias in parser._option_string_actions:
                raise argparse.ArgumentError(action, f"{alias} (an old spelling of {f.flag}) is taken")
            parser._option_string_actions[alias] = action
    return action


def shared_flag(flag: str) -> SharedFlag:
    """The declaration of ``flag`` (``--methods``)."""
    return next(f for f in _FLAGS if f.flag == flag)


def shared_of(parser) -> dict[str, SharedFlag]:
    """The shared flags ``parser`` takes, by their flag (``--methods``): those add_shared added (an option string
    of the same name declared by hand is not one)."""
    flags = {f.flag: f for f in _FLAGS}
    return {o: flags[o] for a in parser._actions for o in a.option_strings
            if o in flags and all(parser._option_string_actions.get(x) is a for x in flags[o].aliases)}
