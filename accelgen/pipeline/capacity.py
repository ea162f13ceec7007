"""Capacity estimates of the pipeline's deployments, which place regime ``capacity``'s rate sweep
(SPEC section 11) around each deployment's knee without hand-tuned rates.

The estimate is :func:`accelgen.costmodel.capacity.capacity_bound` on the requests of the
sweep's workload for that deployment: the same lengths (seed, truncation to the deployment's
max_model_len minus the margin) as the trace the ``trace`` rule writes, so a reader can reproduce
it with ``accelgen capacity --trace``. Arrival rates do not change lengths, so one estimate
serves every rate of the sweep. Cached per process (the Snakefile builds the grid more than
once).
"""

from __future__ import annotations

import json
import math
from typing import Any

from accelgen.config import Deployment
from accelgen.costmodel.capacity import CapacityBound

_CACHE: dict[str, CapacityBound] = {}


def workload_bound(workload: dict[str, Any], dep: Deployment, seed: int,
                   max_model_len: int) -> CapacityBound:
    """The capacity bound of ``dep`` on the trace of ``workload`` (a workload mapping) with
    this seed and truncation."""
    key = json.dumps([workload, dep.model_dump(mode="json"), seed, max_model_len],
                     sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = _compute(workload, dep, seed, max_model_len)
    return _CACHE[key]


def _compute(workload: dict[str, Any], dep: Deployment, seed: int,
             max_model_len: int) -> CapacityBound:
    from accelgen.costmodel.capacity import trace_bound
    from accelgen.workloads import WorkloadConfig, build_trace
    from accelgen.workloads.latency import resolve_latency_reference

    cfg = WorkloadConfig.parse(workload).updated(seed=seed, max_model_len=max_model_len)
    ref = resolve_latency_reference(dep.model, dep.hardware, tp=dep.tp, pp=dep.pp)
    return trace_bound(dep, build_trace(cfg, reference=ref).df)


def sweep_rate(factor: float, estimate: float) -> float:
    """``factor x estimate`` rounded to 3 significant digits (rates name trace directories)."""
    x = factor * estimate
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"capacity sweep: rate {x} from factor {factor} x estimate {estimate}")
    return float(f"{x:.3g}")
