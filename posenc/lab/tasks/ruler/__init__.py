"""RULER's synthetic tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", COLM 2024, arXiv:2404.06654; github.com/NVIDIA/RULER), restated as posenc tasks that run in ``posenc lab``
and ``posenc eval`` alike, offline:

    niah.py               niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery
    variable_tracking.py  vt
    words.py              cwe (common words), fwe (frequent words)
    scoring.py            RULER's string_match_all / string_match_part
    common.py             seeding, fitting a prompt to a length in the model's tokens, haystacks, RulerTask
    report.py             rows with Wilson 95% intervals, the effective-length table and heat map

The group name ``ruler`` runs all eleven (``posenc eval --tasks ruler``). RULER's QA tasks (qa_1 on SQuAD, qa_2 on
HotpotQA) are left out: they need those data sets, downloaded. See docs/ruler.md.
"""

from __future__ import annotations

from posenc.lab.tasks.registry import register_task_group
from posenc.lab.tasks.ruler import niah, variable_tracking, words  # noqa: F401  (registers the tasks, in order)

RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
register_task_group("ruler", RULER_TASKS)
