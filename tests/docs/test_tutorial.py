"""The tutorial (docs/tutorial.py, rendered to docs/tutorial.ipynb) runs top to bottom without an error, and the
committed notebook is the rendering of the current source, with its outputs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from posenc_ci import require

require("docs", "jupytext", "nbclient", "ipykernel")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("render_tutorial", ROOT / "scripts" / "tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code(nb) -> list[str]:
    return [cell.source.strip() for cell in nb.cells if cell.cell_type == "code"]


@pytest.mark.slow
def test_tutorial_runs_top_to_bottom(monkeypatch):
    # the kernel is a fresh process: it must import this checkout's posenc, on one thread like every test here
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = _script().build(timeout=600)  # nbclient raises CellExecutionError on the first failing cell
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    images = sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.outputs)
    assert images >= 6  # the plots are inline


def test_committed_notebook_is_the_rendered_source():
    import jupytext
    import nbformat

    source = jupytext.read(ROOT / "docs" / "tutorial.py")
    committed = nbformat.read(ROOT / "docs" / "tutorial.ipynb", as_version=4)
    assert _code(committed) == _code(source), "docs/tutorial.ipynb is stale: run python scripts/tutorial.py"
    code_cells = [cell for cell in committed.cells if cell.cell_type == "code"]
    showing = [cell for cell in code_cells if any(w in cell.source for w in ("print(", "plt.show()", "Image("))]
    assert len(showing) >= 10
    assert all(cell.outputs for cell in showing), "every cell that prints or plots shows its output in the notebook"
    assert not any(out.output_type == "error" for cell in code_cells for out in cell.outputs)
