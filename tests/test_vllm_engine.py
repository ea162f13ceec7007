"""End-to-end tests on a real vLLM CPU engine with a tiny random-weight model (marker ``vllm``).

Each test starts one engine (about 5-30 s on a 2-core machine) and keeps its workload small;
run them one at a time (`pytest -m vllm`, no xdist).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from accelgen import metrics
from accelgen.results import read_results
from accelgen.vllm_integration import SCHEDULER_CLS
from accelgen.vllm_integration.replay import ReplayConfig, replay_to_dir
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.tiny_model import write_tiny_model
from tests.lazy_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

BLOCKS = 24  # usable KV blocks of 32 tokens: 768 tokens for 50 requests, so KV is scarce


def poisson_trace(n: int = 50, rate: float = 25.0, seed: int = 0) -> pd.DataFrame:
    return mixed_slo_trace(n, rate, seed)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_accelgen_serves_a_poisson_trace_with_preemption(tmp_path: Path,
                                                         async_scheduling: bool) -> None:
    """The plugin under vLLM's async scheduling (its default; on CPU the replay turns it on
    again, with the model in a worker process) and in sync mode."""
    from accelgen.vllm_integration.logsink import read_logs

    # 100 req/s: all 50 requests arrive within about half a second, far faster than the tiny
    # engine serves them on any machine, so the queue backs up and the 24 blocks fill (at 25
    # req/s an idle machine served the trace without ever filling the KV).
    trace = poisson_trace(rate=100.0)
    # kv_growth_reserve=0: admissions leave no room for decode growth, so with 24 blocks the
    # policy must preempt (with its default reserve it rarely needs to on this trace). The
    # engine's max_num_batched_tokens, set below the policy's budget (S_pf = 256), caps it: the
    # policy plans within it, nothing is trimmed.
    cfg = ReplayConfig(
        system="accelgen",
        adapter={"policy": {"name": "accelgen", "params": {"kv_growth_reserve": 0}},
                 "s_pf": 256, "cost": {"base_s": 0.005, "per_token_s": 2e-5},
                 "log_dir": str(tmp_path / "logs")},
        engine={"num_gpu_blocks": BLOCKS + 1, "max_model_len": BLOCKS * 32,
                "max_num_batched_tokens": 192, "max_num_seqs": 64,
                "tiny_dir": tmp_path / "model",
                "async_scheduling": async_scheduling},
        max_wall_s=240.0)
    run = replay_to_dir(trace, cfg, tmp_path / "results")

    reqs, its, summary = read_results(tmp_path / "results")
    assert len(reqs) == 50
    assert (reqs["status"] == "finished").all(), reqs.loc[reqs["status"] != "finished"]
    assert (reqs["num_output_tokens"] == trace["output_len"].to_numpy()).all()
    assert (reqs["token_times"].map(len) == reqs["num_output_tokens"]).all()
    assert (reqs["first_token_time"] >= reqs["arrival"]).all()
    assert int(reqs["num_preemptions"].sum()) > 0
    assert summary["adapter_mismatch_steps"] == 0 and not summary["timed_out"]
    assert summary["adapter_trimmed_steps"] == 0 and (its["info_adapter_trimmed_tokens"] == 0).all()
    assert (its["forward_size"] <= 192).all() and (its["forward_size"] == 192).any()
    assert (its["info_token_budget"] <= 192).all() and (its["info_adapter_mismatch"] == 0).all()
    assert (its["kv_used_blocks"] <= BLOCKS).all()
    assert (its["decision_time"] > 0).all()
    # The results load in the metrics module exactly like a simulator run's.
    again = metrics.summarize(reqs, its, s_pf=256)
    assert again["num_finished"] == 50 and again["num_preemptions"] > 0
    assert 0.0 <= again["slo_attainment_iteration"] <= 1.0
    assert math.isfinite(again["throughput_output_tps"])
    timing = pd.read_parquet(tmp_path / "results" / "timing.parquet")
    assert {"decision_time", "policy_time", "vllm_schedule_time", "exec_time"} <= set(timing)
    cfg_json = json.loads((tmp_path / "results" / "config.json").read_text())
    assert cfg_json["resolved"]["vllm_version"].startswith("0.32.0")
    assert cfg_json["resolved"]["max_num_batched_tokens"] == 192
    assert cfg_json["resolved"]["max_num_batched_tokens_why"] == (
        "max_num_batched_tokens=192 (set by the user) caps the policy's token budget (its own "
        "largest: 256)")
    assert cfg_json["resolved"]["async_scheduling"] is async_scheduling
    assert summary["async_scheduling"] is async_scheduling
    # Async scheduling really overlapped: steps were scheduled with an earlier one in flight.
    if async_scheduling:
        assert summary["overlapped_steps"] > summary["num_iterations"] // 2
    else:
        assert summary["overlapped_steps"] == 0
    assert run.timing_summary["policy_time_mean"] > 0
    # The plugin's own logs (what a server keeps) hold the same requests and steps, complete:
    # the warm-up's and the trace's requests, every step logged once.
    logs = read_logs(tmp_path / "logs")
    served = logs["requests"].set_index("req_id").loc[reqs["req_id"]]
    assert (served["status"] == "finished").all()
    assert (served["num_output_tokens"].to_numpy() == reqs["num_output_tokens"].to_numpy()).all()
    assert len(logs["iterations"]) == len(logs["timing"]) == len(its)


def test_llm_api_child_process_and_bad_slos(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLM(scheduler_cls=...)`` with the engine core in a child process (the plugin and its
    config travel as a class path and ``additional_config``); requests with bad SLOs finish
    with an error naming the field while the others are served."""
    import vllm.envs
    from vllm import LLM, SamplingParams

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    vllm.envs.disable_envs_cache()
    model = write_tiny_model(tmp_path / "model")
    llm = LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, block_size=32, num_gpu_blocks_override=33,
              max_model_len=1024, max_num_batched_tokens=1024, enable_prefix_caching=False,
              async_scheduling=False, scheduler_cls=SCHEDULER_CLS,
              additional_config={"accelgen": {"policy": {"name": "vllm"}, "s_pf": 256}})
    try:
        extras = [{"ttft_slo": 0.5, "tbt_slo": 0.1}, {"ttft_slo": -1.0},
                  {"tbt_slo": "fast"}, {}, {"jct_slo": 10.0, "online": False}]
        params = [SamplingParams(max_tokens=6, ignore_eos=True, extra_args=e, detokenize=False)
                  for e in extras]
        prompts = [{"prompt_token_ids": list(range(5, 5 + 40 + 10 * i))} for i in range(5)]
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
    by_index = {int(o.request_id): o.outputs[0] for o in outs}
    for i in (0, 3, 4):
        assert len(by_index[i].token_ids) == 6 and by_index[i].finish_reason == "length"
    assert by_index[1].finish_reason == "error"
    assert "ttft_slo=-1.0 must be > 0" in str(by_index[1].stop_reason)
    assert by_index[2].finish_reason == "error"
    assert "tbt_slo='fast' is not a number" in str(by_index[2].stop_reason)


