"""The simulator runs a decode-only decision again without asking the policy when the policy
declares it repeats (``Policy.repeats``, Orca and EDF): every result is the one asking at every
iteration gives."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Request
from accelgen.core.specs import Deployment
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.factory import make_cost_model
from accelgen.policies.edf import EDFPolicy
from accelgen.policies.orca import OrcaPolicy
from accelgen.sim.engine import SimulationResult, Simulator
from tests.conftest import LinearCost, assert_same_results, make_requests

ANALYTIC = make_cost_model(Deployment(model="opt-13b", hardware="a100"))


class AskingOrca(OrcaPolicy):
    """Orca asked at every iteration (the definition the repeated iterations must match)."""

    def repeats(self, view: SchedulerView, decision: Decision) -> bool:
        return False


def _run(policy: OrcaPolicy, trace: list[tuple[float, int, int]], *, num_blocks: int,
         block_size: int, max_iterations: int | None, horizon_s: float | None,
         overhead: bool = False) -> SimulationResult:
    reqs = make_requests([(a, p) for a, p, _ in trace])
    cost = LinearCost()
    sim = Simulator(reqs, [o for *_, o in trace], policy, cost, BlockManager(num_blocks, block_size),
                    Pivot(s_pf=256, t_pf=cost.forward_time(256)), max_model_len=100_000,
                    max_iterations=max_iterations, horizon_s=horizon_s,
                    add_scheduler_overhead=overhead)
    return sim.run()


def _count_decisions(monkeypatch: pytest.MonkeyPatch, cls: type[Policy]) -> list[int]:
    """A counter (its one entry) of ``cls.schedule``'s calls from now on."""
    asked = [0]
    schedule = cls.schedule

    def counted(self: Policy, view: SchedulerView) -> Decision:
        asked[0] += 1
        return schedule(self, view)

    monkeypatch.setattr(cls, "schedule", counted)
    return asked


def _same(trace: list[tuple[float, int, int]], **kw: Any) -> tuple[SimulationResult, ...]:
    trace = sorted(trace, key=lambda x: x[0])
    params = {k: kw.pop(k) for k in ("max_batch_size", "max_seq_len")}
    fast = _run(OrcaPolicy(**params), trace, **kw)
    ref = _run(AskingOrca(**params), trace, **kw)
    assert_same_results(fast, ref)
    return fast, ref


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.lists(st.tuples(st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
                                st.integers(min_value=1, max_value=120),
                                st.integers(min_value=1, max_value=80)),
                      min_size=1, max_size=30),
       num_blocks=st.integers(min_value=4, max_value=40), block_size=st.sampled_from([4, 16]),
       max_batch_size=st.integers(min_value=1, max_value=4),
       max_seq_len=st.sampled_from([16, 48, 100, 8192]),
       max_iterations=st.sampled_from([None, 7, 150]),
       horizon_s=st.sampled_from([None, 0.5, 2.0]))
def test_repeated_decisions_give_the_results_of_asking(
        trace: list[tuple[float, int, int]], num_blocks: int, block_size: int,
        max_batch_size: int, max_seq_len: int, max_iterations: int | None,
        horizon_s: float | None) -> None:
    """Arrivals, finishes, block boundaries (a small max_seq_len: blocks on demand and the
    recompute valve), a stopped run and a horizon end a repeated run where asking would have
    seen them."""
    _same(trace, num_blocks=num_blocks, block_size=block_size, max_batch_size=max_batch_size,
          max_seq_len=max_seq_len, max_iterations=max_iterations, horizon_s=horizon_s)


