#!/usr/bin/env bash
# The scaled paper run end to end: config/paper-scaled.yaml over config/paper.yaml (the paper
# config's whole grid, 200 requests per trace), every job of the default target (every figure,
# claims.csv, the fidelity and engine stages), from nothing (--forceall). Then one line: jobs,
# wall time, the simulations' measured CPU time (benchmarks/paper-scaled/runs) and the runtime
# estimate's for the same config (python -m accelgen.pipeline estimate), and their ratio.
#
#   bash scripts/paper_scaled.sh [--cores N] [extra Snakemake arguments]
#   bash scripts/paper_scaled.sh -n          # plan only: the job count
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS=(config/paper.yaml config/paper-scaled.yaml)
ARGS=("$@")
[[ " ${ARGS[*]} " == *" --cores "* ]] || ARGS=(--cores all "${ARGS[@]}")
export PYTHONHASHSEED=0
plan=$(.venv/bin/snakemake -n --forceall --configfile "${CONFIGS[@]}" "${ARGS[@]}" 2>&1 | tail -n 400)
jobs=$(awk '$1 == "total" {print $2}' <<<"$plan" | tail -n 1)
if [[ -z "$jobs" ]]; then
    echo "$plan" >&2
    echo "paper_scaled: the dry run failed" >&2
    exit 1
fi
for a in "${ARGS[@]}"; do
    if [[ "$a" == "-n" || "$a" == "--dry-run" ]]; then
        echo "paper_scaled: planned $jobs jobs (dry run; nothing run)"
        exit 0
    fi
done
start=$(date +%s)
.venv/bin/snakemake --forceall --configfile "${CONFIGS[@]}" "${ARGS[@]}"
wall=$(( $(date +%s) - start ))
.venv/bin/python - "$jobs" "$wall" "${CONFIGS[@]}" <<'PY'
import sys
from accelgen.pipeline.estimate import estimated_seconds, measured_times

jobs, wall, configs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
meas = measured_times("benchmarks/paper-scaled")
cpu = float(meas["cpu_time"].sum())
est = estimated_seconds(configs)
print(f"paper_scaled: {jobs} jobs in {wall} s wall ({wall / 60:.1f} min); "
      f"{len(meas)} simulations measured {cpu / 3600:.2f} CPU-hours, estimate "
      f"{est / 3600:.2f} CPU-hours ({est / cpu - 1:+.0%} of measured)")
PY