def test_cli_replay_stock_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from accelgen.cli import main
    from accelgen.workloads.trace import write_trace

    max_model_len = BLOCKS * 32
    trace = poisson_trace(n=12, rate=40.0, seed=1)
    # The longest prompt asks for more output than max_model_len leaves: the engine stops it
    # there, and the results say so.
    long = int(trace["prompt_len"].idxmax())
    trace.loc[long, ["output_len", "output_len_natural"]] = max_model_len
    write_trace(trace, {"test": True}, tmp_path / "trace.parquet")
    rc = main(["replay", "--trace", str(tmp_path / "trace.parquet"), "--system", "stock",
               "--num-gpu-blocks", str(2 * BLOCKS + 1), "--max-model-len", str(max_model_len),
               "--max-num-batched-tokens", "1024", "--s-pf", "256",
               "--out", str(tmp_path / "stock"), "--no-progress"])
    assert rc == 0
    reqs, its, summary = read_results(tmp_path / "stock")
    served = max_model_len - int(trace.loc[long, "prompt_len"])
    assert reqs.loc[long, "status"] == "cut"
    assert reqs.loc[long, "num_output_tokens"] == reqs.loc[long, "output_len"] == served
    assert reqs.loc[long, "reject_reason"].startswith(f"length_cap: output cut at {served} of "
                                                      f"{max_model_len} tokens")
    assert (reqs.drop(index=long)["status"] == "finished").all()
    assert (summary["num_finished"], summary["num_cut"]) == (11, 1)
    assert "12 requests: 11 finished, 1 cut at max_model_len, 0 rejected" in \
        capsys.readouterr().out
    assert summary["policy"] == "vllm-stock" and summary["num_iterations"] == len(its) > 0


