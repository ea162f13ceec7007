#!/usr/bin/env bash
# The GPU path in one command, for a machine with a GPU and PyTorch only (no vLLM, no flash-attn,
# no network): profile iteration latencies of a Llama-2-7B-shaped model with random weights
# (`accelgen profile --backend torch`, torch SDPA attention, the standard GPU grid), fit the
# calibrated cost model on every other point of each kind (`accelgen calibrate --holdout half`),
# report the other half, and set the analytic model of that GPU beside it. docs/gpu.md.
#
#   bash scripts/gpu_check.sh                               # CUDA device 0, llama-7b -> gpu-check/
#   bash scripts/gpu_check.sh --device cpu --model tiny     # the same steps on a CPU (CI)
#
# Options: --device cuda|cuda:N|cpu (default cuda), --model NAME (a built-in shape, default
# llama-7b), --hardware NAME (the analytic model's GPU: default from the device name, h100 or
# a100; cpu on a CPU), --grid standard|quick (the shapes: the cost model's standard grid, the
# paper's range, or the profiler's handful; default standard on CUDA, quick on a CPU, where the
# run is a rehearsal), --repeats N (timed passes per shape, default 5), --out DIR (default
# gpu-check; written as DIR.partial and renamed when every step succeeded), --python PY (a Python
# with torch; default .venv/bin/python if present, else python3), --wheels DIR (install what the
# Python lacks of numpy, scipy, pydantic, pyyaml from wheel files there, offline, into a venv
# that keeps the machine's torch).
# Writes: profile.csv (the measured points), profile.log, calibrated.yaml (the fitted
# deployment), calibrated.errors.csv (every point's error), calibrate.txt (the report),
# summary.json (MAPE tables and terms), summary.txt (what ran, how long, the held-out errors of
# the calibrated and the analytic model). Exit 0 when every step ran; 2 on bad options or a
# Python without what it needs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE=cuda
MODEL=llama-7b
HARDWARE=""
REPEATS=5
GRID=""
OUT=gpu-check
PY=""
WHEELS=""

die() { echo "gpu_check: error: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
    --model) MODEL="${2:?--model needs a value}"; shift 2 ;;
    --hardware) HARDWARE="${2:?--hardware needs a value}"; shift 2 ;;
    --repeats) REPEATS="${2:?--repeats needs a value}"; shift 2 ;;
    --grid) GRID="${2:?--grid needs a value}"; shift 2 ;;
    --out) OUT="${2:?--out needs a value}"; shift 2 ;;
    --python) PY="${2:?--python needs a value}"; shift 2 ;;
    --wheels) WHEELS="${2:?--wheels needs a value}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer, got $REPEATS"
if [[ -z "$GRID" ]]; then
  if [[ "$DEVICE" == cpu ]]; then GRID=quick; else GRID=standard; fi
fi
case "$GRID" in
  standard) GRID_ARGS=(--grid gpu) ;;
  quick) GRID_ARGS=(--quick) ;;
  *) die "--grid must be standard or quick, got $GRID" ;;
esac
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
command -v "$PY" >/dev/null || die "no Python at $PY (--python)"

WORK="$OUT.partial"
rm -rf "$WORK"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
START=$(date +%s)
# Stopped before the first step: leave nothing behind (after it, DIR.partial keeps the logs).
trap '[[ $? -ne 0 && ! -e "$WORK/steps.txt" ]] && rm -rf "$WORK"' EXIT

# What the steps import: torch for the profile, numpy/scipy/pydantic/yaml for the package and
# the fit (pandas and pyarrow are not needed for CSV points).
missing() {
  "$PY" - <<'EOF'
import importlib.util
need = {"torch": "torch", "numpy": "numpy", "scipy": "scipy", "pydantic": "pydantic",
        "yaml": "pyyaml"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
}
LACK="$(missing)"
if [[ -n "$LACK" && -n "$WHEELS" ]]; then
  [[ "$LACK" == *torch* ]] && die "$PY has no torch; --wheels installs only the small packages"
  echo "gpu_check: installing $LACK from $WHEELS (offline) into $WORK/venv"
  "$PY" -m venv --system-site-packages "$WORK/venv"
  PY="$WORK/venv/bin/python"
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" $LACK
  LACK="$(missing)"
fi
[[ -z "$LACK" ]] || die "$PY lacks: $LACK. Install them (pip install $LACK), or pass --wheels DIR \
with their wheel files (docs/gpu.md says how to prepare them on a machine with network)"

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
DEVICE_NAME="$("$PY" - "$DEVICE" <<'EOF'
import sys
import torch
dev = sys.argv[1]
if dev.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device (use --device cpu for the CPU rehearsal)")
    print(torch.cuda.get_device_name(dev))
else:
    print("cpu")
EOF
)" || die "device $DEVICE: not usable"
if [[ -z "$HARDWARE" ]]; then
  case "$DEVICE_NAME" in
    *H100*|*H200*|*GH200*) HARDWARE=h100 ;;
    *A100*) HARDWARE=a100 ;;
    cpu) HARDWARE=cpu ;;
    *) die "no built-in hardware profile for '$DEVICE_NAME'; name the closest with --hardware" ;;
  esac
