"""Print the installed versions that differ from lock files: `python scripts/lock_drift.py requirements/test.txt ...`.

Used by `scripts/test.sh --latest` to show which newer releases the suite is about to meet.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata


def locked(path: str) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines of a pip requirements lock."""
    pins = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def main() -> int:
    pins = {name: version for path in sys.argv[1:] for name, version in locked(path).items()}
    installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    rows = []
    for name in sorted(set(pins) | set(installed)):
        if name in ("pip", "posenc"):
            continue
        a, b = pins.get(name, "-"), installed.get(name, "-")
        if a != b:
            rows.append(f"  {name:32s} lock {a:20s} latest {b}")
    print("\n".join(rows) if rows else "  none: the newest allowed versions are the locked ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
