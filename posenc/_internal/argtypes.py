"""argparse types the commands share: comma-separated lists, where an empty entry ('96,,192', '128,') is an error,
not skipped, and a bad entry names the expected form."""

from __future__ import annotations

import argparse


def items(text: str, kind: str) -> list[str]:
    """The comma-separated items of ``text``; ``kind`` names them in the error ("integers", "names")."""
    parts = [x.strip() for x in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind} with no empty entry, got {text!r}")
    return parts


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in items(text, "integers")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in items(text, "numbers")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def yes_no(text: str) -> bool:
    """'yes'/'no' (also 1/0, true/false, on/off) -> bool."""
    if text.lower() in ("1", "yes", "true", "on"):
        return True
    if text.lower() in ("0", "no", "false", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
