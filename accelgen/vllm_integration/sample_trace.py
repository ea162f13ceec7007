"""Small synthetic traces for the tiny CPU engine: Poisson arrivals, three prompt-length groups,
online requests with mixed TTFT/TBT SLOs and offline ones with a JCT SLO.

The embedded paper workload needs thousands of KV tokens per request; the tiny engine runs with
a few dozen KV blocks, so its tests and the stock-vs-AccelGen comparison use these instead. SLO
ranges are parameters because a step of the tiny model takes 3-5 ms on an idle core and 10-20x
that on a shared one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from accelgen.workloads.trace import validate_trace

_SOURCES = np.array(["alpaca", "sharegpt", "bookcorpus"])


def mixed_slo_trace(n: int = 50, rate: float = 25.0, seed: int = 0, *,
                    prompt_edges: Sequence[int] = (16, 96, 256, 512),
                    group_share: Sequence[float] = (0.5, 0.35, 0.15),
                    output_range: tuple[int, int] = (8, 48), online_share: float = 0.8,
                    ttft_range: tuple[float, float] = (0.1, 0.6),
                    tbt_choices: Sequence[float] = (0.02, 0.05, 0.1),
                    jct_range: tuple[float, float] = (2.0, 8.0),
                    predicted_output_len: int = 28) -> pd.DataFrame:
    """``n`` requests at ``rate`` req/s; prompt group g draws from [edges[g], edges[g+1])."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    group = rng.choice(len(group_share), n, p=np.asarray(group_share, float))
    edges = np.asarray(prompt_edges)
    prompt = rng.integers(edges[group], edges[group + 1])
    out = rng.integers(*output_range, n)
    online = rng.random(n) < online_share
    ttft = np.where(online, rng.uniform(*ttft_range, n), np.inf)
    tbt = np.where(online, rng.choice(np.asarray(tbt_choices, float), n), np.inf)
    jct = np.where(online, ttft + tbt * (out - 1), rng.uniform(*jct_range, n))
    df = pd.DataFrame({
        "req_id": np.arange(n), "arrival": arrival, "source": _SOURCES[group % 3],
        "prompt_len": prompt, "prompt_len_natural": prompt, "prompt_truncated": False,
        "output_len": out, "output_len_natural": out, "output_capped": False,
        "ttft_slo": ttft, "tbt_slo": tbt, "jct_slo": jct, "online": online,
        "predicted_output_len": predicted_output_len})
    return validate_trace(df)
