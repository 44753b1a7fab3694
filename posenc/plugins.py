"""Plug-ins: import a user's file or module that registers schemes, extension methods or tasks.

    posenc lab --plugin my_scheme.py --schemes rope,mine        # a file: imported under a private module name
    posenc lab --plugin mypackage.positions                     # a module on sys.path

The file uses the ordinary decorators (``posenc.register_scheme``, ``posenc.register_method``,
``posenc.register_task``). Any failure -- the file is missing, it raises on import (a syntax error included), it
registers a taken name, or what it registers lacks the interface -- is a ``PluginError`` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Iterable

from posenc.errors import PosencError


class PluginError(PosencError):
    """A plug-in could not be loaded; the message names the file or module and the reason."""


# module name -> the spec it was loaded from, in load order: what a fresh process (the lab's --jobs workers)
# loads to see the same registrations
LOADED: dict[str, str] = {}


def load_plugin(spec: str):
    """Import one plug-in: a path to a .py file, or a dotted module name. Returns the module.

    A file is imported once per resolved path (loading it again returns the same module, so its registrations
    do not collide with themselves).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin: expected a .py file or a module name, got {spec!r}")
    path = Path(spec).expanduser()
    is_file = spec.endswith(".py") or path.exists() or "/" in spec or "\\" in spec
    where = str(path) if is_file else spec
    try:
        if is_file:
            if not path.is_file():
                raise PluginError(f"plugin {where}: no such file")
            resolved = path.resolve()
            name = "posenc_plugin_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
            if name in sys.modules:
                return sys.modules[name]
            loader_spec = importlib.util.spec_from_file_location(name, resolved)
            if loader_spec is None or loader_spec.loader is None:
                raise PluginError(f"plugin {where}: not an importable Python file")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            LOADED[name] = str(resolved)
            return module
        module = importlib.import_module(spec)
        LOADED[module.__name__] = spec
        return module
    except PluginError:
        raise
    except PosencError as exc:  # a taken name, a missing interface: the registries' own message
        raise PluginError(f"plugin {where}: {exc}") from None
    except ModuleNotFoundError as exc:
        if not is_file and exc.name and spec.startswith(exc.name):
            raise PluginError(f"plugin {where}: no such module (and no such file)") from None
        raise PluginError(f"plugin {where}: import failed: {type(exc).__name__}: {exc}") from None
    except SyntaxError as exc:
        raise PluginError(f"plugin {where}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # whatever the user's code raises on import
        raise PluginError(f"plugin {where}: import failed: {type(exc).__name__}: {exc}") from None


def load_plugins(specs: Iterable[str]) -> list:
    """load_plugin for each spec, in order."""
    return [load_plugin(s) for s in specs or ()]
