"""Retrieval beside perplexity in ``posenc pick --evidence``: what a ``posenc eval`` (its passkey and RULER rows) or a
``posenc tune`` (its survivors' passkey and RULER scores) of the user's model measured, cited per method at one
length, and a note when the method with the lowest perplexity retrieves clearly worse than another.

Perplexity alone can mislead: in posenc's SmolLM2-135M study attention sinks have the lowest perplexity at 2x and
find 1 passkey in 6 (docs/results/smollm2/report.md). So the picker cites, per method:

- passkey as keys found / trials (an eval row is one depth's exact-match rate over ``passkey_trials`` keys; a tune
  keeps each survivor's mean rate over its plan's samples);
- each RULER task's string_match_all score with its samples (n) and Wilson 95% interval, as the eval or tune
  recorded them; the mean over the tasks scored (every sample pooled, with its Wilson interval: the mean of the
  tasks' scores, since every task runs the same samples); and the effective length of that mean where the rows
  allow it, by RULER's own rule (posenc.lab.tasks.ruler.report.effective_length, at the threshold the rows
  record, else RULER's 85.6%).

The note's rule: the method with the lowest perplexity retrieves *clearly* worse than another method measured at the
same length when, on passkey or on the RULER mean over the same tasks, its Wilson 95% interval lies wholly below
the other's (its upper end under the other's lower end). Overlapping intervals are within the noise of the samples,
and say nothing. The recommendation does not change: retrieval is cited, never ranked on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posenc.lab.stats import wilson_interval


@dataclass
class Retrieval:
    """Retrieval measured at one ``length``: passkey per method as (keys found, trials); RULER per method and task
    as {"value": score or None (n/a), "n", "ci_low", "ci_high"} (the tune's own form); the effective length of the
    mean over the RULER tasks per method (None: below the shortest length measured), only where the rows allow it;
    the RULER lengths measured and the threshold."""

    length: int
    passkey: dict[str, tuple[int, int]] = field(default_factory=dict)
    ruler: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    effective: dict[str, int | None] = field(default_factory=dict)
    ruler_lengths: list[int] = field(default_factory=list)
    threshold: float = 0.856


def _passkey_trials(meta: dict[str, Any]) -> int:
    """The keys behind each passkey row of an eval: its settings' ``passkey_trials`` (a depth's row is the rate over
    them)."""
    settings = meta.get("settings") or {}
    trials = settings.get("passkey_trials") or (settings.get("options") or {}).get("passkey_trials")
    return int(trials) if isinstance(trials, int) and trials > 0 else 1


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    """An eval's RULER row as the tune keeps a task's score (n/a rows: no score, n 0)."""
    if row.get("value") is None:
        return {"value": None, "n": 0, "ci_low": None, "ci_high": None, "note": row.get("note")}
    return {"value": float(row["value"]), "n": int(row.get("n_samples") or 0), "ci_low": row.get("ci_low"),
            "ci_high": row.get("ci_high")}


def _effective(out: Retrieval, cells: dict[str, dict[str, dict[int, float | None]]], lengths: list[int]) -> None:
    """Each method's effective length of the mean over its RULER tasks (``cells``: method -> task -> length ->
    score), by the RULER report's own functions. A length where a task has no score (n/a, or not run) has no mean:
    whether the model passes there is unknown, so no effective length is claimed for that method."""
    from posenc.lab.tasks.ruler.report import effective_length, mean_over_tasks

    out.ruler_lengths = sorted(lengths)
    for method, per_task in cells.items():
        table = {t: {L: (v,) for L, v in by_len.items()} for t, by_len in per_task.items()}
        mean = mean_over_tasks(table, list(table), out.ruler_lengths)
        if mean and all(v is not None for v in mean.values()):
            out.effective[method] = effective_length(mean, out.threshold)


def from_eval(doc: dict[str, Any], T: int) -> Retrieval | None:
    """The retrieval rows of a ``posenc eval`` results.json at ``T``, else at its longest retrieval length; None
    when it has none (an eval of perplexity only)."""
    from posenc.lab.tasks.ruler.report import METRIC, run_threshold

    rows = [r for r in doc.get("results") or [] if isinstance(r, dict) and isinstance(r.get("eval_len"), int)
            and isinstance(r.get("scaling"), str)
            and ((r.get("task") == "passkey" and r.get("metric") == "exact_match") or r.get("metric") == METRIC)]
    if not rows:
        return None
    lengths = {r["eval_len"] for r in rows}
    ruler_rows = [r for r in rows if r["metric"] == METRIC]
    out = Retrieval(T if T in lengths else max(lengths), threshold=run_threshold(ruler_rows))
    trials = _passkey_trials(doc.get("meta") or {})
    cells: dict[str, dict[str, dict[int, float | None]]] = {}
    for r in rows:
        if r["task"] == "passkey":
            if r["eval_len"] == out.length and isinstance(r.get("value"), (int, float)):
                found, n = out.passkey.get(r["scaling"], (0, 0))
                out.passkey[r["scaling"]] = (found + round(float(r["value"]) * trials), n + trials)
            continue
        cells.setdefault(r["scaling"], {}).setdefault(r["task"], {})[r["eval_len"]] = r.get("value")
        if r["eval_len"] == out.length:
            out.ruler.setdefault(r["scaling"], {})[r["task"]] = _cell(r)
    _effective(out, cells, sorted({r["eval_len"] for r in ruler_rows}))
    return out if out.passkey or out.ruler else None


def from_tune(doc: dict[str, Any]) -> Retrieval | None:
    """The survivors' retrieval of a ``posenc tune`` results.json at its target (passkey: the mean rate over the
    plan's samples, as keys found / trials); None when the tune measured none (``--tasks lm``)."""
    from posenc.lab.tasks.ruler.report import run_threshold

    passkey, ruler = doc.get("passkey") or {}, doc.get("ruler") or {}
    T = doc["target"]
    out = Retrieval(T, threshold=run_threshold([]))       # a tune scores RULER at the default threshold
    samples = (((doc.get("plan") or {}).get("retrieval") or {}).get("passkey") or {}).get("samples")
    for method, rate in passkey.items():
        if isinstance(rate, (int, float)) and samples:
            out.passkey[method] = (round(rate * samples), int(samples))
    out.ruler = {m: dict(scores) for m, scores in ruler.items() if isinstance(scores, dict) and scores}
    _effective(out, {m: {t: {T: s.get("value")} for t, s in scores.items()} for m, scores in out.ruler.items()},
               [T] if out.ruler else [])
    return out if out.passkey or out.ruler else None


