"""AccelGen's exact plan (SPEC 13): the token budget and the batch forming price the batch actually
formed, every prompt chunk with its per-sequence and attention terms, every decode with its context;
so in a deterministic simulation no iteration takes longer than the SLO it was planned within
(``info_planned_overrun``, ``summary.json``'s ``num_planned_overruns``). And the closed loop: with exact
predictions it plans as the open loop; with a slower engine it learns the ratio and a margin."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import CalibratedTerms, Deployment
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.calibrated import CalibratedCostModel
from accelgen.costmodel.factory import make_cost_model
from accelgen.policies.accelgen import AccelGenPolicy
from accelgen.policies.accelgen.budget import compiled_calibrated_time
from accelgen.policies.accelgen.closed_loop import ClosedLoop
from accelgen.policies.registry import make_policy
from tests.conftest import assert_same_results, run_sim
from tests.strategies import mixed_slo_traces, trace_requests

# The shape of regime `engine`'s calibration of vLLM's CPU engine: no weights floor, a per-sequence
# cost per prompt chunk comparable to a tight TBT class (T_max at the budget counts one chunk).
ENGINE = CalibratedTerms(overhead_s=4e-3, prefill_token_s=2.5e-5, prefill_seq_s=1.75e-3,
                         decode_token_s=6e-5, causal_pair_s=2e-9, context_pair_s=1e-9,
                         context_token_s=3e-8)
GPU = CalibratedTerms(overhead_s=2e-3, weights_s=17e-3, transition_p=1.7, prefill_token_s=1.2e-4,
                      prefill_seq_s=1e-4, decode_token_s=1.5e-4, causal_pair_s=1.6e-8,
                      context_pair_s=7e-9, context_token_s=4e-7, comm_token_s=5e-8)
_OPT13B = Deployment(model="opt-13b", hardware="a100", kv_cache_gb=12.0)


def _cost(kind: str) -> CostModel | None:
    if kind == "analytic":
        return make_cost_model(_OPT13B)
    return CalibratedCostModel(ENGINE) if kind == "engine" else None


@settings(max_examples=100, deadline=None)
@given(terms=st.sampled_from([ENGINE, GPU]), tp=st.sampled_from([1, 2]),
       prefill=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 4096)), max_size=6),
       decode_ctx=st.lists(st.integers(1, 32768), max_size=64))
def test_compiled_calibrated_time_is_the_models_latency(terms: CalibratedTerms, tp: int,
                                                        prefill: list[tuple[int, int]],
                                                        decode_ctx: list[int]) -> None:
    model = CalibratedCostModel(terms, 40, tp=tp)
    shape = BatchShape()
    for n, ctx in prefill:
        shape.add_prefill(n, ctx)
    for ctx in decode_ctx:
        shape.add_decode(ctx)
    got = compiled_calibrated_time(model.calibrated_consts(), shape.prefill_tokens, shape.prefill_seqs,
                                   shape.prefill_attn, shape.decode_seqs, shape.decode_ctx)
    assert got == model.iteration_time(shape)


@pytest.mark.parametrize("name", ["accelgen", "accelgen-closed", "accelgen/order", "accelgen/batch",
                                  "oracle"])
@pytest.mark.parametrize("cost_kind", ["linear", "analytic", "engine"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_no_planned_overruns_in_a_deterministic_simulation(name: str, cost_kind: str, trace,
                                                           num_blocks: int) -> None:
    """The decision prices its batch as the simulator charges it (to the last bit), and no iteration
    is charged more than the latency it was planned within."""
    reqs, outs = trace_requests(trace)
    res = run_sim(reqs, outs, make_policy(name), num_blocks=num_blocks, block_size=16, s_pf=128,
                  cost=_cost(cost_kind))
    its = res.iterations.to_frame()
    if len(its) == 0:
        return
    assert (its["latency"].to_numpy() == its["info_t_planned"].to_numpy()).all()
    over = its[its["info_planned_overrun"] != 0]
    assert over.empty, over[["latency", "info_plan_slo", "info_token_budget"]].head()
    planned = its[np.isfinite(its["info_plan_slo"])]
    assert (planned["latency"] <= planned["info_plan_slo"]).all()
    assert (its["info_time_scale"] == 1.0).all()


def test_the_engine_shape_plans_several_chunks_within_the_slo() -> None:
    """A decode with a 15 ms TBT, then six prompts: the budget that fits one chunk beside it (T_max)
    took two chunks, each charged the per-sequence cost, 1.6-1.7 ms over the SLO (3 iterations before
    the exact plan); the exact plan cuts the batch to the SLO. The paper's token budget does not price
    the batch: its planned iterations overrun, and the diagnostics say so."""
    trace = [(0.0, 64, 40, 0.015, 2.0, None)] + [(0.05 + 0.001 * i, 200, 8, 0.2, 5.0, None)
                                                 for i in range(1, 7)]
    for rule, overruns in (("batch", 0), ("paper", 3)):
        res = run_sim(*trace_requests(trace), make_policy("accelgen", {"budget_rule": rule}),
                      num_blocks=200, block_size=16, s_pf=512, cost=CalibratedCostModel(ENGINE))
        its = res.iterations.to_frame()
        planned = its[np.isfinite(its["info_plan_slo"])]
        late = planned["latency"] > planned["info_plan_slo"]
        assert int(late.sum()) == int((its["info_planned_overrun"] != 0).sum()) == overruns, rule
        assert its["num_prefill_seqs"].max() >= 2  # (several chunks do share iterations)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_the_closed_loop_plans_as_the_open_loop_when_predictions_are_exact(trace, num_blocks: int) -> None:
    reqs, outs = trace_requests(trace)
    open_loop = run_sim(reqs, outs, make_policy("accelgen"), num_blocks=num_blocks, block_size=16,
                        s_pf=128, cost=_cost("engine"))
    reqs, outs = trace_requests(trace)
    closed = make_policy("accelgen-closed")
    res = run_sim(reqs, outs, closed, num_blocks=num_blocks, block_size=16, s_pf=128,
                  cost=_cost("engine"))
    assert_same_results(open_loop, res)
    assert isinstance(closed, AccelGenPolicy) and closed.loop is not None
    assert closed.loop.scale == 1.0


def test_the_closed_loop_learns_a_slower_engine_and_its_spread() -> None:
    loop = ClosedLoop(target=0.9, weight=0.05, window=256)
    for _ in range(600):  # (the window forgets the errors made while the correction climbed)
        loop.observe(0.010, 0.013)
    assert loop.correction == pytest.approx(1.3, rel=1e-3)
    assert loop.margin < 1e-3  # a constant ratio: no spread left once corrected
    rng = np.random.default_rng(0)
    spread = ClosedLoop(target=0.9, weight=0.05, window=256)
    for _ in range(20):
        spread.finished(400)
    spread.finished(0)  # (never started: not counted)
    assert spread.tokens == 400
    errors = rng.lognormal(0.0, 0.1, 2000)
    for e in errors:
        spread.observe(0.010, 0.010 * e)
    # A request of 400 tokens is on time at 90 % if each iteration is at 1 - 0.1 / 400: the
    # lognormal's quantile there (z 3.48, 1.416) relative to its corrected median (~1)
    assert spread.quantile == pytest.approx(1 - 0.1 / 400)
    assert spread.margin == pytest.approx(math.expm1(NormalDist().inv_cdf(1 - 0.1 / 400) * 0.1),
                                          abs=0.06)
    assert spread.scale == pytest.approx(spread.correction * (1 + spread.margin))
    assert spread.tbt_shrink == pytest.approx(1 / (1 + spread.margin))
    # shorter requests overrun fewer times: a smaller margin for the same errors
    short = ClosedLoop(target=0.9, weight=0.05, window=256)
    short.finished(10)
    for e in errors:
        short.observe(0.010, 0.010 * e)
    assert 0 < short.margin < spread.margin
    assert not spread.observe(math.nan, 0.01) and not spread.observe(0.01, 0.0)


def test_the_closed_loop_follows_a_slower_simulated_engine() -> None:
    """The simulator charges 1.3x the policy's model, a 15 ms decode beside 600-token prompts: the open
    loop's iterations planned to the SLO overrun it, the closed loop's correction follows the engine
    (its margin still holds the errors made while the correction climbed) and it overruns far less."""
    class Slower(CalibratedCostModel):
        def iteration_time(self, shape: BatchShape) -> float:
            return 1.3 * super().iteration_time(shape)

    trace = [(0.0, 64, 200, 0.015, 2.0, None)] + [(0.05 + 0.1 * i, 600, 8, 0.2, 5.0, None)
                                                  for i in range(1, 30)]
    late = {}
    for name in ("accelgen", "accelgen-closed"):
        reqs, outs = trace_requests(trace)
        policy = make_policy(name)
        assert isinstance(policy, AccelGenPolicy)
        res = run_sim(reqs, outs, policy, num_blocks=200, block_size=16, s_pf=512, cost=Slower(ENGINE))
        its = res.iterations.to_frame()
        planned = its[np.isfinite(its["info_plan_slo"])]
        late[name] = float((planned["latency"] > planned["info_plan_slo"]).mean())
        if policy.loop is None:
            assert (its["info_time_scale"] == 1.0).all()
        else:  # (the margin still holds the errors made while the correction climbed)
            assert policy.loop.correction == pytest.approx(1.3, rel=0.01)
            assert its["info_time_scale"].iloc[-1] >= 1.28
    assert late["accelgen-closed"] < late["accelgen"] / 2, late


def test_the_closed_loop_prices_the_batch_of_a_model_it_asks() -> None:
    """A model the decision asks (not compiled): the policy prices its batch itself, exactly as the
    simulator charges it, so the closed loop learns there too (here: nothing to correct)."""
    from tests.test_accelgen_decision import Opaque

    trace = [(0.0, 64, 40, 0.015, 2.0, None)] + [(0.05 + 0.01 * i, 300, 8, 0.2, 5.0, None)
                                                 for i in range(1, 7)]
    policy = make_policy("accelgen-closed")
    assert isinstance(policy, AccelGenPolicy) and policy.loop is not None
    res = run_sim(*trace_requests(trace), policy, num_blocks=200, block_size=16, s_pf=512,
                  cost=Opaque(CalibratedCostModel(ENGINE)))
    assert policy.loop.observed == len(res.iterations.to_frame()) > 0
    assert policy.loop.scale == 1.0


def test_a_backend_that_measures_steps_itself_feeds_the_closed_loop() -> None:
    """The vLLM plugin under async scheduling tells ``on_step_end`` a prediction: the loop ignores it
    and takes the measured step from ``observe_step``."""
    trace = [(0.0, 64, 40, 0.015, 2.0, None), (0.05, 300, 8, 0.2, 5.0, None)]
    policy = make_policy("accelgen-closed")
    assert isinstance(policy, AccelGenPolicy) and policy.loop is not None
    policy.measured_by_backend = True
    run_sim(*trace_requests(trace), policy, num_blocks=200, block_size=16, s_pf=512,
            cost=CalibratedCostModel(ENGINE))
    assert policy.loop.observed == 0
    for _ in range(100):
        policy.observe_step(0.010, 0.012)
    assert policy.loop.observed == 100 and policy.loop.correction > 1.15
    assert (policy._ws.time_scale, policy._ws.tbt_shrink) == (policy.loop.correction,
                                                             policy.loop.tbt_shrink)


class Noisy(CalibratedCostModel):
    """The calibrated model x a seeded lognormal step error (10 %, mean 1): the engine's noise."""

    def __init__(self, terms: CalibratedTerms) -> None:
        super().__init__(terms)
        self.draws = iter(np.random.default_rng(7).lognormal(-0.005, 0.1, 100_000).tolist())

    def iteration_time(self, shape: BatchShape) -> float:
        return next(self.draws) * super().iteration_time(shape)


