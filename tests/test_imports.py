"""Package structure: no import cycle anywhere in posenc/ (imports inside functions included), neither between
modules nor between packages (posenc.rope <-> posenc.kernels counts even when no two modules form a loop); every
import points down docs/architecture.md's layer diagram; no module imports another module's _underscore name; every
module imports on its own."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "posenc"
ARCHITECTURE = PKG.parent / "docs" / "architecture.md"

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


def _unit(module: str) -> str:
    """The package-level unit of a module: its subpackage (posenc.rope.apply -> posenc.rope), else the module
    itself (posenc.irope, posenc.cli; the package root is posenc)."""
    return ".".join(module.split(".")[:2])


def _package_edges(graph: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """The module graph collapsed to units, and for each unit edge the module imports behind it."""
    units: dict[str, set[str]] = {_unit(m): set() for m in graph}
    why: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            ua, ub = _unit(a), _unit(b)
            if ua != ub:
                units[ua].add(ub)
                why.setdefault((ua, ub), []).append(f"{a} -> {b}")
    return units, why


def _documented_layers() -> dict[str, int]:
    """unit -> layer from docs/architecture.md's diagram: the fenced block after the ``<!-- layers -->`` marker, one
    line per layer ``L<n>  name name ...  # comment`` (names relative to posenc; ``posenc`` is the package root)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split("<!-- layers -->", 1)[1].split("```", 2)[1]
    layers = {}
    for line in block.splitlines():
        m = re.match(r"\s*L(\d+)\s+(.*)", line.split("#", 1)[0])
        if m:
            for name in re.split(r"[\s,]+", m.group(2).strip()):
                layers[name if name == "posenc" else f"posenc.{name}"] = int(m.group(1))
    return layers


def test_the_graph_sees_imports_inside_functions():
    """The detector itself: a late import inside a function is an edge (that is how cycles hide)."""
    graph = _edges()
    assert "posenc.schemes.registry" in graph["posenc.nn.model"] or "posenc.schemes" in graph["posenc.nn.model"]
    late = {m for m, _ in _imports("posenc.cli")}
    assert "posenc" in late  # `from posenc import __version__` inside _version()
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # two packages that import each other through different modules: no module cycle, a package cycle
    modules = {"posenc.a.x": {"posenc.b.y"}, "posenc.b.y": set(), "posenc.b.z": {"posenc.a.w"}, "posenc.a.w": set()}
    assert not _cycles(modules)
    assert _cycles(_package_edges(modules)[0]) == [["posenc.a", "posenc.b"]]


def test_no_package_cycles():
    """No two packages import each other, counting every import (function-level ones included)."""
    units, why = _package_edges(_edges())
    cycles = _cycles(units)
    detail = [f"{a} -> {b}: {why[(a, b)][:3]}" for c in cycles for a in c for b in c if (a, b) in why]
    assert not cycles, f"package cycles: {cycles}; edges: {detail}"


def test_imports_point_down_the_documented_layers():
    """docs/architecture.md's layer diagram names every package and module, and every import goes to the same
    layer or one below (so the diagram is the import graph, not a wish)."""
    layers = _documented_layers()
    units, why = _package_edges(_edges())
    missing = sorted(set(units) - set(layers))
    assert not missing, f"not in docs/architecture.md's layer diagram: {missing}"
    stale = sorted(set(layers) - set(units))
    assert not stale, f"in docs/architecture.md's layer diagram but not in posenc/: {stale}"
    up = [f"{a} (L{layers[a]}) -> {b} (L{layers[b]}): {why[(a, b)][0]}"
          for a, targets in units.items() for b in targets if layers[b] > layers[a]]
    assert not up, f"imports that point up the layers: {up}"


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