def ruler_mean(scores: dict[str, dict[str, Any]]) -> tuple[list[str], tuple[float, float, float, int] | None]:
    """(the tasks scored, (mean, Wilson 95% low, high, samples)) of one method's RULER tasks, every sample pooled
    by the RULER report's ``pooled``; None when no task has a score."""
    from posenc.lab.tasks.ruler.report import pooled

    scored = [t for t, s in scores.items() if s.get("value") is not None and s.get("n")]
    if not scored:
        return [], None
    mean, low, high, n = pooled([{"value": scores[t]["value"], "n_samples": scores[t]["n"]} for t in scored])
    return scored, (mean, low, high, n)


def _ordered(methods, order) -> list[str]:
    """``methods`` in ``order`` (perplexity, best first) first, then the others by name."""
    first = [m for m in order if m in methods]
    return first + sorted(m for m in methods if m not in first)


def _interval(low, high) -> str:
    return "n/a" if low is None or high is None else f"[{low:.2f}, {high:.2f}]"


def _ruler_text(ret: Retrieval, method: str) -> str:
    """One method's RULER citation: each task's score [Wilson 95%] and n, the mean over the tasks scored, and the
    effective length of that mean when the rows allow it."""
    scores = ret.ruler[method]
    text = ", ".join(f"{t} {s['value']:.2f} {_interval(s['ci_low'], s['ci_high'])} n {s['n']}"
                     if s.get("value") is not None else f"{t} {s.get('note') or 'n/a'}" for t, s in scores.items())
    tasks, mean = ruler_mean(scores)
    if mean is not None and len(scores) > 1:
        text += f", mean over {' + '.join(tasks)} {mean[0]:.2f} {_interval(mean[1], mean[2])} n {mean[3]}"
    if method in ret.effective:
        eff, lens, thr = ret.effective[method], ret.ruler_lengths, f"{100 * ret.threshold:.1f}%"
        at = f"lengths measured {' / '.join(f'{L:,}' for L in lens)}"
        text += (f", effective length below {lens[0]:,} (the mean over the tasks is under {thr} at the shortest, "
                 f"{at})" if eff is None else
                 f", effective length {eff:,}{' or more' if eff == lens[-1] else ''} (the mean over the tasks stays "
                 f">= {thr} up to it, {at})")
    return text


