"""The closed loop's take-in compiled for decode runs (``loop_step.take_in``) is
``ClosedLoop.observe``, value for value (its normal quantile is ``NormalDist``'s), and a noisy
simulation whose decode runs AccelGen's closed loop decides in one call, taking in each step there,
gives the results of asking it step by step."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.specs import NoiseSpec
from accelgen.policies.accelgen import loop_step
from accelgen.policies.accelgen.closed_loop import ClosedLoop
from accelgen.policies.accelgen.state import LOOP_CHANGED, LOOP_SAME, LOOP_STATE
from accelgen.policies.registry import make_policy
from accelgen.sim.engine import Simulator
from tests.conftest import assert_same_results
from tests.test_sim_redecide import ANALYTIC, _NoisyCounted, _NoisyPerIteration, _requests

# One step: a finished online request of that many tokens, or a (predicted, measured) pair.
_ratio = st.one_of(st.floats(0.2, 5.0), st.just(1.0), st.just(1.0 + 5e-10),
                   st.floats(0.99, 1.01), st.sampled_from([0.0, -1.0, math.inf, math.nan]))
_step = st.one_of(st.integers(0, 500),
                  st.tuples(st.one_of(st.floats(1e-4, 0.5), st.sampled_from([0.0, math.inf])),
                            _ratio))


def _state(loop: ClosedLoop) -> tuple[Any, ...]:
    return (*loop.state(), loop.errors.tobytes())


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "jit"])
@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_step, max_size=120), window=st.integers(1, 40),
       every=st.integers(1, 9), target=st.sampled_from([0.5, 0.9, 0.99]),
       weight=st.sampled_from([0.05, 0.5, 1.0]))
def test_compiled_take_in_is_observe(compiled: bool, steps: list[Any], window: int, every: int,
                                     target: float, weight: float) -> None:
    """Two loops fed the same steps, one by ``observe``, the other by ``take_in`` on its state
    record, hold the same state after every step, bit for bit, and say alike whether it
    changed."""
    take_in = loop_step.take_in if compiled else loop_step.take_in.py_func
    asked, run = (ClosedLoop(target, weight, window, every) for _ in range(2))
    record = np.zeros(1, LOOP_STATE).view(np.recarray)
    scratch = np.zeros(window)
    for step in steps:
        if isinstance(step, int):
            asked.finished(step)
            run.finished(step)
            continue
        predicted, ratio = step
        measured = predicted * ratio
        changed = asked.observe(predicted, measured)
        record.view(np.ndarray)[0] = run.state()
        got = take_in(record[0], run.errors, scratch, predicted, measured)
        assert got in (LOOP_SAME, LOOP_CHANGED)
        run.set_state(record.view(np.ndarray)[0].item())
        assert (got == LOOP_CHANGED) == changed
        assert _state(run) == _state(asked)


def test_noisy_closed_loop_runs_are_decided_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under per-step noise the closed loop is never at rest; its decode runs are still decided in
    one call each, their steps taken in by the compiled run (not by ``ClosedLoop.observe``), with
    the results of the same simulation asked iteration by iteration."""
    observed = [0]
    observe = ClosedLoop.observe

    def counted(self: ClosedLoop, predicted: float, measured: float) -> bool:
        observed[0] += 1
        return observe(self, predicted, measured)

    rng = np.random.default_rng(5)
    specs = sorted([(float(a), int(p), int(o), int(k)) for a, p, o, k in zip(
        rng.uniform(0, 40, 16), rng.integers(20, 200, 16), rng.integers(100, 600, 16),
        rng.integers(0, 3, 16), strict=True)], key=lambda x: x[0])
    spec = NoiseSpec(kind="lognormal", step_sigma=0.1)
    results, python_steps = [], []
    for cls in (_NoisyCounted, _NoisyPerIteration):
        observed[0] = 0
        monkeypatch.setattr(ClosedLoop, "observe", counted)
        sim = Simulator(_requests(specs), [o for _, _, o, _ in specs],
                        make_policy("accelgen-closed"), cls(ANALYTIC, spec, seed=8),
                        BlockManager(400, 16), Pivot(s_pf=64, t_pf=ANALYTIC.forward_time(64)),
                        max_model_len=100_000, planning_cost=ANALYTIC)
        results.append(sim.run())
        python_steps.append(observed[0])
    assert_same_results(results[0], results[1])
    n = len(results[0].iterations)
    assert python_steps[1] >= n - 1  # (the reference: every step through ``observe``)
    assert python_steps[0] < 0.1 * n  # (the runs': most steps taken in compiled)


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "jit"])
def test_normal_quantile_is_normal_dist(compiled: bool) -> None:
    """The compiled fit's normal quantile is ``NormalDist().inv_cdf``, bit for bit, near the
    median and in both tails (the quantiles a request of one to millions of tokens reads)."""
    quantile = loop_step.normal_quantile if compiled else loop_step.normal_quantile.py_func
    rng = np.random.default_rng(1)
    ps = np.concatenate([rng.uniform(0.0, 1.0, 20_000), 1.0 - 10.0 ** rng.uniform(-16, -1, 10_000),
                         10.0 ** rng.uniform(-300, -1, 5_000), [0.5, 0.075, 0.925, 1e-300]])
    normal = NormalDist()
    ps = ps[(ps > 0.0) & (ps < 1.0)].tolist()
    assert [p for p in ps if quantile(p) != normal.inv_cdf(p)] == []
