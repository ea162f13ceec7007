"""The AccelGen table's dormant queue and the decision's compiled latency: shortcuts that must
not change a decision.

Waiting online prompts whose TTFT deadline has passed are *dormant* (``RequestTable``): kept in
arrival order apart from the active requests, passed over in blocks by the decision. With the
queue switched off every request is scanned at every decision; both must schedule the same. The
decision evaluates the analytic model's latency compiled (``roofline_time``); it must equal the
model's own ``iteration_time`` to the last bit."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import BatchShape
from accelgen.core.policy import Decision, SchedulerView
from accelgen.core.specs import Deployment
from accelgen.costmodel.analytic import AnalyticCostModel
from accelgen.costmodel.factory import make_cost_model
from accelgen.policies.accelgen import AccelGenPolicy
from accelgen.policies.accelgen.budget import compiled_roofline_time as _roofline_time
from accelgen.policies.registry import make_policy
from accelgen.sim.engine import SimulationResult
from tests.conftest import run_sim
from tests.invariants import table_mismatches
from tests.strategies import mixed_slo_traces, trace_requests


class DormantCount(AccelGenPolicy):
    """Records the most dormant requests the table held at a decision."""

    most_dormant = 0

    def schedule(self, view: SchedulerView) -> Decision:
        d = super().schedule(view)
        self.most_dormant = max(self.most_dormant, self._table.n_dormant)
        return d


def _policy(name: str, dormancy: bool) -> AccelGenPolicy:
    policy = make_policy(name)
    assert isinstance(policy, AccelGenPolicy)
    policy.__class__ = type("Counted", (DormantCount, type(policy)), {})
    policy.verify = table_mismatches  # the table's partition is checked at every decision
    if not dormancy:
        policy._table.dormancy = False
    return policy


def _outcome(res: SimulationResult) -> tuple[Any, ...]:
    return tuple((r.req_id, r.status, r.reject_reason, r.num_preemptions, r.finish_time,
                  tuple(r.token_times)) for r in res.requests)


def _both(name: str, trace: list[Any], num_blocks: int) -> tuple[AccelGenPolicy, SimulationResult]:
    runs = []
    for dormancy in (True, False):
        reqs, outs = trace_requests(trace)
        policy = _policy(name, dormancy)
        runs.append((policy, run_sim(reqs, outs, policy, num_blocks=num_blocks, block_size=16,
                                     s_pf=128)))
    (on, res_on), (off, res_off) = runs
    assert off.most_dormant == 0
    assert _outcome(res_on) == _outcome(res_off)
    assert res_on.iterations.to_frame().equals(res_off.iterations.to_frame())
    return on, res_on


@pytest.mark.parametrize("name", ["accelgen", "oracle"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_dormant_queue_decides_as_scanning_every_request(name: str, trace: list[Any],
                                                          num_blocks: int) -> None:
    _both(name, trace, num_blocks)


@pytest.mark.parametrize("name", ["accelgen", "oracle"])
def test_an_overload_makes_prompts_dormant_and_wakes_them(name: str) -> None:
    # 120 prompts in 0.6 s with 50 ms TTFTs on a small cache: most miss their TTFT while they
    # wait, a few arrive later with room to run; every one finishes in the end.
    trace = [(0.005 * i, 48 + 16 * (i % 7), 12 + (i % 5) * 8, 0.05, 0.05, None)
             for i in range(120)]
    trace += [(4.0 + 0.01 * i, 32, 4, 0.05, 0.1, None) for i in range(5)]
    policy, res = _both(name, trace, num_blocks=40)
    assert policy.most_dormant >= 50
    assert all(r.status.name == "FINISHED" for r in res.requests)


def test_dormancy_is_off_where_lost_prompts_are_not_last_in_arrival_order() -> None:
    for params, dormant in [({}, True), ({"lost_last": False}, False),
                            ({"late_is_urgent": True}, False), ({"order": False}, False)]:
        policy = make_policy("accelgen", params)
        assert isinstance(policy, AccelGenPolicy)
        assert policy._table.dormancy is dormant, params


_DEPLOYMENTS = [Deployment(model="opt-13b", hardware="a100", kv_cache_gb=12.0),
                Deployment(model="llama-3-70b", hardware="a100", tp=4, kv_cache_gb=20.0)]


@pytest.mark.parametrize("dep", _DEPLOYMENTS, ids=lambda d: d.model)
@settings(max_examples=200, deadline=None)
@given(prefill=st.lists(st.integers(min_value=1, max_value=8192), max_size=6),
       decode_ctx=st.lists(st.integers(min_value=1, max_value=32768), max_size=64))
def test_compiled_roofline_time_is_the_models_latency(dep: Deployment, prefill: list[int],
                                                      decode_ctx: list[int]) -> None:
    model = make_cost_model(dep)
    assert isinstance(model, AnalyticCostModel)
    terms = model.roofline_terms()
    shape = BatchShape()
    for n in prefill:  # chunks of n tokens after as many tokens of context
        shape.add_prefill(n, n)
    for ctx in decode_ctx:
        shape.add_decode(ctx)
    want = model.iteration_time(shape)
    got = _roofline_time(terms, shape.prefill_tokens, shape.prefill_seqs, shape.prefill_attn,
                         shape.decode_seqs, shape.decode_ctx)
    assert got == want or (math.isnan(got) and math.isnan(want))
    assert (want > 0) is bool(prefill or decode_ctx)

