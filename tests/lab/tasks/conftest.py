"""Shared fixtures of the task tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def restored_task_registry() -> Iterator[None]:
    """A plug-in's task leaves the task registry as it found it (other tests list the registered tasks)."""
    from posenc.lab.tasks.registry import TASK_SETTINGS, TASKS

    tasks, settings = dict(TASKS), dict(TASK_SETTINGS)
    try:
        yield
    finally:
        TASKS.clear()
        TASKS.update(tasks)
        TASK_SETTINGS.clear()
        TASK_SETTINGS.update(settings)


@pytest.fixture
def task_registry_restored() -> Iterator[None]:
    with restored_task_registry():
        yield


@pytest.fixture(scope="module")
def module_task_registry_restored() -> Iterator[None]:
    """The same for a module whose tests share one plug-in run."""
    with restored_task_registry():
        yield


@pytest.fixture
def plugin_file(tmp_path, task_registry_restored):
    """plugin_file(name, source) -> the path (str) of a plug-in file holding ``source``, the registry restored after
    the test."""
    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(source)
        return str(path)

    return write
