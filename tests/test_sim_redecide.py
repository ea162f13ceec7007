"""After a decode-only iteration the simulator lets AccelGen (and the Oracle) take in the step
and decide in one call (``Policy.schedule_after_decodes``), and runs the same decision object
again while the batch stays the same: every result is the one ``on_step_end`` + ``schedule``
give at every iteration."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Request
from accelgen.core.specs import Deployment, NoiseSpec
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.factory import make_cost_model
from accelgen.costmodel.noise import NoisyCost
from accelgen.policies.accelgen import AccelGenPolicy
from accelgen.policies.accelgen.oracle import OraclePolicy
from accelgen.policies.fastgen import FastGenPolicy
from accelgen.policies.fastserve import FastServePolicy
from accelgen.policies.registry import make_policy
from accelgen.policies.sarathi import SarathiPolicy
from accelgen.policies.vllm import VLLMPolicy
from accelgen.policies.vllm_priority import VLLMPriorityPolicy
from accelgen.sim.engine import SimulationResult, Simulator
from tests.conftest import LinearCost, assert_same_results


class AskingAccelGen(AccelGenPolicy):
    """AccelGen told of every step and asked at every iteration (the definition)."""

    schedule_after_decodes = Policy.schedule_after_decodes


class AskingOracle(OraclePolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


class AskingVLLM(VLLMPolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


class AskingSarathi(SarathiPolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


class AskingFastGen(FastGenPolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


class AskingVLLMPriority(VLLMPriorityPolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


ANALYTIC = make_cost_model(Deployment(model="opt-13b", hardware="a100"))


class OpaqueAnalytic(type(ANALYTIC)):  # type: ignore[misc]
    """The analytic model without its terms: AccelGen's decision cannot price a batch itself and
    asks the model (``Workspace.complete``), while runs of decode steps are still priced at once."""

    def roofline_terms(self) -> None:  # type: ignore[override]
        return None


OPAQUE = copy.copy(ANALYTIC)
OPAQUE.__class__ = OpaqueAnalytic

_BASELINES: dict[str, tuple[type[Policy], type[Policy]]] = {
    "vllm": (VLLMPolicy, AskingVLLM), "sarathi": (SarathiPolicy, AskingSarathi),
    "fastgen": (FastGenPolicy, AskingFastGen),
    "vllm-priority": (VLLMPriorityPolicy, AskingVLLMPriority),
}


# (arrival, prompt, output, kind): kind 0 online, tight TTFT; 1 online, loose; 2 offline (JCT)
Spec = tuple[float, int, int, int]


def _requests(specs: list[Spec]) -> list[Request]:
    reqs = []
    for i, (arrival, prompt, output, kind) in enumerate(specs):
        online = kind < 2
        reqs.append(Request(req_id=i, arrival=arrival, prompt_len=prompt,
                            ttft_slo=(0.05 if kind == 0 else 2.0) if online else math.inf,
                            tbt_slo=0.05 if online else math.inf,
                            jct_slo=math.inf if online else 0.5 + 0.02 * output,
                            online=online, predicted_output_len=max(1, output // 2)))
    return reqs


def _run(policy: Policy, specs: list[Spec], *, num_blocks: int, block_size: int,
         max_iterations: int | None, horizon_s: float | None,
         analytic: bool | str = False) -> SimulationResult:
    # The analytic model prices a run of decode iterations at once (``decode_times``), the
    # linear one iteration by iteration: both paths of ``Simulator._decode_run``. ("opaque":
    # the analytic model whose batches AccelGen cannot price itself.)
    cost: CostModel = (OPAQUE if analytic == "opaque" else ANALYTIC if analytic
                       else LinearCost())
    sim = Simulator(_requests(specs), [o for _, _, o, _ in specs], policy, cost,
                    BlockManager(num_blocks, block_size),
                    Pivot(s_pf=64, t_pf=cost.forward_time(64)), max_model_len=100_000,
                    max_iterations=max_iterations, horizon_s=horizon_s)
    return sim.run()


def _same(fast_policy: Policy, ref_policy: Policy, specs: list[Spec],
          **kw: Any) -> tuple[SimulationResult, SimulationResult]:
    specs = sorted(specs, key=lambda x: x[0])
    fast = _run(fast_policy, specs, **kw)
    ref = _run(ref_policy, specs, **kw)
    assert_same_results(fast, ref)
    return fast, ref


_specs = st.lists(st.tuples(st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
                            st.integers(min_value=1, max_value=150),
                            st.integers(min_value=1, max_value=120),
                            st.integers(min_value=0, max_value=2)),
                  min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=_specs, num_blocks=st.integers(min_value=12, max_value=40),
       block_size=st.sampled_from([4, 16]), oracle=st.booleans(),
       max_iterations=st.sampled_from([None, 9, 200]), horizon_s=st.sampled_from([None, 0.7]),
       analytic=st.sampled_from([False, True, "opaque"]), closed=st.booleans())
def test_deciding_after_decodes_gives_the_results_of_asking(
        specs: list[Spec], num_blocks: int, block_size: int, oracle: bool,
        max_iterations: int | None, horizon_s: float | None, analytic: bool | str,
        closed: bool) -> None:
    """Arrivals, finishes, new blocks, lost and dormant requests (tight TTFTs), offline JCT
    plans, the Oracle's exact plan, the closed loop, a stopped run and a horizon; with the
    analytic model, the decode steps in asking runs (``Simulator._asking_decode_run``), their
    first steps decided in one call (``Policy.decide_decode_run``; with the opaque model its
    decisions ask the model for a batch's latency)."""
    fast, ref = ((OraclePolicy(), AskingOracle()) if oracle
                 else (AccelGenPolicy(closed_loop=closed), AskingAccelGen(closed_loop=closed)))
    _same(fast, ref, specs, num_blocks=num_blocks, block_size=block_size,
          max_iterations=max_iterations, horizon_s=horizon_s, analytic=analytic)


@pytest.mark.parametrize("oracle", [False, True])
def test_accelgen_decode_steps_run_as_asking_runs(oracle: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests served nearly alone under the analytic model: most of AccelGen's (and the
    Oracle's) iterations pass in asking runs, with the results of asking at every iteration
    through ``on_step_end`` and ``schedule``."""
    rng = np.random.default_rng(11)
    specs = [(float(a), int(p), int(o), 1) for a, p, o in zip(
        np.arange(12) * 3.0, rng.integers(20, 120, 12), rng.integers(50, 200, 12), strict=True)]
    run_steps = [0, 0]
    asking_run, decided_run = Simulator._asking_decode_run, Simulator._decided_run

    def counted(self: Simulator, *a: Any) -> tuple[Decision | None, int, float]:
        out = asking_run(self, *a)
        run_steps[0] += out[1]
        return out

    def counted_decided(self: Simulator, *a: Any) -> tuple[int, Decision | None, int, float]:
        out = decided_run(self, *a)
        run_steps[1] += out[0]
        return out

    monkeypatch.setattr(Simulator, "_asking_decode_run", counted)
    monkeypatch.setattr(Simulator, "_decided_run", counted_decided)
    fast, ref = (OraclePolicy(), AskingOracle()) if oracle else (AccelGenPolicy(), AskingAccelGen())
    done, _ = _same(fast, ref, specs, num_blocks=200, block_size=16, max_iterations=None,
                    horizon_s=None, analytic=True)
    assert run_steps[0] > 0.8 * len(done.iterations)
    # (and most of those decided in one call each)
    assert run_steps[1] > 0.7 * len(done.iterations)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=_specs, num_blocks=st.integers(min_value=8, max_value=40),
       block_size=st.sampled_from([4, 16]), token_budget=st.sampled_from([None, 3, 64]),
       max_num_seqs=st.sampled_from([2, 256]), max_iterations=st.sampled_from([None, 9, 300]),
       horizon_s=st.sampled_from([None, 0.7]), analytic=st.booleans(),
       baseline=st.sampled_from(sorted(_BASELINES)))
def test_baseline_after_decodes_gives_the_results_of_asking(
        specs: list[Spec], num_blocks: int, block_size: int, token_budget: int | None,
        max_num_seqs: int, max_iterations: int | None, horizon_s: float | None,
        analytic: bool, baseline: str) -> None:
    """vLLM's, vLLM priority's, Sarathi-Serve's and FastGen's decision handed back after
    decode steps: blocks running short (preemption; FastGen skips the decode), a head-of-line
    request that does not fit, a budget or seat limit cutting the batch, an ongoing prompt
    left without budget; runs of decode iterations cut by an arrival, a finish, a block that
    does not fit, the horizon or ``max_iterations``."""
    kw = {"token_budget": token_budget, "max_num_seqs": max_num_seqs}
    fast_cls, ref_cls = _BASELINES[baseline]
    assert fast_cls(**kw).after_decodes_while_blocks_fit()  # (the loop counts the blocks)
    _same(fast_cls(**kw), ref_cls(**kw), specs, num_blocks=num_blocks, block_size=block_size,
          max_iterations=max_iterations, horizon_s=horizon_s, analytic=analytic)


@pytest.mark.parametrize("analytic", [False, True])
def test_decode_iterations_run_at_once(analytic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests served nearly alone (the capacity sweep's lowest rates): most iterations pass
    in runs of decode iterations, with the results of asking vLLM at every iteration."""
    rng = np.random.default_rng(7)
    specs = [(float(a), int(p), int(o), 1) for a, p, o in zip(
        np.arange(12) * 3.0, rng.integers(20, 120, 12), rng.integers(50, 200, 12), strict=True)]
    run_steps = [0]
    decode_run = Simulator._decode_run

    def counted(self: Simulator, *a: Any) -> float:
        before = self._iteration
        out = decode_run(self, *a)
        run_steps[0] += self._iteration - before
        return out

    monkeypatch.setattr(Simulator, "_decode_run", counted)
    fast, _ = _same(VLLMPolicy(), AskingVLLM(), specs, num_blocks=200, block_size=16,
                    max_iterations=None, horizon_s=None, analytic=analytic)
    assert run_steps[0] > 0.8 * len(fast.iterations)


def test_most_decode_iterations_reuse_the_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long decodes under the Oracle's exact plan (one or two requests at a time): the policy is
    told of most steps in the one call, and most decisions are the previous object again."""
    rng = np.random.default_rng(5)
    specs = [(float(a), int(p), int(o), int(k)) for a, p, o, k in zip(
        np.sort(rng.uniform(0, 1, 12)), rng.integers(20, 120, 12), rng.integers(100, 300, 12),
        rng.integers(0, 3, 12), strict=True)]
    calls = {"step_end": 0, "after": 0, "same": 0}
    step_end, after = OraclePolicy.on_step_end, OraclePolicy.schedule_after_decodes

    def counted_step_end(self: OraclePolicy, *a: Any) -> None:
        calls["step_end"] += 1
        step_end(self, *a)

    def counted_after(self: OraclePolicy, view: SchedulerView, decision: Decision,
                      latency: float) -> Decision:
        calls["after"] += 1
        out = after(self, view, decision, latency)
        calls["same"] += out is decision
        return out

    monkeypatch.setattr(OraclePolicy, "on_step_end", counted_step_end)
    monkeypatch.setattr(OraclePolicy, "schedule_after_decodes", counted_after)
    fast, _ = _same(OraclePolicy(), AskingOracle(), specs, num_blocks=40, block_size=16,
                    max_iterations=None, horizon_s=None)
    n = len(fast.iterations)
    # (the reference's on_step_end calls are counted too: one per iteration)
    assert n > 1000 and calls["step_end"] - n < n / 5
    assert calls["same"] > 0.8 * n and calls["after"] <= n


class _NoisyCounted(NoisyCost):
    """The noisy model, counting the iterations it priced in runs."""

    in_runs = 0

    def took_decode_run(self, iterations: int) -> None:
        self.in_runs += iterations
        super().took_decode_run(iterations)


class _NoisyPerIteration(NoisyCost):
    """The noisy model asked iteration by iteration (no runs priced at once)."""

    def decode_times(self, decode_seqs: int, decode_ctx: np.ndarray) -> np.ndarray | None:
        return None


@pytest.mark.parametrize("stalls", [False, True])
@pytest.mark.parametrize("policy", ["vllm", "accelgen", "accelgen-closed"])
def test_noisy_runs_of_decode_iterations_give_the_results_of_asking_each(
        policy: str, stalls: bool) -> None:
    """A noisy model prices a run of decode iterations with its next draws and moves on by the
    iterations that ran: the charged times, in order, of asking it iteration by iteration
    (runs cut by arrivals, blocks and finishes; stalls drawn beside the factors)."""
    rng = np.random.default_rng(3)
    specs = sorted([(float(a), int(p), int(o), int(k)) for a, p, o, k in zip(
        rng.uniform(0, 6, 30), rng.integers(20, 200, 30), rng.integers(20, 400, 30),
        rng.integers(0, 3, 30), strict=True)], key=lambda x: x[0])
    spec = NoiseSpec(kind="lognormal", step_sigma=0.1, run_sigma=0.05,
                     **({"stall_prob": 0.05, "stall_quantiles": [0.001, 0.01]} if stalls else {}))
    runs = []
    for cls in (_NoisyCounted, _NoisyPerIteration):
        cost = cls(ANALYTIC, spec, seed=4)
        sim = Simulator(_requests(specs), [o for _, _, o, _ in specs], make_policy(policy), cost,
                        BlockManager(60, 16), Pivot(s_pf=64, t_pf=ANALYTIC.forward_time(64)),
                        max_model_len=100_000, planning_cost=ANALYTIC)
        runs.append((sim.run(), cost.drawn, getattr(cost, "in_runs", 0)))
    assert_same_results(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] == len(runs[0][0].iterations)
    assert runs[0][2] > 0.3 * len(runs[0][0].iterations)  # (the runs were taken)


class AskingFastServe(FastServePolicy):
    schedule_after_decodes = Policy.schedule_after_decodes


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=_specs, num_blocks=st.integers(min_value=12, max_value=60),
       swap_blocks=st.sampled_from([0, 8, 200]), block_size=st.sampled_from([4, 16]),
       max_batch_size=st.sampled_from([1, 3, 16]),
       starve_check_every=st.sampled_from([1, 2, 7, 1000]),
       starve_after=st.sampled_from([0.01, 0.05, 3.0]), proactive=st.booleans(),
       max_iterations=st.sampled_from([None, 9, 200]), analytic=st.booleans())
# (the step's end is the decision's clock after decode steps: a starvation check that reads
# the last service one step late promotes a request that was served in time)
@example(specs=[(0.0, 1, 3, 0), (0.0, 1, 4, 0)], num_blocks=12, swap_blocks=0, block_size=4,
         max_batch_size=1, starve_check_every=2, starve_after=0.05, proactive=False,
         max_iterations=None, analytic=True)
def test_fastserve_after_decodes_gives_the_results_of_asking(
        specs: list[Spec], num_blocks: int, swap_blocks: int, block_size: int,
        max_batch_size: int, starve_check_every: int, starve_after: float, proactive: bool,
        max_iterations: int | None, analytic: bool) -> None:
    """FastServe's decision handed back after decode steps (the whole queue in its batch, its
    next blocks free) gives the results of ``on_step_end`` + ``schedule`` at every iteration:
    with demotions reordering the batch, starvation checks (promoting requests or not), a queue
    longer than the batch, blocks running short (swaps, recomputes), host memory or none."""
    kw = {"max_batch_size": max_batch_size, "starve_check_every": starve_check_every,
          "starve_after": starve_after, "proactive": proactive, "swap": swap_blocks > 0}
    specs = sorted(specs, key=lambda x: x[0])
    cost: CostModel = ANALYTIC if analytic else LinearCost()
    runs = []
    for policy in (FastServePolicy(**kw), AskingFastServe(**kw)):
        sim = Simulator(_requests(specs), [o for _, _, o, _ in specs], policy, cost,
                        BlockManager(num_blocks, block_size, num_swap_blocks=swap_blocks),
                        Pivot(s_pf=64, t_pf=cost.forward_time(64)), max_model_len=100_000,
                        max_iterations=max_iterations)
        runs.append(sim.run())
    assert_same_results(runs[0], runs[1])


def test_fastserve_decides_most_steps_of_a_request_alone_after_decodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests served alone: most of FastServe's decisions are the batch handed back after its
    decode steps, not a pass over the queues."""
    calls = {"schedule": 0}
    schedule = FastServePolicy.schedule

    def counted(self: FastServePolicy, view: SchedulerView) -> Decision:
        calls["schedule"] += 1
        return schedule(self, view)

    monkeypatch.setattr(FastServePolicy, "schedule", counted)
    specs = [(20.0 * a, 50, 300, 0) for a in range(6)]
    done, _ = _same(FastServePolicy(), AskingFastServe(), specs, num_blocks=200, block_size=16,
                    max_iterations=None, horizon_s=None)
    n = len(done.iterations)
    # (the reference calls ``schedule`` at every iteration, the fast policy at few)
    assert n > 1000 and calls["schedule"] - n < 0.05 * n
