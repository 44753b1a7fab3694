"""Small argument checks shared by the math modules: each error names the argument and the expected form."""

from __future__ import annotations

from posenc.errors import PosencError


def positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PosencError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PosencError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def positive_float(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PosencError(f"{name} must be a positive number, got {value!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise PosencError(f"{name} must be a positive finite number, got {value!r}")
    return v


def even_int(value, name: str) -> int:
    positive_int(value, name)
    if value % 2:
        raise PosencError(f"{name} must be even (RoPE rotates pairs of dimensions), got {value}")
    return value
