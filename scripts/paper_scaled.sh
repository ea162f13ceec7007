#!/usr/bin/env bash
# The scaled paper run end to end: config/paper-scaled.yaml over config/paper.yaml (the paper
# config's whole grid, 100 requests per trace), every job of the default target (every figure,
# claims.csv, the fidelity and engine stages), from nothing (--forceall), under `accelgen warm`
# as scripts/main.sh runs the quick config. Then one line: jobs, wall time, the simulations'
# measured CPU time (each fork's own, from `accelgen warm --jobs-log`; with --cold, Snakemake's
# benchmark files of jobs that start their own interpreters) and the runtime estimate's for the
# same config (python -m accelgen.pipeline estimate [--warm]), and their ratio. The estimate is
# in the tables' units (accelgen/pipeline/resources.py: AccelGen's paper-trace job at its
# price); with --reference, that job runs after the pipeline (scripts/measure_jobs.py
# --reference, about 2 x 50-180 CPU s) and the measured time is also given in those units.
#
#   bash scripts/paper_scaled.sh [--cold] [--reference] [--cores N] [extra Snakemake arguments]
#   bash scripts/paper_scaled.sh -n          # plan only: the job count
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS=(config/paper.yaml config/paper-scaled.yaml)
JOBS_LOG=benchmarks/paper-scaled/warm-jobs.jsonl
ARGS=()
SPEED_FILE=benchmarks/paper-scaled/host-speed.json
WARM=1
REFERENCE=0
for a in "$@"; do
    case "$a" in
        --cold) WARM=0 ;;
        --reference) REFERENCE=1 ;;
        *) ARGS+=("$a") ;;
    esac
done
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
if (( WARM )); then
    rm -f "$JOBS_LOG"
    .venv/bin/python -m accelgen.cli warm --jobs-log "$JOBS_LOG" -- \
        .venv/bin/snakemake --forceall --configfile "${CONFIGS[@]}" "${ARGS[@]}"
else
    .venv/bin/snakemake --forceall --configfile "${CONFIGS[@]}" "${ARGS[@]}"
fi
wall=$(( $(date +%s) - start ))
rm -f "$SPEED_FILE"
if (( REFERENCE )); then
    .venv/bin/python scripts/measure_jobs.py config/paper.yaml --only capacity-rate --sample 1 \
        --startup-repeats 1 --reference --work benchmarks/paper-scaled/reference \
        --speed-out "$SPEED_FILE"
fi
.venv/bin/python - "$jobs" "$wall" "$WARM" "$JOBS_LOG" "$SPEED_FILE" "${CONFIGS[@]}" <<'PY'
import json
import sys
from pathlib import Path

from accelgen.pipeline.estimate import estimated_seconds, measured_times, measured_warm_times

jobs, wall, warm, jobs_log, speed_file, configs = (
    int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], Path(sys.argv[5]),
    sys.argv[6:])
meas = (measured_warm_times(jobs_log, "results/paper-scaled") if warm
        else measured_times("benchmarks/paper-scaled"))
cpu = float(meas["cpu_time"].sum())
est = estimated_seconds(configs, warm=warm)
how = "forked by accelgen warm" if warm else "each in its own interpreter"
print(f"paper_scaled: {jobs} jobs in {wall} s wall ({wall / 60:.1f} min); "
      f"{len(meas)} simulations ({how}) measured {cpu / 3600:.2f} CPU-hours, estimate "
      f"{est / 3600:.2f} CPU-hours ({est / cpu - 1:+.0%} of measured)")
if speed_file.is_file():
    speed = json.loads(speed_file.read_text())["speed"]
    print(f"paper_scaled: in the tables' units (the host at {speed:.3f}x their time, "
          f"{speed_file}): measured {cpu / speed / 3600:.2f} CPU-hours, estimate "
          f"{est / 3600:.2f} ({est / (cpu / speed) - 1:+.0%} of measured)")
PY
