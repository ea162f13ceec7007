"""The engine sweep's capacity search (``accelgen.engine_regime.search``) on synthetic knees: the
coarse pass brackets, bisection narrows to the tolerance, bounds end it, the next repeat starts
where the last one ended; and the jitter rule of the plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelgen.engine_regime.run import jitter_summary, make_plan
from accelgen.engine_regime.search import SearchSpec, new_search, next_start
from accelgen.engine_regime.sweep_spec import JitterSpec
from accelgen.fidelity.check_spec import engine_deployment
from tests.engine_fakes import ENGINE, ENGINE_TERMS, KV_BLOCKS, fake_cfg


def knee(capacity: float, width: float = 0.05):
    """Attainment falling linearly from 1 to 0 over +-``width`` around a rate where it is 0.9."""
    def att(rate: float) -> float:
        x = (rate / capacity - 1.0) / width
        return float(np.clip(0.9 - 0.5 * x, 0.0, 1.0))
    return att


def run(search, att) -> None:
    while not search.done:
        r = search.next_rate()
        search.record(r, att(r))


@given(cap=st.floats(0.5, 40.0), start=st.floats(0.5, 40.0))
def test_search_brackets_the_knee_to_the_tolerance(cap: float, start: float) -> None:
    spec = SearchSpec(max_probes=20, min_load=0.01, max_load=100.0)
    s = new_search(spec, start, estimate=1.0, target=0.9, first=True)
    run(s, knee(cap))
    assert s.stopped_by == "bracketed"
    low, high = s.bracket()
    assert low is not None and high is not None
    assert low <= cap * 1.01 and high >= cap * 0.99  # the knee is inside (3-digit rates)
    assert high <= low * (1 + spec.tolerance) * 1.01
    value, where = s.capacity()
    assert where == "interpolated" and low <= value <= high
    assert value == pytest.approx(cap, rel=spec.tolerance)


def test_coarse_pass_then_bisection_and_the_next_repeat_starts_near() -> None:
    spec = SearchSpec(coarse_factor=2.0, fine_factor=1.1, tolerance=0.1, max_probes=10)
    s = new_search(spec, 1.0, estimate=1.0, target=0.9, first=True)
    run(s, knee(5.0))
    rates = [p.rate for p in s.probes]
    assert rates[:4] == [1.0, 2.0, 4.0, 8.0]  # coarse: doubling until a miss
    assert rates[4] == pytest.approx(math.sqrt(32), rel=1e-2)  # then the geometric middle
    nxt = new_search(spec, next_start(s, 1.0), estimate=1.0, target=0.9, first=False)
    run(nxt, knee(5.2))
    assert len(nxt.probes) <= 3 < len(s.probes)  # a later repeat: a few fine steps
    assert nxt.capacity()[0] == pytest.approx(5.2, rel=0.1)


def test_floor_and_ceiling_end_a_search_with_a_bound() -> None:
    spec = SearchSpec(coarse_factor=2.0, min_load=0.5, max_load=4.0, max_probes=10)
    low = new_search(spec, 2.0, estimate=1.0, target=0.9, first=True)
    run(low, lambda r: 0.2)
    assert low.stopped_by == "floor" and low.capacity() == (0.0, "below_sweep")
    assert [p.rate for p in low.probes] == [2.0, 1.0, 0.5]
    high = new_search(spec, 2.0, estimate=1.0, target=0.9, first=True)
    run(high, lambda r: 1.0)
    assert high.stopped_by == "ceiling" and high.capacity() == (4.0, "above_sweep")
    few = new_search(spec.model_copy(update={"max_probes": 2}), 2.0, 1.0, 0.9, first=True)
    run(few, lambda r: 1.0)
    assert few.stopped_by == "max_probes" and len(few.probes) == 2


def test_a_probe_at_another_rate_is_refused() -> None:
    s = new_search(SearchSpec(), 2.0, estimate=1.0, target=0.9, first=True)
    with pytest.raises(ValueError, match=r"2\.0 was asked for"):
        s.record(3.0, 1.0)


def test_jitter_rule_raises_the_base_only_when_the_host_needs_it() -> None:
    dep = engine_deployment(ENGINE, KV_BLOCKS, ENGINE_TERMS)
    cfg = fake_cfg()
    calm = make_plan(cfg, dep, jitter_summary([0.010] * 50 + [0.0101] * 50, cfg.jitter))
    assert not calm["tbt_base_raised"] and calm["tbt_base"] == calm["tbt_base_auto"]
    # p99 - p50 of 20 ms: the tightest class must be >= 10 x 20 ms = 200 ms.
    times = [0.010] * 98 + [0.030] * 2
    rough = make_plan(cfg, dep, jitter_summary(times, JitterSpec()))
    j = rough["jitter"]
    assert j["jitter_s"] == pytest.approx(0.020, rel=0.05)
    assert rough["tbt_base_raised"]
    tight = min(rough["tbt_classes"].values())
    assert tight == pytest.approx(10 * j["jitter_s"])
    # Every class keeps its proportion to the base.
    assert sorted(rough["tbt_classes"].values()) == pytest.approx(
        [s * rough["tbt_base"] for s in sorted(cfg.tbt_scale_set)])
    floor = make_plan(cfg, dep, jitter_summary([], JitterSpec(floor_ms=500)))
    assert min(floor["tbt_classes"].values()) == pytest.approx(0.5)
