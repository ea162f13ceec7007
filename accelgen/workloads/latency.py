"""Isolated prefill latency for TTFT SLOs: the project's cost model, or a documented fallback."""

from __future__ import annotations

from pathlib import Path

from accelgen.workloads import fitted
from accelgen.workloads.slo import PrefillLatency

FALLBACK_NAME = ("fallback a+b*n+c*n^2 fitted to A100 13B-class prefill "
                 "(accelgen/workloads/fitted.py); valid for OPT-13B/Llama-13B on one A100 only")


def fallback_prefill_latency(prompt_len: int) -> float:
    """Seconds for one unchunked prefill of ``prompt_len`` tokens on one A100, 13B-class model."""
    a, b, c = fitted.FALLBACK_PREFILL_COEFFS
    return a + b * prompt_len + c * prompt_len * prompt_len


def resolve_prefill_latency(model: str = "opt-13b", hardware: str = "a100",
                            deployment: str | None = None, *, tp: int = 1,
                            pp: int = 1, profile_csv: Path | None = None
                            ) -> tuple[PrefillLatency, str]:
    """``(prefill_latency, description)`` from ``accelgen.costmodel`` when it is installed, else
    the fallback (the description says which; it goes into the trace metadata).

    ``deployment`` names one of the cost model's deployments (with its TP/PP layout, e.g.
    ``opt-175b``); otherwise ``model`` on ``tp x pp`` ``hardware`` devices. ``profile_csv``: a
    measured table (``accelgen profile``) of that deployment instead of its analytic model.
    """
    try:
        from accelgen.costmodel.factory import make_cost_model, resolve_deployment
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("accelgen"):
            return fallback_prefill_latency, FALLBACK_NAME
        raise
    from accelgen.config import Deployment

    # Unknown names raise ValueError with the known ones listed: the CLI reports it.
    dep = (resolve_deployment(deployment) if deployment is not None
           else Deployment(model=model, hardware=hardware, tp=tp, pp=pp))
    if profile_csv is not None:
        dep = dep.model_copy(update={"cost_model": "profile", "profile_csv": Path(profile_csv)})
    cost = make_cost_model(dep)
    name = getattr(cost, "name", type(cost).__name__)
    table = f", table {profile_csv}" if profile_csv is not None else ""
    return cost.prefill_time, (f"cost model {name} ({dep.model} on {dep.num_gpus} x "
                               f"{dep.hardware}, tp={dep.tp} pp={dep.pp}{table})")
