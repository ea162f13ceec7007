"""Scenario tests of the vLLM scheduler plugin with fake model outputs (no forward pass).

A real vLLM ``Scheduler`` subclass runs over a real KV block pool; ``harness.fake_model_output``
plays the model runner and ``harness.step`` calls the scheduler in the engine core's order, sync
or with async scheduling (one step in flight). Each test shows a policy decision reaching vLLM:
token budget and per-request token counts, admission order, hold-back of unselected waiting
requests, explicit preemption of a named victim, rejection, and refusal of bad SLOs.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Request, Status
from accelgen.policies.registry import register_policy
from tests import lazy_vllm as lazy
from tests.lazy_vllm import needs_vllm

pytestmark = needs_vllm

Plan = Callable[[SchedulerView], Decision]


class ScriptedPolicy(Policy):
    """Returns the decisions a test queued, one per step (then nothing)."""

    name = "scripted"
    plans: ClassVar[list[Plan]] = []
    views: ClassVar[list[tuple[list[int], list[int]]]] = []

    def schedule(self, view: SchedulerView) -> Decision:
        ScriptedPolicy.views.append(([r.req_id for r in view.waiting],
                                     [r.req_id for r in view.running]))
        return ScriptedPolicy.plans.pop(0)(view) if ScriptedPolicy.plans else Decision()


class FCFSTestPolicy(Policy):
    """A deliberately plain policy for the tests: running requests first (newest preempted
    when KV runs out), then waiting FCFS while the budget and KV last, prompts chunked."""

    name = "fcfs-test"

    def schedule(self, view: SchedulerView) -> Decision:
        d = Decision()
        budget = view.pivot.s_pf
        free = view.kv.num_free_blocks
        running = list(view.running)
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.num_new_tokens, budget)
            need = view.kv.blocks_needed(r, n)
            while need > free and len(running) > i + 1:
                victim = running.pop()
                d.preempted.append(victim)
                free += victim.num_blocks
            if need > free:
                d.preempted.append(running.pop())
                break
            d.scheduled.append((r, n))
            free -= need
            budget -= n
            i += 1
        if not d.preempted:
            for r in view.waiting:
                n = min(r.num_new_tokens, budget)
                if n <= 0 or view.kv.blocks_needed(r, n) > free:
                    break
                d.scheduled.append((r, n))
                free -= view.kv.blocks_needed(r, n)
                budget -= n
        return d


register_policy("scripted", ScriptedPolicy)
register_policy("fcfs-test", FCFSTestPolicy)

_ids = itertools.count()


@pytest.fixture(autouse=True)
def _reset_script() -> None:
    ScriptedPolicy.plans.clear()
    ScriptedPolicy.views.clear()


MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def plugin(policy: str = "scripted", *, num_blocks: int = 16, s_pf: int = 256,
           async_scheduling: bool = False, **params: object) -> lazy.AccelGenScheduler:
    return lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=num_blocks, max_model_len=1024,
                               max_num_batched_tokens=1024, async_scheduling=async_scheduling,
                               accelgen={"policy": {"name": policy, "params": params}, "s_pf": s_pf,
                                         "cost": {"base_s": 0.01, "per_token_s": 1e-5}})


def add(s: lazy.InstrumentedScheduler, req_id: int, prompt: int, out: int = 4, **extra: object
        ) -> str:
    vid = f"req-{req_id}-{next(_ids)}"
    s.add_request(lazy.make_request(vid, prompt, out, extra_args={"req_id": req_id, **extra}))
    return vid


def serve_mixed_slos(s: lazy.AccelGenScheduler, prompts: list[int], outs: list[int],
                     slos: list[tuple[float, float]]) -> None:
    """Add the requests (request i with SLOs ``slos[i % len(slos)]``: TTFT, TBT) and run the
    engine until every one has ended."""
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        ttft, tbt = slos[i % len(slos)]
        add(s, i, p, o, ttft_slo=ttft, tbt_slo=tbt)
    lazy.run_to_completion(s)


def by_id(view: SchedulerView, req_id: int) -> Request:
    return next(r for r in [*view.waiting, *view.running] if r.req_id == req_id)


def plan(*steps: Plan) -> None:
    ScriptedPolicy.plans.extend(steps)


def run_step(s: lazy.AccelGenScheduler) -> dict[str, int]:
    out, _ = lazy.step(s)
    assert out is not None
    return dict(out.num_scheduled_tokens)


def vid_of(s: lazy.InstrumentedScheduler, req_id: int) -> str:
    return s.vllm_request_ids[req_id]


def test_budget_and_exact_token_counts_reach_vllm() -> None:
    s = plugin()
    for i, p in enumerate((300, 200, 100)):
        add(s, i, p)
    # Chunks vLLM would never pick on its own (it would give request 0 its whole prompt).
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 64), (by_id(v, 1), 33), (by_id(v, 2), 7)]))
    got = run_step(s)
    assert got == {vid_of(s, 0): 64, vid_of(s, 1): 33, vid_of(s, 2): 7}
    assert s.max_num_scheduled_tokens == 1024  # the budget is only lent to one schedule() call
    it = s.iterations_frame().iloc[-1]
    assert it["info_adapter_budget"] == 104 and it["forward_size"] == 104
    assert it["info_adapter_mismatch"] == 0 and s.mismatch_steps == 0
    # Next step: continue request 1's prompt only; 0 and 2 keep their blocks but do not run.
    blocks_before = {i: s.tracked[vid_of(s, i)].num_blocks for i in (0, 2)}
    plan(lambda v: Decision(scheduled=[(by_id(v, 1), 100)]))
    assert run_step(s) == {vid_of(s, 1): 100}
    assert {i: s.tracked[vid_of(s, i)].num_blocks for i in (0, 2)} == blocks_before
    assert s.tracked[vid_of(s, 1)].num_computed_tokens == 133
    assert [s.tracked[v.request_id].req_id for v in s.running] == [0, 1, 2]  # admission order


def test_admission_follows_policy_order_and_holds_back_the_rest() -> None:
    s = plugin(num_blocks=12)
    for i, p in enumerate((320, 64, 64, 96)):  # request 0 (10 blocks) would block vLLM's FCFS
        add(s, i, p)
    plan(lambda v: Decision(scheduled=[(by_id(v, 3), 96), (by_id(v, 1), 64)]))
    out, _ = lazy.step(s)
    # New requests reach the model runner in the policy's order; vLLM did not stop at request 0.
    assert [r.req_id for r in out.scheduled_new_reqs] == [vid_of(s, 3), vid_of(s, 1)]
    assert [s.tracked[v.request_id].req_id for v in s.running] == [3, 1]
    # The held-back requests are still waiting, in their original order.
    assert [s.tracked[v.request_id].req_id for v in s.waiting] == [0, 2]
    assert {s.tracked[vid_of(s, i)].status for i in (0, 2)} == {Status.WAITING}
    # And the policy sees them so in the next view.
    plan(lambda v: Decision())
    lazy.step(s)
    assert ScriptedPolicy.views[-1] == ([0, 2], [3, 1])


def test_explicit_preemption_of_a_named_victim() -> None:
    s = plugin(num_blocks=10)
    add(s, 0, 96)
    add(s, 1, 96)
    add(s, 2, 96)
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 96), (by_id(v, 1), 96),
                                       (by_id(v, 2), 96)]))
    lazy.step(s)
    add(s, 3, 96)  # 3 blocks, plus 1 for request 2's next token; 1 free
    # Without a preemption the decision does not fit, and the adapter says so.
    plan(lambda v: Decision(scheduled=[(by_id(v, 3), 96), (by_id(v, 2), 1)]))
    with pytest.raises(lazy.PolicyDecisionError, match="needing 4 KV blocks with 1 free"):
        s.schedule()
    # Preempt the OLDEST request (vLLM's own rule would take the newest) and admit request 3.
    plan(lambda v: Decision(preempted=[by_id(v, 0)],
                            scheduled=[(by_id(v, 3), 96), (by_id(v, 2), 1)]))
    out, _ = lazy.step(s)
    assert out.preempted_req_ids == {vid_of(s, 0)}
    assert dict(out.num_scheduled_tokens) == {vid_of(s, 3): 96, vid_of(s, 2): 1}
    victim = s.tracked[vid_of(s, 0)]
    assert (victim.status, victim.num_computed_tokens, victim.num_blocks,
            victim.num_preemptions) == (Status.WAITING, 0, 0, 1)
    assert s.requests[vid_of(s, 0)].status == lazy.RequestStatus.PREEMPTED
    # Recompute: the victim goes back to the front of the queue, holding no KV.
    assert s.waiting[0].request_id == vid_of(s, 0)
    assert s.iterations_frame().iloc[-1]["num_preempted"] == 1
    # It resumes later (here by preempting two others): prompt plus its one generated token
    # are recomputed.
    plan(lambda v: Decision(preempted=[by_id(v, 3), by_id(v, 1)],
                            scheduled=[(by_id(v, 0), by_id(v, 0).num_new_tokens)]))
    assert run_step(s) == {vid_of(s, 0): 97}
    # The policy saw the queues as the preemption left them (their lengths had not changed).
    assert ScriptedPolicy.views[-1] == ([0], [1, 2, 3])
    assert [v.request_id for v in s.waiting] == [vid_of(s, 1), vid_of(s, 3)]


def test_policy_rejection_and_invalid_decisions() -> None:
    s = plugin()
    add(s, 0, 64)
    add(s, 1, 64)
    plan(lambda v: Decision(rejected=[(by_id(v, 1), "never fits its KV rule")],
                            scheduled=[(by_id(v, 0), 64)]))
    _, outputs = lazy.step(s)
    rejected = [o for eco in outputs.values() for o in eco.outputs
                if o.request_id == vid_of(s, 1)]
    assert len(rejected) == 1 and rejected[0].finish_reason is not None
    assert "never fits its KV rule" in str(rejected[0].stop_reason)
    m = next(r for r in s.done if r.req_id == 1)
    assert m.status == Status.REJECTED and "never fits" in m.reject_reason
    # Scheduling more tokens than pending is a policy bug and is reported, not patched.
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 5)]))
    with pytest.raises(lazy.PolicyDecisionError, match="scheduled 5 tokens"):
        s.schedule()


@MODES
def test_bad_slos_are_refused_and_others_are_served(async_scheduling: bool) -> None:
    s = plugin("fcfs-test", async_scheduling=async_scheduling)
    good = [add(s, i, 40, ttft_slo=1.0, tbt_slo=0.1) for i in range(3)]
    bad_neg = add(s, 10, 40, ttft_slo=-0.5)
    bad_str = add(s, 11, 40, tbt_slo="soon")
    outputs = []
    for _ in range(200):
        _, res = lazy.step(s)
        outputs.extend(o for eco in res.values() for o in eco.outputs)
        if not s.has_requests() and not res:
            break
    errors = {o.request_id: o for o in outputs if o.request_id in (bad_neg, bad_str)}
    assert set(errors) == {bad_neg, bad_str}
    assert all(o.finish_reason is not None and o.finish_reason.name == "ERROR"
               for o in errors.values())
    assert "ttft_slo=-0.5 must be > 0" in str(errors[bad_neg].stop_reason)
    assert "tbt_slo='soon' is not a number" in str(errors[bad_str].stop_reason)
    assert set(s.invalid) == {bad_neg, bad_str}
    finished = {s.vllm_request_ids[r.req_id] for r in s.done if r.status == Status.FINISHED}
    assert finished == set(good)


@MODES
@pytest.mark.parametrize("policy, params, preempts", [
    ("fcfs-test", {}, True), ("vllm", {}, True),
    # Fake steps take microseconds, so nothing is late and AccelGen has no reason to preempt.
    ("accelgen", {}, False)])
def test_policies_serve_everything_under_scarce_kv(policy: str, params: dict, preempts: bool,
                                                   async_scheduling: bool) -> None:
    pytest.importorskip(f"accelgen.policies.{policy}" if policy != "fcfs-test" else "accelgen")
    s = plugin(policy, num_blocks=20, s_pf=192, async_scheduling=async_scheduling, **params)
    t0 = time.time()
    s.reset_records(t0)
    prompts = [40, 300, 90, 500, 20, 150, 260, 75, 410, 33, 128, 64]
    outs = [30, 10, 40, 8, 50, 20, 12, 35, 6, 45, 25, 30]
    serve_mixed_slos(s, prompts, outs, [(0.3, 0.05), (2.0, 0.2), (0.5, 0.1), (1.0, 0.2)])
    reqs = s.all_requests()
    assert [r.status for r in reqs] == [Status.FINISHED] * len(prompts)
    assert [r.num_output_tokens for r in reqs] == outs
    assert all(len(r.token_times) == r.num_output_tokens for r in reqs)
    assert all(r.first_token_time >= r.arrival for r in reqs)
    its = s.iterations_frame()
    assert (its["forward_size"] <= 192).all()
    assert s.mismatch_steps == 0
    if preempts:
        assert sum(r.num_preemptions for r in reqs) > 0  # 20 blocks cannot hold them all
    assert s.kv_view.num_free_blocks == s.kv_view.num_total_blocks  # everything freed
    timing = s.timing_frame()
    assert len(timing) == len(its)
    assert (timing["decision_time"] >= timing["vllm_schedule_time"]).all()
    assert (timing["policy_time"] > 0).all()


class DefinitionCheckedEDF(Policy):
    """EDF whose every decision is checked against its definition (every candidate sorted at
    that decision) on the same view: the running order it keeps across decisions
    (``edf.OrderedRunning``) must hold under vLLM's async scheduling too, where a step's tokens
    come back after the next decision."""

    name = "edf-checked"

    def __init__(self, **params: object) -> None:
        from accelgen.policies.edf import EDFPolicy

        self.fast = EDFPolicy(**params)
        self.reference = EDFPolicy(**params)
        self.params = self.fast.params
        self.checked = 0

    def on_arrival(self, req: Request, now: float) -> None:
        self.fast.on_arrival(req, now)

    def schedule(self, view: SchedulerView) -> Decision:
        want = self.reference._schedule_sorted(view)
        got = self.fast.schedule(view)
        assert ([(r.req_id, n) for r, n in got.scheduled], [r.req_id for r in got.preempted]) == (
            [(r.req_id, n) for r, n in want.scheduled], [r.req_id for r in want.preempted])
        self.checked += 1
        return got


register_policy("edf-checked", DefinitionCheckedEDF)


@MODES
def test_edf_keeps_its_running_order_under_async_scheduling(async_scheduling: bool) -> None:
    """A token budget far below the running set's (most running requests wait a decision out)
    and scarce KV (preemptions): EDF decides as its definition at every step."""
    s = plugin("edf-checked", num_blocks=12, s_pf=192, async_scheduling=async_scheduling,
               token_budget=6)
    s.reset_records(time.time())
    prompts = [40, 30, 90, 50, 20, 15, 26, 75, 41, 33, 12, 64]
    outs = [60, 10, 80, 16, 90, 40, 24, 70, 12, 90, 50, 60]
    serve_mixed_slos(s, prompts, outs, [(0.3, 0.05), (2.0, 0.2), (0.5, 0.1), (1.0, 0.02)])
    assert [r.status for r in s.all_requests()] == [Status.FINISHED] * len(prompts)
    policy = s.accelgen_policy
    assert policy.checked >= 100
    assert sum(r.num_preemptions for r in s.all_requests()) > 0


@pytest.mark.parametrize("policy, async_scheduling", [
    ("accelgen", False), ("accelgen", True), *((p, False) for p in (
        "vllm", "vllm-priority", "sarathi", "edf", "fastgen"))])
def test_policies_plan_within_the_engines_limits(policy: str, async_scheduling: bool,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The engine's max_num_batched_tokens and max_num_seqs below the policy's own budget and
    running cap: the policy plans within them (its view carries them), so nothing is trimmed
    and vLLM runs exactly the policy's decisions."""
    cfg = {"policy": {"name": policy, "params": {}}, "s_pf": 512,
           "cost": {"base_s": 0.01, "per_token_s": 1e-5}}
    with caplog.at_level("INFO", logger="vllm.accelgen"):
        s = lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=200, max_model_len=1024,
                                max_num_batched_tokens=128, max_num_seqs=3,
                                async_scheduling=async_scheduling, accelgen=cfg)
    line = next(r.getMessage() for r in caplog.records if "engine limits" in r.getMessage())
    assert "max_num_batched_tokens=128" in line and "max_num_seqs=3" in line
    assert "caps the policy's token budget (its own largest: 512)" in line
    assert (s.view.max_num_batched_tokens, s.view.max_num_seqs) == (128, 3)
    s.reset_records(time.time())
    prompts = [300, 40, 200, 90, 500, 20, 150, 260, 75, 33, 128, 64]
    for i, p in enumerate(prompts):
        add(s, i, p, 12, ttft_slo=2.0, tbt_slo=0.5)
    lazy.run_to_completion(s)
    assert {r.status for r in s.all_requests()} == {Status.FINISHED}
    its = s.iterations_frame()
    assert (its["forward_size"] <= 128).all() and (its["forward_size"] == 128).any()
    assert its["num_running"].max() <= 3
    assert s.trimmed_steps == 0 and (its["info_adapter_trimmed_tokens"] == 0).all()
    assert s.mismatch_steps == 0
    assert not [r for r in caplog.records if "trimming" in r.getMessage()]