def test_stock_priority_mode_orders_by_slo_class(tmp_path: Path) -> None:
    """vLLM's own priority mode (``scheduling_policy=priority``) with the SLO-class priority the
    simulator's ``vllm-priority`` uses: a tight-pace arrival overtakes a queued loose-pace one,
    and when KV runs out the running request with the lowest priority is preempted although
    it was admitted first (FCFS would preempt the newest). Same scenarios as
    tests/test_vllm_priority.py, on the real engine."""
    from vllm import SamplingParams

    from accelgen.vllm_integration.replay import (
        ReplayConfig,
        build_engine,
        engine_scheduler,
        shutdown_engine,
    )

    cfg = ReplayConfig(system="stock", scheduling_policy="priority",
                       engine={"num_gpu_blocks": 4 + 1, "max_model_len": 128,
                               "max_num_batched_tokens": 256, "max_num_seqs": 2,
                               "tiny_dir": tmp_path / "model"})
    engine = build_engine(cfg, tmp_path)
    loose, tight = 0.375, 0.047

    def add(i: int, tbt: float, prompt: int, out: int) -> None:
        extra = {"req_id": i, "ttft_slo": 60.0, "tbt_slo": tbt, "jct_slo": 600.0}
        engine.add_request(str(i), {"prompt_token_ids": [5 + (i + k) % 50 for k in range(prompt)]},
                           SamplingParams(max_tokens=out, ignore_eos=True, temperature=0.0,
                                          extra_args=extra, detokenize=False))

    def drain() -> None:
        while engine.has_unfinished_requests():
            engine.step()

    try:
        sched = engine_scheduler(engine)
        # Preemption: loose 0 is admitted first, tight 1 second; each holds 2 of the 4 blocks
        # (40 prompt tokens) and needs a third at its 65th token. 0 gets there first, and the
        # lowest-priority running request is 0 itself: it is preempted, 1 never is.
        add(0, loose, 40, 40)
        engine.step()
        add(1, tight, 40, 40)
        drain()
        # Overtaking: 2 and 3 (loose) run, 4 (loose) and then 5 (tight) wait for a slot
        # (max_num_seqs 2): 5 starts first.
        add(2, loose, 8, 12)
        add(3, loose, 8, 16)
        engine.step()
        add(4, loose, 8, 4)
        add(5, tight, 8, 4)
        drain()
        by_id = {r.req_id: r for r in sched.all_requests()}
    finally:
        shutdown_engine(engine)
    assert all(r.status.name == "FINISHED" for r in by_id.values())
    assert by_id[0].num_preemptions >= 1 and by_id[1].num_preemptions == 0
    assert by_id[5].first_scheduled_time < by_id[4].first_scheduled_time
    assert sched.policy.value == "priority"
