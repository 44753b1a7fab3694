"""The task registry: built-ins in order, a new task through the run loop, and clear errors."""

from __future__ import annotations

import pytest

from posenc._internal.errors import ConfigError
from posenc.lab.tasks import TASKS, Task, get_task, register_task, task_names


@pytest.fixture
def registered():
    before = set(TASKS)
    yield
    for name in set(TASKS) - before:
        del TASKS[name]


def test_builtins_and_their_interface():
    assert task_names()[:3] == ("lm", "copy", "passkey")
    assert get_task("lm").needs_corpus and not get_task("copy").needs_corpus
    assert get_task("copy").metrics == ("exact_match", "token_accuracy")
    with pytest.raises(ConfigError, match="tasks: expected one of lm, copy, passkey.*'reverse'"):
        get_task("reverse")


def test_registration_checks_the_interface(registered):
    with pytest.raises(ConfigError, match="must subclass posenc.lab.tasks.Task"):
        register_task("test-not-a-task")(dict)

    class Half(Task):
        def sampler(self, run, seq_len, batch_size, seed):
            return None

    with pytest.raises(ConfigError, match="lacks the task interface: define evaluate"):
        register_task("test-half")(Half)
    with pytest.raises(ConfigError, match="task 'lm' is already registered"):
        register_task("lm")


def test_default_report_is_one_table_per_metric(registered):
    @register_task("test-constant")
    class Constant(Task):
        metrics = ("score",)
        title = "Constant"

        def sampler(self, run, seq_len, batch_size, seed):
            raise NotImplementedError

        def evaluate(self, ev):
            return []

    rows = [{"task": "test-constant", "scheme": "rope", "scaling": "none", "finetuned": False, "eval_len": L,
             "metric": "score", "value": v, "std": None} for L, v in ((8, 0.5), (16, 0.25))]
    text = TASKS["test-constant"].report(rows)
    assert text.splitlines()[0] == "Constant (score):" and "| rope | 0.50 | 0.25 |" in text