def test_the_closed_loop_keeps_a_tight_decode_on_time_under_per_step_noise() -> None:
    """The simulator charges the model's latency x a lognormal step error (10 %, mean 1): the open
    loop plans the iterations beside four 15 ms decodes to their SLO and many of their tokens come
    late (148 of 1200 here); the closed loop's margin (the error quantile at which a request of
    their length stays on time) keeps them on time (none late)."""
    trace = ([(0.0, 64, 300, 0.015, 2.0, None)] * 4
             + [(0.02 * i, 600, 8, 0.5, 5.0, None) for i in range(1, 100)])
    late = {}
    for name in ("accelgen", "accelgen-closed"):
        reqs, outs = trace_requests(trace)
        res = run_sim(reqs, outs, make_policy(name), num_blocks=400, block_size=16, s_pf=512,
                      cost=Noisy(ENGINE))
        gaps = [np.diff(r.token_times) for r in res.requests if r.tbt_slo == 0.015]
        late[name] = sum(int((g > 0.015).sum()) for g in gaps)
    assert late["accelgen-closed"] <= late["accelgen"] / 5, late


def test_the_borrowed_margins_quantile_is_the_normal_distributions() -> None:
    from accelgen.policies.accelgen.rank import upper_quantile

    for p in (0.5, 0.1, 1e-2, 1e-4, 1e-7):
        assert upper_quantile(p) == pytest.approx(NormalDist().inv_cdf(1 - p), abs=1e-9)


