"""RULER's rows, its effective-length table and heat map (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", github.com/NVIDIA/RULER).

Effective length: the longest length up to which a score stays at or above the threshold: every measured length
up to it reaches it (RULER's threshold: Llama-2-7B's mean score at 4k, 85.6%; the paper's table counts a score
equal to it as passing). It is given per task and for the mean over the tasks present, as RULER reports it.

One RULER task present in the results (the first in registry order) writes the section and the plot for all of
them, so a run of the ``ruler`` group has one table and one heat map.
"""

from __future__ import annotations

from pathlib import Path

from posenc.lab.stats import wilson_interval
from posenc.lab.tables import markdown, model_label, sort_key

METRIC = "string_match_all"
TOO_SHORT = "n/a (too short for the task's template)"
HEATMAP = "ruler_heatmap.png"


def score_rows(ev, lengths, per_length) -> list[dict]:
    """One row per length from its samples' outcomes (a dict per scored sample; None: the model cannot encode the
    length; "too short": the template does not fit): the mean score, its Wilson 95% interval over the samples,
    the prompts' mean tokens and the empty predictions."""
    rows = []
    for L, done in zip(lengths, per_length):
        if any(d is None for d in done):
            rows.append(ev.row(L, METRIC, None))
        elif any(d == "too short" for d in done):
            rows.append(ev.row(L, METRIC, None, note=TOO_SHORT))
        else:
            n = len(done)
            mean = sum(d["score"] for d in done) / n
            low, high = wilson_interval(mean * n, n)
            rows.append(ev.row(L, METRIC, mean, ci_low=round(low, 4), ci_high=round(high, 4), n_samples=n,
                               prompt_tokens=round(sum(d["tokens"] for d in done) / n, 1),
                               nulls=sum(d["null"] for d in done)))
    for row in rows:        # the report's effective length reads the threshold the run was given
        row["threshold"] = ev.cfg.options["ruler_threshold"]
    return rows


def effective_length(scores: dict[int, float | None], threshold: float) -> int | None:
    """The longest length L whose score and every shorter length's reach ``threshold``; None when the shortest
    length falls short (or has no score)."""
    best = None
    for L in sorted(scores):
        if scores[L] is None or scores[L] < threshold:
            break
        best = L
    return best


def _ruler_tasks(results: list[dict]) -> list[str]:
    from posenc.lab.tasks.registry import TASKS

    present = {r["task"] for r in results}      # (a plug-in's RULER-style task reports string_match_all too)
    return [name for name, task in TASKS.items() if METRIC in task.metrics and name in present]


def pooled(rows: list[dict]) -> tuple[float | None, float, float, int]:
    """Rows of one cell over seeds -> (mean score, Wilson low, high, samples); None score when any is n/a."""
    if not rows or any(r["value"] is None for r in rows):
        return None, 0.0, 1.0, 0
    n = sum(r.get("n_samples", 1) for r in rows)
    hits = sum(r["value"] * r.get("n_samples", 1) for r in rows)
    return (hits / n, *wilson_interval(hits, n), n)


def grid(results: list[dict]) -> tuple[list[str], list[int], dict]:
    """-> (tasks, lengths, {model label: {task: {length: pooled cell}}}) of RULER's rows."""
    tasks = _ruler_tasks(results)
    rows = sorted((r for r in results if r["task"] in tasks and r["metric"] == METRIC), key=sort_key)
    lens = sorted({r["eval_len"] for r in rows})
    cells: dict = {}
    for r in rows:
        cells.setdefault(model_label(r), {}).setdefault(r["task"], {}).setdefault(r["eval_len"], []).append(r)
    return tasks, lens, {m: {t: {L: pooled(v) for L, v in by_len.items()} for t, by_len in per.items()}
                         for m, per in cells.items()}


def run_threshold(results: list[dict], default: float = 0.856) -> float:
    """The threshold the rows were scored against (each RULER row records its run's ``ruler_threshold``); RULER's
    85.6% when the rows record none or several (``posenc pick`` reads it for an eval's effective length too)."""
    values = {r.get("threshold") for r in results if r.get("threshold") is not None}
    return values.pop() if len(values) == 1 else default


def mean_over_tasks(per_task: dict, tasks: list[str], lens: list[int]) -> dict[int, float | None]:
    """Each length's mean score over the tasks (None when a task has none there)."""
    out = {}
    for L in lens:
        vals = [per_task.get(t, {}).get(L, (None,))[0] for t in tasks]
        out[L] = None if None in vals else sum(vals) / len(vals)
    return out


def _cell(cell) -> str:
    if cell is None:
        return "-"
    mean, low, high, n = cell
    return "n/a" if mean is None else f"{100 * mean:.0f} [{100 * low:.0f}, {100 * high:.0f}]"


def ruler_report(task, results: list[dict]) -> str:
    """The RULER section (written by the first RULER task present): per model, per task, per length the score in
    percent with its Wilson 95% interval, and the effective length at the threshold."""
    tasks, lens, cells = grid(results)
    if not tasks or task.name != tasks[0]:
        return ""
    threshold = run_threshold(results)
    body = []
    for label, per_task in cells.items():
        for t in tasks:
            scores = {L: c[0] for L, c in per_task.get(t, {}).items()}
            eff = effective_length(scores, threshold)
            body.append([label, t] + [_cell(per_task.get(t, {}).get(L)) for L in lens] + [str(eff or "< " + str(lens[0]))])
        mean = mean_over_tasks(per_task, tasks, lens)
        eff = effective_length(mean, threshold)
        body.append([label, "**mean**"] + ["n/a" if mean[L] is None else f"{100 * mean[L]:.0f}" for L in lens]
                    + [str(eff or "< " + str(lens[0]))])
    title = (f"RULER (string_match_all, % [Wilson 95%]; effective length: longest length up to which the score "
             f"stays >= {100 * threshold:.1f}%)")
    return f"{title}:\n" + markdown(["model", "task"] + [str(L) for L in lens] + ["effective length"], body)


def ruler_heatmap(task, doc: dict, out: Path) -> list[str]:
    """A heat map per model (tasks x lengths, score in percent; cells at the threshold or above in bold) ->
    [HEATMAP] when drawn by the first RULER task present."""
    from posenc.lab.plots import pyplot, save, score_cells

    results = doc["results"]
    tasks, lens, cells = grid(results)
    if not tasks or task.name != tasks[0] or not lens:
        return []
    threshold = run_threshold(results)
    plt = pyplot()
    models = list(cells)
    fig, axes = plt.subplots(1, len(models), figsize=(2 + (1 + 0.9 * len(lens)) * len(models), 0.5 * len(tasks) + 2),
                             squeeze=False, sharey=True)
    for ax, label in zip(axes[0], models):
        grid_v = [[(cells[label].get(t, {}).get(L) or (None,))[0] for L in lens] for t in tasks]
        image = score_cells(ax, grid_v, threshold)
        ax.set(xticks=range(len(lens)), xticklabels=[str(L) for L in lens], yticks=range(len(tasks)),
               yticklabels=tasks, xlabel="length (tokens)")
        ax.set_title(label.replace(", ", "\n"), fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), label=f"score % (bold: >= {100 * threshold:.1f}%)")
    save(fig, out / HEATMAP)
    plt.close(fig)
    return [HEATMAP]
