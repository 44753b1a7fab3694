"""The API reference (mkdocs.yml, docs/api/) builds in strict mode: a docstring that breaks a cross-reference, a page
naming a module that is gone, or a broken link fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posenc_ci import require

require("docs", "mkdocs", "mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # no --quiet: it raises mkdocs' log level above WARNING, so strict mode would never count a warning
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], cwd=config.parent, capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    """The docs configuration and pages in a scratch folder, posenc linked in: -> its folder."""
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "docs" / "api", work / "docs" / "api")
    (work / "posenc").symlink_to(ROOT / "posenc")
    shutil.copy(ROOT / "mkdocs.yml", work / "mkdocs.yml")
    return work


def test_api_reference_builds_strictly(tmp_path):
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    rope = (tmp_path / "site" / "rope" / "index.html").read_text()
    assert "posenc.rope.apply.apply_rope_qk" in rope  # the docstrings were rendered, not an empty page
    assert "posenc.rope.module.Rotary" in rope


def test_every_api_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        assert f": {page.name}" in nav, f"docs/api/{page.name} is not in mkdocs.yml's nav"


def test_a_broken_reference_fails_the_build(tmp_path):
    # the same configuration with one page naming a module that does not exist: strict mode must refuse it
    work = _copy(tmp_path)
    (work / "docs" / "api" / "absolute.md").write_text("# Absolute\n\n::: posenc.no_such_module\n")
    result = _build(work / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no_such_module" in result.stdout + result.stderr


def test_a_docstring_warning_fails_the_build(tmp_path):
    # a shape written [Tq][D] in a docstring is a Markdown reference link to a target "D": only a warning, which
    # strict mode must turn into a failed build
    work = _copy(tmp_path)
    (work / "shapes_probe.py").write_text('def f(q):\n    """q [Tq][D], a list of rows."""\n')
    (work / "docs" / "api" / "absolute.md").write_text("# Absolute\n\n::: shapes_probe\n")
    result = _build(work / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "Could not find cross-reference target 'D'" in result.stdout + result.stderr
