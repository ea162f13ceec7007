"""Arrival times: Poisson, gamma (burstiness) or replayed timestamps (SPEC section 6)."""

from __future__ import annotations

import numpy as np

from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.loaders import load_timestamps
from accelgen.workloads.workload_spec import ArrivalConfig


def poisson(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process from t = 0: cumulative exponential gaps (never
    truncated: long gaps are part of the process)."""
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def gamma(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Gamma-distributed gaps with mean 1/rate and coefficient of variation ``cv``
    (shape k = 1/cv^2, scale = 1/(rate k)); cv = 1 is Poisson, cv > 1 is bursty."""
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))


def replay(timestamps: np.ndarray, n: int, speedup: float = 1.0, origin: str = "") -> np.ndarray:
    """The first ``n`` timestamps, shifted to start at 0 and compressed by ``speedup``."""
    if len(timestamps) < n:
        raise WorkloadError(f"{origin}: {len(timestamps)} timestamps to replay, "
                            f"{n} requests need them")
    t = np.asarray(timestamps[:n], float)
    return (t - t[0]) / speedup


def make_arrivals(cfg: ArrivalConfig, n: int, rng: np.random.Generator,
                  own_timestamps: np.ndarray | None = None, origin: str = "") -> np.ndarray:
    if cfg.kind == "poisson":
        return poisson(n, cfg.rate, rng)
    if cfg.kind == "gamma":
        return gamma(n, cfg.rate, cfg.cv, rng)
    if cfg.replay_path is not None:
        return replay(load_timestamps(cfg.replay_path), n, cfg.speedup, str(cfg.replay_path))
    if own_timestamps is None:
        raise WorkloadError(f"arrival.kind: 'replay' but {origin or 'the input'} has no "
                            "timestamps and no arrival.replay_path is given")
    return replay(own_timestamps, n, cfg.speedup, origin)
