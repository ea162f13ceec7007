"""``accelgen capacity``: the KV (Little's law) and compute bounds on a deployment's sustainable
arrival rate for a trace (SPEC section 11), beside the trace's own arrival rate.

    accelgen capacity --deployment opt-13b --trace data/quick/traces/evaluation/opt-13b/seed0.parquet
    accelgen capacity --deployment opt-13b --kv-cache-gb auto --trace T.parquet
    accelgen capacity --config results/quick/deployments/opt-13b-auto.yaml --trace T.parquet
    accelgen capacity --csv paper_figures/extra_capacity_bounds.csv   # the pipeline's aggregate

The formulas and their assumptions: ``accelgen/costmodel/capacity.py`` and docs/ARTIFACT.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from accelgen.core.specs import Deployment, kv_cache_gb_arg, load_yaml


def add_parser(sub: Any) -> None:
    p = sub.add_parser("capacity", help="KV and compute bounds on the sustainable arrival rate",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--deployment", metavar="NAME", help="a built-in deployment (opt-13b, ...)")
    which.add_argument("--config", type=Path,
                       help="an experiment YAML with a `deployment:` section (e.g. the "
                            "pipeline's results/<name>/deployments/<deployment>.yaml)")
    p.add_argument("--kv-cache-gb", type=kv_cache_gb_arg, metavar="GIB|auto",
                   help="override the deployment's KV GiB per GPU (or auto)")
    p.add_argument("--trace", type=Path, action="append", default=[],
                   help="trace file (.parquet/.csv); repeat for several")
    p.add_argument("--csv", type=Path,
                   help="print the bounds the pipeline aggregated (extra_capacity_bounds.csv or "
                        "fig13_capacity.csv) instead of computing them")
    p.set_defaults(func=run)


def _deployment(args: argparse.Namespace) -> Deployment:
    from accelgen.costmodel.datasheets import resolve_deployment

    if args.config is not None:
        data = load_yaml(args.config)
        if "deployment" not in data:
            raise ValueError(f"{args.config}: no `deployment:` section")
        dep = Deployment.model_validate(data["deployment"])
    else:
        dep = resolve_deployment(args.deployment or "opt-13b")
    if args.kv_cache_gb is not None:
        dep = Deployment.model_validate({**dep.model_dump(), "kv_cache_gb": args.kv_cache_gb})
    return dep


def _offered_rate(df: Any) -> float:
    arrival = df["arrival"].to_numpy(dtype=float)
    span = float(arrival.max() - arrival.min()) if len(arrival) > 1 else 0.0
    return (len(arrival) - 1) / span if span > 0 else math.nan


def format_bound(name: str, bound: Any, offered: float) -> list[str]:
    """The lines printed for one (deployment, trace)."""
    b = bound
    over = offered / b.estimate_rps if b.estimate_rps > 0 and math.isfinite(offered) else math.nan
    return [
        f"{name}: {b.num_requests} requests, mean prompt {b.mean_prompt:.0f}, mean output "
        f"{b.mean_output:.0f} tokens; offered {offered:.3g} req/s",
        f"  KV {b.kv_tokens:,} tokens (blocks of {b.block_size}); S_pf {b.s_pf}, "
        f"T_pf {b.t_pf * 1e3:.1f} ms",
        f"  at one iteration per T_pf: mean residence {b.mean_residence_s:.1f} s, mean resident "
        f"tokens {b.mean_resident_tokens:,.0f}",
        f"  KV/Little bound {b.kv_bound_rps:.3g} req/s; compute bound "
        f"{b.compute_bound_rps:.3g} req/s -> {b.estimate_rps:.3g} req/s ({b.binding}-bound)",
        f"  offered / bound: {over:.3g}x",
    ]


def _print_csv(path: Path) -> int:
    import pandas as pd

    df = pd.read_csv(path)
    if "kv_bound_rps" not in df.columns:
        raise ValueError(f"{path}: no capacity bounds (expected a kv_bound_rps column)")
    rows = df.dropna(subset=["kv_bound_rps"]).drop_duplicates(subset=["deployment"])
    print(f"{'deployment':<20} {'KV tokens':>10} {'KV bound':>9} {'compute':>9} "
          f"{'estimate':>9} {'binding':>8} {'offered':>8} {'x bound':>8}")
    for r in rows.itertuples():
        offered = getattr(r, "offered_rps", math.nan)
        est = min(r.kv_bound_rps, r.compute_bound_rps)
        print(f"{r.deployment:<20} {int(r.kv_tokens):>10,} {r.kv_bound_rps:>9.3g} "
              f"{r.compute_bound_rps:>9.3g} {est:>9.3g} {r.binding:>8} {offered:>8.3g} "
              f"{offered / est if est > 0 else math.nan:>8.3g}")
    print(f"capacity: {len(rows)} deployments from {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from accelgen.costmodel.capacity import trace_bound
    from accelgen.workloads.trace import load_trace

    if args.csv is not None:
        if args.trace or args.deployment or args.config:
            raise ValueError("--csv prints an aggregate: it takes no --trace/--deployment/--config")
        return _print_csv(args.csv)
    if not args.trace:
        raise ValueError("give --trace (one or more), or --csv")
    dep = _deployment(args)
    name = args.deployment or (args.config.stem if args.config else "opt-13b")
    worst = math.inf
    for path in args.trace:
        df = load_trace(path)
        bound = trace_bound(dep, df)
        print("\n".join(format_bound(f"{name} / {path}", bound, _offered_rate(df))))
        worst = min(worst, bound.estimate_rps)
    print(f"capacity: {len(args.trace)} trace(s) on {name}; lowest estimate {worst:.3g} req/s")
    return 0
