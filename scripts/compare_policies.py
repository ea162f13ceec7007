"""Compare serving policies on the quick workload over seeds and arrival rates (issue 4).

For every (rate, seed) the quick workload trace is built the way ``accelgen trace`` builds it for
the pipeline (the ``workload`` section of ``--config``, with that seed, Poisson rate and number
of requests; TTFT SLOs from the deployment's cost model with its TP/PP layout; prompts truncated
to the deployment's context minus the config's ``truncate_margin``). Each policy is simulated on
it (``accelgen.sim.runner.simulate``) and the script prints, per (rate, policy), the mean and the
min..max over seeds of:

- ``req_att``: request-level SLO attainment (``slo_attainment_request``);
- ``goodput``: requests/s that met every SLO (``goodput_rps``);
- ``tok/s``: output-token throughput; ``it_att``: iteration-level (token) SLO attainment;
- ``ttft_ok*``: TTFT attainment among online requests whose TTFT SLO is attainable, i.e. at
  least the request's own isolated prefill latency on the deployment's cost model;
- ``tbt_miss``: requests with at least one inter-token gap above their TBT SLO;
- ``preempt``: preemptions; ``ttft_p50`` (s); ``jct`` (mean, s).

A second table breaks the requests down by outcome (fractions of all requests): ``met``;
``unattain`` (TTFT SLO below the isolated prefill: missed by construction); among the rest
``ttft_only`` (TTFT missed, every TBT met), ``tbt_only`` (TTFT met, a TBT missed), ``both``;
``rejected`` (not finished).

Policies: any registered name (``accelgen.policies.registry``) or ``name:k=v,k=v`` with
parameters (values parsed as YAML). ``--policy-module`` imports a Python file or module first,
which may register more policies in ``registry.POLICIES`` / ``registry.VARIANTS`` (for
prototypes kept outside the package).

    .venv/bin/python scripts/compare_policies.py --seeds 0 1 2 --rates 0.2 8 \\
        --num-requests 200 500 --policies vllm sarathi accelgen "accelgen:gamma=0.5" \\
        --out /tmp/compare.csv --save-dir /tmp/compare_runs

Runs are sequential (one simulation at a time). AccelGen on 500 requests at 8 req/s takes
about 40 s, vLLM about 2 s.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accelgen.core.specs import Deployment, ExperimentConfig, PolicySpec, SimOptions, load_yaml, parse_params
from accelgen.costmodel.datasheets import DEPLOYMENTS
from accelgen.costmodel.factory import effective_max_model_len, make_cost_model
from accelgen.metrics import per_request
from accelgen.sim.runner import simulate
from accelgen.workloads.build import build_trace
from accelgen.workloads.latency import resolve_prefill_latency
from accelgen.workloads.slo import isolated_prefill
from accelgen.workloads.workload_spec import WorkloadConfig

ROOT = Path(__file__).resolve().parent.parent

# (column, header, format) of the main table; every column is a per-run number.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("req_att", "req_att", ".3f"),
    ("goodput", "goodput", ".3f"),
    ("out_tps", "tok/s", ".1f"),
    ("it_att", "it_att", ".4f"),
    ("ttft_att_attainable", "ttft_ok*", ".3f"),
    ("tbt_miss", "tbt_miss", ".1f"),
    ("preemptions", "preempt", ".0f"),
    ("ttft_p50", "ttft_p50", ".2f"),
    ("jct_mean", "jct", ".1f"),
)
OUTCOMES: tuple[str, ...] = ("met", "unattain", "ttft_only", "tbt_only", "both", "rejected")


@dataclass(frozen=True)
class PolicyChoice:
    label: str
    name: str
    params: dict[str, Any]


def parse_policy(spec: str) -> PolicyChoice:
    """``name`` or ``name:k=v,k=v`` (values as YAML: ``accelgen:gamma=0.5,era=false``)."""
    name, _, rest = spec.partition(":")
    return PolicyChoice(spec, name, parse_params([item for item in rest.split(",") if item]))


def load_policy_module(ref: str) -> None:
    """Import a module by name, or a ``.py`` file by path (registered in ``sys.modules`` under
    its stem, so ``registry.POLICIES`` entries may point at ``stem:Class``)."""
    path = Path(ref)
    if path.suffix == ".py":
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {ref}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(ref)


def make_trace(base: WorkloadConfig, dep: Deployment, *, seed: int, rate: float, num_requests: int,
               max_model_len: int) -> pd.DataFrame:
    """The workload trace of one (seed, rate), as ``accelgen trace`` writes it for ``dep``."""
    cfg = base.updated(seed=seed, num_requests=num_requests, max_model_len=max_model_len,
                       arrival={**base.arrival.model_dump(), "kind": "poisson", "rate": rate})
    latency, name = resolve_prefill_latency(dep.model, dep.hardware, tp=dep.tp, pp=dep.pp)
    return build_trace(cfg, latency, name).df


def run_metrics(requests: pd.DataFrame, summary: dict[str, Any], iso: np.ndarray) -> dict[str, Any]:
    """The per-run numbers of both tables from the requests frame and the summary."""
    pr = per_request(requests)
    n = len(pr)
    finished = (pr["status"] == "finished").to_numpy()
    online = pr["online"].to_numpy(dtype=bool)
    ttft = pr["ttft"].to_numpy(dtype=np.float64)
    ttft_slo = pr["ttft_slo"].to_numpy(dtype=np.float64)
    tbt_slo = pr["tbt_slo"].to_numpy(dtype=np.float64)
    attainable = online & (ttft_slo >= iso)
    ttft_met = np.nan_to_num(ttft, nan=math.inf) <= ttft_slo
    tbt_max = pr["tbt_max"].to_numpy(dtype=np.float64)
    tbt_miss = online & finished & np.nan_to_num(tbt_max > tbt_slo, nan=False)
    met = pr["slo_met"].to_numpy(dtype=bool)
    rejected = ~finished
    rest = online & finished & ~met & attainable
    out: dict[str, Any] = {
        "req_att": summary["slo_attainment_request"],
        "goodput": summary["goodput_rps"],
        "out_tps": summary["throughput_output_tps"],
        "it_att": summary["slo_attainment_iteration"],
        "ttft_att_attainable": (float(ttft_met[attainable].mean()) if attainable.any() else math.nan),
        "tbt_miss": float(tbt_miss.sum()),
        "preemptions": float(summary["num_preemptions"]),
        "ttft_p50": summary["ttft_p50"],
        "jct_mean": summary["jct_mean"],
        "throughput_rps": summary["throughput_rps"],
        "makespan": summary["makespan_s"],
        "n": n,
        "attainable": int(attainable.sum()),
        "met": float(met.sum()) / n,
        "unattain": float((online & ~attainable & ~met & finished).sum()) / n,
        "ttft_only": float((rest & ~ttft_met & ~tbt_miss).sum()) / n,
        "tbt_only": float((rest & ttft_met & tbt_miss).sum()) / n,
        "both": float((rest & ~ttft_met & tbt_miss).sum()) / n,
        "rejected": float(rejected.sum()) / n,
    }
    return out


def _cell(values: Sequence[float], fmt: str) -> str:
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return "nan"
    if a.size == 1 or a.min() == a.max():
        return f"{a.mean():{fmt}}"
    return f"{a.mean():{fmt}} [{a.min():{fmt}}..{a.max():{fmt}}]"


def print_tables(df: pd.DataFrame) -> None:
    """Mean [min..max] over seeds per (rate, policy), in the order the runs were made."""
    groups = list(df.groupby(["rate", "policy"], sort=False))
    cols = [("rate", "rate"), ("policy", "policy"), ("n", "n")] + [(c, h) for c, h, _ in METRICS]
    rows = []
    for (rate, policy), g in groups:
        row = {"rate": f"{rate:g}", "policy": str(policy), "n": f"{int(g['n'].iloc[0])}x{len(g)}"}
        for c, _, fmt in METRICS:
            row[c] = _cell(g[c].tolist(), fmt)
        rows.append(row)
    _print_rows(rows, cols)
    print()
    print("Outcome breakdown (fraction of requests; mean [min..max] over seeds). unattain: TTFT SLO "
          "below the isolated prefill; ttft_only/tbt_only/both: misses of attainable requests")
    cols = [("rate", "rate"), ("policy", "policy")] + [(c, c) for c in OUTCOMES]
    rows = []
    for (rate, policy), g in groups:
        row = {"rate": f"{rate:g}", "policy": str(policy)}
        for c in OUTCOMES:
            row[c] = _cell(g[c].tolist(), ".3f")
        rows.append(row)
    _print_rows(rows, cols)


def _print_rows(rows: list[dict[str, str]], cols: list[tuple[str, str]]) -> None:
    widths = {c: max(len(h), *(len(r[c]) for r in rows)) for c, h in cols}
    print("  ".join(f"{h:<{widths[c]}}" if c == "policy" else f"{h:>{widths[c]}}" for c, h in cols))
    for r in rows:
        print("  ".join(f"{r[c]:<{widths[c]}}" if c == "policy" else f"{r[c]:>{widths[c]}}"
                        for c, _ in cols))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "quick.yaml",
                    help="YAML with a `workload` section (default: config/quick.yaml)")
    ap.add_argument("--deployment", default="opt-13b", choices=sorted(DEPLOYMENTS),
                    help="built-in deployment: cost model, KV, TP/PP (default: opt-13b)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rates", type=float, nargs="+", default=None,
                    help="Poisson arrival rates, req/s (default: the config's)")
    ap.add_argument("--num-requests", type=int, nargs="+", default=None,
                    help="requests per trace: one value, or one per rate (default: the config's)")
    ap.add_argument("--policies", nargs="+", default=["vllm", "sarathi", "accelgen"],
                    help="policy names or name:k=v,k=v")
    ap.add_argument("--policy-module", action="append", default=[],
                    help="module or .py file to import first (may register policies)")
    ap.add_argument("--out", type=Path, default=None, help="write the per-run rows as CSV")
    ap.add_argument("--save-dir", type=Path, default=None,
                    help="keep each run's requests/iterations as Parquet under this directory")
    ap.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    args = ap.parse_args(argv)

    for ref in args.policy_module:
        load_policy_module(ref)
    policies = [parse_policy(s) for s in args.policies]
    base = WorkloadConfig.from_yaml(args.config)
    margin = int(load_yaml(args.config).get("truncate_margin", 0))
    dep = DEPLOYMENTS[args.deployment].model_copy()
    max_model_len = max(1, effective_max_model_len(dep) - margin)
    cost = make_cost_model(dep)
    rates = args.rates or [base.arrival.rate]
    counts = args.num_requests or [base.num_requests]
    if len(counts) == 1:
        counts = counts * len(rates)
    if len(counts) != len(rates):
        ap.error("--num-requests takes one value or one per rate")

    rows: list[dict[str, Any]] = []
    for rate, n_req in zip(rates, counts, strict=True):
        for seed in args.seeds:
            trace = make_trace(base, dep, seed=seed, rate=rate, num_requests=n_req,
                               max_model_len=max_model_len)
            iso = isolated_prefill(trace["prompt_len"].to_numpy(), cost.prefill_time)
            for pol in policies:
                exp = ExperimentConfig(deployment=dep, policy=PolicySpec(name=pol.name, params=pol.params),
                                       sim=SimOptions(progress=False), seed=seed)
                t0 = time.perf_counter()
                run = simulate(trace, exp)
                wall = time.perf_counter() - t0
                m = run_metrics(run.requests, run.summary, iso)
                rows.append({"rate": rate, "seed": seed, "policy": pol.label, **m, "wall_s": wall})
                if args.save_dir is not None:
                    d = args.save_dir / f"rate{rate:g}_n{n_req}_seed{seed}" / pol.label.replace("/", "_")
                    d.mkdir(parents=True, exist_ok=True)
                    run.requests.to_parquet(d / "requests.parquet")
                    run.iterations.to_parquet(d / "iterations.parquet")
                    pd.DataFrame({"isolated_prefill": iso}).to_parquet(d / "isolated_prefill.parquet")
                if not args.quiet:
                    print(f"# rate {rate:g} seed {seed} {pol.label}: req_att {m['req_att']:.3f} "
                          f"goodput {m['goodput']:.3f} preempt {m['preemptions']:.0f} "
                          f"({wall:.1f} s wall)", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    print(f"{args.deployment}, {args.config.name} workload, seeds {' '.join(map(str, args.seeds))}; "
          f"mean [min..max] over seeds")
    print_tables(df)
    if args.out is not None:
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
