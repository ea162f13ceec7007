"""vLLM V1's priority scheduling in the simulator (``vllm-priority``): the waiting heap by
(priority, arrival), the victim with the largest (priority, arrival), a scheduled victim taken
out of the batch, no preemption by a waiting request, and the SLO-class priority rule."""

from __future__ import annotations

import math

from accelgen.core.kvcache import BlockManager
from accelgen.policies.registry import make_policy
from accelgen.policies.vllm_priority import OFFLINE_PRIORITY, slo_priority
from tests.conftest import make_requests, put_running, run_sim, scheduler_view
from tests.invariants import RecordingPolicy, check_invariants


def test_slo_priority_orders_tight_tbt_first_offline_last() -> None:
    classes = [slo_priority(True, s) for s in (0.046875, 0.09375, 0.1875, 0.375)]
    assert classes == sorted(classes) and len(set(classes)) == 4
    assert classes[0] == 47
    assert slo_priority(False, 0.046875) == OFFLINE_PRIORITY > max(classes)
    assert classes[-1] < slo_priority(True, math.inf) < OFFLINE_PRIORITY


def test_high_priority_arrival_overtakes_queued_low_priority() -> None:
    # Three loose-pace requests wait (arrived first); a tight-pace one arrives last. KV holds one
    # whole prompt at a time, so admission order is the queue order.
    reqs = make_requests([(0.0, 100), (0.001, 100), (0.002, 100), (0.003, 100)],
                         tbt_slo=0.375)
    reqs[3].tbt_slo = 0.047
    kv = BlockManager(num_blocks=8, block_size=16)
    for name, first in (("vllm-priority", 3), ("vllm", 0)):
        d = make_policy(name, {"token_budget": 512}).schedule(
            scheduler_view(list(reqs), [], kv))
        assert [r.req_id for r, _ in d.scheduled] == [first], name
    # The whole run: the tight request starts before both queued loose ones after the first.
    policy = RecordingPolicy(make_policy("vllm-priority", {"token_budget": 128}))
    res = run_sim(make_requests([(0.0, 100), (0.001, 100), (0.002, 100), (0.003, 100)],
                                tbt_slo=0.375), [5] * 4, policy, num_blocks=8, block_size=16)
    check_invariants(res, policy)
    fcfs = run_sim(make_requests([(0.0, 100), (0.001, 100), (0.002, 100), (0.003, 100)],
                                 tbt_slo=0.375), [5] * 4, make_policy("vllm"), num_blocks=8,
                   block_size=16)
    assert [r.first_scheduled_time for r in res.requests] == \
        [r.first_scheduled_time for r in fcfs.requests]  # one class: FCFS order
    tight = make_requests([(0.0, 100), (0.001, 100), (0.002, 100), (0.003, 100)],
                          tbt_slo=0.375)
    tight[3].tbt_slo = 0.047
    res = run_sim(tight, [5] * 4, make_policy("vllm-priority", {"token_budget": 128}),
                  num_blocks=8, block_size=16)
    start = {r.req_id: r.first_scheduled_time for r in res.requests}
    assert start[3] < start[1] < start[2]


def test_preempts_lowest_priority_running_request_even_if_scheduled() -> None:
    # Running in admission order: low (admitted first, loose pace; its next token needs no new
    # block) and high (tight pace; its next token needs a block); no block free. low is
    # scheduled first, then high needs a block: vLLM preempts the running request with the
    # largest (priority, arrival) - low, already in the batch - and gives its tokens back. FCFS
    # vLLM preempts the newest instead (high itself).
    def state() -> tuple[BlockManager, list]:
        kv = BlockManager(num_blocks=4, block_size=16)
        low, high = make_requests([(0.0, 20), (0.1, 31)], tbt_slo=0.375)
        high.tbt_slo = 0.047
        put_running(low, kv, 20, 1)
        put_running(high, kv, 32, 2)
        return kv, [low, high]

    kv, (low, high) = state()
    assert kv.num_free_blocks == 0
    d = make_policy("vllm-priority", {"token_budget": 64}).schedule(
        scheduler_view([], [low, high], kv))
    assert d.preempted == [low]
    assert [(r.req_id, n) for r, n in d.scheduled] == [(high.req_id, 1)]
    kv, (low, high) = state()
    d = make_policy("vllm", {"token_budget": 64}).schedule(scheduler_view([], [low, high], kv))
    assert d.preempted == [high]
    assert [r.req_id for r, _ in d.scheduled] == [low.req_id]


def test_lowest_priority_request_preempts_itself_and_stops_the_pass() -> None:
    # Running in admission order: a (tight, no new block), low (loose, needs a block), c (tight,
    # no new block); nothing free. low is itself the largest (priority, arrival): vLLM preempts
    # it and ends the running pass, so c is not scheduled in this step.
    kv = BlockManager(num_blocks=6, block_size=16)
    a, low, c = make_requests([(0.0, 20), (0.1, 31), (0.2, 20)], tbt_slo=0.047)
    low.tbt_slo = 0.375
    put_running(a, kv, 20, 1)
    put_running(low, kv, 32, 2)
    put_running(c, kv, 20, 1)
    assert kv.num_free_blocks == 0
    d = make_policy("vllm-priority").schedule(scheduler_view([], [a, low, c], kv))
    assert d.preempted == [low]
    assert [r.req_id for r, _ in d.scheduled] == [a.req_id]


def test_waiting_request_never_preempts() -> None:
    kv = BlockManager(num_blocks=4, block_size=16)
    low = put_running(make_requests([(0.0, 40)], tbt_slo=0.375)[0], kv, 48, 1)
    urgent = make_requests([(0.0, 40), (0.5, 40)], tbt_slo=0.047)[1]
    # Running low decodes (needs no new block); the tight-pace arrival needs 3 blocks, 1 free.
    d = make_policy("vllm-priority").schedule(scheduler_view([urgent], [low], kv))
    assert d.preempted == []
    assert [r.req_id for r, _ in d.scheduled] == [low.req_id]


def test_loaded_run_keeps_invariants_and_finishes_every_request() -> None:
    specs = [(0.01 * i, 40 + 37 * (i % 7)) for i in range(40)]
    reqs = make_requests(specs)
    for i, r in enumerate(reqs):
        r.tbt_slo = (0.047, 0.094, 0.1875, 0.375)[i % 4]
        r.online = i % 5 != 0
    policy = RecordingPolicy(make_policy("vllm-priority", {"token_budget": 96}))
    res = run_sim(reqs, [30 + (i % 9) * 5 for i in range(40)], policy, num_blocks=40,
                  block_size=16)
    check_invariants(res, policy)
    assert all(r.status.name == "FINISHED" for r in res.requests)
    assert sum(r.num_preemptions for r in res.requests) > 0  # the scenario does preempt


def test_replay_config_takes_the_priority_mode_for_stock_only() -> None:
    import argparse

    import pytest

    from accelgen.cli.replay import add_parser, build_config
    from accelgen.vllm_integration.replay import ReplayConfig

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    args = p.parse_args(["replay", "--trace", "t.parquet", "--out", "o", "--system", "stock",
                         "--scheduling-policy", "priority"])
    assert build_config(args).scheduling_policy == "priority"
    with pytest.raises(ValueError, match="scheduling_policy: priority is vLLM's own queue mode"):
        ReplayConfig(system="accelgen", scheduling_policy="priority")
