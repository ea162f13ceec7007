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
from accelgen.core.request import Request, served_output_len
from accelgen.core.specs import Deployment, ExperimentConfig, PolicySpec, SimOptions
from accelgen.costmodel.analytic import roofline_time
from accelgen.costmodel.factory import make_cost_model
from accelgen.experiments import oracle_search
from accelgen.experiments.goodput_bound import CannotWin, GoodputBound, RemainingWork
from accelgen.policies.registry import make_policy
from accelgen.results import requests_frame
from accelgen.sim import engine
from accelgen.sim.engine import Simulator
from tests.conftest import LinearCost, assert_same_results
from tests.strategies import mixed_slo_traces, trace_requests

MAX_MODEL_LEN = 100_000


def _sim(trace: list, policy: str, num_blocks: int, check: object = None) -> Simulator:
    reqs, outs = trace_requests(trace)
    cost = LinearCost()
    params = {"exact_lengths": True} if policy == "oracle" else None
    return Simulator(reqs, outs, make_policy(policy, params), cost,
                     BlockManager(num_blocks, 16), Pivot(s_pf=128, t_pf=cost.forward_time(128)),
                     max_model_len=MAX_MODEL_LEN, max_iterations=200_000, check=check,  # type: ignore[arg-type]
                     check_every=1)


def _work(trace: list, num_blocks: int) -> RemainingWork:
    reqs, outs = trace_requests(trace)
    served = served_output_len(np.array([r.prompt_len for r in reqs]), outs, MAX_MODEL_LEN)
    by_id = [0] * len(reqs)
    for r, n in zip(reqs, served.tolist(), strict=True):
        by_id[r.req_id] = n
    return RemainingWork.of(reqs, by_id, num_blocks=num_blocks, block_size=16,
                            max_model_len=MAX_MODEL_LEN,
                            min_token_iteration_s=LinearCost().min_token_iteration_time())


