"""Helpers shared by posenc's registries (schemes, extension methods, tasks): name checks, where an entry came
from, and calling a factory with only the keyword arguments it accepts. Each registry owns its own table."""

from __future__ import annotations

import inspect
from typing import Callable, Mapping

from posenc.errors import ConfigError


def origin_of(obj) -> str:
    """Where ``obj`` was defined: its source file, else its module (for messages about plug-ins)."""
    try:
        return inspect.getsourcefile(obj) or obj.__module__
    except TypeError:
        return getattr(obj, "__module__", "?")


def check_new_name(kind: str, name, table: Mapping, replace: bool) -> str:
    """``name`` if it may be registered in ``table``; ConfigError for a bad or taken name (entries carry .origin)."""
    if not isinstance(name, str) or not name.strip() or "," in name or name != name.strip():
        raise ConfigError(f"{kind} name must be a non-empty string without commas or surrounding spaces, "
                          f"got {name!r}")
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