def test_a_decision_over_the_engines_token_limit_is_trimmed_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """The guarded error path: a policy that ignores the view's limit gets its decision's tail
    cut (the engine's buffers hold no more), with a warning, counted per step."""
    s = lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=40, max_model_len=1024,
                            max_num_batched_tokens=256,
                            accelgen={"policy": {"name": "scripted", "params": {}}, "s_pf": 256})
    for i in range(3):
        add(s, i, 200)
    plan(lambda v: Decision(scheduled=[(by_id(v, i), 120) for i in range(3)]))
    with caplog.at_level("WARNING", logger="vllm.accelgen"):
        got = run_step(s)
    assert got == {vid_of(s, 0): 120, vid_of(s, 1): 120, vid_of(s, 2): 16}
    assert s.trimmed_steps == 1 and s.mismatch_steps == 0
    assert s.iterations_frame().iloc[-1]["info_adapter_trimmed_tokens"] == 104
    assert any("trimming" in r.getMessage() and "'scripted'" in r.getMessage()
               for r in caplog.records)


@MODES
@pytest.mark.parametrize("policy", ["fcfs-test", "accelgen"])
def test_the_view_is_always_the_engine_queues(policy: str, async_scheduling: bool) -> None:
    """The adapter rebuilds the view's lists only after arrivals, finishes, admissions and
    preemptions; every decision still sees exactly vLLM's queues, in their order, and every
    request's token counts and KV blocks as vLLM has them (with async scheduling: the step in
    flight counted, requests whose last token is in flight left out, as vLLM skips them)."""
    s = plugin(policy, num_blocks=20, s_pf=192, async_scheduling=async_scheduling)
    s.reset_records(time.time())
    checked, left_out = [0], [0]
    inner = s.accelgen_policy.schedule

    def checking(view: SchedulerView) -> Any:
        want_waiting = [v.request_id for v in [*s.kv_holding_waiting, *s.waiting]]
        running = [v for v in s.running if not s._last_token_in_flight(v)]
        left_out[0] += len(s.running) - len(running)
        assert [s._vid_of[m.req_id] for m in view.waiting] == want_waiting
        assert [s._vid_of[m.req_id] for m in view.running] == [v.request_id for v in running]
        for m in [*view.waiting, *view.running]:
            v = s._vreqs[s._vid_of[m.req_id]]
            assert (m.num_computed_tokens, m.num_output_tokens, m.num_blocks) == (
                v.num_computed_tokens, v.num_output_tokens + v.num_output_placeholders,
                s._kv_blocks(v.request_id)), m.req_id
        assert view.kv.num_free_blocks == s.kv_cache_manager.block_pool.get_num_free_blocks()
        checked[0] += 1
        return inner(view)

    s.accelgen_policy.schedule = checking  # type: ignore[method-assign]
    # An arrival before every step: some steps then see an arrival, an admission and a finish
    # at once, which leave both queue lengths as they were.
    prompts = [40, 300, 90, 500, 20, 150, 260, 75, 410, 33, 128, 64] * 4
    for i, p in enumerate(prompts):
        add(s, i, p, 4 + i % 7)
        lazy.step(s)
    lazy.run_to_completion(s)
    assert not s.has_unfinished_requests() and s.mismatch_steps == 0
    assert all(r.status == Status.FINISHED for r in s.all_requests())
    assert checked[0] > 50
    assert (left_out[0] > 0) == async_scheduling
    if policy == "fcfs-test":
        assert sum(r.num_preemptions for r in s.all_requests()) > 0


