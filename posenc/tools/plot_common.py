"""What every ``posenc plot`` picture shares: a matplotlib figure on the Agg canvas (no pyplot state), the atomic
PNG write, and the size limits that keep a plot's tables in memory. matplotlib is imported only when a figure is made.
"""

from __future__ import annotations

import os
from pathlib import Path

from posenc._internal.atomic import atomic_path
from posenc._internal.outputs import check_output
from posenc._internal.validate import check_int
from posenc._internal.errors import PosencError


def figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without touching pyplot's global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, out: str | os.PathLike) -> Path:
    """Write fig as PNG to out atomically (temp file in the same folder, then os.replace)."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise PosencError(f"out must be a .png file name, got {str(out)!r}")
    check_output(out, f"out {out}")
    if not out.parent.exists():
        raise FileNotFoundError(f"output folder does not exist: {out.parent}")
    with atomic_path(out, make_parents=False) as tmp:
        fig.savefig(tmp, format="png")
    return out


def check_size(value, name: str, max: int | None = None) -> int:
    """A positive int, at most ``max`` (the sizes that keep a plot's memory bounded)."""
    return check_int(value, name, min=1, max=max)


# size limits: a plot never needs more, and past them the tables would not fit in memory
MAX_DIM = 8192          # head or model dimension
MAX_TABLE = 2**24       # cells of the sinusoidal table (positions x dim)
MAX_ALIBI_HEADS = 1024
MAX_ALIBI_SEQ = 256     # heatmap side
MAX_POINTS = 100_000
