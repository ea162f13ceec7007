"""The compiled decision (``accelgen_kernel``) decides exactly as the vectorised classes.

``TwinAccelGen`` forms every decision of a simulation twice, with ``DecisionState`` and with the
kernel, on the same table, and compares the batch (slots, tokens, preemptions, the ERA owner, cut
chunks, budget, T_max, SLO_min) and the diagnostics; the run continues with one of the two, so
both are checked over the states that one produces."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.config import Deployment
from accelgen.costmodel.base import BatchShape
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.costmodel.profiles import kv_num_blocks, resolve_model
from accelgen.kvcache import BlockManager
from accelgen.policies import accelgen_kernel as kern
from accelgen.policies.accelgen import INFO_INDEX, INFO_KEYS, AccelGenPolicy, DecisionState
from accelgen.policies.base import Decision, InfoRow, SchedulerView
from accelgen.policies.registry import make_policy
from accelgen.request import Request
from accelgen.sim.engine import Simulator
from accelgen.vllm_integration.config import LinearCostModel, OnlineLinearCostModel
from accelgen.workloads import WorkloadConfig, build_trace, to_requests
from tests.conftest import run_sim
from tests.strategies import mixed_slo_traces, trace_requests


class TwinAccelGen(AccelGenPolicy):
    """AccelGen forming each decision both ways; ``use_kernel_result`` picks the one kept."""

    use_kernel_result = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compared = 0
        self.max_n = 0
        self.preemptions = 0

    def schedule(self, view: SchedulerView) -> Decision:
        bud, lc = self._prepare(view)
        t = self._table
        if t.n == 0:
            return super().schedule(view)
        vs = DecisionState(self, view, t, bud, lc)
        vf = vs.form()
        res = kern.decide(self, view, t, bud, lc)
        want = ([int(s) for s in vf.slots], [int(c) for c in vf.tokens],
                [int(s) for s in vf.preempted], int(vf.era_owner), [int(c) for c in vf.cut_chunks],
                int(vf.budget), float(vs.t_max), _nan_inf(float(vs.slo_min)))
        got = (res.slots, res.tokens, res.preempted, res.era_owner, res.cut_chunks, res.budget,
               res.t_max, _nan_inf(res.slo_min))
        assert _same(got, want), f"decision {self.compared} at t={view.now}: {got} != {want}"
        vi = vs.info(vf)
        assert list(vi) == list(res.info)
        for k in vi:
            assert vi[k] == res.info[k] or (math.isnan(vi[k]) and math.isnan(res.info[k])), \
                (self.compared, k, vi[k], res.info[k])
        self.compared += 1
        self.max_n = max(self.max_n, t.n)
        self.preemptions += len(res.preempted)
        if self.use_kernel_result:
            return self._kernel_decision(res.ints, res.vals)
        return self._decision(vs, vf)


def _nan_inf(x: float) -> float:
    return math.nan if not math.isfinite(x) else x


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_decision_of_batch_is_the_dataclass_with_an_info_row() -> None:
    """``Decision.of_batch`` skips the generated ``__init__``: it must still set every field
    (a field added to ``Decision`` later fails here until ``of_batch`` sets it too)."""
    reqs = [Request(req_id=i, arrival=0.0, prompt_len=8, ttft_slo=1.0, tbt_slo=0.1)
            for i in range(3)]
    values = np.arange(len(INFO_KEYS), dtype=np.float64)
    fast = Decision.of_batch([(reqs[0], 8), (reqs[1], 1)], [reqs[2]], INFO_INDEX, values)
    slow = Decision(scheduled=[(reqs[0], 8), (reqs[1], 1)], preempted=[reqs[2]],
                    info=InfoRow(INFO_INDEX, values.copy()))
    for f in dataclasses.fields(Decision):
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
    assert fast.swap_out is not slow.swap_out  # fresh lists, as the default factories give
    fast.info["adapter_budget"] = 9.0  # an entry under a new name goes to the row's extras
    assert fast.info.as_dict() == {**dict(zip(INFO_KEYS, values.tolist(), strict=True)),
                                   "adapter_budget": 9.0}
    assert fast.info["n_urgent"] == 6.0 and len(fast.info) == len(INFO_KEYS) + 1


def test_only_the_plain_linear_cost_model_offers_its_coefficients() -> None:
    assert LinearCostModel(0.01, 1e-4, 2e-7).linear_coefficients() == (0.01, 1e-4, 2e-7)
    assert OnlineLinearCostModel(0.01, 1e-4).linear_coefficients() == (0.01, 1e-4, 0.0)

    class Curved(LinearCostModel):
        def iteration_time(self, shape: BatchShape) -> float:
            return super().iteration_time(shape) ** 0.5

    assert Curved(0.01, 1e-4).linear_coefficients() is None
    assert make_cost_model(Deployment()).linear_coefficients() is None


def test_default_policy_uses_the_kernel_and_the_variants_do_not() -> None:
    pol = make_policy("accelgen")
    assert isinstance(pol, AccelGenPolicy) and pol.use_kernel
    for name in ("accelgen/order", "accelgen/chunk", "accelgen/batch"):
        p = make_policy(name)
        assert isinstance(p, AccelGenPolicy) and not p.use_kernel, name
    assert not AccelGenPolicy(budget_rule="model").use_kernel


PARAMS: list[dict[str, Any]] = [
    {},
    {"long_prompt_threshold": 200},
    {"long_prompt_threshold": 200, "era_scope": "request"},
    {"late_is_urgent": True},
    {"kv_growth_reserve": 0, "gamma": 0.0},
    {"spill_groups": False, "max_num_seqs": 3},
    {"lost_last": False},
    {"era": False, "budget_cap": 0.5},
    {"min_budget": 64, "kv_growth_reserve": 48},
]


@pytest.mark.parametrize("params", PARAMS, ids=[str(p or "default") for p in PARAMS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80),
       use_kernel_result=st.booleans(), linear=st.booleans())
def test_kernel_decides_as_the_vectorised_classes(params: dict[str, Any], trace: Any,
                                                  num_blocks: int, use_kernel_result: bool,
                                                  linear: bool) -> None:
    """``linear``: the vLLM plugin's cost model, which the kernel evaluates itself
    (``decide_linear``); otherwise T_max comes from the cost model between compiled calls."""
    reqs, outs = trace_requests(trace)
    pol = TwinAccelGen(**params)
    pol.use_kernel_result = use_kernel_result
    cost = LinearCostModel(0.01, 1e-4, 1e-7) if linear else None
    res = run_sim(reqs, outs, pol, num_blocks=num_blocks, block_size=16, s_pf=128, cost=cost)
    assert all(r.status.name in ("FINISHED", "REJECTED") for r in res.requests)
    # (every request rejected at arrival, e.g. longer than the KV: nothing to decide)
    assert pol.compared > 0 or all(r.status.name == "REJECTED" for r in res.requests)


@pytest.mark.parametrize(("use_kernel_result", "params"),
                         [(True, {}), (False, {}), (True, {"gamma": 0.0})])
def test_kernel_decides_as_the_vectorised_classes_on_an_overloaded_trace(
        use_kernel_result: bool, params: dict[str, Any]) -> None:
    """OPT-13B on the A100 cost model with the paper's 12 GB of KV, 8 req/s of the synthetic mix:
    queues of hundreds, urgent, late and lost requests, preemptions."""
    dep = Deployment()
    cost = make_cost_model(dep)
    cfg = WorkloadConfig(num_requests=250, seed=3)
    trace = build_trace(cfg, prefill_latency=cost.prefill_time, latency_name=cost.name).df
    reqs, out_len = to_requests(trace)
    kv = BlockManager(kv_num_blocks(dep), dep.block_size)
    pol = TwinAccelGen(**params)
    pol.use_kernel_result = use_kernel_result
    res = Simulator(reqs, out_len, pol, cost, kv, deployment_pivot(dep),
                    max_model_len=resolve_model(dep.model).max_model_len).run()
    assert pol.compared > 500
    assert pol.max_n > 150
    assert pol.preemptions > 0
    assert all(r.status.name in ("FINISHED", "REJECTED") for r in res.requests)
