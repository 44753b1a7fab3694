"""The task registry: name -> Task (training data, evaluation, metrics, report section, plots); the one owner of
the lab's list of tasks. The run loop, presets, report and plots look tasks up here and never branch on a name.

    >>> @register_task("reverse")
    ... class Reverse(Task):
    ...     metrics = ("exact_match",)
    ...     def sampler(self, run, seq_len, batch_size, seed): ...
    ...     def evaluate(self, ev): ...
"""

from __future__ import annotations

import inspect
from pathlib import Path

from posenc._internal.registry import check_new_name, origin_of
from posenc._internal.settings import Setting, declare
from posenc._internal.validate import check_choice
from posenc._internal.errors import ConfigError
from posenc.lab.tables import markdown, pivot, fmt


HELD_OUT = 1_000_003  # seed offset of a criterion's held-out episodes (the test episodes use the seed itself)


class Task:
    """Base class of a lab task. Subclasses override ``sampler`` and ``evaluate``; the rest has defaults.

    needs_corpus: the run loads the text corpus for it (``run.corpus``). metrics: the metric names of its rows.
    title: heading of its report section. settings: its own settings (``posenc._internal.settings.Setting``), declared
    once: ``posenc lab`` and ``posenc eval`` make a flag of each and validate it; the task reads the values from
    ``cfg.options[name]`` (``run.cfg`` / ``ev.cfg``).
    """

    name = ""
    needs_corpus = False
    metrics: tuple[str, ...] = ()
    title = ""
    origin = ""
    settings: tuple[Setting, ...] = ()

    def check(self, cfg) -> None:
        """Raise ConfigError for lab settings this task cannot run with (called by LabConfig.validate)."""

    def sampler(self, run, seq_len: int, batch_size: int, seed: int):
        """Training batches: an object with ``batch_size`` and ``batch(step, rank=0, world_size=1) -> (inputs
        [B, T] long, targets [B, T] long)``, targets -100 where not scored; a pure function of (seed, step)."""
        raise NotImplementedError

    def evaluate(self, ev) -> list[dict]:
        """Score ``ev.model`` (a ``posenc.lab.context.Evaluation``) -> result rows built with ``ev.row``."""
        raise NotImplementedError

    def text_needed(self, cfg) -> list[tuple]:
        """(tokens, length, sliding stride or None[, setting]) of the scored text (``run.corpus.val``) each of its
        measurements reads, for a task that reads the corpus: a command refuses a text too short for them before
        any model runs (default: none). ``setting``, when given, names the setting whose budget asks for those
        tokens (``eval_tokens``), so the refusal says what to lower; without it the length itself needs them."""
        return []

    def criterion(self, run, model, seed: int) -> float:
        """The training criterion for ``--train-until``: a score in [0, 1] of ``model`` (eval mode, no grad) at
        the training length, on held-out episodes that are not the test ones (optional; a task without it
        cannot train to a criterion)."""
        raise NotImplementedError

    def has_criterion(self) -> bool:
        return type(self).criterion is not Task.criterion

    def report(self, results: list[dict]) -> str:
        """Its section of the terminal / report.md tables (default: one table per metric, by length)."""
        parts = []
        for metric in self.metrics:
            lens, table = pivot(results, self.name, metric)
            if table:
                body = [[label] + [fmt(cells.get(L)) for L in lens] for label, (_, cells) in table.items()]
                parts.append(f"{self.title or self.name} ({metric}):\n"
                             + markdown(["model"] + [str(L) for L in lens], body))
        return "\n\n".join(parts)

    def plot(self, doc: dict, out: Path) -> list[str]:
        """PNG files written into ``out`` for this task's rows (default: none)."""
        return []


# name -> task instance, in registration order (built-ins first: lm, copy, passkey)
TASKS: dict[str, Task] = {}
# setting name -> its declaration, over every registered task (a name belongs to one task)
TASK_SETTINGS: dict[str, Setting] = {}


def register_task(name: str, *, replace: bool = False):
    """Decorator registering a Task subclass (instantiated once, without arguments) as task ``name``."""
    check_new_name("task", name, TASKS, replace)

    def decorator(cls):
        if not (inspect.isclass(cls) and issubclass(cls, Task)):
            raise ConfigError(f"task {name!r}: {getattr(cls, '__name__', cls)!r} (in {origin_of(cls)}) must "
                              "subclass posenc.lab.tasks.Task")
        missing = [hook for hook in ("sampler", "evaluate") if getattr(cls, hook) is getattr(Task, hook)]
        if missing:
            raise ConfigError(f"task {name!r} ({cls.__name__} in {origin_of(cls)}) lacks the task interface: "
                              f"define {' and '.join(missing)}")
        task = cls()
        task.name, task.origin = name, origin_of(cls)
        taken = {k: v for k, v in TASK_SETTINGS.items() if not (replace and v.owner == f"task {name}")}
        task.settings = declare(cls.settings, f"task {name}", taken)
        if replace:
            for k in [k for k, v in TASK_SETTINGS.items() if v.owner == f"task {name}"]:
                del TASK_SETTINGS[k]
        TASK_SETTINGS.update({s.name: s for s in task.settings})
        TASKS[name] = task
        return cls

    return decorator


# group name -> its tasks (``ruler``: RULER's synthetic tasks); a group's tasks run by name or by the group's name,
# not under "all" (which would train and score every one of them in a lab smoke run)
TASK_GROUPS: dict[str, tuple[str, ...]] = {}


def register_task_group(name: str, members) -> None:
    """Name ``members`` (registered tasks) as group ``name``, usable wherever a task name is."""
    check_new_name("task group", name, {}, False)
    if name in TASKS or name in TASK_GROUPS:
        raise ConfigError(f"task group {name!r}: the name is already a task or a group")
    for member in members:
        get_task(member, f"task group {name}")
    TASK_GROUPS[name] = tuple(members)


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def expand_tasks(names) -> list[str]:
    """Task names with "all" (every task outside a group) and group names (their tasks) expanded, each task once,
    in the order given; other names are kept as they are (checked by ``get_task``)."""
    if names == "all":
        grouped = {t for members in TASK_GROUPS.values() for t in members}
        return [t for t in TASKS if t not in grouped]
    out: dict[str, None] = {}
    for name in names:
        out.update(dict.fromkeys(TASK_GROUPS.get(name, (name,))))
    return list(out)


def get_task(name, argument: str = "tasks") -> Task:
    """The registered task ``name``, or ConfigError naming ``argument`` and listing the tasks."""
    return TASKS[check_choice(name, argument, TASKS, error=ConfigError)]


def needs_corpus(tasks) -> bool:
    """Whether a run of these task names loads the text corpus: when any of them reads it. The whole run, every
    worker included, then has it (an extension method's fit, such as LongRoPE's search, scores on it)."""
    return any(get_task(t).needs_corpus for t in tasks)