@MODES
def test_stock_scheduler_records_the_same_files(async_scheduling: bool) -> None:
    s = lazy.make_scheduler(lazy.InstrumentedScheduler, num_blocks=24, async_scheduling=async_scheduling)
    for i in range(4):
        add(s, i, 100 + 50 * i, 5, ttft_slo=0.5)
    lazy.run_to_completion(s)
    reqs = s.requests_frame()
    assert list(reqs["status"]) == ["finished"] * 4
    assert list(reqs["output_len"]) == [5] * 4
    assert (reqs["token_times"].map(len) == 5).all()
    assert math.isclose(reqs["ttft_slo"].iloc[0], 0.5)
    its = s.iterations_frame()
    assert its["forward_size"].iloc[0] == 100 + 150 + 200 + 250
    assert list(its["decode_tokens"].iloc[1:]) == [4] * 4  # (async: the tokens in flight counted)
    assert s.timing_frame()["policy_time"].eq(0).all()
    assert len(its) == 5 and (its["latency"] > 0).all()


@MODES
@pytest.mark.parametrize("scheduler", ["InstrumentedScheduler", "AccelGenScheduler"])
def test_an_output_cut_at_max_model_len_is_recorded_as_cut(scheduler: str,
                                                           async_scheduling: bool) -> None:
    """vLLM stops a sequence at max_model_len with the same status as at max_tokens; the
    scheduler tells the two apart and records the first as cut, with the reason."""
    cls = getattr(lazy, scheduler)
    cfg = {"policy": {"name": "fcfs-test", "params": {}}, "s_pf": 256,
           "cost": {"base_s": 0.01, "per_token_s": 1e-5}}
    s = lazy.make_scheduler(cls, num_blocks=40, max_model_len=256, max_num_batched_tokens=512,
                            accelgen=cfg if cls is lazy.AccelGenScheduler else None,
                            async_scheduling=async_scheduling)
    add(s, 0, 200, 100)  # 200 + 100 > 256: cut after 56 tokens
    add(s, 1, 100, 20)
    add(s, 2, 200, 56)  # exactly reaches max_model_len with its last token: not cut
    lazy.run_to_completion(s, 500)
    assert getattr(s, "mismatch_steps", 0) == 0
    reqs = s.requests_frame()
    assert list(reqs["status"]) == ["cut", "finished", "finished"]
    assert list(reqs["num_output_tokens"]) == [56, 20, 56]
    assert list(reqs["output_len"]) == [56, 20, 56]  # the length it was served
    assert reqs["reject_reason"].iloc[0] == ("length_cap: output cut at 56 of 100 tokens "
                                             "(prompt 200 + output reached max_model_len 256)")
    assert list(reqs["reject_reason"].iloc[1:]) == ["", ""]


