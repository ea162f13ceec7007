"""Isolated latencies for SLOs: the project's cost model, or a documented fallback.

A :class:`LatencyReference` carries what SLO assignment needs of a deployment: the isolated
(unchunked) prefill latency of a prompt (``group_mean`` TTFT SLOs, and the unattainable count),
and for ``ttft_reference: isolated`` (SPEC section 11) the prefill chunked at the deployment's
pivot S_pf, T_pf, and one isolated decode iteration (batch 1) at a given context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accelgen.workloads import fitted
from accelgen.workloads.slo import PrefillLatency

FALLBACK_NAME = ("fallback a+b*n+c*n^2 fitted to A100 13B-class prefill "
                 "(accelgen/workloads/fitted.py); valid for OPT-13B/Llama-13B on one A100 only")


def fallback_prefill_latency(prompt_len: int) -> float:
    """Seconds for one unchunked prefill of ``prompt_len`` tokens on one A100, 13B-class model."""
    a, b, c = fitted.FALLBACK_PREFILL_COEFFS
    return a + b * prompt_len + c * prompt_len * prompt_len


@dataclass(frozen=True)
class LatencyReference:
    """Latencies of one request alone on a deployment (seconds).

    ``chunked_prefill``, ``s_pf``/``t_pf`` and ``decode`` exist only when the reference comes
    from a deployment's cost model (not for a bare prefill function or the fallback).
    """

    prefill: PrefillLatency  # isolated, unchunked prefill of p tokens
    name: str
    chunked_prefill: PrefillLatency | None = None  # isolated, in chunks of s_pf tokens
    s_pf: int | None = None
    t_pf: float | None = None
    decode: Callable[[int], float] | None = None  # one decode iteration, batch 1, context c

    @property
    def complete(self) -> bool:
        return (self.chunked_prefill is not None and self.t_pf is not None
                and self.decode is not None)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name}
        if self.s_pf is not None:
            out.update(s_pf=self.s_pf, t_pf=self.t_pf)
        return out


def resolve_latency_reference(model: str = "opt-13b", hardware: str = "a100",
                              deployment: str | None = None, *, tp: int = 1,
                              pp: int = 1, profile_csv: Path | None = None) -> LatencyReference:
    """The reference of ``accelgen.costmodel`` for a deployment when that package is installed,
    else the fallback prefill function alone (its name says so; it goes into the trace metadata).

    ``deployment`` names one of the cost model's deployments (with its TP/PP layout, e.g.
    ``opt-175b``); otherwise ``model`` on ``tp x pp`` ``hardware`` devices. ``profile_csv``: a
    measured table (``accelgen profile``) of that deployment instead of its analytic model.
    """
    try:
        from accelgen.costmodel.factory import (
            deployment_pivot,
            make_cost_model,
            resolve_deployment,
        )
        from accelgen.costmodel.isolated import ChunkedPrefill, isolated_decode_time
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("accelgen"):
            return LatencyReference(fallback_prefill_latency, FALLBACK_NAME)
        raise
    from accelgen.core.specs import Deployment

    # Unknown names raise ValueError with the known ones listed: the CLI reports it.
    dep = (resolve_deployment(deployment) if deployment is not None
           else Deployment(model=model, hardware=hardware, tp=tp, pp=pp))
    if profile_csv is not None:
        dep = dep.model_copy(update={"cost_model": "profile", "profile_csv": Path(profile_csv)})
    cost = make_cost_model(dep)
    pivot = deployment_pivot(dep)
    name = getattr(cost, "name", type(cost).__name__)
    table = f", table {profile_csv}" if profile_csv is not None else ""

    def decode(context: int) -> float:
        return isolated_decode_time(cost, context)

    return LatencyReference(
        prefill=cost.prefill_time,
        name=(f"cost model {name} ({dep.model} on {dep.num_gpus} x {dep.hardware}, "
              f"tp={dep.tp} pp={dep.pp}{table})"),
        chunked_prefill=ChunkedPrefill(cost, pivot.s_pf), s_pf=pivot.s_pf, t_pf=pivot.t_pf,
        decode=decode)


def resolve_prefill_latency(model: str = "opt-13b", hardware: str = "a100",
                            deployment: str | None = None, *, tp: int = 1,
                            pp: int = 1, profile_csv: Path | None = None
                            ) -> tuple[PrefillLatency, str]:
    """``(prefill_latency, description)``: the unchunked part of
    :func:`resolve_latency_reference`."""
    ref = resolve_latency_reference(model, hardware, deployment, tp=tp, pp=pp,
                                    profile_csv=profile_csv)
    return ref.prefill, ref.name
