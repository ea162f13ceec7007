#!/usr/bin/env bash
# Install the GPU environment into a virtual environment: vLLM 0.32.0 with CUDA (the version the
# AccelGen scheduler plugin supports; it pins torch 2.13.0) and flash-attn (the torch profiler's
# attention kernels, `accelgen profile --backend torch`). For an NVIDIA GPU node (A100) with a
# CUDA toolkit; config/gpu.yaml and docs/gpu.md describe the runs.
#
#   bash scripts/install_gpu.sh .venv        # into ./.venv of the repository (created if missing)
#   MAX_JOBS=8 bash scripts/install_gpu.sh   # limit flash-attn's compile jobs (RAM)
#
# flash-attn builds against the torch already installed, so it comes second and without build
# isolation; where no prebuilt wheel matches that torch/CUDA/Python, it compiles (tens of minutes
# up to hours, needs nvcc). FLASH_ATTN=0 skips it: the profiler then falls back to torch SDPA and
# says so in every profile it writes.
set -euo pipefail
cd "$(dirname "$0")/.."  # the venv path is relative to the repository root

VENV=${1:-${VIRTUAL_ENV:-.venv}}
PY=${PYTHON:-python3}
FLASH_ATTN_SPEC=${FLASH_ATTN_SPEC:-"flash-attn>=2.7,<3"}

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_gpu: creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

"$VPY" -m pip install --quiet -e ".[pipeline,dev,gpu]"
if [[ "${FLASH_ATTN:-1}" != "0" ]]; then
  "$VPY" -m pip install --quiet --no-build-isolation "$FLASH_ATTN_SPEC"
fi
"$VPY" - <<'PYEOF'
import importlib.util

import torch
import vllm

print(f"install_gpu: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"CUDA devices: {torch.cuda.device_count()}, flash-attn: "
      f"{'yes' if importlib.util.find_spec('flash_attn') else 'no (profiles use SDPA)'}")
PYEOF
