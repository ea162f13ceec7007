r"""Regime ``engine`` (SPEC 12): a capacity sweep inside the real vLLM CPU engine, the simulator
beside it.

    # 1. calibrate on the engine, plan the sweep, replay every point, simulate it (needs vllm)
    accelgen engine-sweep run --out results/quick/engine --renice -15 [--spec JSON]
    # 2. the figure's CSV and the text report (no vLLM needed)
    accelgen engine-sweep report --runs results/quick/engine \
        --csv paper_figures/fig17_engine_capacity.csv

``run`` writes under --out (an earlier sweep's files are removed first): engine_sweep.json
(config), machine.json, sources.json, calibration/ (the calibration replay, the fitted
deployment, the engine's noise, the host's step jitter), plan.json (pivot, SLO classes and the
jitter rule, capacity estimate, the searches' bounds, budgets, scheduling mode), traces/,
real/<system>/seed<s>/rate<r>/ (the engine's results of every probe of its capacity searches,
point.json: times and the machine's load), sim/, sim-noise/ (the simulator's searches, without
and with the engine's noise), speed.json and sim-speed/ (the simulator charged at the host's
speed measured during the replays); each source's searches.json. ``report`` prints capacity per
system (median and range over the repeats, engine and each prediction), the ordering, the pairs
the engine separates, each plugin system against the best stock vLLM, capacity per SLO class,
and writes the CSV. The pipeline's stage is rules/engine.smk (target ``fig17``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _say(msg: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {msg}", flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from accelgen.cli.fidelity import load_config_data, raise_priority, require_vllm
    from accelgen.engine_regime.run import PREDICTION_DIRS, probed_points, run_sweep
    from accelgen.engine_regime.sweep_spec import EngineSweepConfig

    data = load_config_data(args.config, args.spec)
    cfg = EngineSweepConfig.model_validate(data)
    require_vllm("engine-sweep run", "engine")
    if args.renice is not None:
        raise_priority(args.renice)
    t0 = time.time()
    run_sweep(cfg, args.out, say=_say)
    n = {d: len(probed_points(args.out, d)) for d in ("real", *PREDICTION_DIRS)}
    print(f"engine sweep: wrote {args.out} ({len(cfg.systems)} systems x {cfg.repeats} repeats: "
          f"{n['real']} replays, " + ", ".join(f"{v} simulations ({k})" for k, v in n.items()
                                               if k != "real")
          + f"; {time.time() - t0:.0f} s)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from accelgen.engine_regime.analyze import build_report

    if args.resimulate:
        from accelgen.engine_regime.run import (
            read_config,
            read_deployment,
            read_plan,
            simulate_sweep,
        )

        simulate_sweep(read_config(args.runs), read_plan(args.runs), read_deployment(args.runs),
                       args.runs, say=_say)
    rep = build_report(args.runs)
    print(rep.text())
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        rep.frame().to_csv(args.csv, index=False, float_format="%.6g")
        print(f"wrote {args.csv} ({len(rep.points)} points, {len(rep.capacity)} capacities)")
    else:
        print(f"engine sweep report: {args.runs} ({len(rep.points)} points, "
              f"{len(rep.capacity)} capacities; no CSV asked for)")
    return 0


def _add_commands(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="engine_cmd", required=True, metavar="{run,report}")
    s = sub.add_parser("run", help="calibrate, replay the sweep, simulate it (needs vllm)")
    s.add_argument("--out", type=Path, required=True, help="runs directory")
    s.add_argument("--config", type=Path, help="EngineSweepConfig YAML")
    s.add_argument("--spec", help="EngineSweepConfig fields as a JSON object (after --config)")
    s.add_argument("--renice", type=int, metavar="N",
                   help="run the engines at nice N (e.g. -15) in their own session")
    s.set_defaults(func=cmd_run)
    r = sub.add_parser("report", help="capacities, ordering, per-class attainment; the CSV")
    r.add_argument("--runs", type=Path, required=True)
    r.add_argument("--csv", type=Path, help="the figure's CSV (fig17_engine_capacity.csv)")
    r.add_argument("--resimulate", action="store_true",
                   help="redo the simulations first (after a simulator change; the replays "
                        "and the calibration stay)")
    r.set_defaults(func=cmd_report)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``accelgen engine-sweep run|report`` (accelgen.cli)."""
    p = sub.add_parser("engine-sweep", help="regime engine: capacity sweep inside vLLM",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_commands(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelgen.cli.engine_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_commands(p)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