def test_the_plugin_asks_the_policy_registry() -> None:
    """Registered names (above), built-in ones and import paths all come from
    ``accelgen.policies.registry``."""
    assert isinstance(plugin("fcfs-test").accelgen_policy, FCFSTestPolicy)
    assert plugin("accelgen/order").accelgen_policy.params.order is False  # type: ignore[attr-defined]
    s = plugin(f"{__name__}:FCFSTestPolicy")
    assert type(s.accelgen_policy).__name__ == "FCFSTestPolicy"
    with pytest.raises(ValueError, match="unknown policy 'fastgn'"):
        plugin("fastgn")


def test_engine_configs_the_plugin_cannot_honour() -> None:
    with pytest.raises(ValueError, match="clairvoyant"):
        plugin("oracle")


def test_fake_output_helper_matches_engine_semantics() -> None:
    s = lazy.make_scheduler(lazy.InstrumentedScheduler, num_blocks=8)
    add(s, 0, 40, 2)
    out = s.schedule()
    mro = lazy.fake_model_output(s, out)
    assert mro.sampled_token_ids == [[7]]  # the whole prompt ran: one token sampled


# -- the AccelGen policy itself, through the plugin ---------------------------------------------


def accelgen_plugin(num_blocks: int, s_pf: int, base_s: float, **params: object
                    ) -> lazy.AccelGenScheduler:
    pytest.importorskip("accelgen.policies.accelgen")
    s = lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=num_blocks, max_model_len=1024,
                            max_num_batched_tokens=1024,
                            accelgen={"policy": {"name": "accelgen", "params": params},
                                      "s_pf": s_pf, "cost": {"base_s": base_s, "per_token_s": 0.0}})
    s.reset_records(time.time())
    return s


