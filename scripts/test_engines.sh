#!/usr/bin/env bash
# The engines check (CI runs it after the README's test command): set up .venv with requirements/engines.txt (the
# test set plus llama.cpp through llama-cpp-python, compiled from source: ~6 minutes on 2 cores the first time) and
# run the tests that need llama.cpp itself: a GGUF posenc extend writes, run in llama.cpp, against transformers with
# the config posenc writes for the same method (tests/engines/test_llama_cpp.py), and the audit on Gemma 3 270M
# (tests/engines/test_audit.py). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-true}"
bash scripts/setup.sh engines
exec .venv/bin/python -m pytest -q tests/engines "$@"
