#!/usr/bin/env bash
# One command for a newcomer (and CI): set up .venv with the test extra and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