def test_accelgen_orders_admission_by_slack() -> None:
    s = accelgen_plugin(num_blocks=32, s_pf=256, base_s=0.01)
    loose = add(s, 0, 200, ttft_slo=10.0, tbt_slo=1.0)
    tight = add(s, 1, 200, ttft_slo=0.5, tbt_slo=1.0)  # arrived later, far less slack
    out, _ = lazy.step(s)
    # The tighter request goes first and gets its whole prompt; the looser one gets the rest
    # of the 256-token budget as a chunk.
    assert [r.req_id for r in out.scheduled_new_reqs] == [tight, loose]
    assert dict(out.num_scheduled_tokens) == {tight: 200, loose: 56}


def test_accelgen_era_holds_back_a_second_long_prompt() -> None:
    s = accelgen_plugin(num_blocks=64, s_pf=1024, base_s=0.01, long_prompt_threshold=300,
                        era_scope="prefill")
    long_a = add(s, 0, 400, ttft_slo=5.0)
    long_b = add(s, 1, 400, ttft_slo=5.0)
    short = add(s, 2, 50, ttft_slo=5.0)
    out, _ = lazy.step(s)
    # Budget (1024) and KV (64 blocks) would take all three; ERA admits one long prompt only.
    got = dict(out.num_scheduled_tokens)
    assert long_b not in got and got.get(long_a) == 400 and got.get(short) == 50
    assert [v.request_id for v in s.waiting] == [long_b]
    # Once long_a's prefill is complete, long_b may start.
    out, _ = lazy.step(s)
    assert out.num_scheduled_tokens.get(long_b) == 400


