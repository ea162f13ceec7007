"""EDF's waiting queue, kept in deadline order across decisions, decides exactly as sorting every
candidate at every decision does (the definition, ``EDFPolicy._schedule_sorted``)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen.policies.base import Decision, SchedulerView
from accelgen.policies.edf import EDFPolicy
from tests.conftest import run_sim
from tests.strategies import mixed_slo_traces, trace_requests


class SortedEDF(EDFPolicy):
    """EDF deciding by the definition at every decision."""

    def schedule(self, view: SchedulerView) -> Decision:
        return self._schedule_sorted(view)


def _outcome(res: Any) -> list[tuple]:
    return [(r.req_id, r.status, r.num_preemptions, tuple(r.token_times)) for r in res.requests]


@settings(max_examples=60, deadline=None)
@given(trace=mixed_slo_traces, budget=st.sampled_from([32, 64, 256]),
       blocks=st.sampled_from([24, 40, 64]), max_num_seqs=st.sampled_from([2, 4, 256]))
def test_queue_decides_as_the_definition(trace: list[Any], budget: int, blocks: int,
                                         max_num_seqs: int) -> None:
    params = {"token_budget": budget, "max_num_seqs": max_num_seqs}
    runs = []
    for cls in (EDFPolicy, SortedEDF):
        reqs, out = trace_requests(trace)
        runs.append(run_sim(reqs, out, cls(**params), num_blocks=blocks, block_size=16))
    fast, ref = runs
    assert _outcome(fast) == _outcome(ref)
    assert fast.iterations.to_frame().equals(ref.iterations.to_frame())
