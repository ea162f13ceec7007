"""Simulator speed benchmark (a script, not a unit test: wall-clock numbers are noisy here).

Builds the quick trace and the 20K-request paper trace with `accelgen trace`, then simulates each
policy on OPT-13B / A100 and reports simulated iterations per wall second and wall time.

    .venv/bin/python scripts/bench_sim.py [--policies vllm sarathi ...] [--skip-paper]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelgen.config import Deployment, ExperimentConfig, PolicySpec, SimOptions
from accelgen.sim.runner import simulate
from accelgen.workloads.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent


def build_trace(config: str, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "accelgen.cli", "trace", "--config", config,
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policies", nargs="+",
                    default=["vllm", "vllm-v0", "sarathi", "accelgen", "fastgen", "orca",
                             "fastserve"])
    ap.add_argument("--skip-paper", action="store_true")
    args = ap.parse_args()
    configs = [("quick", "config/quick.yaml")]
    if not args.skip_paper:
        configs.append(("paper", "config/paper.yaml"))
    print(f"{'trace':6} {'policy':10} {'requests':>8} {'iterations':>10} {'wall s':>8} "
          f"{'it/wall s':>10} {'sim s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in configs:
            trace = load_trace(build_trace(str(ROOT / cfg), Path(tmp) / f"{label}.parquet"))
            for name in args.policies:
                exp = ExperimentConfig(deployment=Deployment(model="opt-13b", hardware="a100"),
                                       policy=PolicySpec(name=name),
                                       sim=SimOptions(progress=False))
                t0 = time.perf_counter()
                try:
                    run = simulate(trace, exp)
                except ValueError as exc:  # policy not available
                    print(f"{label:6} {name:10} skipped: {exc}")
                    continue
                wall = time.perf_counter() - t0
                n_it = run.summary["num_iterations"]
                print(f"{label:6} {name:10} {len(trace):>8} {n_it:>10} {wall:>8.1f} "
                      f"{n_it / wall:>10.0f} {run.summary['makespan_s']:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
