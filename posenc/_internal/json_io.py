"""Reading JSON a user or another program wrote (configs, search checkpoints, results, checkpoint metadata): the one
owner of the limits. Whatever the text, the reader raises ``error`` (a PosencError) with one line naming the file:
not JSON, nested deeper than ``MAX_DEPTH`` (Python's decoder would hit its recursion limit, and every walk over
the value after it), or a number past Python's digit limit for integers (4300 digits) -- never a RecursionError
or a bare ValueError that would read as a bug in posenc."""

from __future__ import annotations

import json

from posenc._internal.errors import ConfigError, PosencError

# far deeper than any config, checkpoint or results file posenc reads (a config.json is 3-4 levels deep)
MAX_DEPTH = 64


def loads(text: str, what: str, *, error: type[PosencError] = ConfigError):
    """``json.loads(text)``, or ``error`` starting with ``what`` ("config file 'x.json'")."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise error(f"{what}: nests JSON objects / lists too deeply (more than {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:   # "Exceeds the limit (4300 digits) for integer string conversion"
        if "digits" in str(exc):
            raise error(f"{what}: holds a number with thousands of digits (past Python's limit for integers); "
                        "no setting needs one") from None
        raise error(f"{what} is not valid JSON: {' '.join(str(exc).split())[:120]}") from None
    check_depth(data, what, error=error)
    return data


def check_depth(data, what: str, *, error: type[PosencError] = ConfigError) -> None:
    """``error`` when ``data`` nests lists / dicts more than ``MAX_DEPTH`` levels (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise error(f"{what}: nests JSON objects / lists too deeply (more than {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
