"""Property tests: random traces (online and offline requests) through AccelGen, each ablation
and parameter variants keep the simulator's invariants (``tests.invariants``): KV within capacity,
every request finished or rejected with a reason, each finished request emitted exactly its
capped output length, increasing token times, forward size = sum of scheduled tokens. Also: the
policy's arrays mirror the requests at every decision, requests that fit finish, and ERA keeps at
most one long prompt in prefill."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accelgen.core.policy import Decision, SchedulerView
from accelgen.core.specs import Deployment
from accelgen.costmodel.factory import make_cost_model
from accelgen.policies.accelgen import AccelGenPolicy
from accelgen.policies.registry import make_policy
from tests.conftest import run_sim
from tests.invariants import RecordingPolicy, check_invariants, table_mismatches
from tests.strategies import mixed_slo_traces, trace_requests

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("accelgen", {}),
    ("accelgen/order", {}),
    ("accelgen/chunk", {}),
    ("accelgen/batch", {}),
    ("accelgen", {"era_scope": "prefill", "long_prompt_threshold": 200}),
    ("accelgen", {"long_prompt_threshold": 200}),
    ("accelgen", {"budget_rule": "model"}),
    ("accelgen", {"budget_rule": "paper"}),
    ("accelgen", {"late_is_urgent": True}),
    ("accelgen", {"kv_growth_reserve": 0, "gamma": 0.0}),
    ("accelgen", {"spill_groups": False, "max_num_seqs": 3}),
    ("accelgen/chunk", {"long_prompt_threshold": 200, "budget_cap": 0.5}),
]

class EraCheck(RecordingPolicy):
    """Records the most long prompts in prefill at once (started, prefill not complete)."""

    def __init__(self, inner: AccelGenPolicy) -> None:
        super().__init__(inner)
        self.threshold = inner.params.long_prompt_threshold
        self.most_long = 0

    def schedule(self, view: SchedulerView) -> Decision:
        d = super().schedule(view)
        starting = {r.req_id for r, _ in d.scheduled}
        n = sum(1 for r in [*view.waiting, *view.running]
                if r.prompt_len + r.num_output_tokens >= self.threshold and r.num_new_tokens > 1
                and (r.num_computed_tokens > 0 or r.req_id in starting))
        self.most_long = max(self.most_long, n)
        return d


@pytest.mark.parametrize(("name", "params"), VARIANTS,
                         ids=[f"{n}{p or ''}" for n, p in VARIANTS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_invariants_hold(name: str, params: dict[str, Any], trace, num_blocks: int) -> None:
    reqs, outs = trace_requests(trace)
    inner = make_policy(name, params)
    assert isinstance(inner, AccelGenPolicy)
    inner.verify = table_mismatches  # raises inside schedule() if the arrays drift from the requests
    policy = EraCheck(inner)
    res = run_sim(reqs, outs, policy, num_blocks=num_blocks, block_size=16, s_pf=128)
    check_invariants(res, policy)
    for r in res.requests:
        if r.prompt_len + outs[r.req_id] <= num_blocks * 16:
            assert r.status.name == "FINISHED", (name, params, r.req_id, r.reject_reason)
    if inner.params.era:
        assert policy.most_long <= 1


_OPT13B = Deployment(model="opt-13b", hardware="a100", kv_cache_gb=12.0)


# FCFS (/Order): a loose prompt chunk fills most of the budget, then a later group with a 20 ms
# TBT would lower it below what is already in the batch (it must not join, nor claim SLO_min).
_LATER_GROUP_TIGHTER = [(0.5, 16, 1, 0.2, 0.5, None), (1.773, 47, 20, 0.02, 0.5, None),
                        (0.0, 100, 50, 0.2, 0.5, None), (0.5, 64, 66, 0.2, 0.05, None),
                        (0.5, 304, 76, 0.05, 3.0, None), (0.5, 16, 1, 0.05, 0.5, None),
                        (0.0, 16, 1, 0.2, 3.0, None)]


@pytest.mark.parametrize("name", ["accelgen", "accelgen/order", "accelgen/batch", "oracle"])
@pytest.mark.parametrize("cost_kind", ["linear", "analytic"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
@example(trace=_LATER_GROUP_TIGHTER, num_blocks=28)
def test_batch_budget_iterations_fit_slo_min(name: str, cost_kind: str, trace,
                                             num_blocks: int) -> None:
    """Budget rule ``batch`` (default): when the cost model is the simulator's, no iteration
    takes longer than the SLO_min it was planned for, unless the budget was at its minimum (then
    nothing could save that token); and the budget is a real one (the analytic model is asked
    for latencies mid-decision, also when a later slack group lowers SLO_min)."""
    reqs, outs = trace_requests(trace)
    cost = None if cost_kind == "linear" else make_cost_model(_OPT13B)
    res = run_sim(reqs, outs, make_policy(name), num_blocks=num_blocks, block_size=16,
                  s_pf=128, cost=cost)
    its = res.iterations.to_frame()
    if len(its) == 0:  # every request rejected up front (larger than the KV)
        return
    assert (its["info_token_budget"] >= 1).all()
    planned = its[(its["info_budget_clamped_low"] == 0) & (its["info_slo_min"] < 1e9)]
    late = planned[planned["latency"] > planned["info_slo_min"] + 1e-12]
    assert late.empty, late[["latency", "info_slo_min", "info_token_budget"]].head()


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.one_of(st.sampled_from([0.0, 1.0, -2.5, float("nan")]),
                               st.floats(allow_nan=True, allow_infinity=True)), max_size=300),
       presorted=st.booleans(), descending=st.booleans())
def test_the_decisions_sort_is_numpys_stable_sort(keys: list[float], presorted: bool,
                                                  descending: bool) -> None:
    """``rank._merge_sort`` (the decision's queue order) orders slots as numpy's stable sort
    does, NaN last and ties in their given order, whether the queue comes in order or not."""
    import numpy as np

    from accelgen.policies.accelgen import rank

    column = np.array(keys, dtype=np.float64)
    if presorted:
        column = np.sort(column, kind="stable")
    m = len(column)
    slots = np.arange(m, dtype=np.int64)[::-1].copy()  # (slot numbers unrelated to positions)
    gathered = -column if descending else column.copy()
    expected = slots[np.argsort(gathered, kind="stable")]
    rank._merge_sort(gathered, slots, m, np.empty(m + 1), np.empty(m + 1, np.int64))
    assert slots.tolist() == expected.tolist()
