"""Check that the installed set satisfies what pyproject.toml asks of posenc with the given extras.

Usage: python scripts/check_lock.py "test,hf"   (exit 1, naming each miss, when a lock in requirements/ is stale)
scripts/setup.sh runs it after installing a lock with --no-deps, where a dependency added to pyproject.toml but
missing from the lock would otherwise only show up as an ImportError much later.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement


def misses(extras: set[str]) -> list[str]:
    """Requirements of the installed posenc (base plus ``extras``) that the environment does not satisfy."""
    out = []
    for line in metadata.requires("posenc") or []:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            out.append(f"{req} (installed {version})")
    return out


def main() -> int:
    extras = {e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e}
    missing = misses(extras)
    if missing:
        print("setup: the lock does not hold what pyproject.toml asks for; run `bash scripts/lock.sh`:", file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