def test_accelgen_preempts_a_loose_request_for_an_urgent_one() -> None:
    # Every iteration is predicted to take 0.5 s, so a request whose TTFT deadline is 0.75 s
    # away is urgent now (0 <= slack < T_max); the running one has a 100 s TBT.
    s = accelgen_plugin(num_blocks=12, s_pf=512, base_s=0.5)
    hog = add(s, 0, 320, 50, ttft_slo=100.0, tbt_slo=100.0)
    out, _ = lazy.step(s)
    assert dict(out.num_scheduled_tokens) == {hog: 320}  # 10 of 12 blocks
    urgent = add(s, 1, 96, ttft_slo=0.75, tbt_slo=100.0)  # needs 3 blocks, 2 free
    out, _ = lazy.step(s)
    assert out.preempted_req_ids == {hog}
    assert out.num_scheduled_tokens.get(urgent) == 96
    assert s.tracked[hog].num_preemptions == 1 and s.tracked[hog].status == Status.WAITING


def test_online_cost_model_feeds_the_policy_a_new_pivot() -> None:
    s = lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=32,
                            accelgen={"policy": {"name": "fcfs-test"}, "s_pf": 128,
                                      "cost": {"kind": "online", "base_s": 1.0, "per_token_s": 0.0,
                                               "refit_every": 4}})
    before = s.view.pivot
    assert before.t_pf == pytest.approx(1.0)
    for i in range(3):
        add(s, i, 64, 4)
    while s.has_unfinished_requests():
        lazy.step(s)
    # Fake steps take microseconds: the refitted model and T_pf now say so.
    assert s.view.pivot is not before and s.view.pivot.t_pf < 0.1
    assert s.view.pivot is s.pivot


@MODES
def test_vllm_policy_through_the_plugin_reproduces_stock_vllm(async_scheduling: bool) -> None:
    """The `vllm` policy (accelgen.policies.vllm) driven through the plugin makes the same
    decisions as vLLM's own scheduler, step by step, preemptions included: the adapter adds
    nothing and loses nothing. And the instrumented stock scheduler (an ``AsyncScheduler``)
    schedules exactly as the class vLLM itself picks for the mode: ``Scheduler`` in sync mode,
    ``AsyncScheduler`` with async scheduling."""
    import numpy as np
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    def run(cls: type) -> list[tuple[dict[str, int], list[str]]]:
        s = lazy.make_scheduler(cls, num_blocks=60, max_num_batched_tokens=256, max_model_len=1920,
                                accelgen={"policy": {"name": "vllm", "params": {"token_budget": 256}},
                                          "s_pf": 256}, async_scheduling=async_scheduling)
        rng = np.random.default_rng(0)
        prompts, outs = rng.integers(16, 600, 80), rng.integers(8, 64, 80)
        history = []
        for i in itertools.count():
            if i < len(prompts):  # one arrival per step; ids equal in both runs
                s.add_request(lazy.make_request(f"r{i}", int(prompts[i]), int(outs[i]),
                                                extra_args={"req_id": i}))
            elif not s.has_requests():
                break
            out, _ = lazy.step(s)
            assert out is not None
            history.append((dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids)))
        assert getattr(s, "mismatch_steps", 0) == 0
        return history

    vllm_own = run(AsyncScheduler if async_scheduling else Scheduler)
    stock, plugged = run(lazy.InstrumentedScheduler), run(lazy.AccelGenScheduler)
    assert sum(len(p) for _, p in stock) > 0  # the workload does exercise preemption
    assert stock == vllm_own
    assert plugged == stock


