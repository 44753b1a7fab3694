#!/usr/bin/env bash
# Create .venv (once) and install posenc into it, with the pins in constraints.txt (torch 2.13.0: the CPU wheel on
# the project's machines). Usage: bash scripts/setup.sh [EXTRA]   e.g. EXTRA=test or EXTRA=test,bench
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version 2>&1)"
  "$python" -m venv .venv
fi
target="."
[ -n "$extra" ] && target=".[${extra}]"
echo "setup: installing posenc ($target) and its pinned dependencies into .venv (torch is the large download:" \
     "a few minutes on a machine without cached wheels)"
# no --quiet: pip names each download and shows its progress bar, so a long first install visibly moves
.venv/bin/python -m pip install --disable-pip-version-check -c constraints.txt -e "$target"
echo "setup: done (.venv/bin/posenc)"
