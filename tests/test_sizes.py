"""Size limits of posenc/ (issue 44): no module over 600 lines, no function over 80 lines, measured with ``ast``.

How lines are counted:
- a module: the file's line count (``len(text.splitlines())``: docstring, comments and blank lines included);
- a function (``def`` or ``async def``, methods and nested functions included, each counted on its own): from its
  first decorator (or the ``def`` line when it has none) to its last line, ``end_lineno - start + 1``, so its
  docstring, comments and blank lines inside count too. A nested function's lines also count toward the function
  that holds it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "posenc"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Modules ("posenc/x/y.py") and functions ("posenc/x/y.py:name") still over the limits while they are split: none
# now. This list only shrinks: never add an entry. An entry no longer over its limit fails the test: delete it then.
KNOWN_OVER: set[str] = set()


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of one function: first decorator (or ``def``) to its end, inclusive."""
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return node.end_lineno - start + 1


def sizes(root: Path = PKG) -> dict[str, int]:
    """Every module ("posenc/x/y.py") and function ("posenc/x/y.py:name") under ``root`` -> its lines."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent).as_posix()
        out[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{rel}:{node.name}"
                out[key] = max(out.get(key, 0), function_lines(node))   # same name twice: the longer one
    return out


def over_limits(measured: dict[str, int]) -> dict[str, int]:
    """The entries of ``measured`` over their limit (600 for a module, 80 for a function)."""
    return {name: n for name, n in measured.items()
            if n > (MAX_FUNCTION_LINES if ":" in name else MAX_MODULE_LINES)}


def test_the_counter_counts_decorators_docstrings_and_nested_functions(tmp_path):
    pkg = tmp_path / "posenc"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(77))
    (pkg / "m.py").write_text(f'@decorator\ndef f():\n    """doc."""\n{body}\n\n\ndef g():\n    def inner():\n'
                              f'        pass\n    return inner\n')
    measured = sizes(pkg)
    assert measured["posenc/m.py"] == 2 + 1 + 77 + 2 + 4
    assert measured["posenc/m.py:f"] == 80          # decorator + def + docstring + 77 lines
    assert measured["posenc/m.py:g"] == 4
    assert measured["posenc/m.py:inner"] == 2
    assert over_limits(measured) == {}
    (pkg / "m.py").write_text(f'@a\n@b\ndef f():\n    """doc."""\n{body}\n')
    assert over_limits(sizes(pkg)) == {"posenc/m.py:f": 81}
    (pkg / "big.py").write_text("x = 1\n" * 601)
    assert over_limits(sizes(pkg))["posenc/big.py"] == 601


def test_no_module_or_function_is_over_the_limits():
    over = over_limits(sizes())
    new = {name: n for name, n in over.items() if name not in KNOWN_OVER}
    assert not new, (f"over the limits ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function): {new}; "
                     "split by job (a module per job, helpers for a long function)")


def test_the_known_offenders_list_is_not_stale():
    measured = sizes()
    over = over_limits(measured)
    stale = sorted(name for name in KNOWN_OVER if name not in over)
    assert not stale, (f"in KNOWN_OVER but no longer over the limits (or gone): {stale}; delete them from KNOWN_OVER "
                       f"({ {name: measured.get(name) for name in stale} })")