def test_logs_written_at_shutdown_for_out_of_process_engines(tmp_path) -> None:
    from accelgen.vllm_integration.logsink import read_logs

    s = lazy.make_scheduler(lazy.InstrumentedScheduler, num_blocks=16,
                            accelgen={"log_dir": str(tmp_path / "logs")})
    add(s, 0, 50, 3)
    while s.has_unfinished_requests():
        lazy.step(s)
    s.shutdown()
    logs = read_logs(tmp_path / "logs")
    assert list(logs["requests"]["num_output_tokens"]) == [3]
    assert list(logs["requests"]["status"]) == ["finished"]
    assert len(logs["iterations"]) == len(logs["timing"]) == 3


def test_logs_while_serving_hold_in_flight_and_aborted_requests(tmp_path) -> None:
    """The log directory is current while the engine serves: what an engine-core crash would
    leave behind. Requests in flight and requests vLLM aborted are unfinished, with why."""
    from accelgen.vllm_integration.adapter_config import AUTO_REQ_ID_BASE
    from accelgen.vllm_integration.logsink import has_log, read_log
    from accelgen.vllm_integration.scheduler import ABORTED_REASON, IN_FLIGHT_REASON

    logs = tmp_path / "logs"
    s = lazy.make_scheduler(lazy.InstrumentedScheduler, num_blocks=16,
                            accelgen={"log_dir": str(logs), "log_flush_interval_s": 0.05})
    add(s, 0, 40, 3)
    aborted = add(s, 1, 40, 50)
    s.add_request(lazy.make_request("no-id", 30, 2, extra_args={"online": 1}))  # vLLM's 0/1 bool
    for _ in range(4):
        lazy.step(s)
    # Within the flush interval (plus the writer's 1 s minimum gap) the files hold the state.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reqs = read_log(logs / "requests.parquet") if has_log(logs / "requests.parquet") \
            else None
        if reqs is not None and (reqs["status"] == "finished").sum() == 2:
            break
        time.sleep(0.05)
    assert reqs is not None
    by_id = reqs.set_index("req_id")
    assert by_id.loc[0, "status"] == "finished"
    assert by_id.loc[1, "status"] == "unfinished"
    assert by_id.loc[1, "reject_reason"] == IN_FLIGHT_REASON
    auto = [i for i in by_id.index if i >= AUTO_REQ_ID_BASE]
    assert len(auto) == 1 and by_id.loc[auto[0], "status"] == "finished"
    assert bool(by_id.loc[auto[0], "online"])
    # vLLM aborts a request (client gone, or the server stopping in abort mode).
    s.finish_requests(aborted, lazy.RequestStatus.FINISHED_ABORTED)
    s.shutdown()
    reqs = read_log(logs / "requests.parquet").set_index("req_id")
    assert reqs.loc[1, "status"] == "unfinished"
    assert reqs.loc[1, "reject_reason"] == ABORTED_REASON
    assert len(reqs) == 3 and s.log_sink is not None and s.log_sink.writes >= 2



# -- async scheduling: the policy decides with one step in flight ------------------------------


def test_async_the_policy_decides_on_the_state_with_a_step_in_flight() -> None:
    """With async scheduling the decision of step N+1 comes before step N's outputs: the
    policy sees step N's tokens computed, its sampled tokens counted (dated at the step's
    predicted end, when the next step starts), its KV allocated, and a request whose last token
    is in flight already finished."""
    s = plugin(async_scheduling=True)  # cost: 0.01 s + 1e-5 s per token
    t0 = time.time()
    s.reset_records(t0)
    a = add(s, 0, 100, 3)
    b = add(s, 1, 200, 1)  # its only token is sampled by its prompt step
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 100), (by_id(v, 1), 150)]))
    out, back = lazy.step(s)
    assert out is not None and not back  # step 0 in flight
    predicted = 0.01 + 250 * 1e-5
    seen: dict[str, Any] = {}

    def second(view: SchedulerView) -> Decision:
        seen["now"], seen["running"] = view.now, {m.req_id: m for m in view.running}
        ra, rb = by_id(view, 0), by_id(view, 1)
        seen["a"] = (ra.num_computed_tokens, ra.num_output_tokens, ra.num_new_tokens,
                     ra.num_blocks, ra.last_token_time)
        seen["b"] = (rb.num_computed_tokens, rb.num_output_tokens, rb.num_new_tokens)
        return Decision(scheduled=[(ra, 1), (rb, 50)])

    plan(second)
    out, back = lazy.step(s)  # schedules step 1, then step 0's outputs come back
    assert dict(out.num_scheduled_tokens) == {a: 1, b: 50}
    # a's prompt is computed and its first token (sampled by step 0) counted, dated at step
    # 0's predicted end; b's first chunk is computed, no token.
    assert seen["a"][:4] == (100, 1, 1, 4)
    assert seen["a"][4] == pytest.approx(seen["now"])
    assert seen["b"] == (150, 0, 50)
    assert seen["now"] >= predicted and seen["now"] - predicted < time.time() - t0
    # Step 0's token came back: a's mirror dates it now; its second token is in flight.
    m = s.tracked[a]
    assert len(m.token_times) == 1 and m.num_output_tokens == 2
    # Step 1 samples b's only token and a's second: b leaves the policy's view at once (vLLM
    # will not schedule it again), while it still holds its KV until its token comes back.
    seen.clear()
    plan(lambda v: (seen.update(running=[r.req_id for r in v.running], free=v.kv.num_free_blocks)
                    or Decision(scheduled=[(by_id(v, 0), 1)])))
    out, _ = lazy.step(s)
    assert seen["running"] == [0] and seen["free"] == 16 - 4 - 7
    assert dict(out.num_scheduled_tokens) == {a: 1}
    lazy.run_to_completion(s)
    reqs = {r.req_id: r for r in s.all_requests()}
    assert [reqs[i].status for i in (0, 1)] == [Status.FINISHED] * 2
    assert [len(reqs[i].token_times) for i in (0, 1)] == [3, 1]
    assert s.mismatch_steps == 0 and not s._leaving


