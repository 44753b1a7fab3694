#!/usr/bin/env bash
# Create .venv (once) and install posenc into it, with the pins in constraints.txt (torch 2.13.0: the CPU wheel on
# the project's machines). Usage: bash scripts/setup.sh [EXTRA]   e.g. EXTRA=test or EXTRA=test,bench
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
target="."
[ -n "$extra" ] && target=".[${extra}]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e "$target"
