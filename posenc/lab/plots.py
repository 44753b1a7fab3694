"""Plot helpers for the lab's PNGs: one style per scheme / extension method, series by model label, atomic saves.

Each task draws its own plots (posenc/lab/tasks/) with these; ``report.write_report`` asks every task present in
the results. Colours follow the registries' order, so plug-in schemes and methods get their own.
"""

from __future__ import annotations

from pathlib import Path

from posenc._atomic import atomic_path
from posenc.extensions import method_names
from posenc.lab.tables import model_label, sort_key
from posenc.schemes import scheme_names

# one colour per registered scheme (built-ins first); the last ones are for the schemes of issue 11 and plug-ins
SCHEME_PALETTE = ("tab:gray", "tab:orange", "tab:brown", "tab:blue", "tab:green", "tab:purple", "tab:olive",
                  "tab:cyan", "tab:pink", "tab:red", "black", "gold", "navy", "lime", "teal", "maroon")
METHOD_PALETTE = ("tab:red", "tab:cyan", "tab:olive", "tab:pink", "black", "tab:brown", "tab:purple", "tab:green")


def _colour(name: str, names: tuple, palette: tuple) -> str | None:
    return palette[names.index(name) % len(palette)] if name in names else None


def style(row: dict) -> dict:
    """Line style of a row's model: solid per scheme, dashed per extension method, dotted when fine-tuned."""
    if row["scaling"] == "none":
        return dict(color=_colour(row["scheme"], scheme_names(), SCHEME_PALETTE),
                    linestyle=":" if row["finetuned"] else "-." if row.get("positions") else "-", linewidth=2.2,
                    marker="o")
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


def log_axes(ax, ticks, logy=False):
    """Plain-number labels on log axes: the evaluation lengths on x, values on y."""
    from matplotlib import ticker

    ax.set_xticks(sorted(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if logy:
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def accuracy_plot(results, task: str, panels: list[tuple[str, str]], out: Path, name: str) -> list[str]:
    """Accuracy vs length (mean over seeds and other cells), one panel per (metric, title); -> [name] if drawn."""
    first = series(results, task, panels[0][0])
    if not first:
        return []
    plt = pyplot()
    train_len = results[0]["train_len"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) if len(panels) > 1 else 8, 5), squeeze=False)
    for ax, (metric, title) in zip(axes[0], panels):
        for label, rows in series(results, task, metric).items():
            by_len: dict[int, list[float]] = {}
            for r in rows:
                if r["value"] is not None:
                    by_len.setdefault(r["eval_len"], []).append(r["value"])
            pts = sorted((L, sum(v) / len(v)) for L, v in by_len.items())
            if pts:
                ax.plot(*zip(*pts), label=label, **style(rows[0]))
        ax.axvline(train_len, color="0.6", linewidth=1)
        ax.set(xscale="log", xlabel="sequence length (tokens)", ylabel="accuracy", title=title, ylim=(-0.03, 1.03))
        log_axes(ax, {r["eval_len"] for rows in first.values() for r in rows})
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out / name)
    plt.close(fig)
    return [name]
