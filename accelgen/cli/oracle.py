"""``accelgen oracle``: the CLAIRVOYANT Oracle's schedule search (``accelgen.experiments.oracle_search``)
on one trace; writes the best run as a results directory plus ``oracle_search.csv``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def _configure(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--trace", required=True, type=Path, help="trace file (.parquet or .csv)")
    ap.add_argument("--out", required=True, type=Path, help="results directory (best run)")
    ap.add_argument("--config", type=Path, help="experiment YAML (deployment/policy/sim/seed)")
    ap.add_argument("--deployment", help="a built-in deployment, e.g. opt-13b")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--grid", help='JSON object of parameter lists, e.g. \'{"gamma": [0.5, 1]}\'')
    ap.add_argument("--param", action="append", metavar="KEY=VALUE", help="fixed oracle parameter")
    ap.add_argument("--metric", default="goodput_rps", help="summary metric to maximise")
    ap.add_argument("--processes", type=int, default=1, help="schedules simulated in parallel")
    ap.add_argument("--floor-run", type=Path, metavar="DIR",
                    help="results directory of AccelGen's own run of this trace (accelgen "
                         "simulate --policy accelgen, same config and seed): read as the "
                         "floor's results instead of simulating it again")
    ap.add_argument("--no-prune", action="store_true",
                    help="run every schedule to its end (by default one whose goodput can no "
                         "longer reach the best so far is stopped: the same best schedule)")
    ap.add_argument("--no-share", action="store_true",
                    help="simulate every schedule (by default one that is an earlier one's on "
                         "this trace, differing only in ERA's scope where no request can be a "
                         "long prompt, takes that one's row: the same table)")
    ap.add_argument("--no-progress", action="store_true")
    ap.set_defaults(func=run)
    return ap


_DESCRIPTION = ("CLAIRVOYANT Oracle: simulate AccelGen with true output lengths over a grid of its "
                "parameters, and AccelGen's own schedule, and keep the best goodput.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``accelgen oracle ...`` (for ``accelgen.cli.COMMANDS``)."""
    _configure(sub.add_parser("oracle", help="clairvoyant Oracle search", description=_DESCRIPTION))


def run(a: argparse.Namespace) -> int:
    from accelgen.cli.simulate import build_config
    from accelgen.experiments.oracle_search import closing_lines, search_to_dir
    from accelgen.workloads.trace import load_trace

    ns = argparse.Namespace(config=a.config, deployment=a.deployment, model=None, hardware=None,
                            tp=None, pp=None, kv_cache_gb=None, profile_csv=None, policy="oracle",
                            param=a.param, no_progress=True, seed=a.seed)
    cfg = build_config(ns)
    grid = json.loads(a.grid) if a.grid else None
    res = search_to_dir(load_trace(a.trace), cfg, a.out, grid, metric=a.metric,
                        processes=a.processes, trace_path=str(a.trace),
                        progress=not a.no_progress, floor_run=a.floor_run,
                        prune=not a.no_prune, share=not a.no_share)
    print("\n".join(closing_lines(res, a.out)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = _configure(argparse.ArgumentParser(prog="python -m accelgen.cli.oracle",
                                            description=_DESCRIPTION))
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
