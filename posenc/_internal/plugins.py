"""Plug-ins: import a user's file or module that registers schemes, extension methods or tasks.

    posenc lab --plugin my_scheme.py --schemes rope,mine        # a file: imported under a private module name
    posenc lab --plugin mypackage.positions                     # a module on sys.path

The file uses the ordinary decorators (``posenc.register_scheme``, ``posenc.register_method``,
``posenc.register_task``). Any failure -- the file is missing, it raises on import (a syntax error included), it
registers a taken name, what it registers lacks the interface, or it registers nothing at all (a file given by
mistake, a registration under ``if __name__ == "__main__":``) -- is a ``PluginError`` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Iterable

from posenc._internal.errors import PosencError


class PluginError(PosencError):
    """A plug-in could not be loaded; the message names the file or module and the reason."""


# module name -> the spec it was loaded from, in load order: what a fresh process (the lab's --jobs workers)
# loads to see the same registrations
LOADED: dict[str, str] = {}
# what a plug-in registers: (kind, registry module, its table). The registries sit above this module
# (docs/architecture.md): they are read from sys.modules, not imported -- a registry not loaded holds nothing.
REGISTRIES = (("scheme", "posenc.schemes.registry", "SCHEMES"),
              ("extension method", "posenc.extensions.registry", "METHODS"),
              ("attention method", "posenc.attention.registry", "ATTENTION_METHODS"),
              ("task", "posenc.lab.tasks.registry", "TASKS"),
              ("rope type", "posenc.rope.registry", "ROPE_SCALING_FUNCTIONS"))
PACKAGE = Path(__file__).resolve().parent.parent  # posenc/


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
            before = _registered()
            try:
                loader_spec.loader.exec_module(module)
                _check_registers(where, before)
            except BaseException:
                del sys.modules[name]
                raise
            LOADED[name] = str(resolved)
            return module
        fresh, before = spec not in sys.modules, _registered()
        module = importlib.import_module(spec)
        if fresh:
            try:
                _check_registers(where, before)
            except PluginError:
                sys.modules.pop(spec, None)    # (loading it again is refused again, not taken as loaded)
                raise
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
    except SystemExit as exc:  # sys.exit() / exit() at import: the run would end with nothing done
        raise PluginError(f"plugin {where}: called sys.exit({exc.code!r}) while being imported; a plug-in must "
                          "only define and register (posenc ran nothing)") from None
    except Exception as exc:  # whatever the user's code raises on import
        raise PluginError(f"plugin {where}: import failed: {type(exc).__name__}: {exc}") from None


def _plugin_files() -> dict[str, str]:
    """Resolved source file -> the plug-in spec, for every plug-in loaded (files and modules)."""
    files = {}
    for name, spec in LOADED.items():
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) or (spec if spec.endswith(".py") else None)
        if path:
            files[str(Path(path).resolve())] = spec
    return files


def _entries() -> list[tuple[str, str, object]]:
    """(kind, name, entry) of every entry of the registries loaded (``REGISTRIES``)."""
    found = []
    for kind, module_name, attr in REGISTRIES:
        table = getattr(sys.modules.get(module_name), attr, None) or {}
        found += [(kind, name, entry) for name, entry in table.items()]
    return found


def _entries_from(path: str) -> list[tuple[str, str, object]]:
    """(kind, name, entry) of every registration made from the file ``path``."""
    return [(kind, name, entry) for kind, name, entry in _entries()
            if getattr(entry, "origin", "") and str(Path(entry.origin).resolve()) == path]


def _registered() -> set[tuple[str, str, int]]:
    """(kind, name, id of the entry) of every registration now: what a plug-in's import is compared with."""
    return {(kind, name, id(entry)) for kind, name, entry in _entries()}


def _is_posencs(entry) -> bool:
    """Whether ``entry`` was defined inside posenc (a built-in, registered when a plug-in first imports its
    registry), not by a plug-in."""
    origin = str(getattr(entry, "origin", "") or "")
    if not origin.endswith(".py"):
        return origin == "posenc" or origin.startswith("posenc.")
    return Path(origin).resolve().is_relative_to(PACKAGE)


def _check_registers(where: str, before: set) -> None:
    """PluginError naming the plug-in when its import registered nothing (no new or replaced scheme, extension
    method, task or rope type): the run would go on without what the user meant to add, and without a word."""
    if any((kind, name, id(entry)) not in before and not _is_posencs(entry) for kind, name, entry in _entries()):
        return
    raise PluginError(f"plugin {where}: registers nothing (no scheme, extension method, task or rope type); a "
                      "plug-in registers with posenc.register_scheme, posenc.register_method or "
                      "posenc.register_task when it is imported")


def _hooks(kind: str, entry) -> dict:
    """hook name -> the function posenc calls for it, for one registry entry."""
    import inspect

    if kind == "extension method":
        return {h: getattr(entry, h) for h in ("write", "transformers_form", "fit", "train_positions")
                if getattr(entry, h, None) is not None}
    if kind == "rope type":
        return {"rope type function": entry, **({"check": entry.check} if getattr(entry, "check", None) else {})}
    owner = entry.factory if kind == "scheme" else type(entry)
    if not inspect.isclass(owner):
        return {"factory": owner}
    hooks = {}
    for cls in reversed(owner.__mro__):
        hooks.update({k: v for k, v in vars(cls).items() if callable(v)})
    return hooks


def _describe_hook(code, entries) -> tuple[str, str] | None:
    """(what: "scheme 'mine'", hook: "bias()") for the plug-in function whose code object is ``code``."""
    for kind, name, entry in entries:
        for hook, fn in _hooks(kind, entry).items():
            if getattr(getattr(fn, "__func__", fn), "__code__", None) is code:
                return f"{kind} {name!r}", f"{'__init__ (the factory)' if hook == '__init__' else hook}()"
    return None


def plugin_fault(exc: BaseException) -> str | None:
    """When ``exc`` was raised inside a loaded plug-in's code: one line naming the plug-in file, what it
    registered, the hook posenc called (the plug-in's outermost function on the stack) and the line that raised;
    else None (the fault is posenc's, or the input's)."""
    files = _plugin_files()
    if not files:
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((str(Path(tb.tb_frame.f_code.co_filename).resolve()), tb.tb_lineno, tb.tb_frame.f_code))
        tb = tb.tb_next
    ours = [f for f in frames if f[0] in files]
    if not ours:
        return None
    path, _, code = ours[0]
    line = ours[-1][1]
    entries = _entries_from(path)
    described = _describe_hook(code, entries)
    if described is not None:
        where = f", {described[0]}, hook {described[1]}"
    else:
        names = [f"{kind} {name!r}" for kind, name, _ in entries]
        where = (f" (registers {', '.join(names)})" if names else "") + \
            f": {getattr(code, 'co_qualname', code.co_name)}()"
    text = "" if isinstance(exc, SystemExit) else " ".join(str(exc).split())[:240]
    raised = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"raised {type(exc).__name__}"
    return (f"plugin {files[path]}{where} {raised}{': ' + text if text else ''} (line {line} of "
            f"{Path(path).name}); a fault in the plug-in, not in posenc or your settings")


def load_plugins(specs: Iterable[str]) -> list:
    """load_plugin for each spec, in order."""
    return [load_plugin(s) for s in specs or ()]
