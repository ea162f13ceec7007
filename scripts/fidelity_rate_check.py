"""How sensitive the fidelity stage's replays are to the host's speed, by arrival rate.

For each rate, the fidelity trace (the run's config with that rate and request count) is
simulated for stock vLLM and AccelGen on a finished run's calibrated model, charged at the
model's speed and at slower hosts (every term x speed). A rate where a 15 % slower host moves a
system's TTFT by a factor puts that system at its knee: the stage's verdict would then follow the
host's speed rather than the simulator's error (docs/profiling.md section 3.5).

    .venv/bin/python scripts/fidelity_rate_check.py --runs results/quick/fidelity \
        --rates 25:300 15:200 12:200 10:200 --speeds 1 1.15 1.3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from accelgen.fidelity.check_spec import FidelityConfig, make_trace
from accelgen.fidelity.run import read_deployment, simulate_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="a fidelity runs directory")
    ap.add_argument("--rates", nargs="+", default=["25:300", "15:200", "12:200", "10:200"],
                    help="RATE:REQUESTS pairs")
    ap.add_argument("--speeds", nargs="+", type=float, default=[1.0, 1.15, 1.3])
    args = ap.parse_args()
    dep = read_deployment(args.runs)
    base = FidelityConfig.model_validate_json((args.runs / "fidelity.json").read_text())
    print("| rate (req/s) | requests | host speed | system | throughput (req/s) | TTFT p50 (ms) "
          "| TTFT p95 (ms) | TBT p50 (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.rates:
            rate, n = pair.split(":")
            cfg = base.model_copy(update={"rate": float(rate), "num_requests": int(n)})
            trace = make_trace(cfg)
            for speed in args.speeds:
                for system in cfg.systems:
                    s = simulate_run(trace, system, dep, cfg.engine,
                                     Path(tmp) / f"{rate}-{speed}-{system}", speed=speed,
                                     charge=dep)
                    print(f"| {rate} | {n} | {speed:g} | {system} | {s['throughput_rps']:.1f} "
                          f"| {s['ttft_p50'] * 1e3:.0f} | {s['ttft_p95'] * 1e3:.0f} "
                          f"| {s['tbt_p50'] * 1e3:.1f} |", flush=True)
    print(f"fidelity_rate_check: {len(args.rates)} rates x {len(args.speeds)} speeds on "
          f"{args.runs}'s calibrated model")


if __name__ == "__main__":
    main()
