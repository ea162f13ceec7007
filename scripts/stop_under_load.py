#!/usr/bin/env python
"""SIGTERM to ``accelgen serve`` while requests keep arriving (``accelgen.serving.stop_under_load``):
start one server (tiny model, AccelGen, the plugin's logs), run ``--clients`` closed-loop
streaming clients for ``--load-s`` seconds, send SIGTERM and keep the clients sending until the
server has exited (at most ``--stop-limit-s``, then it is killed).

    flock /work/notes/heavy.lock .venv/bin/python scripts/stop_under_load.py --out results/stop

Writes ``<out>/report.json`` (exit status, seconds from SIGTERM to the exit, the clients'
outcomes before and after SIGTERM, the plugin's ``shutdown.json``) and ``<out>/server.log``;
prints one closing line; exits 1 if the server did not exit 0 within ``--stop-limit-s`` with its
``shutdown.json`` written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/stop"))
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--load-s", type=float, default=8.0)
    p.add_argument("--stop-limit-s", type=float, default=90.0)
    p.add_argument("--max-tokens", type=int, default=64)
    args, server_args = p.parse_known_args()

    from accelgen.serving.stop_under_load import StopConfig, closing_line, stop_under_load

    cfg = StopConfig(clients=args.clients, load_s=args.load_s, stop_limit_s=args.stop_limit_s,
                     max_tokens=args.max_tokens)
    report = stop_under_load(args.out, cfg, server_args=server_args,
                             log=lambda s: print(s, file=sys.stderr, flush=True))
    print(closing_line(report, args.out))
    ok = (report["exit_status"] == 0 and report["exit_after_sigterm_s"] is not None
          and report["shutdown_summary"] is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
