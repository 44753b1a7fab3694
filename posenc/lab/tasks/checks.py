"""What a task hands the lab is checked where it is handed over, so that a task's bug is reported as that task's
(its registered name, the file that registered it, the hook), not as a NaN loss, a wrong table or "a bug in posenc":

    sampler(...).batch(step, rank, world_size)  -> (inputs, targets): integer tensors of one shape [B, T] with
                                                   T = the length asked and 1 <= B <= the batch asked, ids in
                                                   [0, vocab), targets in [0, vocab) or -100, at least one scored
    evaluate(ev)                                -> a list of rows (dicts built by ev.row)
                                                   (``evaluate_task``: the one call of the hook, for ``posenc
                                                   lab`` and ``posenc eval`` alike)
    ev.row(eval_len, metric, value)             -> eval_len one the run asked for; a metric with a range
                                                   (``value_range``: accuracies, exact match) in it, finite
"""

from __future__ import annotations

import math

import torch

from posenc._internal.validate import is_int, is_number
from posenc._internal.errors import PosencError

IGNORE = -100  # the targets' "not scored" id (torch's cross_entropy ignore_index)
# metrics that are fractions: a value outside [0, 1] (or not finite) is a bug in the task that reported it
FRACTION_WORDS = ("accuracy", "exact_match", "match", "rate", "recall", "precision", "fraction")


class TaskError(PosencError):
    """A task broke its contract with the lab; the message names the task, its file and the hook."""


def task_label(task) -> str:
    """"task 'reverse' (registered by /path/reverse.py)"."""
    origin = getattr(task, "origin", "") or type(task).__module__
    return f"task {getattr(task, 'name', '?')!r} (registered by {origin})"


def value_range(task, metric: str) -> tuple[float, float] | None:
    """The range a metric's values must lie in: the task's ``value_ranges`` entry, else [0, 1] for fractions
    (accuracy, exact match, ...), else None (unbounded: perplexity, loss)."""
    ranges = getattr(task, "value_ranges", None) or {}
    if metric in ranges:
        return ranges[metric]
    if any(word in metric.lower() for word in FRACTION_WORDS):
        return (0.0, 1.0)
    return None


class CheckedSampler:
    """``sampler`` with each batch checked against what the lab asked of it (``seq_len``, at most ``batch_size``
    rows, ids below ``vocab``)."""

    def __init__(self, sampler, task, seq_len: int, batch_size: int, vocab: int):
        self.inner, self.task, self.seq_len, self.rows, self.vocab = sampler, task, seq_len, batch_size, vocab
        if not callable(getattr(sampler, "batch", None)):
            raise self._error("sampler()", f"returned {type(sampler).__name__}, which has no batch(step, rank, "
                                           "world_size) method")
        self.batch_size = getattr(sampler, "batch_size", batch_size)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _error(self, hook: str, problem: str) -> TaskError:
        return TaskError(f"{task_label(self.task)}: {hook} {problem}")

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        got = self.inner.batch(step, rank, world_size)
        hook = f"sampler().batch(step={step})"
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise self._error(hook, f"returned {type(got).__name__}; expected (inputs, targets)")
        inputs, targets = got
        for what, t in (("inputs", inputs), ("targets", targets)):
            if not isinstance(t, torch.Tensor):
                raise self._error(hook, f"returned {what} of type {type(t).__name__}; expected a torch tensor")
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise self._error(hook, f"returned {what} of dtype {t.dtype}; expected integer token ids (long)")
            if t.dim() != 2 or t.shape[1] != self.seq_len or not 1 <= t.shape[0] <= max(self.rows, 1):
                raise self._error(hook, f"returned {what} of shape {list(t.shape)}; expected [rows, {self.seq_len}] "
                                        f"with 1 to {self.rows} rows (the length and batch asked)")
        if inputs.shape != targets.shape:
            raise self._error(hook, f"returned inputs {list(inputs.shape)} and targets {list(targets.shape)}; "
                                    "expected one shape")
        lo, hi = int(inputs.min()), int(inputs.max())
        if lo < 0 or hi >= self.vocab:
            raise self._error(hook, f"returned input ids in [{lo}, {hi}]; expected ids in [0, {self.vocab - 1}] "
                                    f"(the model's vocabulary of {self.vocab})")
        scored = targets != IGNORE
        if not bool(scored.any()):
            raise self._error(hook, f"returned targets that are all {IGNORE} (nothing to score: the loss would be "
                                    "NaN)")
        t = targets[scored]
        if int(t.min()) < 0 or int(t.max()) >= self.vocab:
            raise self._error(hook, f"returned target ids in [{int(t.min())}, {int(t.max())}]; expected ids in "
                                    f"[0, {self.vocab - 1}] or {IGNORE} (not scored)")
        return inputs.long(), targets.long()


