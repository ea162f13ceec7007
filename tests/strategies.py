"""Hypothesis strategies shared by the policy property tests."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from accelgen.core.request import Request
from tests.conftest import make_requests

# (arrival, prompt tokens, output tokens, TBT SLO, TTFT SLO, offline JCT SLO or None for online)
mixed_slo_traces = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=3.0, allow_nan=False),  # arrival
        st.integers(min_value=1, max_value=600),  # prompt tokens
        st.integers(min_value=1, max_value=80),  # output tokens
        st.sampled_from([0.02, 0.05, 0.2, 1.0]),  # tbt slo
        st.sampled_from([0.05, 0.5, 3.0]),  # ttft slo
        st.sampled_from([None, None, None, 2.0, 30.0]),  # offline JCT SLO (None: online)
    ),
    min_size=1, max_size=40,
)


def trace_requests(trace: list[Any]) -> tuple[list[Request], list[int]]:
    """Requests (ids in arrival order) and their true output lengths from a ``mixed_slo_traces``
    example: online ones with TTFT/TBT SLOs (JCT = TTFT + TBT per later token), offline ones
    with a JCT SLO and a predicted (not true) output length of 40."""
    trace = sorted(trace, key=lambda x: x[0])
    reqs = make_requests([(a, p) for a, p, *_ in trace])
    for r, (_, _, out, tbt, ttft, jct) in zip(reqs, trace, strict=True):
        r.tbt_slo, r.ttft_slo = tbt, ttft
        if jct is not None:
            r.online, r.ttft_slo, r.tbt_slo, r.jct_slo = False, math.inf, math.inf, jct
            r.predicted_output_len = 40
        else:
            r.jct_slo = ttft + tbt * (out - 1)
    return reqs, [o for _, _, o, *_ in trace]
