"""Argument checks shared by the whole package: the one owner of "is this a valid int / number / choice".

Every error names the argument (as the library calls it; the CLI maps arguments to its flags) and the expected form,
and is raised as ``error`` (``PosencError`` unless the caller owns a more specific subclass such as ``ConfigError``).
Booleans are never numbers here, and strings are never numbers: ``base='1e4'`` is refused, not parsed.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from typing import Iterable

from posenc._internal.errors import PosencError


def is_int(x) -> bool:
    """Whether ``x`` is an integer (Python, numpy or any numbers.Integral) and not a bool: the test every reader
    of untrusted values (configs, rows, options) shares with check_int."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_number(x) -> bool:
    """Whether ``x`` is a real number (int, float, numpy scalars, any numbers.Real) and not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _describe(lo, hi, kind: str) -> str:
    if kind == "an integer" and hi is None and lo in (0, 1):
        return "a positive integer" if lo == 1 else "a non-negative integer"
    if lo is not None and hi is not None:
        return f"{kind} in [{lo}, {hi}]"
    if lo is not None:
        return f"{kind} >= {lo}"
    if hi is not None:
        return f"{kind} <= {hi}"
    return kind


def check_int(value, name: str, *, min: int | None = None, max: int | None = None,
              error: type[PosencError] = PosencError) -> int:
    """``value`` as a Python int, or ``error`` naming ``name``. Accepts numpy/torch integer scalars, not bool/float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be {_describe(min, max, 'an integer')}, got {value!r}")
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise error(f"{name} must be {_describe(min, max, 'an integer')}, got {value}")
    return value


def check_float(value, name: str, *, min: float | None = None, max: float | None = None, positive: bool = False,
                finite: bool = True, error: type[PosencError] = PosencError) -> float:
    """``value`` as a float, or ``error`` naming ``name``. ``positive``: strictly > 0. NaN is always refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number, got {value!r}")
    v = float(value)
    kind = "a positive finite number" if positive and finite else "a positive number" if positive else \
        "a finite number" if finite else "a number"
    if v != v or (finite and math.isinf(v)) or (positive and not v > 0):
        raise error(f"{name} must be {_describe(min, max, kind)}, got {value!r}")
    if (min is not None and v < min) or (max is not None and v > max):
        raise error(f"{name} must be {_describe(min, max, kind)}, got {value!r}")
    return v


def check_bool(value, name: str, *, error: type[PosencError] = PosencError) -> bool:
    """``value`` if it is True or False, else ``error``: a truthy string or number must not silently mean True."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}")
    return value


def check_distinct(values, name: str, *, error: type[PosencError] = PosencError):
    """``values`` if no entry repeats, else ``error``: a repeated seed would count twice in a mean ± std, a repeated
    scheme, method or length would be run twice under one name."""
    seen = set()
    for v in values:
        if v in seen:
            raise error(f"{name}: {v!r} appears more than once; give each entry once")
        seen.add(v)
    return values


def check_choice(value, name: str, choices: Iterable, *, error: type[PosencError] = PosencError):
    """``value`` if it is one of ``choices``, else ``error`` listing them."""
    choices = list(choices)
    if isinstance(value, bool) or value not in choices:
        raise error(f"{name}: expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def positive_int(value, name: str, *, error: type[PosencError] = PosencError) -> int:
    return check_int(value, name, min=1, error=error)


def non_negative_int(value, name: str, *, error: type[PosencError] = PosencError) -> int:
    return check_int(value, name, min=0, error=error)


def positive_float(value, name: str, *, error: type[PosencError] = PosencError) -> float:
    return check_float(value, name, positive=True, error=error)


def even_int(value, name: str, *, error: type[PosencError] = PosencError) -> int:
    check_int(value, name, min=1, error=error)
    if value % 2:
        raise error(f"{name} must be even (RoPE rotates pairs of dimensions), got {value}")
    return int(value)


def heads_divide(d_model, n_heads, *, error: type[PosencError] = PosencError) -> int:
    """head_dim = d_model // n_heads, or ``error`` if n_heads does not divide d_model: the one owner of that rule."""
    d_model = check_int(d_model, "d_model", min=1, error=error)
    n_heads = check_int(n_heads, "n_heads", min=1, error=error)
    if d_model % n_heads:
        raise error(f"d_model must be divisible by n_heads ({n_heads}), got {d_model}")
    return d_model // n_heads


# the largest base float32 holds: RoPE and the sinusoidal encoding raise the base to a power in float32
FLOAT32_MAX = 3.4028234663852886e38


def user_stacklevel() -> int:
    """stacklevel for a warning raised two frames up, pointing at the first caller outside posenc (the user's line)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # posenc/, not posenc/_internal/
    frame, level = sys._getframe(2), 2
    while frame is not None and (frame.f_code.co_filename.startswith(package)  # dataclass __init__ too:
                                 or (frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__")):
        frame, level = frame.f_back, level + 1
    return level


def check_base(value, name: str, *, error: type[PosencError] = PosencError) -> float:
    """A RoPE or sinusoidal base as a float: a positive number float32 can hold (strings are refused, not parsed),
    or ``error``. The one rule for a base, wherever a user gives one.

    A base <= 1 only warns: the frequencies base^(-2j/d) then stop decreasing with j (they grow for a base < 1),
    so no pair keeps long-range position; published models use 1e4 and above.
    """
    value = check_float(value, name, positive=True, error=error)
    if value > FLOAT32_MAX:
        raise error(f"{name} must be at most {FLOAT32_MAX:.4g} (float32's largest value: RoPE raises it to a "
                    f"power in float32, so larger bases give inf), got {value!r}")
    if value <= 1:
        warnings.warn(f"{name} {value:g} <= 1: the frequencies theta^(-2j/d) do not decrease with j"
                      + (" (they grow)" if value < 1 else " (all equal 1)")
                      + ", so no pair encodes long-range position; RoPE (and sinusoidal) bases are normally >= 1e4",
                      UserWarning, stacklevel=user_stacklevel())
    return value
