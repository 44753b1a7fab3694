"""Settings a plug-in owns (a lab task, an extension method), declared once: name, kind, default, bounds, help.

From the declaration come the command-line flag (``--copy-examples``), its argparse type and the validation
(through posenc/_internal/validate.py, errors naming the setting), so a task adds a setting in one place and every command
that runs the task (``posenc lab``, ``posenc eval``) takes it.

    >>> Setting("copy_examples", 64, "copy-task test sequences per length", kind="int", min=1, max=2**20)

Kinds: "int", "float", "bool" (flag value yes/no), "floats" (a comma-separated list of distinct numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from posenc._internal.validate import check_bool, check_distinct, check_float, check_int
from posenc._internal.errors import ConfigError

KINDS = ("int", "float", "bool", "floats")


@dataclass(frozen=True)
class Setting:
    """One declared setting. ``min``/``max`` bound an int or float (each entry of floats); ``owner`` is filled in
    by the registry that holds it (e.g. "task copy")."""

    name: str
    default: Any
    help: str = ""
    kind: str = "int"
    min: float | None = None
    max: float | None = None
    owner: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"setting {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.name.isidentifier():
            raise ConfigError(f"setting {self.name!r}: expected a Python identifier (e.g. copy_examples)")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value):
        """``value`` checked (ConfigError naming the setting), in its canonical type."""
        if self.kind == "int":
            return check_int(value, self.name, min=self.min, max=self.max, error=ConfigError)
        if self.kind == "float":
            return check_float(value, self.name, min=self.min, max=self.max, error=ConfigError)
        if self.kind == "bool":
            return check_bool(value, self.name, error=ConfigError)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{self.name} must be a list of numbers, got {value!r}")
        check_distinct(value, self.name, error=ConfigError)
        return [check_float(v, self.name, min=self.min, max=self.max, error=ConfigError) for v in value]

    def arg_type(self):
        """The argparse ``type`` of its flag."""
        from posenc._internal.argtypes import floats, yes_no

        return {"int": int, "float": float, "bool": yes_no, "floats": floats}[self.kind]


def declare(settings: Iterable[Setting], owner: str, taken: Mapping[str, Setting]) -> tuple[Setting, ...]:
    """``settings`` with ``owner`` filled in; ConfigError for a name another owner already declared otherwise (an
    identical declaration, as a subclass of a task inherits it, is shared)."""
    out = []
    for s in settings:
        if not isinstance(s, Setting):
            raise ConfigError(f"{owner}: settings must be posenc._internal.settings.Setting values, got {s!r}")
        other = taken.get(s.name)
        if other is not None and other.owner != owner:
            if replace(other, owner="") == replace(s, owner=""):   # the same declaration, inherited (a subclass of
                out.append(other)                                 # a task): shared, still its first owner's
                continue
            raise ConfigError(f"{owner}: setting {s.name!r} is already declared by {other.owner}")
        out.append(Setting(s.name, s.default, s.help, s.kind, s.min, s.max, owner))
    return tuple(out)


def check_settings(declared: Mapping[str, Setting], values: Mapping[str, Any]) -> dict:
    """Every declared setting's value (``values``' own, else its default), checked; ConfigError for a name no
    owner declares."""
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(unknown)} (declared: {', '.join(declared) or 'none'})")
    return {name: s.check(values.get(name, s.default)) for name, s in declared.items()}


def add_setting_flags(parser, declared: Mapping[str, Setting]) -> None:
    """One flag per declared setting (default None: not given), with the owner in its help."""
    for s in declared.values():
        parser.add_argument(s.flag, dest=s.name, type=s.arg_type(), default=None,
                            help=f"{s.owner}: {s.help} (default {s.default})")


def parse_options(text: str) -> dict:
    """'key=value,key=value' -> dict; values are JSON when they parse (numbers, true/false, [lists]), else strings
    (the form of --scheme-options and --task-options)."""
    import argparse
    import json

    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value pairs separated by commas, got {item!r}")
        if key.strip() in out:   # two values for one key: refuse rather than keep one of them silently
            raise argparse.ArgumentTypeError(f"{key.strip()} is given more than once; give each key once")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out
