#!/usr/bin/env bash
# One command for a newcomer: set up .venv and run the project's main job, `posenc lab` on the embedded corpus.
# Extra arguments go to `posenc lab` (e.g. --preset smoke, --out runs/mine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/posenc lab "$@"