@pytest.mark.parametrize("policy", ["accelgen", "oracle", "vllm", "sarathi", "edf"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_the_bound_holds_at_every_iteration_and_checking_changes_nothing(
        policy: str, trace: list, num_blocks: int) -> None:
    """With the work still to do priced (the tighter bound: without it the span is only
    shorter), on policies that reject no admitted request."""
    seen: list[float] = []
    bound = GoodputBound(best=0.0, work=_work(trace, num_blocks))
    assert bound.work is not None

    def record(now: float, requests: list[Request]) -> None:
        seen.append(bound.bound(now, requests))
        bound(now, requests)  # (best 0: never stops)

    checked = _sim(trace, policy, num_blocks, record).run()
    plain = _sim(trace, policy, num_blocks).run()
    assert_same_results(checked, plain)
    pr = metrics.per_request(requests_frame(checked.requests, checked.served_output_len))
    # (the work bound holds for a run that serves every request it admits)
    assert not (pr["status"] == "unfinished").any()
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


def test_the_work_still_to_do_counts_block_iterations_and_lengthens_the_span() -> None:
    """Per request, the blocks held summed over the iterations of its remaining tokens, as a
    token-by-token count gives; a long request not yet started pushes the end past ``now``."""
    reqs = [Request(req_id=i, arrival=0.0, prompt_len=37 if i < 4 else 1, ttft_slo=100.0,
                    tbt_slo=1.0) for i in range(5)]
    served = [50, 50, 50, 50, 3]

    def work(num_blocks: int, least: float = 0.5) -> RemainingWork:
        return RemainingWork.of(reqs, served, num_blocks=num_blocks, block_size=16,
                                max_model_len=1000, min_token_iteration_s=least)

    six = work(6)  # (37 + 50 tokens: 6 blocks, the whole cache)
    for rid in (0, 4):
        prompt = reqs[rid].prompt_len
        for emitted in range(served[rid] + 1):
            brute = sum((prompt + j - 2) // 16 for j in range(emitted + 1, served[rid] + 1))
            assert six.block_iterations(rid, emitted) == brute
            if emitted == 0:
                assert six.unstarted[rid] == brute
    assert six.unstarted[0] == 166
    assert GoodputBound(best=0.0).bound(1.0, reqs) == 5.0  # (no completion yet: one window)
    # (4 x 166 block-iterations over 6 blocks: 111 iterations of 0.5 s, beyond 50 tokens)
    assert GoodputBound(best=0.0, work=six).bound(1.0, reqs) == 5.0 / math.ceil(
        (1.0 + 111 * 0.5) * (1 - 1e-6))
    # (with room for all: the longest request's 50 tokens)
    assert GoodputBound(best=0.0, work=work(600)).bound(1.0, reqs) == 5.0 / math.ceil(
        (1.0 + 50 * 0.5) * (1 - 1e-6))
    # (a request that never fits is rejected, not served: no work)
    assert not work(5).admitted[0] and work(5).admitted[4]
    assert GoodputBound(best=0.0, work=work(6, least=0.0)).work is None  # (no least time)


def test_the_least_token_iteration_is_below_every_iteration_of_the_roofline() -> None:
    rng = np.random.default_rng(0)
    for model in ("opt-13b", "llama-3-70b"):
        cost = make_cost_model(Deployment(model=model, hardware="a100",
                                          tp=1 if model == "opt-13b" else 4))
        least = cost.min_token_iteration_time()
        assert least > 0.0
        shapes = [(0, 0, 0.0, 1, 0), (1, 1, 0.0, 0, 0), (1, 1, 1.0, 0, 0)]
        for _ in range(200):
            pf = int(rng.integers(0, 4096))
            shapes.append((pf, int(rng.integers(1, 4)) if pf else 0,
                           float(pf * (pf + 1) / 2 + rng.integers(0, 10**6)) if pf else 0.0,
                           int(rng.integers(0 if pf else 1, 256)), int(rng.integers(0, 10**6))))
        for shape in shapes:
            assert roofline_time(cost.roofline_terms(), *shape) >= least, shape


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


def test_a_point_whose_schedule_is_an_earlier_ones_is_not_simulated_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no request can be a long prompt, points that differ only in ERA's scope make one
    schedule: the search simulates the first and gives the other the same row, stopped where
    its own run would have been (checked every iteration); the table and the best run are those
    of the search that simulates every point. Where long prompts are, nothing is shared, and
    the scope does change a schedule there."""
    monkeypatch.setattr(engine, "CHECK_EVERY_ITERATIONS", 1)
    cfg = ExperimentConfig(deployment=Deployment(model="opt-13b", hardware="a100",
                                                 kv_cache_gb=1.0), sim=SimOptions(progress=False))
    # (ERA's scope first, so that each point in request scope is checked against a bar the
    # points between it and its twin may have raised)
    grid = {"era_scope": ["prefill", "request"], "kv_plan": ["exact", "none"],
            "gamma": [0.25, 1.5]}
    stopped_shared = 0
    for seed in (1, 2, 3):
        trace = _trace(24, seed)  # (prompt and output under 1,800 tokens: no long prompt)
        shared = oracle_search.search(trace, cfg, grid)
        alone = oracle_search.search(trace, cfg, grid, share=False)
        assert shared.same_as == {4: 0, 5: 1, 6: 2, 7: 3} and alone.same_as == {}
        pd.testing.assert_frame_equal(shared.table, alone.table)
        assert shared.best_params == alone.best_params
        assert shared.best.summary == alone.best.summary
        pd.testing.assert_frame_equal(shared.best.iterations, alone.best.iterations)
        stopped_shared += int(shared.table.loc[4:7, "stopped"].sum())
    assert stopped_shared > 0, "a shared row must be stopped from the earlier run's checks"
    # In processes (every point checked against the floor's goodput; a stopped run comes back
    # pickled): the same.
    trace = _trace(24, 1)
    shared = oracle_search.search(trace, cfg, grid, processes=2)
    alone = oracle_search.search(trace, cfg, grid, processes=2, share=False)
    pd.testing.assert_frame_equal(shared.table, alone.table)
    assert len(shared.same_as) == 4 and shared.table["stopped"].any()

    long_cfg = cfg.model_copy(update={"policy": PolicySpec(
        name="oracle", params={"long_prompt_threshold": 600})})
    differ = 0
    for seed in (1, 2, 3):
        trace = _trace(24, seed)
        res = oracle_search.search(trace, long_cfg, grid, prune=False)
        assert res.same_as == {}
        t = res.table.drop(columns=["param_era_scope"])
        differ += not t.iloc[:4].reset_index(drop=True).equals(t.iloc[4:8].reset_index(drop=True))
    assert differ > 0, "with long prompts, ERA's scope must change some schedule"
    no_era = [{"era": False, "era_scope": scope} for scope in ("prefill", "request")]
    assert oracle_search.same_schedules(no_era, _trace(4, 1).assign(prompt_len=5000)) == {1: 0}
