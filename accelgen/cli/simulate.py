"""``accelgen simulate``: run one policy on one trace in the simulator.

``--policy oracle`` runs the CLAIRVOYANT Oracle's schedule search (``accelgen.experiments.oracle_search``
with its default grid; ``--param`` values are the base it overrides), as ``accelgen oracle``
does: the Oracle's result is its best schedule, never below AccelGen's own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from accelgen.cli.options import hidden_alias
from accelgen.core.specs import (
    Deployment,
    ExperimentConfig,
    PolicySpec,
    SimOptions,
    kv_cache_gb_arg,
    load_yaml,
    parse_params,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a policy on a trace",
                       description=__doc__)
    p.add_argument("--trace", required=True, type=Path, help="trace file (.parquet or .csv)")
    p.add_argument("--policy", default=None, help="policy name (see --list-policies)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="policy parameter")
    p.add_argument("--config", type=Path, help="experiment YAML (deployment/policy/sim/seed)")
    p.add_argument("--deployment", help="a built-in deployment, e.g. opt-13b, opt-175b")
    p.add_argument("--model")
    p.add_argument("--hardware")
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--kv-cache-gb", type=kv_cache_gb_arg, metavar="GIB|auto",
                   help="KV cache GiB per GPU, or auto (docs/costmodel.md)")
    hidden_alias(p, "--kv-gb", "kv_cache_gb")
    p.add_argument("--profile-csv", type=Path, help="use a measured profile table as cost model")
    p.add_argument("--seed", type=int)
    p.add_argument("--noise", metavar="FILE|JSON",
                   help="charge the iterations with the engine's noise: `accelgen fit-noise`'s "
                        "file, or a noise spec as JSON, e.g. '{\"kind\": \"lognormal\", "
                        "\"step_sigma\": 0.1}' (docs/simulator.md, Noise)")
    p.add_argument("--out", required=True, type=Path, help="results directory")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> ExperimentConfig:
    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    cfg = ExperimentConfig(**data)
    dep = cfg.deployment.model_dump()
    if args.deployment:
        from accelgen.costmodel.datasheets import DEPLOYMENTS

        if args.deployment not in DEPLOYMENTS:
            raise ValueError(f"unknown deployment {args.deployment!r}; known: {', '.join(DEPLOYMENTS)}")
        dep = DEPLOYMENTS[args.deployment].model_dump()
    for key, value in (("model", args.model), ("hardware", args.hardware), ("tp", args.tp),
                       ("pp", args.pp), ("kv_cache_gb", args.kv_cache_gb)):
        if value is not None:
            dep[key] = value
    if args.profile_csv is not None:
        dep["cost_model"], dep["profile_csv"] = "profile", args.profile_csv
    policy = cfg.policy.model_dump()
    if args.policy:
        policy = {"name": args.policy, "params": {}}
    policy["params"].update(parse_params(args.param))
    sim = cfg.sim.model_dump()
    if args.no_progress:
        sim["progress"] = False
    if getattr(args, "noise", None):
        from accelgen.costmodel.noise import read_noise

        sim["noise"] = read_noise(args.noise).model_dump()
    return ExperimentConfig(deployment=Deployment(**dep), policy=PolicySpec(**policy),
                            sim=SimOptions(**sim),
                            seed=args.seed if args.seed is not None else cfg.seed)


def run(args: argparse.Namespace) -> int:
    from accelgen.results import outcome_counts
    from accelgen.sim.runner import simulate_to_dir
    from accelgen.workloads.trace import load_trace

    cfg = build_config(args)
    trace = load_trace(args.trace)
    if cfg.policy.name == "oracle":
        from accelgen.experiments.oracle_search import closing_lines, search_to_dir

        res = search_to_dir(trace, cfg, args.out, trace_path=str(args.trace),
                            progress=not args.no_progress and cfg.sim.progress)
        print("\n".join(closing_lines(res, args.out)))
        return 0
    out = simulate_to_dir(trace, cfg, args.out, progress=not args.no_progress,
                          trace_path=str(args.trace))
    s, t = out.summary, out.timing_summary
    print(f"{cfg.policy.name} on {cfg.deployment.model}/{cfg.deployment.hardware}: "
          f"{s['num_iterations']} iterations, {s['num_preemptions']} preemptions")
    print(f"  throughput {s['throughput_output_tps']:.1f} out tok/s, {s['throughput_rps']:.2f} req/s;"
          f" goodput {s['goodput_rps']:.2f} req/s; SLO attainment request "
          f"{s['slo_attainment_request']:.3f}, iteration {s['slo_attainment_iteration']:.3f}")
    print(f"  simulated {s['makespan_s']:.1f} s in {t['sim_wall_time_s']:.2f} s wall "
          f"({t['iterations_per_wall_s']:.0f} it/s); decision p50 "
          f"{t['decision_time_p50'] * 1e6:.0f} us")
    print(f"  results: {args.out} ({outcome_counts(s)})")
    return 0
