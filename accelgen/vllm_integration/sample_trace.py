"""Small synthetic traces for the tiny CPU engine: Poisson arrivals, prompt lengths in buckets,
online requests with mixed TTFT/TBT SLOs and offline ones with a JCT SLO.

The embedded paper workload needs thousands of KV tokens per request; the tiny engine runs with
a few dozen KV blocks, so its tests, the stock-vs-AccelGen comparison and the fidelity check
(``accelgen.fidelity.check_spec.make_trace``) use these instead. SLO ranges are parameters
because a step of the tiny model takes 3-5 ms on an idle core and 10-20x that on a shared one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from accelgen.workloads.trace import validate_trace

OfflineJCT = tuple[float, float] | Callable[[np.ndarray], np.ndarray]


def mixed_slo_trace(n: int = 50, rate: float = 25.0, seed: int = 0, *,
                    buckets: Sequence[tuple[int, int, float]] = (
                        (16, 96, 0.5), (96, 256, 0.35), (256, 512, 0.15)),
                    source_names: Sequence[str] = ("alpaca", "sharegpt", "bookcorpus"),
                    output_range: tuple[int, int] = (8, 48), online_share: float = 0.8,
                    ttft_range: tuple[float, float] = (0.1, 0.6),
                    tbt_choices: Sequence[float] = (0.02, 0.05, 0.1),
                    offline_jct: OfflineJCT = (2.0, 8.0),
                    predicted_output_len: int = 28) -> pd.DataFrame:
    """``n`` requests at ``rate`` req/s. A request's prompt length is uniform in [lo, hi) of a
    bucket (lo, hi, share) drawn by share; its source is the bucket's name (the last name for
    buckets beyond the names). Outputs are uniform in [output_range). An offline request's JCT
    SLO is uniform in ``offline_jct`` or ``offline_jct(output lengths)``."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    share = np.array([b[2] for b in buckets], dtype=float)
    group = rng.choice(len(buckets), n, p=share / share.sum())
    lo = np.array([b[0] for b in buckets])[group]
    hi = np.array([b[1] for b in buckets])[group]
    prompt = rng.integers(lo, hi)
    out = rng.integers(*output_range, n)
    online = rng.random(n) < online_share
    ttft = np.where(online, rng.uniform(*ttft_range, n), np.inf)
    tbt = np.where(online, rng.choice(np.asarray(tbt_choices, float), n), np.inf)
    offline = offline_jct(out) if callable(offline_jct) else rng.uniform(*offline_jct, n)
    jct = np.where(online, ttft + tbt * (out - 1), offline)
    names = np.asarray(source_names)
    df = pd.DataFrame({
        "req_id": np.arange(n, dtype=np.int64), "arrival": arrival,
        "source": names[np.minimum(group, len(names) - 1)],
        "prompt_len": prompt, "prompt_len_natural": prompt, "prompt_truncated": False,
        "output_len": out, "output_len_natural": out, "output_capped": False,
        "ttft_slo": ttft, "tbt_slo": tbt, "jct_slo": jct, "online": online,
        "predicted_output_len": np.full(n, predicted_output_len, np.int64)})
    return validate_trace(df)
