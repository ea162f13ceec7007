"""Waiting queues kept in order across decisions (``OrderedWaiting``) decide exactly as sorting
at every decision does: EDF (its definition, ``EDFPolicy._schedule_sorted``) and Sarathi ordered
by slack."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen.core.policy import Decision, SchedulerView
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


# Many short requests at once beside a budget of a few tokens: the running set grows to
# dozens while a decision schedules a few, so EDF re-keys them one by one (``OrderedRunning``).
_crowded_traces = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=0.5, allow_nan=False),
              st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=60),
              st.sampled_from([0.02, 0.05, 0.2, 1.0]), st.sampled_from([0.05, 0.5, 3.0]),
              st.sampled_from([None, None, None, 2.0])),
    min_size=10, max_size=60)


@settings(max_examples=60, deadline=None)
@given(trace=_crowded_traces, budget=st.sampled_from([1, 2, 5]),
       blocks=st.sampled_from([30, 60, 400]))
def test_running_order_decides_as_the_definition(trace: list[Any], budget: int,
                                                 blocks: int) -> None:
    runs = []
    for cls in (EDFPolicy, SortedEDF):
        reqs, out = trace_requests(trace)
        runs.append(run_sim(reqs, out, cls(token_budget=budget), num_blocks=blocks,
                            block_size=4))
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


# One operation on a need index: ("add", key, need), ("remove", index into the live entries),
# or ("first", key, free).
_need_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40), st.integers(0, 20)),
    st.tuples(st.just("remove"), st.integers(0, 1_000)),
    st.tuples(st.just("first"), st.integers(0, 45), st.integers(-1, 25))), max_size=80)


@settings(max_examples=200, deadline=None)
@given(ops=_need_ops, max_need=st.sampled_from([20, 21, 31, 100]))
def test_need_index_finds_the_first_fitting_entry(ops: list[tuple], max_need: int) -> None:
    """``NeedIndex.first`` against a pass over every entry (needs 0-20, equal keys told apart
    by req_id, free blocks below, within and beyond the needs held)."""
    from accelgen.policies.common import NeedIndex
    from tests.conftest import make_requests

    index = NeedIndex(max_need=max_need)
    live: list[tuple[tuple[float, int, object], int]] = []  # (entry, need), insertion order
    next_id = 0
    for op in ops:
        if op[0] == "add":
            (r,) = make_requests([(0.0, 1)])
            entry = (float(op[1]), next_id, r)
            next_id += 1
            index.add(entry, op[2])
            live.append((entry, op[2]))
        elif op[0] == "remove" and live:
            entry, need = live.pop(op[1] % len(live))
            index.remove(entry[:2], need)
        elif op[0] == "first":
            key = (float(op[1]), -1)
            expected = min((e for e, need in live if e[:2] >= key and need <= op[2]),
                           default=None, key=lambda e: e[:2])
            assert index.first(key, op[2]) is expected


@settings(max_examples=100, deadline=None)
@given(specs=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 3000)), min_size=1,
                      max_size=40),
       queries=st.lists(st.tuples(st.integers(0, 45), st.integers(0, 3000)), max_size=10))
def test_ordered_waiting_fitting_positions(specs: list[tuple[int, int]],
                                           queries: list[tuple[int, int]]) -> None:
    """``OrderedWaiting.fitting``: the first position from ``start`` on whose request needs at
    most ``free`` blocks, also after the index grew for needs beyond its first size (block
    size 1: a prompt of p tokens needs p blocks)."""
    from accelgen.policies.common import OrderedWaiting
    from tests.conftest import make_requests

    reqs = make_requests([(float(a), p) for a, p in specs])
    queue = OrderedWaiting(lambda r: r.arrival, by_need=True)
    for r in reqs:
        queue._add(r, 1)
    order = sorted(reqs, key=lambda r: (r.arrival, r.req_id))
    assert [e[2] for e in queue.entries] == order
    for start, free in queries:
        expected = next((i for i in range(start, len(order)) if order[i].prompt_len <= free),
                        len(order))
        assert queue.fitting(start, free) == expected
    for r in order[::2]:
        queue._remove(r)
    rest = order[1::2]
    for start, free in queries:
        expected = next((i for i in range(start, len(rest)) if rest[i].prompt_len <= free),
                        len(rest))
        assert queue.fitting(start, free) == expected


def test_edf_rekeys_a_token_that_comes_back_a_decision_late() -> None:
    """vLLM's async scheduling: a step's token comes back after the next decision, so a request
    decided two decisions ago changes its deadline though the last decision left it out. EDF's
    running order (``edf.OrderedRunning``) re-keys it and decides as its definition."""
    from accelgen.core.kvcache import BlockManager
    from accelgen.policies.edf import REKEY_SHARE
    from tests.conftest import make_requests, put_running, scheduler_view

    kv = BlockManager(num_blocks=80, block_size=16)
    # (and ten due later: few requests change per decision beside the running set, so it is
    # re-keyed one by one, not sorted anew)
    a, b, c, *later = (put_running(r, kv, 31, 2) for r in make_requests([(0.0, 30)] * 13))
    for r, last, tbt in ((a, 0.0, 1.0), (b, 0.0, 1.5), (c, 0.0, 2.0)):
        r.last_token_time, r.tbt_slo = last, tbt
    for r in later:
        r.last_token_time, r.tbt_slo = 0.0, 9.0
    assert 2 * REKEY_SHARE < 13
    fast, reference = EDFPolicy(token_budget=1), EDFPolicy(token_budget=1)

    def decide(now: float) -> list[int]:
        view = scheduler_view([], [a, b, c, *later], kv, now=now)
        want = reference._schedule_sorted(view)
        got = fast.schedule(view)
        assert [(r.req_id, n) for r, n in got.scheduled] == [
            (r.req_id, n) for r, n in want.scheduled]
        return [r.req_id for r, _ in got.scheduled]

    assert decide(0.0) == [a.req_id]
    a.last_token_time = 2.0  # the engine dates a's token in flight at its predicted end
    assert decide(0.1) == [b.req_id]
    a.last_token_time = 0.2  # a's token came back early, after the decision that left a out
    b.last_token_time = 2.0
    assert decide(0.2) == [a.req_id]  # a due at 1.2, before c's 2.0
