"""Deployment -> cost model and pivot, with name resolution for models and hardware."""

from __future__ import annotations

from pathlib import Path

from accelgen.core.iteration import Pivot
from accelgen.core.specs import Deployment
from accelgen.costmodel.analytic import AnalyticCostModel
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.calibrated import CalibratedCostModel
from accelgen.costmodel.datasheets import (
    kv_num_blocks,
    resolve_deployment,
    resolve_hardware,
    resolve_model,
)
from accelgen.costmodel.pivot import DEFAULT_MAX_SIZE, find_pivot
from accelgen.costmodel.table import ProfileCostModel

__all__ = ["deployment_pivot", "effective_max_model_len", "kv_num_blocks", "make_cost_model",
           "pivot_of", "resolve_deployment", "resolve_hardware", "resolve_model"]


def _cache_key(dep: Deployment) -> str:
    # Deployments are mutable pydantic models, so cache on their JSON; a profile table is also
    # keyed by its size and mtime so that a re-profiled file is picked up.
    key = dep.model_dump_json()
    if dep.cost_model == "profile" and dep.profile_csv is not None:
        p = Path(dep.profile_csv)
        if p.exists():
            st = p.stat()
            key += f"|{st.st_size}|{st.st_mtime_ns}"
    return key


_COST_MODELS: dict[str, CostModel] = {}
_PIVOTS: dict[str, tuple[int, float]] = {}


def make_cost_model(dep: Deployment) -> CostModel:
    """The deployment's cost model (cost models are stateless, so instances are shared)."""
    key = _cache_key(dep)
    if key not in _COST_MODELS:
        _COST_MODELS[key] = _build(dep)
    return _COST_MODELS[key]


def _build(dep: Deployment) -> CostModel:
    if dep.cost_model == "profile":
        assert dep.profile_csv is not None  # guaranteed by Deployment's validator
        return ProfileCostModel.from_csv(dep.profile_csv)
    model = resolve_model(dep.model)
    if dep.cost_model == "calibrated":
        assert dep.calibration is not None  # guaranteed by Deployment's validator
        return CalibratedCostModel(dep.calibration, model.num_layers, tp=dep.tp, pp=dep.pp)
    if model.num_heads % dep.tp:
        raise ValueError(f"tp={dep.tp} does not divide the {model.num_heads} heads of "
                         f"{model.name}")
    return AnalyticCostModel(model, resolve_hardware(dep.hardware), tp=dep.tp, pp=dep.pp,
                             collectives=dep.collectives)


def effective_max_model_len(dep: Deployment) -> int:
    return dep.max_model_len if dep.max_model_len is not None else \
        resolve_model(dep.model).max_model_len


def deployment_pivot(dep: Deployment) -> Pivot:
    """Pivot of the deployment's cost model at its tolerance, on multiples of its block size up
    to min(8192, max_model_len). Cached; returns a fresh Pivot each call."""
    key = _cache_key(dep)
    if key not in _PIVOTS:
        _PIVOTS[key] = _pivot(dep)
    s_pf, t_pf = _PIVOTS[key]
    return Pivot(s_pf=s_pf, t_pf=t_pf)


def pivot_of(cost: CostModel, dep: Deployment) -> Pivot:
    """The pivot of ``cost`` by the deployment's rule: its ``pivot_tolerance``, on multiples of
    its block size up to min(8192, max_model_len) (at least one block). ``deployment_pivot`` is
    this for the deployment's own cost model; a simulation given another cost model (e.g. an
    engine step model) uses it directly."""
    max_size = min(DEFAULT_MAX_SIZE, effective_max_model_len(dep))
    max_size -= max_size % dep.block_size
    return find_pivot(cost, tolerance=dep.pivot_tolerance, step=dep.block_size,
                      max_size=max(max_size, dep.block_size))


def _pivot(dep: Deployment) -> tuple[int, float]:
    p = pivot_of(make_cost_model(dep), dep)
    return p.s_pf, p.t_pf
