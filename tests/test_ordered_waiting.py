"""Waiting queues kept in order across decisions (``OrderedWaiting``) decide exactly as sorting
at every decision does: EDF (its definition, ``EDFPolicy._schedule_sorted``) and Sarathi ordered
by slack."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen.policies.base import Decision, SchedulerView
from accelgen.policies.edf import EDFPolicy
from accelgen.policies.sarathi import SarathiPolicy
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


def _slack_sorted() -> SarathiPolicy:
    """Sarathi ordered by slack, sorting the waiting queue at every decision (the definition)."""
    policy = SarathiPolicy(order="slack", token_budget=64)
    policy._slack_order = None
    return policy


@settings(max_examples=60, deadline=None)
@given(trace=mixed_slo_traces, blocks=st.sampled_from([24, 40, 64]),
       max_num_seqs=st.sampled_from([2, 4, 128]))
def test_sarathi_slack_order_decides_as_the_definition(trace: list[Any], blocks: int,
                                                       max_num_seqs: int) -> None:
    runs = []
    for make in (lambda: SarathiPolicy(order="slack", token_budget=64,
                                       max_num_seqs=max_num_seqs),
                 _slack_sorted):
        policy = make()
        policy.params.max_num_seqs = max_num_seqs
        reqs, out = trace_requests(trace)
        runs.append(run_sim(reqs, out, policy, num_blocks=blocks, block_size=16))
    fast, ref = runs
    assert _outcome(fast) == _outcome(ref)
    assert fast.iterations.to_frame().equals(ref.iterations.to_frame())


def test_slack_ties_go_by_request_id() -> None:
    """Deadlines that differ but round to the same slack are ordered by req_id, as sorting by
    slack orders them."""
    from accelgen.policies.sarathi import _by_slack
    from tests.conftest import make_requests

    a, b, c = make_requests([(0.0, 10), (0.0, 10), (0.0, 10)])
    now = 2.0**53  # at this magnitude, deadlines 1 apart give the same slack
    entries = [(1.0, 2, c), (2.0, 0, a), (1e6, 1, b)]
    assert [r.req_id for r in _by_slack(entries, now)] == sorted(
        [0, 1, 2], key=lambda i: ({2: 1.0, 0: 2.0, 1: 1e6}[i] - now, i))
