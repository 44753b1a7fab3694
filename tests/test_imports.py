"""Package structure: no import cycle anywhere in posenc/ (imports inside functions included), no module imports
another module's _underscore name, and every module imports on its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "posenc"

# Delete an entry once it is fixed.
KNOWN_CYCLES: set = set()
KNOWN_PRIVATE: set = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _lazy_exports(package: str) -> dict[str, str]:
    """The package's _EXPORTS table (public name -> defining module), read without importing it."""
    tree = ast.parse(MODULES[package].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _imports(name: str) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import statement of module ``name``."""
    tree = ast.parse(MODULES[name].read_text())
    is_pkg = MODULES[name].name == "__init__.py"
    # imports under `if TYPE_CHECKING:` never run: annotations only, no runtime dependency
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("posenc")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("posenc"):
                out += [(base, a.name) for a in node.names]
    return out


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        for module, attr in _imports(name):
            target = module
            if attr and f"{module}.{attr}" in MODULES:  # from pkg import submodule
                target = f"{module}.{attr}"
            elif attr and module in MODULES and MODULES[module].name == "__init__.py":
                target = _lazy_exports(module).get(attr, module)  # a lazily exported name: its defining module
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports_inside_functions():
    """The detector itself: a late import inside a function is an edge (that is how cycles hide)."""
    graph = _edges()
    assert "posenc.schemes.registry" in graph["posenc.nn.model"] or "posenc.schemes" in graph["posenc.nn.model"]
    late = {m for m, _ in _imports("posenc.cli")}
    assert "posenc" in late  # `from posenc import __version__` inside _version()
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = [c for c in _cycles(_edges()) if frozenset(c) not in KNOWN_CYCLES]
    assert not cycles, f"import cycles: {cycles}"


def test_no_imports_of_other_modules_private_names():
    bad = []
    for name in MODULES:
        for module, attr in _imports(name):
            if attr and attr.startswith("_") and not attr.startswith("__") and module != name \
                    and f"{module}.{attr}" not in MODULES and (name, module, attr) not in KNOWN_PRIVATE:
                bad.append(f"{name} imports {module}.{attr}")
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != "posenc.__main__"))
def test_every_module_imports(name):
    importlib.import_module(name)
