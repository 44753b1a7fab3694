"""Plot helpers for the lab's PNGs: one style per scheme / extension method, series by model label, atomic saves.

Each task draws its own plots (posenc/lab/tasks/) with these; ``report.write_report`` asks every task present in
the results. Colours follow the registries' order, so plug-in schemes and methods get their own.
"""

from __future__ import annotations

from pathlib import Path

from posenc._internal.atomic import atomic_path
from posenc.attention import attention_method_names
from posenc.extensions import method_names
from posenc.lab.tables import model_label, sort_key
from posenc.schemes import scheme_names

# one colour per registered scheme (built-ins first); the last ones are for the schemes of issue 11 and plug-ins
SCHEME_PALETTE = ("tab:gray", "tab:orange", "tab:brown", "tab:blue", "tab:green", "tab:purple", "tab:olive",
                  "tab:cyan", "tab:pink", "tab:red", "black", "gold", "navy", "lime", "teal", "maroon")
METHOD_PALETTE = ("tab:red", "tab:cyan", "tab:olive", "tab:pink", "black", "tab:brown", "tab:purple", "tab:green")
# methods that change attention (kind "attention") get their own colours, in their own order, and a dash-dot line
ATTENTION_PALETTE = ("teal", "tab:purple", "tab:orange", "maroon", "gold", "navy", "lime", "tab:green")


def _colour(name: str, names: tuple, palette: tuple) -> str | None:
    return palette[names.index(name) % len(palette)] if name in names else None


def style(row: dict) -> dict:
    """Line style of a row's model: solid per scheme, dashed per extension method, dotted when fine-tuned."""
    if row["scaling"] == "none":
        return dict(color=_colour(row["scheme"], scheme_names(), SCHEME_PALETTE),
                    linestyle=":" if row["finetuned"] else "-." if row.get("positions") else "-", linewidth=2.2,
                    marker="o")
    if row["scaling"] in attention_method_names():
        return dict(color=_colour(row["scaling"], attention_method_names(), ATTENTION_PALETTE), linestyle="-.",
                    linewidth=1.4, marker="^", markersize=4)
    return dict(color=_colour(row["scaling"], method_names(), METHOD_PALETTE),
                linestyle=":" if row["finetuned"] else "--", linewidth=1.4, marker="s", markersize=4)


def series(results, task, metric, **match) -> dict[str, list[dict]]:
    """{model label: its rows} for one task and metric, in display order."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(results, key=sort_key):
        if r["task"] == task and r["metric"] == metric and all(r.get(k) == v for k, v in match.items()):
            groups.setdefault(model_label(r), []).append(r)
    return groups


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")


def score_cells(ax, scores, threshold: float, texts=None):
    """Scores in [0, 1] (rows x columns; None: not measured or n/a) as a heat map in percent on viridis 0-100, each
    cell's text written in it (``texts``, or the percent and "n/a" where None), cells at ``threshold`` or above in bold
    black (readable on viridis' bright end, above ~70%) -> the image, for a colour bar. The lab's RULER heat map and
    posenc tune's retrieval heat map both draw their cells here, so they read alike."""
    shown = [[float("nan") if v is None else 100 * v for v in row] for row in scores]
    image = ax.imshow(shown, vmin=0, vmax=100, cmap="viridis", aspect="auto")
    for i, row in enumerate(scores):
        for j, v in enumerate(row):
            text = texts[i][j] if texts is not None else "n/a" if v is None else f"{100 * v:.0f}"
            passing = v is not None and v >= threshold
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if passing else "white",
                    fontweight="bold" if passing else "normal")
    return image


