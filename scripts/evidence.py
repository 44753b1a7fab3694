"""Write the evidence ``posenc pick`` ships with: posenc/tools/measured/<study>/results.json, extracts of the full
results under docs/results/ (posenc.tools.evidence.SHIPPED names them; LAB_ROWS says which rows a lab preset's
extract keeps: those the cited sentences read, posenc.tools.lab_evidence). Run after a study or a preset's results
change; ``python scripts/smollm2_study.py collect`` runs it for the SmolLM2 study, and
tests/tools/test_evidence_data.py fails while an extract is stale.

    python scripts/evidence.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from posenc.tools.evidence import SHIPPED, write_extracts  # noqa: E402


def main() -> int:
    for path in write_extracts(ROOT / "docs" / "results", SHIPPED):
        print(f"evidence: wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
