"""Patch specs: an attention rule as JSON, ``{"method": "self-extend", "group_size": 4, "window": 8}`` (the
registered method name and the typed rule's fields), so that a rule chosen by ``posenc tune`` can be stored in a file
and applied later with ``posenc.patch(model, "patch_spec.json")``.

``rule_spec(rule)`` writes a rule's fields; ``read_patch_spec(source)`` (a dict, or a path to such a JSON file) builds
the same typed rule through the registry (``as_rule``: an unknown method or option is one ConfigError line).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

from posenc._internal.errors import ConfigError

SPEC_KEY = "method"


def rule_spec(rule) -> dict:
    """``{"method": rule.name, field: value, ...}`` of a typed rule (fields left None are left out: the model's
    trained length derives them when the spec is applied)."""
    values = {f.name: getattr(rule, f.name) for f in fields(rule) if getattr(rule, f.name) is not None}
    return {SPEC_KEY: rule.name, **values}


def is_patch_spec(source) -> bool:
    """True for what ``read_patch_spec`` reads: a mapping, or a path (str or PathLike) ending in .json."""
    if isinstance(source, dict):
        return True
    return isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(".json")


def read_patch_spec(source):
    """The typed rule a patch spec names (``source``: a dict or a .json path). ConfigError naming the spec for an
    unreadable file, a spec without "method", or an option its method lacks."""
    from posenc.attention.registry import as_rule  # (imported when read: the registry never imports this module)

    what = "patch spec"
    if not isinstance(source, dict):
        what = f"patch spec {source}"
        try:
            source = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{what}: cannot read it as JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(source, dict) or not isinstance(source.get(SPEC_KEY), str):
        raise ConfigError(f'{what}: expected a JSON object with "{SPEC_KEY}" (an attention method name) and the '
                          'rule\'s fields, e.g. {"method": "self-extend", "group_size": 4, "window": 8}')
    options = {k: v for k, v in source.items() if k != SPEC_KEY}
    return as_rule(source[SPEC_KEY], what, **options)