def log_axes(ax, ticks, logy=False):
    """Plain-number labels on log axes: the evaluation lengths on x, values on y."""
    from matplotlib import ticker

    ax.set_xticks(sorted(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if logy:
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def mark_unsupported(ax, rows: list[dict], pts: list[tuple], line) -> bool:
    """Where a model cannot run (a learned table past its length: value None, note "n/a ..."), end its line with
    an x marker at the first such length, labelled "n/a beyond its table": a lone dot would look like a result."""
    missing = sorted(r["eval_len"] for r in rows if r["value"] is None and str(r.get("note", "")).startswith("n/a"))
    if not missing or not pts:
        return False
    x, y = missing[0], pts[-1][1]
    ax.plot([pts[-1][0], x], [y, y], color=line.get_color(), linestyle=":", linewidth=1)
    ax.plot([x], [y], marker="x", markersize=9, color=line.get_color(), linestyle="none")
    ax.annotate(f"n/a beyond its table ({pts[-1][0]})", (x, y), textcoords="offset points", xytext=(6, 4),
                fontsize=7, color=line.get_color())
    return True


def coinciding(curves: dict[str, list[tuple]], rel: float = 1e-3) -> list[list[str]]:
    """Groups of labels whose points are all equal within ``rel`` (the lines hide each other in a plot)."""
    groups: list[list[str]] = []
    for label, pts in curves.items():
        for g in groups:
            ref = curves[g[0]]
            if len(ref) == len(pts) and all(a[0] == b[0] and abs(a[1] - b[1]) <= rel * max(abs(a[1]), abs(b[1]))
                                            for a, b in zip(ref, pts)):
                g.append(label)
                break
        else:
            groups.append([label])
    return [g for g in groups if len(g) > 1]


def coinciding_text(curves: dict[str, list[tuple]], width: int = 150) -> str | None:
    """'coinciding (drawn on top of each other): a = b; c = d', wrapped, or None when no curves coincide."""
    import textwrap

    groups = coinciding(curves)
    if not groups:
        return None
    return textwrap.fill("coinciding (drawn on top of each other): " + "; ".join(" = ".join(g) for g in groups),
                         width)


def note_coinciding(ax, curves: dict[str, list[tuple]]) -> str | None:
    """Say under the axes which curves coincide; -> the note."""
    text = coinciding_text(curves)
    if text:
        ax.text(0.0, -0.16, text, transform=ax.transAxes, fontsize=7, color="0.3", va="top")
    return text


def legend(ax) -> None:
    """The legend beside the axes, or a note when nothing finite was drawn (every model diverged)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        ax.text(0.5, 0.5, "no finite result to draw (diverged: see the tables)", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="0.3")


def accuracy_plot(results, task: str, panels: list[tuple[str, str]], out: Path, name: str) -> list[str]:
    """Accuracy vs length (mean over seeds and other cells), one panel per (metric, title); -> [name] if drawn."""
    first = series(results, task, panels[0][0])
    if not first:
        return []
    plt = pyplot()
    train_len = results[0]["train_len"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) if len(panels) > 1 else 8, 5), squeeze=False)
    notes: list[str] = []
    for ax, (metric, title) in zip(axes[0], panels):
        drawn: dict[str, list[tuple]] = {}
        for label, rows in series(results, task, metric).items():
            by_len: dict[int, list[float]] = {}
            for r in rows:
                if r["value"] is not None:
                    by_len.setdefault(r["eval_len"], []).append(r["value"])
            pts = sorted((L, sum(v) / len(v)) for L, v in by_len.items())
            if pts:
                line, = ax.plot(*zip(*pts), label=label, **style(rows[0]))
                mark_unsupported(ax, rows, pts, line)
                drawn[label] = pts
        note = coinciding_text(drawn, width=90 * len(panels))
        if note:
            notes.append(f"{title}: {note}" if len(panels) > 1 else note)
        ax.axvline(train_len, color="0.6", linewidth=1)
        ax.set(xscale="log", xlabel="sequence length (tokens)", ylabel="accuracy", title=title, ylim=(-0.03, 1.03))
        log_axes(ax, {r["eval_len"] for rows in first.values() for r in rows})
        ax.grid(True, alpha=0.3)
    legend(axes[0][-1])
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), fontsize=7, color="0.3", va="top")
    save(fig, out / name)
    plt.close(fig)
    return [name]
