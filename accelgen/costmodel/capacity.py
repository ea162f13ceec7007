"""Analytic bounds on the sustainable arrival rate of a deployment for a workload (SPEC 11).

Both bounds assume the deployment runs saturated: every iteration is a forward of S_pf tokens
taking T_pf (the pivot), whatever the scheduler.

- **KV bound (Little's law on the KV cache).** A request holds KV for ceil(n/b) blocks of b
  tokens while it is resident: during its i-th prefill chunk min(i x S_pf, p) tokens, during the
  decode step that makes output token j+1, p + j tokens. At one iteration per T_pf it stays
  W = (ceil(p / S_pf) + o - 1) x T_pf and occupies KV x time = T_pf x (sum of those token
  counts). In steady state the KV in use is lambda x E[KV x time] <= KV tokens, so

      lambda_KV = KV tokens / E[KV x time] = KV tokens / (mean resident tokens x mean residence)

  with mean resident tokens = E[KV x time] / E[W] (the time-weighted mean).
- **Compute bound.** A request needs p + o - 1 forward tokens (the first output token comes
  with the last prefill chunk); the deployment does at most S_pf / T_pf forward tokens per
  second (the pivot's throughput, within its tolerance of the plateau), so
  lambda_compute = (S_pf / T_pf) / E[p + o - 1].

The estimate is the smaller of the two. Neither models queueing, preemption (recomputed tokens)
or iterations shorter than T_pf: a KV-bound deployment whose decode batches are small runs
iterations faster than T_pf, so its real knee can lie above lambda_KV (docs/ARTIFACT.md compares
the bound with the measured capacities).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from accelgen.core.specs import Deployment
from accelgen.costmodel.factory import deployment_pivot, kv_num_blocks


@dataclass(frozen=True, slots=True)
class CapacityBound:
    """The bounds of one deployment on one set of requests (rates in requests/s)."""

    num_requests: int
    kv_tokens: int
    block_size: int
    s_pf: int
    t_pf: float
    mean_prompt: float
    mean_output: float
    mean_residence_s: float  # E[W] at one iteration per T_pf
    mean_resident_tokens: float  # E[KV x time] / E[W]
    kv_bound_rps: float
    compute_bound_rps: float

    @property
    def estimate_rps(self) -> float:
        return min(self.kv_bound_rps, self.compute_bound_rps)

    @property
    def binding(self) -> str:
        return "KV" if self.kv_bound_rps <= self.compute_bound_rps else "compute"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimate_rps": self.estimate_rps, "binding": self.binding}


def _ceil_sum(n: np.ndarray, b: int) -> np.ndarray:
    """sum_{x=1}^{n} ceil(x / b) (0 for n <= 0)."""
    n = np.maximum(n, 0)
    q, r = np.divmod(n, b)
    return b * q * (q + 1) // 2 + r * (q + 1)


def kv_token_iterations(prompt_len: np.ndarray, output_len: np.ndarray, s_pf: int,
                        block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request: (iterations resident, sum over those iterations of block-rounded KV tokens
    held), at one S_pf chunk per prefill iteration and one token per decode iteration."""
    p = np.asarray(prompt_len, dtype=np.int64)
    o = np.maximum(np.asarray(output_len, dtype=np.int64), 1)
    chunks = -(-p // s_pf)
    held = np.zeros(len(p), dtype=np.float64)
    for k in range(1, int(chunks.max(initial=0)) + 1):
        tokens = np.minimum(k * s_pf, p)
        held += np.where(k <= chunks, -(-tokens // block_size) * block_size, 0)
    # decode steps j = 1 .. o-1 hold p + j tokens: block_size x sum ceil(x / b), x = p+1..p+o-1
    held += block_size * (_ceil_sum(p + o - 1, block_size) - _ceil_sum(p, block_size))
    return (chunks + o - 1).astype(np.float64), held


def capacity_bound(dep: Deployment, prompt_len: np.ndarray, output_len: np.ndarray,
                   s_pf: int | None = None, t_pf: float | None = None) -> CapacityBound:
    """The KV and compute bounds of ``dep`` for requests of these (served) lengths."""
    if len(prompt_len) == 0:
        raise ValueError("capacity bound of an empty trace")
    if s_pf is None or t_pf is None:
        pivot = deployment_pivot(dep)
        s_pf, t_pf = pivot.s_pf, pivot.t_pf
    kv_tokens = kv_num_blocks(dep) * dep.block_size
    iters, held = kv_token_iterations(prompt_len, output_len, s_pf, dep.block_size)
    residence = iters * t_pf
    kv_time = held * t_pf
    forward = np.asarray(prompt_len, np.float64) + np.maximum(np.asarray(output_len,
                                                                         np.float64), 1) - 1
    kv_bound = kv_tokens / float(kv_time.mean()) if kv_time.mean() > 0 else math.inf
    return CapacityBound(
        num_requests=len(prompt_len), kv_tokens=kv_tokens, block_size=dep.block_size,
        s_pf=s_pf, t_pf=t_pf, mean_prompt=float(np.mean(prompt_len)),
        mean_output=float(np.mean(output_len)), mean_residence_s=float(residence.mean()),
        mean_resident_tokens=float(kv_time.sum() / residence.sum()),
        kv_bound_rps=kv_bound, compute_bound_rps=float(s_pf / t_pf / forward.mean()))


def trace_bound(dep: Deployment, trace: Any) -> CapacityBound:
    """The bound for a trace DataFrame (served lengths; every request counts)."""
    return capacity_bound(dep, trace["prompt_len"].to_numpy(), trace["output_len"].to_numpy())
