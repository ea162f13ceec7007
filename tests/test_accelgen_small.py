"""The plain-Python decision path (``accelgen_small``) decides exactly as the vectorised one.

``TwinAccelGen`` forms every decision of a simulation twice, with ``DecisionState`` and with
``SmallDecisionState`` on the same table, and compares the batch (slots, tokens, preemptions, the
ERA owner, cut chunks, budget) and the diagnostics; the run continues with one of the two, so
both paths are checked over the states that path produces."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.config import Deployment
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.costmodel.profiles import kv_num_blocks, resolve_model
from accelgen.kvcache import BlockManager
from accelgen.policies.accelgen import SMALL_QUEUE, AccelGenPolicy, DecisionState
from accelgen.policies.accelgen_small import SmallDecisionState
from accelgen.policies.base import Decision, SchedulerView
from accelgen.policies.registry import make_policy
from accelgen.sim.engine import Simulator
from accelgen.workloads import WorkloadConfig, build_trace, to_requests
from tests.conftest import run_sim
from tests.strategies import mixed_slo_traces, trace_requests


class TwinAccelGen(AccelGenPolicy):
    """AccelGen forming each decision with both state classes; ``use_small`` picks the one kept."""

    use_small = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compared = 0
        self.max_n = 0

    def schedule(self, view: SchedulerView) -> Decision:
        bud, lc = self._prepare(view)
        t = self._table
        if t.n == 0:
            return super().schedule(view)
        formed = []
        for cls in (DecisionState, SmallDecisionState):
            state = cls(self, view, t, bud, lc)
            formed.append((state, state.form()))
        (vs, vf), (ss, sf) = formed
        got, want = _batch(sf, ss), _batch(vf, vs)
        assert got == want, f"decision {self.compared} at t={view.now}: {got} != {want}"
        vi, si = vs.info(vf), ss.info(sf)
        assert vi.keys() == si.keys()
        for k in vi:
            assert vi[k] == si[k] or (math.isnan(vi[k]) and math.isnan(si[k])), (k, vi[k], si[k])
        self.compared += 1
        self.max_n = max(self.max_n, t.n)
        st_, former = formed[1] if self.use_small else formed[0]
        return self._decision(st_, former)


def _batch(former: Any, state: Any) -> tuple[Any, ...]:
    return ([int(s) for s in former.slots], [int(c) for c in former.tokens],
            [int(s) for s in former.preempted], int(former.era_owner),
            [int(c) for c in former.cut_chunks], int(former.budget), float(state.t_max),
            float(state.slo_min))


def test_default_policy_uses_the_small_path_for_short_queues_only() -> None:
    pol = make_policy("accelgen")
    assert isinstance(pol, AccelGenPolicy) and pol._small_state is SmallDecisionState
    assert pol.small_queue == SMALL_QUEUE
    for name in ("accelgen/order", "accelgen/chunk", "accelgen/batch"):
        p = make_policy(name)
        assert isinstance(p, AccelGenPolicy) and p._small_state is None, name


PARAMS: list[dict[str, Any]] = [
    {},
    {"long_prompt_threshold": 200},
    {"long_prompt_threshold": 200, "era_scope": "request"},
    {"budget_rule": "model"},
    {"late_is_urgent": True},
    {"kv_growth_reserve": 0, "gamma": 0.0},
    {"spill_groups": False, "max_num_seqs": 3},
    {"lost_last": False},
    {"era": False, "budget_cap": 0.5},
]

@pytest.mark.parametrize("params", PARAMS, ids=[str(p or "default") for p in PARAMS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80),
       use_small=st.booleans())
def test_small_path_decides_as_the_vectorised_one(params: dict[str, Any], trace: Any,
                                                  num_blocks: int, use_small: bool) -> None:
    reqs, outs = trace_requests(trace)
    pol = TwinAccelGen(**params)
    pol.use_small = use_small
    res = run_sim(reqs, outs, pol, num_blocks=num_blocks, block_size=16, s_pf=128)
    assert all(r.status.name in ("FINISHED", "REJECTED") for r in res.requests)
    # (every request rejected at arrival, e.g. longer than the KV: nothing to decide)
    assert pol.compared > 0 or all(r.status.name == "REJECTED" for r in res.requests)


@pytest.mark.parametrize(("use_small", "params"), [(True, {}), (False, {}), (True, {"gamma": 0.0})])
def test_small_path_decides_as_the_vectorised_one_on_an_overloaded_trace(
        use_small: bool, params: dict[str, Any]) -> None:
    """OPT-13B on the A100 cost model with the paper's 12 GB of KV, 8 req/s of the synthetic mix:
    queues of hundreds, urgent, late and lost requests, preemptions."""
    dep = Deployment()
    cost = make_cost_model(dep)
    cfg = WorkloadConfig(num_requests=250, seed=3)
    trace = build_trace(cfg, prefill_latency=cost.prefill_time, latency_name=cost.name).df
    reqs, out_len = to_requests(trace)
    kv = BlockManager(kv_num_blocks(dep), dep.block_size)
    pol = TwinAccelGen(**params)
    pol.use_small = use_small
    res = Simulator(reqs, out_len, pol, cost, kv, deployment_pivot(dep),
                    max_model_len=resolve_model(dep.model).max_model_len).run()
    assert pol.compared > 500
    assert pol.max_n > 3 * SMALL_QUEUE  # far beyond the size the small path is used for
    assert sum(r.num_preemptions for r in res.requests) > 0
    assert all(r.status.name in ("FINISHED", "REJECTED") for r in res.requests)
