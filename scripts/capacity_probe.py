"""Regime `capacity` for a few systems without the pipeline: each system simulated in this
process on the capacity sweep's traces (the grid's rate variants, seed, truncation and tuned
budgets), optionally with per-step noise (``accelgen.costmodel.noise.sensitivity_noise``, as
figure 18); prints request-level attainment per rate and capacity at 90 % and 99 %
(``metrics.sweep_capacity``). The pipeline's runs (``snakemake fig13 fig18``) are the reference;
this is for a quick look at a handful of points (e.g. how far down the 99 % capacity lies).

    .venv/bin/python scripts/capacity_probe.py --systems accelgen vllm-priority \\
        [--load-factors 0.0039 0.0078] [--noise 0.1] [--config config/quick.yaml] [--out DIR]

``--out`` keeps every run's results directory (``DIR/<variant>/<system>``), e.g. to look at which
requests missed and in which iterations.

``--decode-margin M`` runs each open-loop AccelGen system (its ablations too) with every online
decode planned within its TBT SLO / (1 + M) (``AccelGenPolicy.fix_decode_margin``), the margin the
closed loop keeps under noise, here fixed and without noise: what planning with that margin
everywhere costs (docs/accelgen.md, *Closed loop*); other systems run as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "quick.yaml")
    ap.add_argument("--systems", nargs="+", required=True)
    ap.add_argument("--deployment", help="default: the capacity experiment's first")
    ap.add_argument("--load-factors", nargs="+", type=float,
                    help="default: the capacity experiment's")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="per-step noise level (log standard deviation, mean 1)")
    ap.add_argument("--seed", type=int, default=None, help="default: the experiment's first")
    ap.add_argument("--decode-margin", type=float, default=0.0, metavar="M",
                    help="open-loop AccelGen plans every online decode within TBT / (1 + M)")
    ap.add_argument("--out", type=Path,
                    help="also write every run's results directory under OUT/<variant>/<system>")
    args = ap.parse_args()

    from accelgen import metrics
    from accelgen.cli import main as accelgen_main
    from accelgen.core.specs import ExperimentConfig, PolicySpec, SimOptions
    from accelgen.costmodel.noise import sensitivity_noise
    from accelgen.pipeline import config_file
    from accelgen.pipeline.__main__ import main as pipeline_main
    from accelgen.pipeline.capacity import sweep_rate
    from accelgen.pipeline.grid import Grid
    from accelgen.policies.accelgen.policy import AccelGenPolicy
    from accelgen.policies.registry import make_policy, register_policy
    from accelgen.sim.runner import simulate
    from accelgen.workloads.trace import load_trace

    cfg = config_file.load_file(args.config)
    grid = Grid(cfg)
    cap = cfg.experiments.capacity
    if cap is None:
        print(f"{args.config}: no experiments.capacity", file=sys.stderr)
        return 2
    unknown = [s for s in args.systems if s not in grid.systems]
    if unknown:
        print(f"unknown system(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.decode_margin >= 0.0:
        print(f"--decode-margin: must be >= 0, got {args.decode_margin}", file=sys.stderr)
        return 2
    d = args.deployment or cap.deployments[0]
    seed = args.seed if args.seed is not None else cfg.seeds_of(cap)[0]
    dep = cfg.deployment(d)
    est = grid.capacity_bound(cap.workload, d, cfg.seeds_of(cap)[0]).estimate_rps
    noise = sensitivity_noise(args.noise)

    def with_margin(name: str) -> Any:
        """A factory of policy ``name`` planning its decodes with the fixed margin."""
        def factory(**params: Any) -> AccelGenPolicy:
            policy = make_policy(name, params)
            assert isinstance(policy, AccelGenPolicy)
            policy.fix_decode_margin(args.decode_margin)
            return policy
        return factory

    # The policy each system runs: an open-loop AccelGen one under ``--decode-margin`` registered
    # as planning with that margin.
    policy_of: dict[str, str] = {}
    for s in args.systems:
        spec = grid.systems[s]
        probe = make_policy(spec.policy, dict(spec.params))
        policy_of[s] = spec.policy
        if args.decode_margin > 0.0 and isinstance(probe, AccelGenPolicy) and probe.loop is None:
            policy_of[s] = f"{spec.policy}+margin"
            register_policy(policy_of[s], with_margin(spec.policy))
    factors = args.load_factors or cap.load_factors
    att: dict[str, list[tuple[float, float]]] = {s: [] for s in args.systems}
    tmp = Path(tempfile.mkdtemp(prefix="capacity_probe."))
    for f in sorted(factors):
        rate = sweep_rate(f, est)
        v = grid._rate_variant(cap.workload, rate)
        # The trace as the pipeline's `trace` rule writes it (`accelgen trace` on the variant's
        # workload file), so that the runs are the pipeline's.
        wl_yaml, tpath = tmp / f"{v}.yaml", tmp / f"{v}-seed{seed}.parquet"
        if pipeline_main(["write-yaml", "--spec", grid.workload_spec_json(v), "--out",
                          str(wl_yaml)]) != 0 or accelgen_main([
                "trace", "--config", str(wl_yaml), "--out", str(tpath), "--seed", str(seed),
                *grid.trace_args(v, d), "--quiet"]) != 0:
            print(f"could not write the trace of {v}", file=sys.stderr)
            return 1
        trace = load_trace(tpath)
        for s in args.systems:
            spec = grid.systems[s]
            params = dict(spec.params)
            if spec.budget == "tuned":
                params["token_budget"] = grid._resolve_tuned(v, cap.workload, d, s,
                                                             seed).token_budget
            ec = ExperimentConfig(deployment=dep,
                                  policy=PolicySpec(name=policy_of[s], params=params),
                                  sim=SimOptions(progress=False, noise=noise), seed=seed)
            run = simulate(trace, ec)
            if args.out is not None:
                run.write(args.out / v / s)
            a = float(run.summary["slo_attainment_request"])
            att[s].append((rate, a))
            print(f"{d} seed {seed} noise {args.noise:g}: load factor {f:g} rate {rate:g} "
                  f"{s}: request-level attainment {a:.3f}", flush=True)
    for s, pts in att.items():
        rates, atts = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        c90, w90 = metrics.sweep_capacity(rates, atts, 0.9)
        c99, w99 = metrics.sweep_capacity(rates, atts, 0.99)
        print(json.dumps({"system": s, "deployment": d, "seed": seed, "noise": args.noise,
                          "decode_margin": args.decode_margin,
                          "capacity_90": c90, "where_90": w90, "capacity_99": c99,
                          "where_99": w99}), flush=True)
    print(f"capacity_probe: {len(args.systems)} systems x {len(factors)} rates simulated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
