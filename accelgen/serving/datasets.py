"""Request sets for ``accelgen bench-serve`` besides a trace file, as ``vllm bench serve`` makes
them, and SLOs for them from a named class set (``workloads.slo_classes``).

``random_dataset``: ``num_prompts`` requests whose prompt and output lengths are uniform integers
in ``[floor(L x (1 - r)), ceil(L x (1 + r))]`` for the mean length ``L`` and range ratio ``r``
(``0 <= r < 1``; vLLM's ``--random-input-len``, ``--random-output-len``, ``--random-range-ratio``;
vLLM takes the tokenizer's special tokens off the prompt length first, none here: prompts are
token ids). The lengths come from the named stream ``("bench", "random")`` of the seed; the
prompts' ids are ``workloads.prompts.prompt_token_ids`` of each request id, as for a trace. The
set is a trace (``workloads.trace`` columns) with every arrival at 0 (``--request-rate`` spreads
them) and ``predicted_output_len`` the mean output length (what a user would tell the scheduler
to expect, not each request's own).

Without a class set the requests carry no SLOs: they are offline with a JCT SLO of
``adapter_config.MAX_SLO_S`` only to make a valid trace, and bench-serve sends no SLOs for them
and reports no attainment. ``with_slo_classes`` gives a request set (random or a trace) the SLOs
of a named class set instead of its own.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from accelgen.vllm_integration.adapter_config import MAX_SLO_S
from accelgen.workloads.rng import stream
from accelgen.workloads.slo_classes import draw_slo_classes
from accelgen.workloads.trace import validate_trace

RANDOM_SOURCE = "random"


def length_range(mean: int, range_ratio: float, what: str) -> tuple[int, int]:
    """``[low, high]`` (inclusive) of a length with mean ``mean`` and range ratio ``r``."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = math.floor(mean * (1 - range_ratio))
    high = math.ceil(mean * (1 + range_ratio))
    if low < 1:
        raise ValueError(f"--random-{what}-len {mean} with --random-range-ratio {range_ratio} "
                         f"allows {what} lengths below 1 (low end {low})")
    return low, high


def random_dataset(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                   seed: int) -> pd.DataFrame:
    """``num_prompts`` requests of random lengths, without SLOs (see the module docstring)."""
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    in_lo, in_hi = length_range(input_len, range_ratio, "input")
    out_lo, out_hi = length_range(output_len, range_ratio, "output")
    rng = stream(seed, "bench", "random")
    prompt = rng.integers(in_lo, in_hi + 1, size=num_prompts)
    out = rng.integers(out_lo, out_hi + 1, size=num_prompts)
    n = num_prompts
    return validate_trace(pd.DataFrame({
        "req_id": np.arange(n, dtype=np.int64), "arrival": np.zeros(n),
        "source": RANDOM_SOURCE, "prompt_len": prompt, "prompt_len_natural": prompt,
        "prompt_truncated": False, "output_len": out, "output_len_natural": out,
        "output_capped": False, "ttft_slo": math.inf, "tbt_slo": math.inf,
        "jct_slo": MAX_SLO_S, "online": False,
        "predicted_output_len": np.full(n, output_len, np.int64)}))


def with_slo_classes(trace: pd.DataFrame, name: str, seed: int
                     ) -> tuple[pd.DataFrame, dict[int, str]]:
    """``trace`` with the SLOs of the class set ``name`` (drawn with ``seed``), and each
    request's class name by req_id."""
    drawn = draw_slo_classes(name, trace["output_len"].to_numpy(), seed)
    out = trace.assign(online=drawn.online, ttft_slo=drawn.ttft_slo, tbt_slo=drawn.tbt_slo,
                       jct_slo=drawn.jct_slo)
    return validate_trace(out), dict(zip(trace["req_id"].tolist(), drawn.slo_class.tolist(),
                                         strict=True))