def test_most_iterations_of_a_long_decode_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    trace = [(float(a), int(p), int(o)) for a, p, o in zip(
        np.sort(rng.uniform(0, 2, 20)), rng.integers(1, 100, 20), rng.integers(20, 200, 20),
        strict=True)]
    asked = _count_decisions(monkeypatch, OrcaPolicy)
    fast, _ = _same(trace, num_blocks=40, block_size=16, max_batch_size=2, max_seq_len=8192,
                    max_iterations=None, horizon_s=None)
    asked_fast = asked[0] - len(_.iterations)  # the reference asked once per iteration
    assert len(fast.iterations) > 1000 and asked_fast < len(fast.iterations) / 5
    # Decision time is not charged: with add_scheduler_overhead the policy is asked every time.
    asked[0] = 0
    trace = sorted(trace)
    _run(OrcaPolicy(max_batch_size=2), trace, num_blocks=40, block_size=16,
         max_iterations=None, horizon_s=None, overhead=True)
    assert asked[0] >= len(fast.iterations)
    assert not math.isnan(fast.end_time)


class AskingEDF(EDFPolicy):
    """EDF asked at every iteration."""

    def repeats(self, view: SchedulerView, decision: Decision) -> bool:
        return False


# TBT SLOs drawn from a few values, two of them closer than ``edf.ORDER_GAP_S``.
_TBTS = (0.05, 0.05 + 1e-9, 0.08, 0.2)


def _edf_requests(specs: list[tuple[float, int, int, int]]) -> list[Request]:
    return [Request(req_id=i, arrival=a, prompt_len=p, ttft_slo=1.0 if kind < 4 else math.inf,
                    tbt_slo=_TBTS[kind] if kind < 4 else math.inf,
                    jct_slo=math.inf if kind < 4 else 5.0, online=kind < 4)
            for i, (a, p, _, kind) in enumerate(specs)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(st.tuples(st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
                                st.integers(min_value=1, max_value=120),
                                st.integers(min_value=1, max_value=150),
                                st.integers(min_value=0, max_value=4)),
                      min_size=1, max_size=20),
       num_blocks=st.integers(min_value=6, max_value=60), block_size=st.sampled_from([4, 16]),
       token_budget=st.sampled_from([2, 64]), analytic=st.booleans(),
       max_iterations=st.sampled_from([None, 150]), horizon_s=st.sampled_from([None, 1.5]))
def test_edf_repeats_give_the_results_of_asking(
        specs: list[tuple[float, int, int, int]], num_blocks: int, block_size: int,
        token_budget: int, analytic: bool, max_iterations: int | None,
        horizon_s: float | None) -> None:
    """EDF's repeated decode steps (``EDFPolicy.repeats``; runs of them at once,
    ``Simulator._decode_run``, under the analytic model): online requests of equal, close and
    distant TBT SLOs and offline ones, a budget smaller than the batch, blocks running short."""
    specs = sorted(specs, key=lambda x: x[0])
    results = []
    for policy in (EDFPolicy(token_budget=token_budget), AskingEDF(token_budget=token_budget)):
        cost: CostModel = ANALYTIC if analytic else LinearCost()
        sim = Simulator(_edf_requests(specs), [o for _, _, o, _ in specs], policy, cost,
                        BlockManager(num_blocks, block_size),
                        Pivot(s_pf=64, t_pf=cost.forward_time(64)), max_model_len=100_000,
                        max_iterations=max_iterations, horizon_s=horizon_s)
        results.append(sim.run())
    assert_same_results(*results)


def test_most_of_edfs_decode_steps_served_alone_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    specs = [(float(a), int(p), int(o), int(k)) for a, p, o, k in zip(
        np.arange(10) * 20.0, rng.integers(1, 100, 10), rng.integers(50, 300, 10),
        rng.integers(0, 5, 10), strict=True)]
    asked = _count_decisions(monkeypatch, EDFPolicy)
    res = Simulator(_edf_requests(specs), [o for _, _, o, _ in specs], EDFPolicy(), ANALYTIC,
                    BlockManager(200, 16), Pivot(s_pf=64, t_pf=ANALYTIC.forward_time(64)),
                    max_model_len=100_000).run()
    assert len(res.iterations) > 1000 and asked[0] < len(res.iterations) / 5
