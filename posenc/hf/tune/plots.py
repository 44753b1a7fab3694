"""``posenc tune``'s plots: perplexity per candidate with its spread over the paired windows, and the retrieval heat
map (survivors x tasks).

Each plot has a data function (``ppl_data``, ``heatmap_data``) that reads what results.json holds, even a partial
document, and returns the arrays drawn, and a draw function that draws exactly those. Tests can therefore assert on
the plotted numbers, not on pixels. ``write_plots`` draws what the document has so far. The tune calls it after every
completed stage (the trained-length check, each race window, passkey, and the answer after RULER), so an
interrupted tune still has its plots, and ``--resume`` draws them again from the kept measurements. The PNGs are
written atomically (posenc.lab.plots.save). matplotlib is imported only here, and only when a plot is drawn. When
it cannot be imported, the tune still completes, and the report says why the plots were skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

from posenc.hf.tune import race as racing

PPL_PLOT = "perplexity.png"
HEATMAP = "retrieval_heatmap.png"
PLOTS = (PPL_PLOT, HEATMAP)
# survivors in colour, eliminated candidates grey and hollow, the winner as a star
ALIVE, OUT, WINNER, TRAINED, FLAGGED = "tab:blue", "0.55", "gold", "tab:orange", "tab:red"


def _ppl(loss) -> float | None:
    """A log-perplexity (nats per token) as perplexity; None where it was not measured or diverged."""
    return math.exp(loss) if loss is not None and math.isfinite(loss) else None


def ppl_data(doc: dict) -> dict | None:
    """What the perplexity plot draws, from results.json's document (complete or partial) -> {"candidates": [one
    dict per candidate, in the answer's order], "unchanged_trained_ppl", "target", "trained", "windows", "winner"};
    None before anything was measured. Per candidate: its per-window perplexities at the target (None where not
    measured), their mean as exp(mean log-perplexity) (the perplexity over those windows' tokens: the windows are
    equally long), min and max, the mean paired difference to the best and the race's half-width Z x sd / sqrt(n),
    whether it is still in the race, and its perplexity at the trained length with the check's flag."""
    losses = (doc.get("race") or {}).get("losses") or {}
    checked = doc.get("trained_check") or {}
    if not losses and not checked:
        return None
    plan = doc["plan"]
    kinds = {c["name"]: c["kind"] for c in plan["candidates"]}
    measured = {n: v for n, v in losses.items() if any(x is not None for x in v)}
    # the answer's own ranking (racing.answer), so the plotted means are results.json's to the last digit
    ranking = {r["name"]: r for r in racing.answer(measured, kinds)["ranking"]} if measured else {}
    alive = set((doc.get("race") or {}).get("alive") or kinds)
    flagged = set(racing.flagged(checked))
    trained, target = doc["trained"], doc["target"]
    rows = []
    for name in [*ranking, *(n for n in kinds if n not in ranking)]:
        r = ranking.get(name, {})
        points = [_ppl(x) for x in losses.get(name, [])]
        finite = [p for p in points if p is not None]
        sd, n = r.get("sd"), r.get("shared_windows", 0)
        rows.append({"name": name, "kind": kinds[name], "window_ppl": points,
                     "mean_ppl": _ppl(r.get("mean_loss")), "min_ppl": min(finite, default=None),
                     "max_ppl": max(finite, default=None), "diff_to_best": r.get("diff_to_best"),
                     "half_width": racing.Z * sd / math.sqrt(n) if sd is not None and n > 1 else None,
                     "tie": r.get("tie", False), "alive": name in alive,
                     "trained_ppl": _ppl(doc["measurements"].get(f"{name}@{trained}#0")) if name in checked
                     else None, "flagged": name in flagged})
    return {"candidates": rows, "unchanged_trained_ppl": _ppl(doc["measurements"].get(f"none@{trained}#0")),
            "target": target, "trained": trained, "windows": plan["windows"],
            "winner": (doc.get("answer") or {}).get("winner")}