def check_row(task, cfg, eval_len, metric: str, value, nonfinite: bool = False) -> None:
    """TaskError when a row breaks the contract (a length not asked, a fraction out of [0, 1] or not finite).
    ``nonfinite``: ev.row turned a non-finite value of a model with finite weights into "diverged"."""
    asked = set(cfg.eval_lens) | set(cfg.sliding_lens or ())
    if not is_int(eval_len) or eval_len not in asked:
        raise TaskError(f"{task_label(task)}: evaluate() reported a row for eval_len {eval_len!r}, which the run "
                        f"did not ask for (eval_lens {sorted(asked)})")
    if not isinstance(metric, str) or not metric:
        raise TaskError(f"{task_label(task)}: evaluate() reported a row with metric {metric!r}; expected a name")
    bounds = value_range(task, metric)
    if nonfinite and bounds is not None:
        raise TaskError(f"{task_label(task)}: evaluate() reported a non-finite {metric} at length {eval_len} for a "
                        f"model whose weights are finite; expected a value in [{bounds[0]:g}, {bounds[1]:g}]")
    if value is None:
        return
    if not is_number(value):
        raise TaskError(f"{task_label(task)}: evaluate() reported {metric} = {value!r} at length {eval_len}; "
                        "expected a number or None")
    if bounds is not None and not (math.isfinite(value) and bounds[0] <= value <= bounds[1]):
        raise TaskError(f"{task_label(task)}: evaluate() reported {metric} = {value!r} at length {eval_len}; "
                        f"expected a value in [{bounds[0]:g}, {bounds[1]:g}]")


def check_rows(task, rows, ev=None) -> list[dict]:
    """``rows`` if evaluate() returned a list of row dicts whose lengths and values keep the contract
    (``check_row``, with ``ev``: the Evaluation); TaskError naming the task otherwise."""
    if not isinstance(rows, list):
        raise TaskError(f"{task_label(task)}: evaluate() returned {type(rows).__name__}; expected a list of rows "
                        "built with ev.row(...)")
    needed = ("task", "scheme", "eval_len", "metric", "value", "seed")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in needed):
            shown = (type(row).__name__ if not isinstance(row, dict)
                     else f"a dict without {[k for k in needed if k not in row]}")
            raise TaskError(f"{task_label(task)}: evaluate() returned row {i} as {shown}; build rows with "
                            "ev.row(eval_len, metric, value)")
        if ev is not None:
            from posenc.lab.context import DIVERGED

            nonfinite = row.get("note") == DIVERGED and not ev.diverged
            check_row(task, ev.cfg, row["eval_len"], row["metric"], row["value"], nonfinite=nonfinite)
    return rows


def evaluate_task(task, ev) -> list[dict]:
    """``task.evaluate(ev)``, its rows checked (``check_rows``): the one place both ``posenc lab`` and ``posenc eval``
    call a task's evaluate, so a row that breaks the contract is the task's error in both commands."""
    return check_rows(task, task.evaluate(ev), ev)
