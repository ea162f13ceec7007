"""Simulator mechanics, results files and metrics on hand-checked cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from accelgen import metrics
from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.policies.registry import make_policy
from accelgen.results import read_results, requests_frame, write_results
from accelgen.sim.engine import PolicyError
from tests.conftest import LinearCost, make_requests, run_sim
from tests.invariants import check_invariants


def test_single_request_timeline_matches_cost_model() -> None:
    cost = LinearCost(base=0.01, per_token=1e-3, per_ctx=0.0)
    reqs = make_requests([(0.5, 100)])
    res = run_sim(reqs, [3], make_policy("vllm", {"token_budget": 512}), cost=cost)
    r = res.requests[0]
    # prefill of 100 tokens, then two decodes of one token each
    t1 = 0.5 + 0.01 + 0.1
    assert r.token_times == pytest.approx([t1, t1 + 0.011, t1 + 0.022])
    assert r.first_token_time == pytest.approx(t1)
    assert r.finish_time == pytest.approx(t1 + 0.022)


def test_chunked_prefill_emits_first_token_after_last_chunk() -> None:
    cost = LinearCost(base=0.01, per_token=1e-3, per_ctx=0.0)
    reqs = make_requests([(0.0, 250)])
    res = run_sim(reqs, [1], make_policy("vllm", {"token_budget": 100}), cost=cost)
    its = res.iterations.to_frame()
    assert its["prefill_tokens"].tolist() == [100, 100, 50]
    assert len(res.requests[0].token_times) == 1


def test_rejections_have_reasons() -> None:
    reqs = make_requests([(0.0, 50), (0.0, 5000), (0.1, 30)])
    # 5000 + 10 tokens do not fit in 64 blocks x 16 = 1024 tokens of KV.
    res = run_sim(reqs, [10, 10, 10], make_policy("vllm"), num_blocks=64, block_size=16)
    check_invariants(res)
    rej = [r for r in res.requests if r.status.name == "REJECTED"]
    assert [r.req_id for r in rej] == [1]
    assert "KV capacity" in rej[0].reject_reason
    res = run_sim(make_requests([(0.0, 500)]), [10], make_policy("vllm"), max_model_len=400)
    assert "max_model_len" in res.requests[0].reject_reason


def test_output_cut_at_max_model_len_is_recorded_and_counted() -> None:
    # Request 0 would end at 90 + 50 tokens, beyond max_model_len 100; request 1 ends exactly
    # at it (not cut); request 2 is far from it.
    res = run_sim(make_requests([(0.0, 90), (0.0, 60), (0.0, 10)]), [50, 40, 5],
                  make_policy("vllm"), max_model_len=100)
    check_invariants(res)
    assert res.served_output_len.tolist() == [10, 40, 5]
    assert [r.num_output_tokens for r in res.requests] == [10, 40, 5]
    assert [r.status.name for r in res.requests] == ["CUT", "FINISHED", "FINISHED"]
    assert res.requests[0].reject_reason == ("length_cap: output cut at 10 of 50 tokens "
                                             "(prompt 90 + output reached max_model_len 100)")
    rf = requests_frame(res.requests, res.served_output_len)
    assert rf["status"].tolist() == ["cut", "finished", "finished"]
    s = metrics.summarize(rf, res.iterations.to_frame(), s_pf=256)
    assert (s["num_finished"], s["num_cut"], s["num_rejected"], s["num_unfinished"]) == (2, 1, 0, 0)
    # A cut request was served: it counts in throughput like a finished one.
    assert s["throughput_output_tps"] * s["makespan_s"] == pytest.approx(55)


class _Greedy(Policy):
    """Schedules every waiting prompt whole, ignoring KV: a buggy policy."""

    name = "greedy"

    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(scheduled=[(r, r.num_new_tokens) for r in view.waiting])


class _Idle(Policy):
    name = "idle"

    def schedule(self, view: SchedulerView) -> Decision:
        return Decision()


def test_kv_overflow_is_a_policy_error_not_silently_fixed() -> None:
    reqs = make_requests([(0.0, 600), (0.0, 600)])
    with pytest.raises(PolicyError, match="KV overflow"):
        run_sim(reqs, [5, 5], _Greedy(), num_blocks=64, block_size=16)


def test_stalled_policy_rejects_with_reason() -> None:
    res = run_sim(make_requests([(0.0, 10), (1.0, 10)]), [2, 2], _Idle())
    assert all(r.status.name == "REJECTED" and "stalled" in r.reject_reason for r in res.requests)


def test_metrics_on_hand_built_requests() -> None:
    df = pd.DataFrame({
        "req_id": [0, 1, 2], "arrival": [0.0, 0.0, 1.0], "source": ["a", "a", "b"],
        "online": [True, True, False], "prompt_len": [10, 10, 10], "output_len": [3, 2, 1],
        "ttft_slo": [0.5, 0.5, math.inf], "tbt_slo": [0.2, 0.2, math.inf],
        "jct_slo": [1.0, 1.0, 0.5],
        "status": ["finished", "finished", "rejected"], "reject_reason": ["", "", "x"],
        "num_output_tokens": [3, 2, 0], "first_scheduled_time": [0.0, 0.0, np.nan],
        "first_token_time": [0.4, 0.6, np.nan], "finish_time": [0.9, 0.7, 1.0],
        "num_preemptions": [0, 0, 0],
        "token_times": [[0.4, 0.5, 0.9], [0.6, 0.7], []],
    })
    pr = metrics.per_request(df)
    # req 0: first ok, gap 0.1 ok, gap 0.4 misses; req 1: first token late, gap ok
    assert pr["tokens_met"].tolist() == [2, 1, 0]
    assert pr["slo_met"].tolist() == [False, False, False]
    assert pr["jct_met"].tolist() == [True, True, False]
    its = pd.DataFrame({"start": [0.0], "latency": [0.1], "forward_size": [50],
                        "prefill_tokens": [49], "decode_tokens": [1], "prefill_attn": [0.0],
                        "decode_ctx": [10], "kv_used_blocks": [3], "kv_total_blocks": [4]})
    s = metrics.summarize(df, its, s_pf=100)
    assert s["slo_attainment_iteration"] == pytest.approx(3 / 5)
    assert s["jct_attainment"] == pytest.approx(2 / 3)
    assert s["num_rejected"] == 1
    assert s["throughput_rps"] == pytest.approx(2 / 0.9)
    assert s["gpu_util_mean"] == pytest.approx(0.5)
    assert s["kv_util_mean"] == pytest.approx(0.75)
    assert metrics.capacity(np.array([1, 2, 3]), np.array([0.99, 0.95, 0.85])) == pytest.approx(2.5)


def test_results_files_are_deterministic(tmp_path) -> None:
    def once(out):
        reqs = make_requests([(i * 0.03, 20 + 37 * (i % 9)) for i in range(50)])
        res = run_sim(reqs, [5 + i % 13 for i in range(50)], make_policy("sarathi"),
                      num_blocks=40)
        rf = requests_frame(res.requests, res.served_output_len)
        its = res.iterations.to_frame()
        write_results(out, rf, its, metrics.summarize(rf, its, s_pf=256), {"x": 1},
                      res.iterations.timing_frame(), {"wall": res.wall_time_s})
    once(tmp_path / "a")
    once(tmp_path / "b")
    for name in ("requests.parquet", "iterations.parquet", "summary.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    reqs, its, summary = read_results(tmp_path / "a")
    assert len(reqs) == 50 and "decision_time" in its and summary["num_finished"] == 50


def test_results_writer_leaves_nothing_on_failure(tmp_path) -> None:
    bad = pd.DataFrame({"x": [object()]})  # not serialisable by pyarrow
    with pytest.raises(Exception):  # noqa: B017
        write_results(tmp_path / "out", bad, bad, {}, {})
    assert list(tmp_path.iterdir()) == []
