"""Lazy package exports: ``import posenc`` stays cheap (no matplotlib, transformers, triton or compiler)."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """Return (__getattr__, __dir__) for a package whose public names live in submodules.

    ``exports`` maps a public name to the module that defines it; the first access imports that module and
    caches the value in the package's namespace, so later accesses are plain attribute reads.
    """

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(exports)

    return __getattr__, __dir__