def test_async_preempting_a_request_with_a_token_in_flight() -> None:
    """A victim whose token is still in flight: vLLM delivers that token when it comes back;
    the policy is told at once (its output count includes the token), and the recompute covers
    the prompt and every token, that one included."""
    s = plugin(num_blocks=10, async_scheduling=True)
    v0, v1 = add(s, 0, 96, 5), add(s, 1, 96, 5)
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 96), (by_id(v, 1), 96)]))
    lazy.step(s)
    plan(lambda v: Decision(scheduled=[(by_id(v, 0), 1), (by_id(v, 1), 1)]))
    lazy.step(s)  # step 0's tokens come back; step 1 in flight
    seen: list[int] = []

    def preempt(view: SchedulerView) -> Decision:
        victim = by_id(view, 0)
        return Decision(preempted=[victim], scheduled=[(by_id(view, 1), 1)])

    plan(preempt, lambda v: (seen.append(by_id(v, 0).num_new_tokens) or Decision(
        scheduled=[(by_id(v, 1), 1), (by_id(v, 0), by_id(v, 0).num_new_tokens)])))
    out, _ = lazy.step(s)
    assert out.preempted_req_ids == {v0}
    victim = s.tracked[v0]
    assert (victim.status, victim.num_computed_tokens, victim.num_output_tokens) == (
        Status.WAITING, 0, 2)  # token 1 came back, token 2 is in flight
    out, _ = lazy.step(s)  # the in-flight token came back (delivered) before this decision
    assert seen == [96 + 2] and out.num_scheduled_tokens[v0] == 98
    plan(*[lambda v: Decision(scheduled=[(r, r.num_new_tokens) for r in v.running])] * 20)
    lazy.run_to_completion(s, 20)
    reqs = {r.req_id: r for r in s.all_requests()}
    assert [len(reqs[i].token_times) for i in (0, 1)] == [5, 5]
    assert reqs[0].num_preemptions == 1 and reqs[0].status == Status.FINISHED
    assert s.mismatch_steps == 0 and s.requests.get(v1) is None


@MODES
def test_accelgen_never_schedules_a_request_it_preempts(async_scheduling: bool) -> None:
    """A step's predicted 20 ms make the mixed-SLO trace's decodes urgent under scarce KV, so
    AccelGen preempts for their blocks. A victim is never also in the batch (it once was: a
    short urgent decode preempted for an earlier one's block was still forced in as a decode;
    with async scheduling vLLM then refuses to resume it while its token is in flight)."""
    from accelgen.vllm_integration.adapter_config import request_extra_args
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace
    from accelgen.workloads.trace import to_requests

    s = lazy.make_scheduler(lazy.AccelGenScheduler, num_blocks=24, max_num_batched_tokens=1024,
                            max_model_len=768, async_scheduling=async_scheduling,
                            accelgen={"policy": {"name": "accelgen",
                                                 "params": {"kv_growth_reserve": 0}},
                                      "s_pf": 256, "cost": {"base_s": 0.02, "per_token_s": 2e-5}})
    s.reset_records(time.time())
    inner = s.accelgen_policy.schedule
    both: list[int] = []

    def checking(view: SchedulerView) -> Decision:
        d = inner(view)
        both.extend(r.req_id for r, _ in d.scheduled if r in d.preempted)
        return d

    s.accelgen_policy.schedule = checking  # type: ignore[method-assign]
    trace = mixed_slo_trace(50, 100.0, 1)
    reqs, out_len = to_requests(trace)
    for r, n in zip(reqs, out_len.tolist(), strict=True):
        s.add_request(lazy.make_request(str(r.req_id), r.prompt_len, n,
                                        extra_args=request_extra_args(r)))
        lazy.step(s)
    lazy.run_to_completion(s)
    assert sum(r.num_preemptions for r in s.all_requests()) > 0
    assert both == [] and s.mismatch_steps == 0
    assert all(r.status == Status.FINISHED for r in s.all_requests())
    assert (s.overlapped_steps > 0) is async_scheduling
