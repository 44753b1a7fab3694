"""RULER's scoring of a prediction (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", github.com/NVIDIA/RULER, scripts/eval/evaluate.py and scripts/eval/synthetic/constants.py),
restated per sample:

    clean_prediction   strip, control characters (below 0x20) to newlines, strip again
    string_match_all   the fraction of the references found in the prediction (case-insensitive substrings):
                       every synthetic task (niah, variable tracking, common and frequent words)
    string_match_part  1 when any reference is found, else 0: RULER's QA tasks (not built here: they need
                       downloaded data sets)

RULER reports the mean over samples times 100; posenc keeps fractions in [0, 1] (the lab's rows).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean_prediction(text: str) -> str:
    """The prediction as RULER scores it: surrounding whitespace off, control characters made newlines."""
    return _CONTROL.sub("\n", text.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` that occur in ``prediction``, ignoring case (RULER's per-sample rule)."""
    if not references:
        raise ValueError("string_match_all: expected at least one reference")
    low = prediction.lower()
    return sum(ref.lower() in low for ref in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 when any of ``references`` occurs in ``prediction`` (ignoring case), else 0.0."""
    if not references:
        raise ValueError("string_match_part: expected at least one reference")
    low = prediction.lower()
    return float(any(ref.lower() in low for ref in references))