def test_the_closed_loop_hands_the_decision_its_fit_and_risk_only_under_errors() -> None:
    exact = ClosedLoop(target=0.9, weight=0.05, window=256)
    for _ in range(100):
        exact.observe(0.010, 0.010)
    assert exact.scales[:4] == (1.0, 1.0, 0.0, 0.0) and exact.scales[5] == 0.0  # (no risk to lend)
    noisy = ClosedLoop(target=0.9, weight=0.05, window=256)
    noisy.finished(400)
    for e in np.random.default_rng(1).lognormal(0.0, 0.1, 1000):
        noisy.observe(0.010, 0.010 * e)
    correction, shrink, median, sd, z, risk = noisy.scales
    assert correction == noisy.correction
    assert shrink == pytest.approx(1 / (1 + noisy.margin)) and risk == pytest.approx(0.1)
    assert sd == pytest.approx(0.1, rel=0.2) and abs(median) < 0.03
    # a request of 400 tokens has 401 deadlines: its first token's and each next one's
    assert z == pytest.approx(NormalDist().inv_cdf(1 - 0.1 / 401))
    assert noisy.margin == pytest.approx(max(math.expm1(median + z * sd), 0.0))


def _loop_state(loop: ClosedLoop) -> tuple[object, ...]:
    return (loop.correction, loop.margin, loop.median, loop.sd, loop.quantile, loop.scales,
            loop.observed, loop._i, loop._n, loop._since, loop._errors.tolist())