def _ppl_panel(ax, data: dict) -> None:
    """Left panel: per-window perplexities (small dots), their mean with a min-max bar, the trained-length check."""
    from matplotlib import ticker

    for x, c in enumerate(data["candidates"]):
        colour = ALIVE if c["alive"] else OUT
        points = [(w, p) for w, p in enumerate(c["window_ppl"]) if p is not None]
        # the windows side by side, in window order, so that one window's points line up across candidates
        spread = 0.3 / max(1, data["windows"] - 1)
        ax.plot([x - 0.15 + spread * w for w, _ in points], [p for _, p in points], "o", color=colour,
                markersize=3, alpha=0.6, linestyle="none")
        if c["mean_ppl"] is not None:
            star = c["name"] == data["winner"]
            ax.errorbar([x], [c["mean_ppl"]], yerr=[[c["mean_ppl"] - c["min_ppl"]], [c["max_ppl"] - c["mean_ppl"]]],
                        fmt="*" if star else "o", markersize=14 if star else 7, capsize=4, color=colour,
                        markerfacecolor=WINNER if star else colour if c["alive"] else "white")
        if c["trained_ppl"] is not None:
            ax.plot([x + 0.25], [c["trained_ppl"]], "D", markersize=5,
                    color=FLAGGED if c["flagged"] else TRAINED)
    if data["unchanged_trained_ppl"] is not None:
        ax.axhline(data["unchanged_trained_ppl"], color=TRAINED, linestyle="--", linewidth=1)
    ax.set(yscale="log", ylabel="perplexity",
           title=f"at {data['target']} tokens: windows (dots), mean with min-max; at {data['trained']} (diamonds)")
    # plain numbers on the log axis (the lab's convention), not 2 x 10^1
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.title.set_fontsize(9)


def _diff_panel(ax, data: dict) -> None:
    """Right panel: the race's rule, each mean paired difference to the best with Z standard errors."""
    for x, c in enumerate(data["candidates"]):
        if c["diff_to_best"] is None:
            continue
        ax.errorbar([x], [c["diff_to_best"]], yerr=None if c["half_width"] is None else [c["half_width"]],
                    fmt="o", capsize=4, color=ALIVE if c["alive"] else OUT,
                    markerfacecolor=ALIVE if c["alive"] else "white")
        if c["tie"]:
            ax.annotate("tie", (x, c["diff_to_best"]), textcoords="offset points", xytext=(5, 5), fontsize=7)
    ax.axhline(0.0, color="0.3", linewidth=1)
    ax.set(ylabel="mean paired difference to the best (nats)",
           title=f"race rule: out when above {racing.Z:g} standard errors (bars)")
    ax.title.set_fontsize(9)


def draw_ppl(data: dict, path: Path) -> None:
    """The perplexity plot of ``ppl_data``'s arrays, written atomically to ``path``."""
    from matplotlib.lines import Line2D

    from posenc.lab.plots import save
    from posenc.tools.plot_common import figure

    names = [c["name"] + (" (flagged)" if c["flagged"] else "") for c in data["candidates"]]
    fig = figure(max(8.0, 1.3 * len(names) + 3), 5.5)
    axes = fig.subplots(1, 2)
    _ppl_panel(axes[0], data)
    _diff_panel(axes[1], data)
    for ax in axes:
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.grid(True, axis="y", alpha=0.3)
    key = [Line2D([], [], marker="o", color=ALIVE, linestyle="none", label="in the race (survivor)"),
           Line2D([], [], marker="o", color=OUT, markerfacecolor="white", linestyle="none", label="eliminated"),
           Line2D([], [], marker="*", color=ALIVE, markerfacecolor=WINNER, markersize=12, linestyle="none",
                  label="winner"),
           Line2D([], [], marker="D", color=TRAINED, linestyle="none",
                  label=f"at the trained length {data['trained']}"),
           Line2D([], [], marker="D", color=FLAGGED, linestyle="none", label="flagged: worse at the trained length"),
           Line2D([], [], color=TRAINED, linestyle="--", label="unchanged model at the trained length")]
    fig.legend(handles=key, loc="outside lower center", ncols=3, fontsize=7)
    save(fig, path)


