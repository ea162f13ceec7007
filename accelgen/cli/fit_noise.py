r"""``accelgen fit-noise``: fit the engine's noise around its cost model to real replays, for
the simulator (``accelgen simulate --noise FILE``, ``sim.noise``).

    # regime engine's calibration replay, against the model fitted on it
    accelgen fit-noise --runs results/quick/engine/calibration/real-stock \
        --deployment results/quick/engine/calibration/deployment.yaml --out noise.yaml
    # the fidelity stage's rounds (every replay), lognormal
    accelgen fit-noise --runs results/quick/fidelity/round-*/real-* \
        --deployment results/quick/fidelity/calibration/deployment.yaml --kind lognormal \
        --out noise.yaml

Each step's measured span (``accelgen.costmodel.points``) over the model's prediction for its
batch is a ratio; a replay's run factor is the median of its ratios, the step errors its ratios
over it, pooled (``accelgen.costmodel.noise.fit_noise``). Steps that woke an idle engine are
left out unless ``--after-idle``. Prints the fit per replay and writes one YAML file.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from accelgen.core.specs import Deployment, load_yaml


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit-noise", help="fit the engine's step noise to replays (for the "
                       "simulator's --noise)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, type=Path, metavar="DIR",
                   help="results directories of real replays (accelgen replay's format)")
    p.add_argument("--deployment", required=True, type=Path, metavar="YAML",
                   help="the deployment whose cost model predicts the steps (a YAML with a "
                        "`deployment:` section, e.g. accelgen calibrate's output)")
    p.add_argument("--kind", choices=("empirical", "lognormal"), default="empirical")
    p.add_argument("--after-idle", action="store_true",
                   help="keep the steps that woke an idle engine")
    p.add_argument("--independent", action="store_true",
                   help="draw every step's error independently (no host phase fitted)")
    p.add_argument("--no-stalls", action="store_true",
                   help="charge every step's error as a factor (no stalls fitted: steps over "
                        "twice the model are then the error's tail)")
    p.add_argument("--out", required=True, type=Path, help="the noise file (YAML)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.costmodel.noise import fit_replays, write_noise

    data = load_yaml(args.deployment)
    if not isinstance(data, dict) or "deployment" not in data:
        print(f"error: {args.deployment}: no `deployment:` section", file=sys.stderr)
        return 2
    dep = Deployment.model_validate(data["deployment"])
    try:
        spec, record = fit_replays(args.runs, make_cost_model(dep), args.kind,
                                   after_idle=args.after_idle, phase=not args.independent,
                                   stalls=not args.no_stalls)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in record["replays"]:
        print(f"{r['replay']}: {r['fitted_steps']} of {r['steps']} steps, run factor "
              f"{r['run_factor']:.3f}, step error p10/p50/p90 {r['step_error_p10']:.3f} / "
              f"{r['step_error_p50']:.3f} / {r['step_error_p90']:.3f}")
    e = record["step_error"]
    print(f"step error (pooled): p1 {e['p1']:.3f}, p10 {e['p10']:.3f}, p90 {e['p90']:.3f}, "
          f"p99 {e['p99']:.3f}; log sigma (robust) {record['step_error_log_sigma_robust']:.3f};"
          f" run factor: log mean {spec.run_mu:+.3f}, log sigma {spec.run_sigma:.3f}")
    ph = record["phase"]
    lags = ", ".join(f"{k} {v:.2f}" for k, v in ph["autocorrelation"].items())
    print(f"host phase: share {spec.phase_share:.2f}, persistence {spec.phase_persistence:.3f}"
          + (f" (autocorrelation {lags})" if lags else "")
          + ("" if ph["fitted"] else " (--independent)"))
    st = record["stalls"]
    print(f"stalls (steps over {st['over_ratio']:g} x the model): " + (
        f"{st['count']} ({st['share']:.2%}), adding {1e3 * st['seconds_p50']:.1f} ms at the "
        f"median, {1e3 * st['seconds_p90']:.1f} ms at p90" if st["fitted"] and st["count"]
        else "none fitted" + (" (--no-stalls)" if args.no_stalls else "")))
    write_noise(args.out, spec, record, "accelgen fit-noise " + shlex.join(sys.argv[2:]))
    n = len(record["replays"])
    print(f"wrote {args.out}: {args.kind} noise from {record['steps']} steps of {n} "
          f"replay{'s' if n != 1 else ''}")
    return 0