def cite(ret: Retrieval, T: int, order=()) -> str:
    """The retrieval citation: passkey keys found / trials per method, then each method's RULER scores; methods in
    ``order`` (perplexity, best first) first."""
    where = "" if ret.length == T else f" (not measured at the target {T:,}; the longest length measured)"
    parts = []
    if ret.passkey:
        parts.append("passkey keys found / trials: " + ", ".join(
            f"{m} {ret.passkey[m][0]}/{ret.passkey[m][1]}" for m in _ordered(ret.passkey, order)))
    if ret.ruler:
        parts.append("RULER string_match_all [Wilson 95%] n samples, " + "; ".join(
            f"{m}: {_ruler_text(ret, m)}" for m in _ordered(ret.ruler, order)))
    return f"retrieval at length {ret.length:,}{where}: " + "; ".join(parts)


def _clearly_above(cells: dict[str, tuple[float, float, float, str]], best: str) -> str | None:
    """The method whose interval lies wholly above ``best``'s (``cells``: method -> (score, low, high, text)),
    the highest-scoring one when several; None when none does."""
    if best not in cells:
        return None
    above = [m for m, c in cells.items() if m != best and c[1] > cells[best][2]]
    return max(above, key=lambda m: cells[m][0], default=None)


def worse_note(ret: Retrieval, best: str, perplexity: str) -> str | None:
    """The note when ``best`` (the method with the lowest perplexity; ``perplexity``: its number, as cited)
    retrieves clearly worse than another method (module docstring: Wilson 95% intervals apart), on passkey or on the
    RULER mean over the same tasks, with both numbers; None otherwise."""
    parts = []
    keys = {m: (f / n, *wilson_interval(f, n), f"{f}/{n} keys") for m, (f, n) in ret.passkey.items() if n}
    other = _clearly_above(keys, best)
    if other is not None:
        parts.append(f"passkey: {other} finds {keys[other][3]} {_interval(*keys[other][1:3])}, {best} "
                     f"{keys[best][3]} {_interval(*keys[best][1:3])}")
    means = {m: ruler_mean(s) for m, s in ret.ruler.items()}
    tasks = means.get(best, ([], None))[0]
    same = {m: (v[0], v[1], v[2], f"{v[0]:.2f}") for m, (t, v) in means.items() if v is not None and t == tasks}
    other = _clearly_above(same, best)
    if other is not None:
        parts.append(f"RULER mean over {' + '.join(tasks)}: {other} {same[other][3]} {_interval(*same[other][1:3])}, "
                     f"{best} {same[best][3]} {_interval(*same[best][1:3])}")
    if not parts:
        return None
    return (f"{best} has the lowest perplexity ({perplexity}) but retrieves clearly worse at length "
            f"{ret.length:,} than another method measured there (Wilson 95% intervals apart): " + "; ".join(parts)
            + ". Perplexity does not show whether far tokens are found: check retrieval before deploying it")
