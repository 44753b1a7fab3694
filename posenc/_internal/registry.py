"""Helpers shared by posenc's registries (schemes, extension methods, tasks): name checks, where an entry came
from, and calling a factory with only the keyword arguments it accepts. Each registry owns its own table."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Callable, Mapping

from posenc._internal.errors import ConfigError


def origin_of(obj) -> str:
    """Where ``obj`` was defined: its source file, else its module (for messages about plug-ins)."""
    try:
        return inspect.getsourcefile(obj) or obj.__module__
    except TypeError:
        return getattr(obj, "__module__", "?")


# a registered name: words of letters, digits and underscores joined by single dashes or pluses ("rope+alibi",
# "pose-yarn", "vllm_dynamic"), starting with a letter. Names become parts of file names (checkpoints/TASK-SCHEME-
# seedN, plots), flags' comma lists and report columns, so no separator, dot, space or comma can be in one.
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:[-+][A-Za-z0-9_]+)*")
NAME_MAX = 64


def check_name(kind: str, name) -> str:
    """``name`` if it is a plain identifier-with-dashes (``NAME_PATTERN``, at most ``NAME_MAX`` characters);
    ConfigError otherwise."""
    if not isinstance(name, str) or len(name) > NAME_MAX or not NAME_PATTERN.fullmatch(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80]) + "..."
        raise ConfigError(f"{kind} name must be letters, digits and underscores joined by '-' or '+', starting with "
                          f"a letter, at most {NAME_MAX} characters (e.g. 'my-scheme'), got {shown}")
    return name


def path_under(folder: str | os.PathLike, *parts: str, what: str = "path") -> Path:
    """``folder / parts...``, or ConfigError when the result would leave ``folder`` (a name with a separator or
    '..' in it): every path built from a registered name goes through here, so that nothing is written outside
    the folder the user chose, whatever a plug-in put in a registry table."""
    base = Path(folder)
    path = base.joinpath(*parts)
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\\" in part or "\0" in part or os.sep in part \
                or (os.altsep and os.altsep in part):
            raise ConfigError(f"{what} {part!r}: not a plain file name (it would leave {base})")
    resolved_base = os.path.realpath(base)
    if os.path.commonpath([resolved_base, os.path.realpath(path)]) != resolved_base:
        raise ConfigError(f"{what} {path}: leaves {base}")
    return path


def check_new_name(kind: str, name, table: Mapping, replace: bool) -> str:
    """``name`` if it may be registered in ``table``; ConfigError for a bad or taken name (entries carry .origin)."""
    check_name(kind, name)
    if name in table and not replace:
        raise ConfigError(f"{kind} {name!r} is already registered (by {table[name].origin}); choose another name "
                          "or pass replace=True")
    return name


def call_with_accepted(factory: Callable, kwargs: Mapping, what: str):
    """factory(**the kwargs its signature accepts; all of them if it takes **kwargs).

    Raises ConfigError naming ``what`` when the factory requires an argument that ``kwargs`` lacks.
    """
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: give it everything
        return factory(**kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return factory(**kwargs)
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(f"{what} needs {', '.join(missing)}, which is not provided (given: "
                          f"{', '.join(sorted(kwargs))})")
    accepted = {p.name for p in named}
    return factory(**{k: v for k, v in kwargs.items() if k in accepted})
