"""Capacity estimates of the pipeline's deployments, which place regime ``capacity``'s rate sweep
(SPEC section 11) around each deployment's knee without hand-tuned rates.

The estimate is :func:`accelgen.costmodel.capacity.capacity_bound` on the requests of the
sweep's workload for that deployment: the same lengths (seed, truncation to the deployment's
max_model_len minus the margin) as the trace the ``trace`` rule writes, so a reader can reproduce
it with ``accelgen capacity --trace``. Arrival rates do not change lengths, so one estimate
serves every rate of the sweep. Cached per process (the Snakefile builds the grid more than
once).

The same trace gives the token budget of the ``tuned`` systems (:func:`workload_tuned_budget`,
Sarathi-Serve's rule, :mod:`accelgen.costmodel.budget`): the tightest TBT SLO of its online
requests, its prompt lengths, and the decode batch by Little's law at the capacity estimate.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from accelgen.core.specs import Deployment
from accelgen.costmodel.budget import TunedBudget
from accelgen.costmodel.capacity import CapacityBound

_CACHE: dict[str, CapacityBound] = {}
_TRACES: dict[str, pd.DataFrame] = {}
_BUDGETS: dict[str, TunedBudget] = {}


def workload_bound(workload: dict[str, Any], dep: Deployment, seed: int,
                   max_model_len: int) -> CapacityBound:
    """The capacity bound of ``dep`` on the trace of ``workload`` (a workload mapping) with
    this seed and truncation."""
    from accelgen.costmodel.capacity import trace_bound

    key = _key(workload, dep, seed, max_model_len)
    if key not in _CACHE:
        _CACHE[key] = trace_bound(dep, _trace(workload, dep, seed, max_model_len))
    return _CACHE[key]


def workload_tuned_budget(workload: dict[str, Any], dep: Deployment, seed: int,
                          max_model_len: int, max_num_seqs: int) -> TunedBudget:
    """Sarathi-Serve's token budget for ``dep`` on the trace of ``workload``: the largest
    multiple of the block size (up to min(max_model_len, 8192)) whose predicted iteration, with
    the decode batch at the capacity estimate (Little's law with iterations of the tightest TBT
    SLO), meets the tightest TBT SLO of the trace's online requests
    (:func:`accelgen.costmodel.budget.tuned_token_budget`)."""
    from accelgen.costmodel.budget import knee_decodes, tuned_token_budget
    from accelgen.costmodel.factory import make_cost_model

    key = json.dumps([_key(workload, dep, seed, max_model_len), max_num_seqs])
    if key in _BUDGETS:
        return _BUDGETS[key]
    df = _trace(workload, dep, seed, max_model_len)
    online = df["online"].to_numpy(dtype=bool)
    tbt = df["tbt_slo"].to_numpy(dtype=np.float64)[online]
    tbt = tbt[np.isfinite(tbt) & (tbt > 0)]
    if tbt.size == 0:
        raise ValueError("a tuned token budget needs online requests with a TBT SLO; the "
                         "workload has none")
    tightest = float(tbt.min())
    bound = workload_bound(workload, dep, seed, max_model_len)
    prompt = df["prompt_len"].to_numpy()
    decodes = knee_decodes(prompt, df["output_len"].to_numpy(), rate=bound.estimate_rps,
                           t_iteration=tightest, max_num_seqs=max_num_seqs)
    out = tuned_token_budget(make_cost_model(dep), tightest, prompt, decodes,
                             block_size=dep.block_size, max_tokens=min(max_model_len, 8192))
    _BUDGETS[key] = out
    return out


def _key(workload: dict[str, Any], dep: Deployment, seed: int, max_model_len: int) -> str:
    return json.dumps([workload, dep.model_dump(mode="json"), seed, max_model_len],
                      sort_keys=True)


def _trace(workload: dict[str, Any], dep: Deployment, seed: int,
           max_model_len: int) -> pd.DataFrame:
    """The trace the ``trace`` rule writes for this workload, deployment and seed (cached)."""
    key = _key(workload, dep, seed, max_model_len)
    if key not in _TRACES:
        from accelgen.workloads import WorkloadConfig, build_trace
        from accelgen.workloads.latency import resolve_latency_reference

        cfg = WorkloadConfig.parse(workload).updated(seed=seed, max_model_len=max_model_len)
        ref = resolve_latency_reference(dep.model, dep.hardware, tp=dep.tp, pp=dep.pp)
        _TRACES[key] = build_trace(cfg, reference=ref).df
    return _TRACES[key]


def sweep_rate(factor: float, estimate: float) -> float:
    """``factor x estimate`` rounded to 3 significant digits (rates name trace directories)."""
    x = factor * estimate
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"capacity sweep: rate {x} from factor {factor} x estimate {estimate}")
    return float(f"{x:.3g}")
