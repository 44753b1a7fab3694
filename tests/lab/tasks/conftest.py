"""Shared fixtures of the task tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def task_registry_restored() -> Iterator[None]:
    """A plug-in's task leaves the task registry as it found it (other tests list the registered tasks)."""
    from posenc.lab.tasks.registry import TASK_SETTINGS, TASKS

    tasks, settings = dict(TASKS), dict(TASK_SETTINGS)
    yield
    TASKS.clear()
    TASKS.update(tasks)
    TASK_SETTINGS.clear()
    TASK_SETTINGS.update(settings)


@pytest.fixture
def plugin_file(tmp_path, task_registry_restored):
    """plugin_file(name, source) -> the path (str) of a plug-in file holding ``source``, the registry restored after
    the test."""
    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(source)
        return str(path)

    return write
