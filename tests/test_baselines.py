"""Scenario tests for the defining behaviour of orca, fastgen, fastserve, edf and the
system-wide-SLO sarathi variant. Each fails if the behaviour it names breaks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accelgen.costmodel.base import BatchShape
from accelgen.kvcache import BlockManager
from accelgen.policies.base import Pivot, SchedulerView
from accelgen.policies.fastserve import FastServePolicy, MLFQState
from accelgen.policies.registry import make_policy
from accelgen.request import Request, Status
from tests.conftest import LinearCost, make_requests, run_sim
from tests.invariants import RecordingPolicy, check_invariants


def _view(waiting: list[Request], running: list[Request], kv: BlockManager, *, s_pf: int = 256,
          now: float = 0.0) -> SchedulerView:
    cost = LinearCost()
    return SchedulerView(now=now, waiting=waiting, running=running, swapped=[], kv=kv, cost=cost,
                         pivot=Pivot(s_pf, cost.forward_time(s_pf)), max_model_len=100_000)


def _running(r: Request, kv: BlockManager, computed: int, outputs: int) -> Request:
    """Put ``r`` in the running state holding KV for ``computed`` tokens."""
    r.status, r.num_output_tokens = Status.RUNNING, outputs
    kv.allocate(r, computed)
    r.num_computed_tokens = computed
    return r


# -- Orca ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("num_blocks", "expected_concurrency"), [(64, 4), (160, 8)])
def test_orca_concurrency_limited_by_reservation(num_blocks: int, expected_concurrency: int) -> None:
    # Each admission reserves 256 tokens = 16 blocks. With 64 blocks only 4 requests can run
    # although the batch allows 8 and their real KV need (50 tokens = 4 blocks) is far smaller;
    # with 160 blocks the batch size (8) is the limit instead.
    reqs = make_requests([(0.0, 30)] * 12)
    policy = RecordingPolicy(make_policy("orca", {"max_seq_len": 256}))
    res = run_sim(reqs, [20] * 12, policy, num_blocks=num_blocks, block_size=16)
    check_invariants(res, policy)
    its = res.iterations.to_frame()
    assert its["batch_size"].max() == expected_concurrency
    # Allocated KV is the reservations, not the tokens: 16 blocks per resident request.
    assert (its["kv_used_blocks"] == 16 * its["num_running"]).all()
    assert its["kv_used_tokens"].max() < 16 * 16 * expected_concurrency / 2
    assert its["num_preempted"].sum() == 0


def test_orca_runs_whole_prompts_mixed_with_decodes() -> None:
    reqs = make_requests([(0.0, 40), (0.05, 900), (0.06, 300)])
    res = run_sim(reqs, [30, 5, 5], make_policy("orca", {"max_seq_len": 1024}), num_blocks=256,
                  block_size=16)
    check_invariants(res)
    its = res.iterations.to_frame()
    # No chunking: each prompt is processed in exactly one iteration, whole.
    assert sorted(its.loc[its["prefill_tokens"] > 0, "prefill_tokens"]) == [40, 300, 900]
    # Mixed iterations: the 900-token prompt joins request 0's decodes.
    big = its[its["prefill_tokens"] == 900].iloc[0]
    assert big["decode_tokens"] == 1


def test_orca_reservation_is_head_of_line() -> None:
    # 40 blocks; reservation 320 tokens = 20 blocks: two requests fit, the third waits for a
    # whole reservation to be freed even though its own prompt would fit in the free blocks.
    kv = BlockManager(num_blocks=40, block_size=16)
    reqs = make_requests([(0.0, 20)] * 3)
    d = make_policy("orca", {"max_seq_len": 320}).schedule(_view(list(reqs), [], kv))
    assert [r.req_id for r, _ in d.scheduled] == [0, 1]
    assert [(r.req_id, n) for r, n in d.reserve] == [(0, 320), (1, 320)]


# -- FastGen -------------------------------------------------------------------------------------

def test_fastgen_fills_forward_exactly_to_budget() -> None:
    budget = 128
    prompts = [300, 90, 500, 45, 260, 700]
    reqs = make_requests([(0.0, p) for p in prompts])
    policy = RecordingPolicy(make_policy("fastgen", {"token_budget": budget}))
    res = run_sim(reqs, [12] * len(prompts), policy, num_blocks=1000, block_size=16)
    check_invariants(res, policy)
    its = res.iterations.to_frame()
    with_prefill = its.index[its["prefill_tokens"] > 0]
    # While prompt work remains (every prefill iteration but the last), the forward is full.
    full = its.loc[with_prefill[:-1], "forward_size"]
    assert (full == budget).all(), full.tolist()
    assert len(full) >= sum(prompts) // budget - 1
    assert its["forward_size"].max() <= budget
    # Decodes come first: a prompt never displaces a runnable decode.
    assert its.loc[with_prefill[:-1], "decode_tokens"].sum() > 0


def test_fastgen_split_prompt_continues_first() -> None:
    reqs = make_requests([(0.0, 200), (0.0, 200)])
    res = run_sim(reqs, [3, 3], make_policy("fastgen", {"token_budget": 150}), num_blocks=200,
                  block_size=16)
    r0, r1 = res.requests
    # Iteration 1: r0[0:150]; iteration 2: r0[150:200] + r1[0:100]: r0 finished its prompt first.
    assert r0.first_token_time < r1.first_token_time
    its = res.iterations.to_frame()
    assert its["prefill_tokens"].tolist()[:2] == [150, 150]


def test_fastgen_prompt_starts_only_if_whole_remainder_fits() -> None:
    kv = BlockManager(num_blocks=30, block_size=16)
    holder = _running(make_requests([(0.0, 200)])[0], kv, 208, 9)  # 13 blocks
    new = make_requests([(0.0, 200), (0.0, 300)])[1]  # needs 19 blocks; 17 are free
    d = make_policy("fastgen", {"token_budget": 128}).schedule(_view([new], [holder], kv))
    # A 127-token chunk would fit in 8 blocks, but FastGen waits for the whole prompt.
    assert [(r.req_id, n) for r, n in d.scheduled] == [(0, 1)]
    assert d.info["kv_gate_stop"] == 1.0
    # End to end: the second prompt cannot start until the first request has freed its KV.
    reqs = make_requests([(0.0, 200), (0.01, 300)])
    res = run_sim(reqs, [100, 5], make_policy("fastgen", {"token_budget": 128}), num_blocks=30,
                  block_size=16)
    check_invariants(res)
    r0, r1 = res.requests
    assert r1.first_scheduled_time >= r0.finish_time


def test_fastgen_flushes_last_kv_holder_when_nothing_fits() -> None:
    kv = BlockManager(num_blocks=4, block_size=16)
    a = _running(make_requests([(0.0, 31)])[0], kv, 32, 2)
    b = _running(make_requests([(0.0, 31), (0.0, 31)])[1], kv, 32, 2)
    assert kv.num_free_blocks == 0  # both want a third block for their next token
    d = make_policy("fastgen").schedule(_view([], [a, b], kv))
    assert d.scheduled == [] and d.preempted == [b]
    d = make_policy("fastgen", {"deadlock_flush": "all"}).schedule(_view([], [a, b], kv))
    assert d.preempted == [b, a]


# -- FastServe -----------------------------------------------------------------------------------

FS = {"base_quantum": 0.02}  # quanta 20, 40, 80, 160, 320 ms under the linear test cost


def test_fastserve_skip_join_by_isolated_prefill_time() -> None:
    cost = LinearCost()
    policy = FastServePolicy(**FS)
    prompts = [50, 200, 500, 1200, 3000, 20_000]
    times = [cost.prefill_time(p) for p in prompts]
    # The prompts were picked so that their prefill times fall in successive quantum ranges.
    assert times[0] <= 0.02 < times[1] <= 0.04 < times[2] <= 0.08 < times[3] <= 0.16 < times[4]
    assert times[4] <= 0.32 < times[5]
    reqs = make_requests([(0.0, p) for p in prompts])
    kv = BlockManager(num_blocks=2000, block_size=16)
    policy.schedule(_view(list(reqs), [], kv))
    assert [r.policy_state.level for r in reqs] == [0, 1, 2, 3, 4, 4]
    # Behaviour: with one slot, a short request arriving during a long one's decodes is served
    # ahead of it; the long one joined a low queue and waits.
    reqs = make_requests([(0.0, 1200), (0.2, 50)])
    res = run_sim(reqs, [40, 5], FastServePolicy(max_batch_size=1, **FS), num_blocks=400,
                  block_size=16)
    check_invariants(res)
    long, short = res.requests
    # (An iteration already under way when it arrives is not interrupted.)
    during = [t for t in long.token_times if short.first_scheduled_time < t <= short.finish_time]
    assert during == [], "the low-priority request kept running during the short one"
    assert short.finish_time - short.arrival < 0.1


def test_fastserve_demotes_after_quantum() -> None:
    cost = LinearCost()
    policy = FastServePolicy(max_batch_size=1, **FS)
    kv = BlockManager(num_blocks=100, block_size=16)
    r = make_requests([(0.0, 50)])[0]
    d = policy.schedule(_view([r], [], kv))
    st: MLFQState = r.policy_state
    assert st.level == 0
    lat = cost.prefill_time(50)  # 15 ms: within the 20 ms quantum of level 0
    policy.on_step_end(_view([], [r], kv), d, lat)
    assert (st.level, st.attained) == (0, pytest.approx(lat))
    policy.on_step_end(_view([], [r], kv, now=lat), d, 0.01)  # 25 ms > 20 ms: demoted
    assert (st.level, st.attained) == (1, 0.0)
    # End to end: request 0 has used its top-level quantum when request 1 arrives at the same
    # level, so request 1 runs ahead of it (FCFS alone would keep serving request 0).
    reqs = make_requests([(0.0, 50), (0.1, 50)])
    res = run_sim(reqs, [40, 3], FastServePolicy(max_batch_size=1, **FS), num_blocks=100,
                  block_size=16)
    check_invariants(res)
    r0, r1 = res.requests
    assert r1.finish_time < r0.finish_time
    assert not [t for t in r0.token_times if r1.first_scheduled_time < t < r1.finish_time]
    # Without demotion (one queue) request 1 waits for request 0 to finish.
    res = run_sim(make_requests([(0.0, 50), (0.1, 50)]), [40, 3],
                  FastServePolicy(max_batch_size=1, num_queues=1, **FS), num_blocks=100,
                  block_size=16)
    assert res.requests[1].first_token_time > res.requests[0].finish_time


def test_fastserve_starving_request_is_promoted() -> None:
    # One slot; a long-prompt request (level 3) arrives just after an overload of short top-level
    # requests (one every 20 ms, 25 ms of work each, for 6 s). After 3 s without service it is
    # promoted to the top queue and runs long before the stream ends.
    def trace() -> list[Request]:
        return make_requests([(0.0, 50), (0.001, 1200)] + [(0.02 * i, 50) for i in range(1, 300)])

    outs = [2, 2] + [2] * 299
    res = run_sim(trace(), outs, FastServePolicy(max_batch_size=1, **FS), num_blocks=2000,
                  block_size=16)
    check_invariants(res)
    long = res.requests[1]
    assert res.iterations.to_frame()["info_promoted"].sum() >= 1
    assert 3.0 < long.first_scheduled_time < 5.0
    res = run_sim(trace(), outs, FastServePolicy(max_batch_size=1, starve_after=1e6, **FS),
                  num_blocks=2000, block_size=16)
    assert res.requests[1].first_scheduled_time > 6.0


def test_fastserve_swap_is_charged_as_time() -> None:
    bw, kv_bytes, bs = 1e6, 1024, 16
    per_block = bs * kv_bytes / bw  # 16 ms per block over the host link
    # r0 holds most of the KV while decoding; r1 (higher priority) needs more than is free, so
    # r0 is swapped out to host, and later swapped back in to finish.
    reqs = make_requests([(0.0, 200), (0.3, 150)])
    res = run_sim(reqs, [60, 30], FastServePolicy(**FS), num_blocks=24, block_size=bs,
                  kv_bytes_per_token=kv_bytes, host_link_bandwidth=bw, num_swap_blocks=100)
    check_invariants(res)
    its = res.iterations.to_frame()
    assert its["info_swap_out"].sum() >= 1 and its["info_swap_in"].sum() >= 1
    assert res.requests[0].num_preemptions == 0  # swapped, not recomputed
    swaps = its[its["swap_time"] > 0]
    assert len(swaps) >= 2
    blocks = swaps["swap_time"] / per_block
    np.testing.assert_allclose(blocks, np.round(blocks), atol=1e-9)
    # The iteration latency is the cost model's compute time plus the swap time.
    cost = LinearCost()
    for _, row in its.iterrows():
        shape = BatchShape(int(row["prefill_tokens"]), int(row["num_prefill_seqs"]),
                           float(row["prefill_attn"]), int(row["decode_tokens"]),
                           int(row["decode_ctx"]))
        assert row["latency"] == pytest.approx(cost.iteration_time(shape) + row["swap_time"])
    # With an infinitely fast link the same schedule costs no swap time.
    fast = run_sim(make_requests([(0.0, 200), (0.3, 150)]), [60, 30], FastServePolicy(**FS),
                   num_blocks=24, block_size=bs, kv_bytes_per_token=kv_bytes,
                   host_link_bandwidth=math.inf, num_swap_blocks=100)
    assert fast.iterations.to_frame()["swap_time"].sum() == 0.0
    assert fast.end_time < res.end_time


def test_swap_overlap_charges_the_longer_of_compute_and_transfer() -> None:
    bw, kv_bytes, bs = 1e6, 1024, 16
    runs = {}
    for overlap in (False, True):
        runs[overlap] = run_sim(make_requests([(0.0, 200), (0.3, 150)]), [60, 30],
                                FastServePolicy(**FS), num_blocks=24, block_size=bs,
                                kv_bytes_per_token=kv_bytes, host_link_bandwidth=bw,
                                num_swap_blocks=100, swap_overlap=overlap)
    its = runs[True].iterations.to_frame()
    swaps = its[its["swap_time"] > 0]
    assert len(swaps) >= 2
    cost = LinearCost()
    for _, row in swaps.iterrows():
        shape = BatchShape(int(row["prefill_tokens"]), int(row["num_prefill_seqs"]),
                           float(row["prefill_attn"]), int(row["decode_tokens"]),
                           int(row["decode_ctx"]))
        assert row["latency"] == pytest.approx(max(cost.iteration_time(shape), row["swap_time"]))
    assert runs[True].end_time < runs[False].end_time


def test_fastserve_recomputes_when_swap_space_is_full() -> None:
    reqs = make_requests([(0.0, 200), (0.3, 150)])
    res = run_sim(reqs, [60, 30], FastServePolicy(**FS), num_blocks=24, block_size=16,
                  host_link_bandwidth=1e6, num_swap_blocks=0)
    check_invariants(res)
    its = res.iterations.to_frame()
    assert its["swap_time"].sum() == 0.0
    assert res.requests[0].num_preemptions >= 1


# -- EDF -----------------------------------------------------------------------------------------

def test_edf_serves_earliest_deadline_first() -> None:
    def trace() -> list[Request]:
        reqs = make_requests([(0.0, 1000), (0.001, 60)])
        reqs[0].ttft_slo, reqs[1].ttft_slo = 5.0, 0.1
        return reqs

    # Request 0's prompt takes 16 iterations of 64 tokens (about 0.26 s); request 1, due at
    # 0.101 s, goes first from the second iteration on.
    res = run_sim(trace(), [5, 5], make_policy("edf", {"token_budget": 64}), num_blocks=100,
                  block_size=16)
    check_invariants(res)
    r0, r1 = res.requests
    assert r1.first_token_time - r1.arrival <= 0.1
    assert r1.first_token_time < r0.first_token_time
    assert res.iterations.to_frame()["forward_size"].max() <= 64
    # FCFS with the same budget (Sarathi: ongoing prefills first) misses request 1's TTFT.
    res = run_sim(trace(), [5, 5], make_policy("sarathi", {"token_budget": 64}), num_blocks=100,
                  block_size=16)
    assert res.requests[1].first_token_time - res.requests[1].arrival > 0.1


def test_edf_preempts_only_later_deadlines() -> None:
    kv = BlockManager(num_blocks=4, block_size=16)
    a = _running(make_requests([(0.0, 31)])[0], kv, 32, 2)
    b = _running(make_requests([(0.0, 31), (0.0, 31)])[1], kv, 32, 2)
    a.last_token_time, b.last_token_time = 0.0, 0.0
    a.tbt_slo, b.tbt_slo = 0.5, 0.1  # b is due first
    d = make_policy("edf").schedule(_view([], [a, b], kv))
    assert d.preempted == [a]
    assert [r.req_id for r, _ in d.scheduled] == [b.req_id]


# -- Sarathi with one system-wide SLO --------------------------------------------------------------

def test_sarathi_system_slo_sweep() -> None:
    cost = LinearCost()
    s_pf = 256
    t_pf = cost.forward_time(s_pf)
    budgets = []
    for slo in (0.2, 0.4, 0.6, 0.8, 1.0):
        reqs = make_requests([(i * 0.05, 100 + 211 * (i % 5)) for i in range(30)])
        res = run_sim(reqs, [20] * 30, make_policy("sarathi", {"system_slo": slo}),
                      num_blocks=400, block_size=16, s_pf=s_pf)
        check_invariants(res)
        its = res.iterations.to_frame()
        budget = int(its["info_token_budget"].iloc[0])
        assert budget == max(16, int(s_pf * slo / t_pf))
        assert its["prefill_tokens"].max() <= budget
        budgets.append(budget)
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets)


def test_orca_sequences_outgrowing_a_short_reservation_still_finish() -> None:
    # max_seq_len below the sequences' length (not the paper's setting): blocks beyond the
    # reservation are taken on demand; when every running request is stuck, the newest is
    # recomputed (the documented safety valve) instead of stalling.
    reqs = make_requests([(0.0, 30)] * 4)
    policy = RecordingPolicy(make_policy("orca", {"max_seq_len": 64}))
    res = run_sim(reqs, [150] * 4, policy, num_blocks=24, block_size=16)
    check_invariants(res, policy)
    assert all(r.status.name == "FINISHED" for r in res.requests)
    its = res.iterations.to_frame()
    assert its["batch_size"].max() == 4  # 4 reservations of 4 blocks fit in 24 blocks
    assert sum(r.num_preemptions for r in res.requests) >= 1
