"""What differs when the suite runs as CI does (``CI`` true: ``scripts/test.sh`` and ``.ci/run`` set it)."""

from __future__ import annotations

import importlib
import os

import pytest


def in_ci() -> bool:
    """True when the environment says CI (the usual ``CI=true``; also 1 / yes)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(extra: str, *modules: str) -> None:
    """Import ``modules`` (from the optional extra ``extra``). Under CI the test set-up installs every extra, so a
    missing one fails the test module instead of skipping it (a skip there would hide what the tests check);
    elsewhere a missing module skips, with the extra that installs it as the reason."""
    for name in modules:
        if not in_ci():
            pytest.importorskip(name, reason=f"the {extra} extra is not installed (pip install -e '.[{extra}]')")
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"{name} is missing, but CI's test set-up (bash scripts/setup.sh test) installs the "
                              f"{extra} extra: {exc}") from exc
