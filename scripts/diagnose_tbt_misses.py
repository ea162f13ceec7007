"""Which iterations make the requests of one TBT class miss, and why (SPEC 11, last paragraph).

    .venv/bin/python scripts/diagnose_tbt_misses.py results/quick/runs/capacity-rate0.0198/\
opt-13b-auto/accelgen/seed0 --deployment opt-13b --kv-cache-gb auto

For every gap between two tokens of a request of the class (default: the tightest, 47 ms) that
exceeded its TBT SLO, it finds the iteration that emitted the late token and prints: how many
requests of the class missed, the composition of those iterations (forward size, prefill
tokens, decodes, the decodes' KV context, the prefill chunk's attention pairs), the policy's
diagnostics (``info_*``: token budget, SLO_min, T_max) and the iteration's latency split into
the cost model's terms, beside what the paper's budget rule assumed (T_pf x S_f / S_pf) and a
prefill-only forward of the same size (what the ``model`` budget rule inverts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import Deployment, kv_cache_gb_arg
from accelgen.costmodel.datasheets import resolve_deployment
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.results import read_results

INFO = ("info_token_budget", "info_slo_min", "info_t_max", "info_n_urgent",
        "info_n_decode_skipped")
SHAPE = ("latency", "forward_size", "prefill_tokens", "decode_tokens", "num_prefill_seqs",
         "decode_ctx", "prefill_attn")


def late_iterations(reqs: pd.DataFrame, its: pd.DataFrame, tbt: float
                    ) -> tuple[int, int, list[int]]:
    """(requests of the class, those with a late token, indices of the late tokens'
    iterations)."""
    ends = (its["start"] + its["latency"]).to_numpy()
    cls = reqs[np.isclose(reqs["tbt_slo"], tbt)]
    missed, idx = 0, []
    for _, r in cls.iterrows():
        t = np.asarray(r["token_times"], dtype=float)
        late = np.flatnonzero(np.diff(t) > r["tbt_slo"])
        missed += bool(late.size)
        idx += [int(np.searchsorted(ends, t[k + 1] - 1e-12)) for k in late]
    return len(cls), missed, sorted(set(idx))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a results directory (accelgen simulate --out)")
    ap.add_argument("--deployment", default="opt-13b")
    ap.add_argument("--kv-cache-gb", type=kv_cache_gb_arg, default=None)
    ap.add_argument("--tbt-class", type=float, default=0.1875 * 0.25,
                    help="TBT SLO of the class to look at (s; default 0.046875)")
    args = ap.parse_args(argv)
    dep = resolve_deployment(args.deployment)
    if args.kv_cache_gb is not None:
        dep = Deployment.model_validate({**dep.model_dump(), "kv_cache_gb": args.kv_cache_gb})
    reqs, its, summary = read_results(args.results)
    n_cls, n_missed, idx = late_iterations(reqs, its, args.tbt_class)
    print(f"{args.results}: {summary.get('policy')}; TBT class {args.tbt_class * 1e3:.1f} ms: "
          f"{n_missed} of {n_cls} requests had a late token, from {len(idx)} iterations")
    if not idx:
        return 0
    cost, pivot = make_cost_model(dep), deployment_pivot(dep)
    x = its.iloc[idx][[c for c in (*SHAPE, *INFO) if c in its]].copy()
    x["paper_rule_T"] = pivot.t_pf * x["forward_size"] / pivot.s_pf
    x["prefill_only_T"] = [cost.forward_time(int(s)) for s in x["forward_size"]]
    terms = []
    for r in x.itertuples():
        shape = BatchShape(prefill_tokens=int(r.prefill_tokens),
                           prefill_seqs=int(r.num_prefill_seqs), prefill_attn=float(r.prefill_attn),
                           decode_seqs=int(r.decode_tokens), decode_ctx=int(r.decode_ctx))
        terms.append(getattr(cost, "breakdown", lambda s: {})(shape))
    pd.set_option("display.width", 200)
    print("\nlate iterations (mean / min / median / max):")
    print(x.describe().T[["mean", "min", "50%", "max"]].to_string(float_format="{:.4g}".format))
    if terms and terms[0]:
        print("\ncost-model terms of those iterations (ms):")
        print((pd.DataFrame(terms) * 1e3).describe().T[["mean", "min", "max"]]
              .to_string(float_format="{:.2f}".format))
    print(f"\nwith a prefill chunk: {(x['prefill_tokens'] > 0).mean():.0%}; "
          f"S_pf {pivot.s_pf}, T_pf {pivot.t_pf * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
