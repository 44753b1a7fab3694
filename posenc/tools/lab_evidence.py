"""The lab's measured numbers in the sentences posenc cites, filled in from the packaged extracts at run time.

A sentence that cites a lab preset (posenc.tools.pick_rules.EVIDENCE, an extension method's ``note``) names each
number as a format field ``{STUDY[CELL]:SPEC}``: STUDY is a folder of posenc/tools/measured/ (posenc.tools.evidence
ships the extracts of docs/results/STUDY/results.json), CELL is ``SCHEME[/SCALING]@LENGTH[#METRIC]`` (scaling
"none" and metric "ppl" when left out; LENGTH ``*`` is the mean over the lengths measured), SPEC the rounding.
The value is the mean over the row's seeds; ``.std`` is their standard deviation and ``.vs[CELL]`` the relative
difference to another cell (``{schemes[nope@128].vs[rope@128]:.0%}`` -> "29%"). ``fill(text)`` formats a sentence;
a text with no such field comes back as it is.
"""

from __future__ import annotations

import math
import statistics
import string
from typing import Any

from posenc.tools.evidence import SHIPPED, read_results

# the lab studies a sentence may cite (the "lab" extracts posenc ships)
LAB_STUDIES = tuple(sorted(n for n, kind in SHIPPED.items() if kind == "lab"))


class Missing:
    """A cell the packaged extract does not hold (a damaged install): formats as "n/a" whatever the spec."""

    std = property(lambda self: self)
    vs = property(lambda self: _AnyMissing())

    def __format__(self, spec: str) -> str:
        return "n/a"


class _AnyMissing:
    def __getitem__(self, key: str) -> Missing:
        return Missing()


class Cell(float):
    """A cited number: the mean over the row's seeds, with ``std`` (over the seeds; NaN for one seed) and ``vs``
    (the relative difference to another cell of the same study)."""

    std: float
    vs: Any


def _parse(key: str) -> tuple[str, str, str, str]:
    """``SCHEME[/SCALING]@LENGTH[#METRIC]`` -> (scheme, scaling, length, metric)."""
    key, _, metric = key.partition("#")
    model, _, length = key.partition("@")
    scheme, _, scaling = model.partition("/")
    return scheme, scaling or "none", length, metric or "ppl"


def _mean_std(row: dict[str, Any]) -> tuple[float, float]:
    """The mean and standard deviation over a row's seeds (its ``values``; a one-seed row: its value, NaN)."""
    values = row.get("values")
    if isinstance(values, list) and values and all(v is not None for v in values):
        return math.fsum(values) / len(values), statistics.stdev(values) if len(values) > 1 else math.nan
    return float(row["value"]), math.nan


class Study:
    """The rows of one packaged lab extract, looked up by cell (see the module docstring)."""

    def __init__(self, doc: dict[str, Any]):
        self.rows = [r for r in doc.get("rows", []) if r.get("value") is not None and not r.get("finetuned")]

    def _matching(self, scheme: str, scaling: str, metric: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("scheme") == scheme and r.get("scaling") == scaling
                and r.get("metric") == metric]

    def __getitem__(self, key: str) -> Cell | Missing:
        scheme, scaling, length, metric = _parse(key)
        rows = self._matching(scheme, scaling, metric)
        if length != "*":
            rows = [r for r in rows if str(r.get("eval_len")) == length]
        if not rows or (length != "*" and len(rows) > 1):
            return Missing()
        if length == "*":   # the mean over the lengths measured
            cell = Cell(math.fsum(_mean_std(r)[0] for r in rows) / len(rows))
            cell.std = math.nan
        else:
            mean, std = _mean_std(rows[0])
            cell = Cell(mean)
            cell.std = std
        cell.vs = _Versus(self, cell)
        return cell


class _Versus:
    def __init__(self, study: Study, cell: float):
        self.study, self.cell = study, cell

    def __getitem__(self, key: str) -> float | Missing:
        other = self.study[key]
        return other if isinstance(other, Missing) else self.cell / other - 1


def cited_studies(text: str) -> list[str]:
    """The lab studies ``text``'s format fields cite (none for a plain text, or one that is no format string)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f]
    except ValueError:
        return []
    return sorted({f.split("[", 1)[0] for f in fields} & set(LAB_STUDIES))


def fill(text: str, root=None, **extra: Any) -> str:
    """``text`` with its lab numbers filled in from the packaged extracts (``root``: another folder of extracts);
    ``extra``: values of the text's other fields. A text citing no lab study and no ``extra`` is returned as is."""
    cited = cited_studies(text)
    if not cited and not extra:
        return text
    studies = {name: Study(read_results(name, root) or {}) for name in cited}
    return text.format(**studies, **extra)
