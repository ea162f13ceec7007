"""Per-request SLO assignment (SPEC sections 2 and 6; rules in docs/workloads.md).

Online request i (prompt p_i tokens after truncation, n_i output tokens after the cap):
- TTFT SLO = mean isolated prefill latency of its length group x U[ttft_scale]. The group is
  floor(p_i / 512) and its mean is taken over the trace's requests in that group (the paper
  measured "the average prompt processing latency for each group").
- TBT SLO = tbt_base x scale, scale uniform over a set or U[range].
- JCT SLO (derived) = TTFT SLO + TBT SLO x (n_i - 1).
Offline request: no TTFT/TBT SLO (stored as +inf); JCT SLO = U[offline_jct_scale] x
(group mean isolated prefill + tbt_base x (n_i - 1)), i.e. a multiple of the time it would take
at reading speed after an average prefill.

Every draw comes from its own named stream, and all are drawn for every request whatever the
offline fraction, so changing one setting does not reshuffle the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from accelgen.workloads.config import SLOConfig
from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.rng import stream

PrefillLatency = Callable[[int], float]


@dataclass
class SLOs:
    ttft: np.ndarray
    tbt: np.ndarray
    jct: np.ndarray
    online: np.ndarray  # bool
    isolated_prefill: np.ndarray  # seconds, the request's own prompt
    unattainable_ttft: int  # online requests whose TTFT SLO < their own isolated prefill


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


def assign_slos(cfg: SLOConfig, prompt_len: np.ndarray, output_len: np.ndarray,
                prefill_latency: PrefillLatency, seed: int) -> SLOs:
    n = len(prompt_len)
    iso = isolated_prefill(prompt_len, prefill_latency)
    ref = group_mean(iso, prompt_len // cfg.length_group)

    ttft = ref * stream(seed, "slo", "ttft").uniform(*cfg.ttft_scale, size=n)
    tbt_rng = stream(seed, "slo", "tbt")
    if cfg.tbt_scale_kind == "set":
        scale = tbt_rng.choice(np.asarray(cfg.tbt_scale_set, float), size=n)
    else:
        scale = tbt_rng.uniform(*cfg.tbt_scale_range, size=n)
    tbt = cfg.tbt_base * scale
    steps = np.maximum(output_len - 1, 0)
    jct = ttft + tbt * steps

    online = np.ones(n, bool)
    n_off = round(cfg.offline_fraction * n)
    offline_idx = stream(seed, "slo", "offline").permutation(n)[:n_off]
    off_scale = stream(seed, "slo", "offline_scale").uniform(*cfg.offline_jct_scale, size=n)
    if n_off:
        online[offline_idx] = False
        off = ~online
        jct[off] = off_scale[off] * (ref[off] + cfg.tbt_base * steps[off])
        ttft[off] = math.inf
        tbt[off] = math.inf
    unattainable = int((online & (ttft < iso)).sum())
    return SLOs(ttft, tbt, jct, online, iso, unattainable)
