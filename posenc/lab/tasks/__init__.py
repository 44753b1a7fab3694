"""The lab's tasks behind one registry.

    registry.py  Task (sampler / evaluate / report / plot / check), TASKS, register_task, get_task, task_names
    lm.py        byte-level language modelling: perplexity vs length (non-overlapping, sliding), per-position loss
    copy.py      the copy task (exercise 3): exact match and token accuracy per length
    passkey.py   passkey retrieval over a length x depth grid (greedy decoding with the KV cache)
    ruler/       RULER's synthetic tasks (niah_*, vt, cwe, fwe; the group name ``ruler``) and its effective length

A new task is one module here (registered with ``@register_task``) plus one import line below.
"""

from __future__ import annotations

from posenc.lab.tasks.registry import (TASK_GROUPS, TASKS, Task, expand_tasks, get_task, needs_corpus,
                                       register_task, register_task_group, task_names)
from posenc.lab.tasks import lm, copy, passkey, ruler  # noqa: F401,E401  (registers the built-ins, in this order)

__all__ = ["TASKS", "TASK_GROUPS", "Task", "expand_tasks", "get_task", "needs_corpus", "register_task",
           "register_task_group", "task_names"]