@settings(max_examples=100, deadline=None)
@given(window=st.integers(1, 40), every=st.integers(1, 10), n=st.integers(0, 120),
       before=st.lists(st.sampled_from([1.0, 1.0, 1.0, 1.0, 1.3]), max_size=20),
       finished=st.lists(st.integers(0, 500), max_size=3))
def test_exact_steps_taken_in_at_once_leave_the_state_of_one_by_one(
        window: int, every: int, n: int, before: list[float], finished: list[int]) -> None:
    """``ClosedLoop.observe_exact`` (a decode run's exact steps, ``decode_run``) leaves what
    ``observe`` of a ratio of 1 does step by step, from any state at rest."""
    one, bulk = (ClosedLoop(target=0.9, weight=0.05, window=window, every=every) for _ in "ab")
    for loop in (one, bulk):
        for t in finished:
            loop.finished(t)
        for ratio in before:
            loop.observe(0.01, 0.01 * ratio)
    assume(one.at_rest())
    for _ in range(n):
        assert not one.observe(0.02, 0.02 * (1 + 1e-12))  # (exact: within EXACT_RATIO)
    bulk.observe_exact(n)
    assert _loop_state(bulk) == _loop_state(one)
    assert bulk.at_rest()


def test_an_at_risk_prompt_borrows_its_decodes_margin_under_noise() -> None:
    """Two 47 ms decodes under 10 % per-step noise: the closed loop plans their iterations within
    47 ms / (1 + margin), which leaves a 3,000-token prompt small chunks. Once its TTFT is at risk
    (slack under T_max) the decodes are planned at the margin of risk (1 - target) / (N x 2) per
    iteration (a smaller one, never above their TBT): bigger iterations, an earlier first token
    than the same prompt gets with a loose TTFT, which never borrows."""
    plan, ttft = {}, {}
    for slo in (0.45, 50.0):
        trace = [(0.0, 64, 400, 0.047, 1.0, None)] * 2 + [(5.0, 3000, 4, 0.5, slo, None)]
        policy = make_policy("accelgen-closed")
        assert isinstance(policy, AccelGenPolicy)
        res = run_sim(*trace_requests(trace), policy, num_blocks=2000, block_size=16, s_pf=512,
                      cost=Noisy(GPU))
        its = res.iterations.to_frame()
        prompt = res.requests[-1]
        ttft[slo] = prompt.token_times[0] - prompt.arrival
        plan[slo] = its[(its["start"] >= 5.0) & (its["start"] < prompt.token_times[0])]["info_slo_min"]
    assert plan[50.0].max() < 0.047 / 1.2  # (the margin, about 0.35 here)
    assert plan[0.45].max() > plan[50.0].max() + 2e-3 and plan[0.45].max() <= 0.047
    assert ttft[0.45] < ttft[50.0]


