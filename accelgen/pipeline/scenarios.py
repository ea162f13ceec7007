"""Hand-built traces of two paper figures, written as Vidur/Sarathi length CSVs.

The pipeline replays them through ``accelgen trace`` (``kind: vidur_csv``, replayed arrivals),
so their SLOs are assigned exactly like those of every other trace.

- ``era`` (paper figure 6, "ERA vs Sarathi-Serve"): two long prompts (10,214 and 10,252 tokens)
  and 20 short ones (128-384 tokens). The long prompts arrive first, then the short ones, one
  every ``interval`` seconds.
- ``chunking`` (paper figure 2, welcome extra): ``num_others`` short requests arrive at time 0
  and are decoding when one ``long_prompt``-token prompt arrives; run with and without chunking.

Lengths inside the given ranges are drawn with ``numpy.random.default_rng(seed)``; the same
spec gives the same file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "arrived_at")


def _draw(rng: np.random.Generator, lo_hi: tuple[int, int] | list[int], n: int) -> np.ndarray:
    lo, hi = int(lo_hi[0]), int(lo_hi[1])
    return rng.integers(lo, hi + 1, size=n, dtype=np.int64)


def era_frame(long_prompts: list[int], num_short: int, short_range: tuple[int, int],
              output_range: tuple[int, int], long_output: int, interval: float,
              seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n_long = len(long_prompts)
    prompts = np.concatenate([np.asarray(long_prompts, dtype=np.int64),
                              _draw(rng, short_range, num_short)])
    outputs = np.concatenate([np.full(n_long, long_output, dtype=np.int64),
                              _draw(rng, output_range, num_short)])
    arrivals = np.arange(n_long + num_short, dtype=np.float64) * interval
    return pd.DataFrame({"num_prefill_tokens": prompts, "num_decode_tokens": outputs,
                         "arrived_at": np.round(arrivals, 9)})


def chunking_frame(long_prompt: int, long_output: int, num_others: int,
                   other_prompt_range: tuple[int, int], other_output_range: tuple[int, int],
                   seed: int = 0, long_arrival: float = 0.5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompts = np.concatenate([_draw(rng, other_prompt_range, num_others), [long_prompt]])
    outputs = np.concatenate([_draw(rng, other_output_range, num_others), [long_output]])
    arrivals = np.concatenate([np.zeros(num_others), [long_arrival]])
    return pd.DataFrame({"num_prefill_tokens": prompts.astype(np.int64),
                         "num_decode_tokens": outputs.astype(np.int64), "arrived_at": arrivals})


def scenario_frame(spec: dict[str, Any]) -> pd.DataFrame:
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind == "era":
        return era_frame(**spec)
    if kind == "chunking":
        return chunking_frame(**spec)
    raise ValueError(f"unknown scenario kind {kind!r} (known: era, chunking)")


def write_scenario(spec: dict[str, Any], out: Path | str) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    scenario_frame(spec).to_csv(tmp, index=False, columns=list(COLUMNS))
    os.replace(tmp, out)
    return out
