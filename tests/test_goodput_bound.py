"""The bound that stops an Oracle candidate that cannot win (``experiments.goodput_bound``): at
every point of a run it is at least the run's final goodput, checking changes nothing, and a
search that stops candidates chooses the schedule, and writes the run, that the full search does."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen import metrics
from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.request import Request
from accelgen.core.specs import Deployment, ExperimentConfig, SimOptions
from accelgen.experiments import oracle_search
from accelgen.experiments.goodput_bound import CannotWin, GoodputBound
from accelgen.policies.registry import make_policy
from accelgen.results import requests_frame
from accelgen.sim import engine
from accelgen.sim.engine import Simulator
from tests.conftest import LinearCost, assert_same_results
from tests.strategies import mixed_slo_traces, trace_requests


def _sim(trace: list, policy: str, num_blocks: int, check: object = None) -> Simulator:
    reqs, outs = trace_requests(trace)
    cost = LinearCost()
    params = {"exact_lengths": True} if policy == "oracle" else None
    return Simulator(reqs, outs, make_policy(policy, params), cost,
                     BlockManager(num_blocks, 16), Pivot(s_pf=128, t_pf=cost.forward_time(128)),
                     max_model_len=100_000, max_iterations=200_000, check=check,  # type: ignore[arg-type]
                     check_every=1)


@pytest.mark.parametrize("policy", ["accelgen", "oracle", "vllm", "sarathi", "edf"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_the_bound_holds_at_every_iteration_and_checking_changes_nothing(
        policy: str, trace: list, num_blocks: int) -> None:
    seen: list[float] = []
    bound = GoodputBound(best=0.0)

    def record(now: float, requests: list[Request]) -> None:
        seen.append(bound.bound(now, requests))
        bound(now, requests)  # (best 0: never stops)

    checked = _sim(trace, policy, num_blocks, record).run()
    plain = _sim(trace, policy, num_blocks).run()
    assert_same_results(checked, plain)
    pr = metrics.per_request(requests_frame(checked.requests, checked.served_output_len))
    final = float(metrics.goodput_series(pr).mean())
    # (checked before every decision from the second iteration on)
    assert len(seen) >= min(len(checked.iterations), 2) - 1
    assert all(b >= final for b in seen), (min(seen), final)
    # (the bound falls as the run goes: what is lost stays lost, the span only grows)
    assert all(b >= a for a, b in zip(seen[1:], seen, strict=False))
    assert bound.lost <= int((~pr["slo_met"]).sum())


def test_a_request_is_lost_only_when_no_later_token_can_save_it() -> None:
    """Online: a first token not come past its TTFT SLO, a late gap, a running request past its
    TBT SLO since its last token; offline: not done past its JCT SLO. Not before."""
    online = Request(req_id=0, arrival=1.0, prompt_len=10, ttft_slo=0.5, tbt_slo=0.125)
    offline = Request(req_id=1, arrival=1.0, prompt_len=10, online=False, jct_slo=2.0)
    bound = GoodputBound(best=0.0)
    assert bound.bound(1.5, [online, offline]) == 2.0 and bound.lost == 0  # exactly on the SLO
    online.first_token_time = 1.25
    online.token_times.extend([1.25, 1.375])
    assert bound.bound(1.5, [online, offline]) == 2.0 and bound.lost == 0
    assert bound.bound(1.51, [online, offline]) == 1.0 and bound.lost == 1  # next token too late
    assert bound.bound(3.01, [online, offline]) == 0.0 and bound.lost == 2  # JCT passed, not done
    with pytest.raises(CannotWin, match="2 requests lost"):
        GoodputBound(best=0.5)(3.01, [online, offline])


def _trace(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompt, out = rng.integers(50, 1500, n), rng.integers(5, 300, n)
    ttft, tbt = rng.uniform(0.1, 1.0, n), rng.uniform(0.02, 0.3, n)
    return pd.DataFrame({
        "req_id": np.arange(n), "arrival": np.sort(rng.uniform(0, 2.0, n)), "source": "test",
        "prompt_len": prompt, "prompt_len_natural": prompt, "prompt_truncated": False,
        "output_len": out, "output_len_natural": out, "output_capped": False, "ttft_slo": ttft,
        "tbt_slo": tbt, "jct_slo": ttft + tbt * (out - 1), "online": True,
        "predicted_output_len": 150})


def test_a_search_that_stops_candidates_keeps_the_full_searchs_best_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked every iteration, candidates are stopped; the schedule chosen and its run are the
    full search's, every other schedule's row the same, a stopped one's bound above its goodput
    and below the best."""
    monkeypatch.setattr(engine, "CHECK_EVERY_ITERATIONS", 1)
    cfg = ExperimentConfig(deployment=Deployment(model="opt-13b", hardware="a100",
                                                 kv_cache_gb=1.0), sim=SimOptions(progress=False))
    grid = {"kv_plan": ["exact", "none"], "gamma": [0.25, 1.5]}
    stopped = 0
    for seed in (1, 2, 3):
        trace = _trace(24, seed)
        full = oracle_search.search(trace, cfg, grid, prune=False)
        pruned = oracle_search.search(trace, cfg, grid)
        assert pruned.best_params == full.best_params and pruned.floor_won == full.floor_won
        pd.testing.assert_frame_equal(pruned.best.requests, full.best.requests)
        pd.testing.assert_frame_equal(pruned.best.iterations, full.best.iterations)
        assert pruned.best.summary == full.best.summary
        ran, cut = pruned.table[~pruned.table["stopped"]], pruned.table[pruned.table["stopped"]]
        assert not full.table["stopped"].any()
        pd.testing.assert_frame_equal(ran.drop(columns=["stopped"]).dropna(axis=1, how="all"),
                                      full.table.loc[ran.index].drop(columns=["stopped"])
                                      .dropna(axis=1, how="all"), check_dtype=False)
        best = full.table.loc[full.table["best"], "goodput_rps"].iloc[0]
        for i, row in cut.iterrows():
            assert full.table.loc[i, "goodput_rps"] <= row["goodput_bound"] < best
            assert math.isnan(row["goodput_rps"])
        stopped += len(cut)
    assert stopped > 0, "the traces must stop some candidate"
