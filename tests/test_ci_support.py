"""Under CI the docs tests (strict API reference build, tutorial execution) cannot skip: the test set-up installs
the docs extra, so a missing tool fails them; elsewhere they skip naming the extra."""

from __future__ import annotations

import pytest
from posenc_ci import require


def test_a_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(ImportError, match=r"no_such_docs_tool is missing, but CI's test set-up .* installs the docs "
                                          r"extra"):
        require("docs", "no_such_docs_tool")


def test_a_missing_tool_skips_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"the docs extra is not installed \(pip install -e '\.\[docs\]'\)"):
        require("docs", "no_such_docs_tool")


def test_the_docs_tools_are_installed_by_the_test_set_up():
    require("docs", "mkdocs", "mkdocstrings_handlers.python", "jupytext", "nbclient", "ipykernel")
