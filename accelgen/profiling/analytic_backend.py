"""``--backend analytic``: the calibrated analytic cost model written out as a profile table.

This is the pipeline's "profile pivot forward sizes" stage on a machine without the paper's GPUs:
the table holds the analytic model's latencies (A100 efficiencies fitted on measured kernel
times, see ``accelgen.costmodel.analytic``), not measurements of this machine, and its metadata
says so. Fresh prefills are written at every multiple of the block size, so the pivot read from
the table equals the analytic model's own (same points, same rule).
"""

from __future__ import annotations

from accelgen.core.specs import Deployment
from accelgen.costmodel.datasheets import resolve_model
from accelgen.costmodel.factory import make_cost_model
from accelgen.profiling.grid import Shape, gpu_grid
from accelgen.profiling.measure import Measurement, pivot_max_size


def analytic_shapes(dep: Deployment) -> list[Shape]:
    max_len = dep.max_model_len or resolve_model(dep.model).max_model_len
    top = pivot_max_size(max_len, dep.block_size)
    shapes = [Shape.prefill(s) for s in range(dep.block_size, top + 1, dep.block_size)]
    shapes += [s for s in gpu_grid(top) if not s.is_base and s.max_len() <= max_len]
    return list(dict.fromkeys(shapes))


def profile_analytic(dep: Deployment) -> tuple[list[Measurement], dict[str, object]]:
    if dep.cost_model != "analytic":
        raise ValueError("--backend analytic needs an analytic deployment (no --profile-csv)")
    cost = make_cost_model(dep)
    meas = [Measurement(s, [cost.iteration_time(s.row(1.0).shape())]) for s in analytic_shapes(dep)]
    meta: dict[str, object] = {
        "backend": "analytic (NOT measured on this machine: the calibrated roofline model, "
                   "accelgen.costmodel.analytic)",
        "model": dep.model,
        "device": f"{dep.tp * dep.pp} x {dep.hardware} (tp {dep.tp}, pp {dep.pp})",
        "cost_model": repr(cost),
    }
    return meas, meta
