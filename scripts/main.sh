#!/usr/bin/env bash
# The main job: set up, then regenerate every figure of the paper on the quick config
# (simulator backend, built-in workload; no GPU, no downloads). Extra arguments go to Snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/snakemake --cores all "$@"