def heatmap_data(doc: dict) -> dict | None:
    """What the retrieval heat map draws -> {"rows": survivors, "columns": passkey and the RULER tasks, "scores":
    rows x columns in [0, 1] (None: n/a, or not measured yet), "n": samples per cell (passkey: the plan's depths x
    trials; None: not measured yet)}; None when no retrieval was measured."""
    passkey, ruler = doc.get("passkey") or {}, doc.get("ruler") or {}
    rows = list(dict.fromkeys([*passkey, *ruler]))
    if not rows:
        return None
    tasks = list(next(iter(ruler.values()))) if ruler else []
    columns = (["passkey"] if passkey else []) + tasks
    samples = ((doc["plan"].get("retrieval") or {}).get("passkey") or {}).get("samples")
    scores, counts = [], []
    for name in rows:
        got = ruler.get(name) or {}
        cells = [((passkey[name], samples) if name in passkey else (None, None))] if passkey else []
        cells += [(got[t]["value"], got[t]["n"]) if t in got else (None, None) for t in tasks]
        scores.append([v for v, _ in cells])
        counts.append([n for _, n in cells])
    return {"rows": rows, "columns": columns, "scores": scores, "n": counts, "target": doc["target"]}


def draw_heatmap(data: dict, path: Path) -> None:
    """The retrieval heat map of ``heatmap_data``'s arrays (score in percent and n in each cell; bold at RULER's
    threshold or above), drawn by the lab's RULER heat-map cells (posenc.lab.plots.score_cells)."""
    from posenc.lab.plots import save, score_cells
    from posenc.lab.tasks.registry import TASK_SETTINGS
    from posenc.tools.plot_common import figure

    threshold = TASK_SETTINGS["ruler_threshold"].default
    rows, columns = data["rows"], data["columns"]
    # "n/a": measured, but the task's template does not fit (n 0); "-": not measured yet (an interrupted tune)
    texts = [[f"{100 * v:.0f}\nn {n}" if v is not None else "-" if n is None else "n/a" for v, n in zip(s, k)]
             for s, k in zip(data["scores"], data["n"])]
    fig = figure(2.5 + 0.9 * len(columns), 1.5 + 0.55 * len(rows))
    ax = fig.subplots()
    image = score_cells(ax, data["scores"], threshold, texts)
    ax.set_xticks(range(len(columns)), columns, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(f"retrieval on the survivors at {data['target']} tokens", fontsize=9)
    fig.colorbar(image, ax=ax, label=f"score % (bold: >= {100 * threshold:.1f}%)")
    save(fig, path)


def write_plots(doc: dict, out: Path, retrieval: bool) -> dict:
    """Draw every plot ``doc`` has data for into ``out`` -> {"files": [names written], "not_drawn": [why a plot
    is absent]}. ``retrieval``: whether --tasks asked for retrieval (without it, an earlier heat map in ``out`` is
    removed: it would not be this tune's)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:      # a declared dependency, but the measurements matter more than the pictures
        return {"files": [], "not_drawn": [f"plots skipped: matplotlib cannot be imported ({exc})"]}
    files, not_drawn = [], []
    data = ppl_data(doc)
    if data is not None:
        draw_ppl(data, out / PPL_PLOT)
        files.append(PPL_PLOT)
    heat = heatmap_data(doc)
    if heat is not None:
        draw_heatmap(heat, out / HEATMAP)
        files.append(HEATMAP)
    elif not retrieval:
        (out / HEATMAP).unlink(missing_ok=True)
        not_drawn.append(f"no retrieval heat map: --tasks {','.join(doc.get('tasks') or ['lm'])} measures no "
                         "retrieval (add passkey or ruler)")
    return {"files": files, "not_drawn": not_drawn}
