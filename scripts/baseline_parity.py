"""Does a baseline serve like vLLM where vLLM has no queue? A rate sweep finds vLLM's capacity on a
workload; the policy and vLLM then run the same traces at fractions of it.

    .venv/bin/python scripts/baseline_parity.py [--policy fastserve] [--config config/quick.yaml]
        [--deployment opt-13b] [--rates 0.05 0.1 0.2 0.3 0.5] [--fractions 0.25 0.5]

vLLM's capacity here is its throughput knee: the offered rate beyond which its throughput stops
following the offered rate, so its queue grows without bound. The sweep shows, per offered rate,
vLLM's throughput / offered rate and its median queueing delay (arrival to first scheduling); the
capacity is vLLM's throughput at the highest swept rate, which must overload it (the script says
so if it does not). The traces are the config's `workload` section (its request count and seed)
with Poisson arrivals at the given rate and prompts cut to the deployment's max_model_len - 1, as
the pipeline does.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accelgen.core.specs import ExperimentConfig, PolicySpec, SimOptions
from accelgen.costmodel.datasheets import DEPLOYMENTS, resolve_model
from accelgen.costmodel.factory import make_cost_model
from accelgen.sim.runner import simulate
from accelgen.workloads.build import build_trace
from accelgen.workloads.workload_spec import WorkloadConfig

ROOT = Path(__file__).resolve().parent.parent


def make_trace(cfg: WorkloadConfig, deployment: str, rate: float) -> pd.DataFrame:
    dep = DEPLOYMENTS[deployment]
    max_len = (dep.max_model_len or resolve_model(dep.model).max_model_len) - 1
    cost = make_cost_model(dep)
    cfg = cfg.updated(max_model_len=max_len, arrival={"kind": "poisson", "rate": rate})
    return build_trace(cfg, cost.prefill_time, cost.name).df


def serve(trace: pd.DataFrame, deployment: str, policy: str) -> dict[str, Any]:
    cfg = ExperimentConfig(deployment=DEPLOYMENTS[deployment], policy=PolicySpec(name=policy),
                           sim=SimOptions.model_validate({"progress": False}))
    t0 = time.perf_counter()
    run = simulate(trace, cfg)
    out = dict(run.summary)
    req = run.requests
    out["queue_delay_p50"] = float(np.median(req["first_scheduled_time"] - req["arrival"]))
    out["offered_rps"] = len(trace) / float(trace["arrival"].max() - trace["arrival"].min())
    its = run.iterations
    out["swapped_blocks_s"] = float(its["swap_time"].sum()) if "swap_time" in its else 0.0
    out["wall_s"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="fastserve")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "quick.yaml")
    ap.add_argument("--deployment", default="opt-13b")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--num-requests", type=int, help="default: the config's workload section")
    args = ap.parse_args()
    cfg = WorkloadConfig.from_yaml(args.config)
    if args.num_requests:
        cfg = cfg.updated(num_requests=args.num_requests)

    print(f"vLLM rate sweep: {args.config.name} workload ({cfg.num_requests} requests, seed "
          f"{cfg.seed}), {args.deployment}")
    print(f"{'offered':>8} {'thr rps':>8} {'thr/off':>7} {'queue p50 s':>11} {'ttft p50 s':>10} "
          f"{'tbt ms':>7}")
    thr = []
    for rate in sorted(args.rates):
        s = serve(make_trace(cfg, args.deployment, rate), args.deployment, "vllm")
        thr.append((s["offered_rps"], s["throughput_rps"]))
        print(f"{s['offered_rps']:>8.4f} {s['throughput_rps']:>8.4f} "
              f"{s['throughput_rps'] / s['offered_rps']:>7.3f} {s['queue_delay_p50']:>11.2f} "
              f"{s['ttft_p50']:>10.2f} {s['tbt_mean'] * 1e3:>7.1f}", flush=True)
    offered, achieved = thr[-1]
    capacity = achieved
    if achieved > 0.9 * offered:
        print(f"the highest rate ({offered:.3g} req/s) does not overload vLLM: add a higher one")
        return 1
    print(f"vLLM capacity (throughput under overload): {capacity:.4f} req/s")

    print(f"\n{args.policy} vs vllm at fractions of that capacity")
    print(f"{'fraction':>8} {'rate':>7} {'system':>10} {'thr rps':>8} {'tbt mean ms':>11} "
          f"{'tbt p99 ms':>10} {'ttft p50 s':>10} {'queue p50 s':>11} {'preempt':>7} "
          f"{'swap s':>7} {'attain':>6} {'wall s':>6}")
    ok = True
    for f in args.fractions:
        trace = make_trace(cfg, args.deployment, f * capacity)
        runs = {p: serve(trace, args.deployment, p) for p in ("vllm", args.policy)}
        for name, s in runs.items():
            print(f"{f:>8.2f} {f * capacity:>7.4f} {name:>10} {s['throughput_rps']:>8.4f} "
                  f"{s['tbt_mean'] * 1e3:>11.1f} {s['tbt_p99'] * 1e3:>10.1f} {s['ttft_p50']:>10.2f} "
                  f"{s['queue_delay_p50']:>11.2f} {s['num_preemptions']:>7} "
                  f"{s['swapped_blocks_s']:>7.1f} {s['slo_attainment_request']:>6.3f} "
                  f"{s['wall_s']:>6.1f}", flush=True)
        v, p = runs["vllm"], runs[args.policy]
        thr_ratio = p["throughput_rps"] / v["throughput_rps"]
        tbt_ratio = p["tbt_mean"] / v["tbt_mean"]
        good = abs(thr_ratio - 1) <= 0.10 and tbt_ratio <= 2.0
        ok &= good
        print(f"{'':>8} throughput ratio {thr_ratio:.3f} (within 10 %: {abs(thr_ratio - 1) <= 0.1}),"
              f" mean TBT ratio {tbt_ratio:.2f} (within 2x: {tbt_ratio <= 2.0})")
    print(f"baseline_parity: {args.policy} {'serves' if ok else 'does NOT serve'} like vLLM at "
          f"{', '.join(f'{f:g}' for f in args.fractions)} x vLLM's capacity ({capacity:.4f} req/s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