def test_a_fixed_decode_margin_plans_every_decode_within_its_shrunk_slo() -> None:
    """``fix_decode_margin`` (scripts/capacity_probe.py --decode-margin): the open loop plans the
    iterations beside a 15 ms decode within 15 ms / 1.5 and charges them so, with no noise; the
    closed loop, which sets its own margin, refuses it, as does a negative margin."""
    trace = [(0.0, 64, 40, 0.015, 2.0, None)] + [(0.05 + 0.001 * i, 200, 8, 0.2, 5.0, None)
                                                 for i in range(1, 7)]
    plans = {}
    for margin in (0.0, 0.5):
        policy = make_policy("accelgen")
        assert isinstance(policy, AccelGenPolicy)
        policy.fix_decode_margin(margin)
        res = run_sim(*trace_requests(trace), policy, num_blocks=200, block_size=16, s_pf=512,
                      cost=CalibratedCostModel(ENGINE))
        its = res.iterations.to_frame()
        beside = its[(its["decode_tokens"] > 0) & (its["prefill_tokens"] > 0)
                     & np.isfinite(its["info_plan_slo"])]
        assert not beside.empty
        assert (beside["latency"] <= beside["info_plan_slo"]).all()
        assert (its["info_time_scale"] == 1.0 + margin).all()
        plans[margin] = beside["info_plan_slo"].max()
    assert plans[0.0] == pytest.approx(0.015)
    assert plans[0.5] == pytest.approx(0.015 / 1.5)
    with pytest.raises(ValueError, match="closed loop"):
        closed = make_policy("accelgen-closed")
        assert isinstance(closed, AccelGenPolicy)
        closed.fix_decode_margin(0.5)
    with pytest.raises(ValueError, match=">= 0"):
        policy.fix_decode_margin(-0.1)
