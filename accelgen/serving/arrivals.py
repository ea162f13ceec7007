"""Arrival times at a request rate, as ``vllm bench serve`` makes them (``--request-rate``,
``--burstiness``, ``--seed``).

Inter-arrival times are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``
(``burstiness`` 1: a Poisson process; below 1 burstier, above 1 more even), accumulated from the
start of the run (the first request comes one interval after it), then scaled so that the last
one is exactly ``n / rate``: vLLM's normalisation, which keeps the achieved rate equal to the
asked one for any seed. A rate of ``inf`` sends everything at time 0. The draw comes from
NumPy's ``default_rng(seed)`` (vLLM draws from the global ``np.random`` state after its dataset
sampling), so the same seed gives the same shape here, not vLLM's exact times. The shape does
not depend on the rate: times at rate ``r`` are those at rate 1 divided by ``r``, so probes at
several rates (``capacity``) replay one pattern faster or slower.
"""

from __future__ import annotations

import math

import numpy as np


def request_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """``n`` non-decreasing arrival times (s) at ``rate`` requests per second."""
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 (or inf), got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if n == 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.ones(n)
    else:
        gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / burstiness,
                                                 size=n)
    unit = np.cumsum(gaps)
    return unit * (n / unit[-1]) / rate
