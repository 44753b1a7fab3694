"""For tests that load plug-ins: plug-ins register into process-wide tables (schemes, methods, tasks and the
settings tasks and methods declare), so each test's additions are removed after it::

    @pytest.fixture
    def clean_registries():
        with registries_restored():
            yield
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from posenc.attention.registry import ATTENTION_METHODS
from posenc.extensions.registry import METHOD_SETTINGS, METHODS
from posenc.lab.tasks import TASKS
from posenc.lab.tasks.registry import TASK_SETTINGS
from posenc.schemes import SCHEMES


@contextmanager
def registries_restored():
    tables = (SCHEMES, METHODS, ATTENTION_METHODS, TASKS, TASK_SETTINGS, METHOD_SETTINGS)
    before = [dict(t) for t in tables]
    modules = set(sys.modules)
    try:
        yield
    finally:
        _restore(tables, before, modules)


def _restore(tables, before, modules) -> None:
    for table, saved in zip(tables, before):
        table.clear()
        table.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith("posenc_plugin_"):
            del sys.modules[name]