fi
echo "gpu_check: $MODEL on $DEVICE ($DEVICE_NAME), $GRID grid, analytic model of $HARDWARE;" \
  "writing $WORK"

run_step() {  # name, then the command; its output to <name>.log and the terminal
  local name="$1"; shift
  local t0; t0=$(date +%s)
  set +e
  "$@" 2>&1 | tee "$WORK/$name.log"
  local rc=${PIPESTATUS[0]}
  set -e
  echo "$name $(( $(date +%s) - t0 ))" >> "$WORK/steps.txt"
  if [[ $rc -ne 0 ]]; then
    echo "gpu_check: step $name failed (exit $rc); its log: $WORK/$name.log" >&2
    exit "$rc"
  fi
}

run_step profile "$PY" -m accelgen.cli profile --backend torch --model "$MODEL" \
  --device "$DEVICE" --attention sdpa "${GRID_ARGS[@]}" --repeats "$REPEATS" --warmup 1 \
  --out "$WORK/profile.csv"
run_step calibrate "$PY" -m accelgen.cli calibrate --points "$WORK/profile.csv" \
  --model "$MODEL" --hardware "$HARDWARE" --holdout half --show 20 \
  --out "$WORK/calibrated.yaml" --summary "$WORK/summary.json"
mv "$WORK/calibrate.log" "$WORK/calibrate.txt"

"$PY" - "$WORK" "$DEVICE" "$DEVICE_NAME" "$(( $(date +%s) - START ))" <<'EOF'
"""summary.txt: what ran, how long, and the held-out errors of both models by kind."""
import json
import sys
from pathlib import Path

work, device, name, elapsed = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
s = json.loads((work / "summary.json").read_text())
meta = [ln[1:].strip() for ln in (work / "profile.csv").read_text().splitlines()
        if ln.startswith("#")]
steps = [ln.split() for ln in (work / "steps.txt").read_text().splitlines()]
dep = s["deployment"]
lines = [f"gpu_check: {dep['model']} (random weights) on {device} ({name}); "
         f"{elapsed} s in all (" + ", ".join(f"{n} {t} s" for n, t in steps) + ")",
         f"profile: {s['num_points']} points; " + "; ".join(
             m for m in meta if m.split(":")[0] in ("device", "dtype", "attention", "torch",
                                                    "repeats", "load_average")),
         f"calibrate: fit on every other point of each kind, the other half held out; "
         f"{sum(t['fitted'] for k, t in s['terms'].items() if 'fitted' in t)} terms fitted"
         + (f"; held: {', '.join(k for k, t in s['terms'].items() if t.get('held'))}"
            if any(t.get("held") for t in s["terms"].values()) else ""),
         f"MAPE by kind (mean |predicted / measured - 1|; worst), the calibrated model against "
         f"the analytic model of {dep['model']} on {dep['hardware']} (A100-fitted efficiencies"
         + (", CPU placeholder numbers: not meaningful" if dep["hardware"] == "cpu" else "")
         + "):"]
ref = {(r["set"], r["kind"]): r for r in s["analytic"]}
for r in s["calibrated"]:
    a = ref.get((r["set"], r["kind"]))
    other = f"{a['mape']:6.1%} (worst {a['worst']:+7.1%})" if a else "-"
    lines.append(f"  {r['set']:<9} {r['kind']:<8} n {r['n']:>4}  calibrated {r['mape']:6.1%} "
                 f"(worst {r['worst']:+7.1%})  analytic {other}")
(work / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

rm -rf "$OUT"
mv "$WORK" "$OUT"
echo "gpu_check: wrote $OUT (profile.csv, calibrated.yaml, calibrate.txt, summary.json, summary.txt)"
