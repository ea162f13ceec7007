"""Scenario tests for the defining behaviour of vllm, vllm-v0 and sarathi."""

from __future__ import annotations

from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Decision, SchedulerView
from accelgen.core.request import Status
from accelgen.policies.common import is_prefilling
from accelgen.policies.registry import make_policy
from tests.conftest import LinearCost, make_requests, run_sim, scheduler_view
from tests.invariants import RecordingPolicy, check_invariants


def test_vllm_v0_prefill_only_iterations_and_head_of_line_blocking() -> None:
    # Request 0 decodes for long; request 1 (huge prompt) cannot fit beside it, and request 2
    # (small) waits behind request 1 although it would fit: head-of-line blocking.
    reqs = make_requests([(0.0, 100), (0.05, 960), (0.06, 20)])
    res = run_sim(reqs, [200, 5, 5], make_policy("vllm-v0"), num_blocks=64, block_size=16)
    check_invariants(res)
    its = res.iterations.to_frame()
    mixed = its[(its["prefill_tokens"] > 0) & (its["decode_tokens"] > 0)]
    assert mixed.empty, "vllm-v0 must never mix prefill and decode in one iteration"
    _, r1, r2 = res.requests
    assert r2.first_scheduled_time >= r1.first_scheduled_time
    # Request 2 could have run right away on free KV but did not start before request 1.
    assert r2.first_scheduled_time > 1.0


def test_vllm_admission_needs_whole_prompt_to_fit() -> None:
    kv = BlockManager(num_blocks=10, block_size=16)
    reqs = make_requests([(0.0, 200)])  # 13 blocks needed for the whole prompt; 10 exist
    small = make_requests([(0.0, 200), (0.0, 100)])[1]
    # A 64-token budget would fit a first chunk of either, but vLLM (SPEC) admits only when the
    # whole remaining prompt fits in free KV, and stops at the head of the queue.
    d = make_policy("vllm", {"token_budget": 64}).schedule(scheduler_view([reqs[0], small], [], kv))
    assert d.scheduled == []
    d = make_policy("vllm", {"token_budget": 64}).schedule(scheduler_view([small], [], kv))
    assert [(r.req_id, n) for r, n in d.scheduled] == [(1, 64)]
    assert kv.blocks_needed(small, 64) == 4  # blocks are per chunk, not for the whole prompt


def test_vllm_preempts_newest_running_request() -> None:
    kv = BlockManager(num_blocks=4, block_size=16)
    reqs = make_requests([(0.0, 16), (0.0, 16), (0.0, 16), (0.0, 16)])
    for r in reqs:  # every request holds one full block and wants to decode a 17th token
        r.status, r.num_output_tokens, r.num_computed_tokens, r.num_blocks = Status.RUNNING, 1, 16, 1
    kv.num_free_blocks = 0
    d = make_policy("vllm").schedule(scheduler_view([], list(reqs), kv))
    assert [r.req_id for r in d.preempted] == [3, 2]
    assert [r.req_id for r, _ in d.scheduled] == [0, 1]


def test_sarathi_decodes_never_stall_and_budget_holds() -> None:
    class Check(RecordingPolicy):
        def schedule(self, view: SchedulerView) -> Decision:
            d = super().schedule(view)
            ids = {r.req_id for r, _ in d.scheduled}
            gone = {r.req_id for r in d.preempted}
            for r in view.running:
                if not is_prefilling(r) and r.req_id not in gone:
                    assert r.req_id in ids, "a running decode was stalled"
            n_dec = sum(1 for r, n in d.scheduled if not is_prefilling(r))
            assert sum(n for _, n in d.scheduled) <= d.info["token_budget"] + n_dec
            return d

    reqs = make_requests([(i * 0.02, 50 + 97 * (i % 7)) for i in range(40)])
    policy = Check(make_policy("sarathi", {"token_budget": 128}))
    res = run_sim(reqs, [30 + i % 11 for i in range(40)], policy, num_blocks=200, block_size=16)
    check_invariants(res, policy)
    its = res.iterations.to_frame()
    assert its["prefill_tokens"].max() <= 128
    assert (its["forward_size"] > its["decode_tokens"]).any()  # prefills were piggybacked


def test_sarathi_system_slo_sets_budget() -> None:
    kv = BlockManager(num_blocks=100, block_size=16)
    cost = LinearCost()
    t_pf = cost.forward_time(256)
    for slo in (0.2, 0.4, 1.0):
        p = make_policy("sarathi", {"system_slo": slo})
        d = p.schedule(scheduler_view([], [], kv))
        assert d.info["token_budget"] == max(16, int(256 * slo / t_pf))
