"""Per-request SLO assignment (SPEC sections 2, 6 and 11; rules in docs/workloads.md).

Online request i (prompt p_i tokens after truncation, n_i output tokens after the cap):
- TTFT SLO = reference_i x U[ttft_scale]. ``ttft_reference: group_mean`` (the paper's rule, the
  default): reference_i = mean isolated prefill latency of its length group floor(p_i / 512),
  over the trace's requests in that group (the paper measured "the average prompt processing
  latency for each group"). ``isolated`` (SPEC section 11): reference_i = the request's own
  isolated prefill chunked at S_pf plus one T_pf (the iteration it may arrive during), so every
  SLO is attainable at zero load.
- TBT SLO = tbt_base x scale, scale uniform over a set or U[range]. In ``isolated`` mode a TBT
  SLO below tbt_floor_factor x one isolated decode iteration (batch 1, at the request's longest
  context) is raised to that floor and counted.
- JCT SLO (derived) = TTFT SLO + TBT SLO x (n_i - 1).
Offline request: no TTFT/TBT SLO (stored as +inf); JCT SLO = U[offline_jct_scale] x
(reference_i + tbt_base x (n_i - 1)), i.e. a multiple of the time it would take at reading
speed after a reference prefill.

Every draw comes from its own named stream, and all are drawn for every request whatever the
offline fraction or the reference, so changing one setting does not reshuffle the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.rng import stream
from accelgen.workloads.workload_spec import SLOConfig

PrefillLatency = Callable[[int], float]


class LatencyRef(Protocol):
    """What SLO assignment reads of a deployment (``accelgen.workloads.latency``)."""

    @property
    def prefill(self) -> PrefillLatency: ...
    @property
    def chunked_prefill(self) -> PrefillLatency | None: ...
    @property
    def t_pf(self) -> float | None: ...
    @property
    def decode(self) -> Callable[[int], float] | None: ...


@dataclass
class SLOs:
    ttft: np.ndarray
    tbt: np.ndarray
    jct: np.ndarray
    online: np.ndarray  # bool
    isolated_prefill: np.ndarray  # seconds, the request's own prompt, unchunked
    # online requests whose TTFT SLO < their own isolated prefill (one pass or S_pf chunks,
    # whichever is quicker)
    unattainable_ttft: int
    # online requests whose TTFT SLO < their chunked isolated prefill + T_pf (None: unknown)
    ttft_below_chunked: int | None = None
    # online requests whose drawn TBT SLO was below one isolated decode iteration (None: unknown)
    tbt_below_decode: int | None = None
    tbt_raised: int = 0  # of those, raised to the floor (isolated mode)


def isolated_prefill(prompt_len: np.ndarray, prefill_latency: PrefillLatency) -> np.ndarray:
    """Latency per request, calling ``prefill_latency`` once per distinct length."""
    uniq, inverse = np.unique(prompt_len, return_inverse=True)
    lat = np.empty(len(uniq))
    for j, p in enumerate(uniq):
        value = float(prefill_latency(int(p)))
        if not (math.isfinite(value) and value > 0):
            raise WorkloadError(f"prefill_latency({int(p)}) returned {value}; the cost model must "
                                "give a positive, finite latency")
        lat[j] = value
    return lat[inverse]


def group_mean(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per element: the mean of ``values`` over the elements of its group."""
    sums = np.bincount(groups, weights=values)
    counts = np.bincount(groups)
    return (sums / np.maximum(counts, 1))[groups]


def _chunked_reference(prompt_len: np.ndarray, ref: LatencyRef) -> np.ndarray | None:
    """Chunked isolated prefill + T_pf per request, or None without a deployment reference."""
    if ref.chunked_prefill is None or ref.t_pf is None:
        return None
    return isolated_prefill(prompt_len, ref.chunked_prefill) + ref.t_pf


def _decode_floor(prompt_len: np.ndarray, output_len: np.ndarray,
                  ref: LatencyRef) -> np.ndarray | None:
    """One isolated decode iteration at the request's longest context (prompt + output - 1)."""
    if ref.decode is None:
        return None
    return isolated_prefill(prompt_len + np.maximum(output_len - 1, 0), ref.decode)


def assign_slos(cfg: SLOConfig, prompt_len: np.ndarray, output_len: np.ndarray,
                latency: PrefillLatency | LatencyRef, seed: int) -> SLOs:
    """SLOs of every request. ``latency``: a deployment reference, or a bare unchunked prefill
    function (enough for ``group_mean``)."""
    ref: LatencyRef = _Bare(latency) if callable(latency) else latency
    n = len(prompt_len)
    iso = isolated_prefill(prompt_len, ref.prefill)
    chunked = _chunked_reference(prompt_len, ref)
    floor = _decode_floor(prompt_len, output_len, ref)
    if cfg.ttft_reference == "isolated":
        if chunked is None or floor is None:
            raise WorkloadError("slo.ttft_reference 'isolated' needs a deployment's cost model "
                                "(its pivot and decode latency); this trace has only a prefill "
                                "function (accelgen trace --deployment or --model/--hardware)")
        reference = chunked
    else:
        reference = group_mean(iso, prompt_len // cfg.length_group)

    ttft = reference * stream(seed, "slo", "ttft").uniform(*cfg.ttft_scale, size=n)
    tbt_rng = stream(seed, "slo", "tbt")
    if cfg.tbt_scale_kind == "set":
        scale = tbt_rng.choice(np.asarray(cfg.tbt_scale_set, float), size=n)
    else:
        scale = tbt_rng.uniform(*cfg.tbt_scale_range, size=n)
    tbt = cfg.tbt_base * scale
    below_decode = None if floor is None else tbt < floor
    raised = 0
    if cfg.ttft_reference == "isolated":
        assert floor is not None and below_decode is not None
        tbt = np.where(below_decode, cfg.tbt_floor_factor * floor, tbt)
    steps = np.maximum(output_len - 1, 0)
    jct = ttft + tbt * steps

    online = np.ones(n, bool)
    n_off = round(cfg.offline_fraction * n)
    offline_idx = stream(seed, "slo", "offline").permutation(n)[:n_off]
    off_scale = stream(seed, "slo", "offline_scale").uniform(*cfg.offline_jct_scale, size=n)
    if n_off:
        online[offline_idx] = False
        off = ~online
        jct[off] = off_scale[off] * (reference[off] + cfg.tbt_base * steps[off])
        ttft[off] = math.inf
        tbt[off] = math.inf
    # No scheduler prefills a request alone faster than the quicker of one pass and S_pf chunks
    # (a cost model may charge one long causal pass more than chunks over prior context).
    fastest = iso if chunked is None or ref.t_pf is None else np.minimum(iso, chunked - ref.t_pf)
    unattainable = int((online & (ttft < fastest)).sum())
    below_chunked = None if chunked is None else int((online & (ttft < chunked)).sum())
    n_below = None if below_decode is None else int((online & below_decode).sum())
    if cfg.ttft_reference == "isolated" and n_below is not None:
        raised = n_below
    return SLOs(ttft, tbt, jct, online, iso, unattainable, below_chunked, n_below, raised)


@dataclass(frozen=True)
class _Bare:
    """A bare prefill function as a reference without a deployment."""

    prefill: PrefillLatency
    chunked_prefill: PrefillLatency | None = None
    t_pf: float | None = None
    decode: Callable[[int], float] | None = None
