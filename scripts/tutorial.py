"""Render docs/tutorial.py (percent format, the source) to docs/tutorial.ipynb with its outputs.

    python scripts/tutorial.py            # execute the tutorial and write docs/tutorial.ipynb
    python scripts/tutorial.py --check    # execute it, fail on any error, write nothing

Needs the docs extra (jupytext, nbclient, ipykernel). The kernel runs in docs/, so that the notebook's relative
links and paths mean the same in the rendered file; the output is stable apart from timings and the plots' bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "tutorial.py"
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def build(timeout: int = 600):
    """The tutorial as an executed notebook (nbformat NotebookNode); raises on the first cell that fails."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(SOURCE)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(SOURCE.parent)}}).execute()
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="execute only; write nothing")
    args = parser.parse_args(argv)
    nb = build()
    if not args.check:
        import nbformat

        tmp = NOTEBOOK.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(NOTEBOOK)  # atomic: a failed run never leaves half a notebook
        print(f"wrote {NOTEBOOK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
