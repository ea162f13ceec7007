"""``shutdown.json``: what the scheduler holds when its engine shuts down (KV blocks, vLLM's and
the plugin's request tables, the policy's own table, the log's counts), written after the final
log write; and the shutdown grace period (requests still held after it end unfinished). In
process, on vLLM's scheduler without an engine (``harness``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from accelgen.vllm_integration.adapter_config import AdapterConfig, shutdown_grace
from accelgen.vllm_integration.logsink import (
    ABORTED_REASON,
    IN_FLIGHT_REASON,
    SHUTDOWN_REASON,
    read_logs,
)
from accelgen.vllm_integration.shutdown_summary import read_summary
from tests import lazy_vllm as lazy
from tests.lazy_vllm import needs_vllm

pytestmark = needs_vllm


def _serve(cls: type, logs: Path, *, finish: bool) -> lazy.InstrumentedScheduler:
    s = lazy.make_scheduler(cls, num_blocks=32, accelgen={"log_dir": str(logs)})
    for i, (prompt, out) in enumerate([(40, 3), (70, 5), (30, 60)]):
        s.add_request(lazy.make_request(f"r{i}", prompt, out, extra_args={"req_id": i}))
    for _ in range(6):
        lazy.step(s)
    # A write while serving: the scheduler forgets what it wrote, counting it for the summary.
    ended, steps = len(s.done), len(s.log)
    assert ended and steps and s.log_sink is not None and s.log_sink.flush()
    assert not s.done and not len(s.log) and not s._timing and not s.max_tokens.keys() - {2}
    assert (s.forgotten.requests, s.forgotten.iterations) == (ended, steps)
    assert s.num_iterations == steps
    s.finish_requests("r2", lazy.RequestStatus.FINISHED_ABORTED)  # the client went away
    s.add_request(lazy.make_request("r3", 20, 4, extra_args={"req_id": 3}))
    if finish:
        for _ in range(200):
            if not s.has_unfinished_requests():
                break
            lazy.step(s)
    else:
        lazy.step(s)  # r3 is admitted and holds KV blocks
    s.shutdown()
    return s


@pytest.mark.parametrize("scheduler", ["AccelGenScheduler", "InstrumentedScheduler"])
def test_a_drained_scheduler_holds_nothing(tmp_path: Path, scheduler: str) -> None:
    cls = getattr(lazy, scheduler)
    _serve(cls, tmp_path / "logs", finish=True)
    summary = read_summary(tmp_path / "logs")
    assert summary is not None
    assert summary["kv_blocks_free"] == summary["kv_blocks_total"] > 0
    assert summary["vllm_requests"] == summary["waiting"] == summary["running"] == 0
    assert summary["tracked_requests"] == 0
    assert summary["policy_live_requests"] == (0 if cls is lazy.AccelGenScheduler else None)
    assert summary["requests_by_status"] == {"finished": 3, "unfinished": 1}
    assert summary["unfinished_by_reason"] == {ABORTED_REASON: 1}
    # Written after the final log write, and the log agrees.
    logs = read_logs(tmp_path / "logs")
    assert logs["requests"]["status"].value_counts().to_dict() == {"finished": 3,
                                                                  "unfinished": 1}
    assert summary["iterations"] == len(logs["iterations"]) > 0
    assert (tmp_path / "logs" / "requests.parquet").stat().st_mtime_ns <= \
        (tmp_path / "logs" / "shutdown.json").stat().st_mtime_ns


def test_a_request_left_in_flight_shows_in_the_summary(tmp_path: Path) -> None:
    """What the soak's drain check reads when a request was not drained: its blocks, and the
    request in vLLM's, the plugin's and the policy's tables."""
    _serve(lazy.AccelGenScheduler, tmp_path / "logs", finish=False)
    summary = read_summary(tmp_path / "logs")
    assert summary is not None
    assert summary["kv_blocks_free"] < summary["kv_blocks_total"]
    assert summary["tracked_requests"] == summary["policy_live_requests"] >= 1
    assert summary["vllm_requests"] == summary["tracked_requests"]
    assert summary["unfinished_by_reason"].get(IN_FLIGHT_REASON, 0) >= 1


def test_no_summary_without_a_shutdown(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None


@pytest.mark.parametrize("scheduler", ["AccelGenScheduler", "InstrumentedScheduler"])
def test_requests_left_after_the_grace_period_end_unfinished(tmp_path: Path, scheduler: str) -> None:
    """SIGTERM in the engine core (``shutdown_since``): within the grace period the requests
    go on; after it every request vLLM holds ends (finish reason abort, a final output for its
    client), the log says why, and the scheduler is drained for its summary."""
    cls = getattr(lazy, scheduler)
    s = lazy.make_scheduler(cls, num_blocks=32, accelgen={"log_dir": str(tmp_path / "logs"),
                                                          "shutdown_grace_s": 5.0})
    # Not vLLM's engine-core process: the test process's signal handlers stay as they are.
    assert not lazy.watch_shutdown_signals(s)
    for i, (prompt, out) in enumerate([(40, 200), (70, 200), (30, 3)]):
        s.add_request(lazy.make_request(f"r{i}", prompt, out, extra_args={"req_id": i}))
    lazy.step(s)
    s.shutdown_since = time.monotonic()  # what the signal handler notes
    lazy.step(s)
    assert len(s.tracked) == 3  # within the grace period: served on
    s.shutdown_since -= 5.0
    ended: dict[str, Any] = {}
    for _ in range(3):
        _, outputs = lazy.step(s)
        for eco in outputs.values():
            ended.update({o.request_id: o for o in eco.outputs if o.finish_reason is not None})
        if not s.has_requests():
            break
    assert not s.has_requests() and not s.tracked
    assert {rid: str(o.finish_reason) for rid, o in ended.items()} == {
        "r0": "abort", "r1": "abort", "r2": "abort"}
    s.shutdown()
    summary = read_summary(tmp_path / "logs")
    assert summary is not None
    assert summary["kv_blocks_free"] == summary["kv_blocks_total"]
    assert summary["tracked_requests"] == summary["vllm_requests"] == 0
    assert summary["policy_live_requests"] == (0 if cls is lazy.AccelGenScheduler else None)
    assert summary["unfinished_by_reason"] == {SHUTDOWN_REASON: 3}
    requests = read_logs(tmp_path / "logs")["requests"]
    assert set(requests["reject_reason"]) == {SHUTDOWN_REASON}


def test_the_default_grace_leaves_vllm_time_to_write_the_logs() -> None:
    cfg = AdapterConfig()
    assert shutdown_grace(cfg, 30.0) == 10.0
    assert shutdown_grace(cfg, 12.0) == 7.0
    assert shutdown_grace(cfg, 0.0) == 0.0
    assert shutdown_grace(AdapterConfig(shutdown_grace_s=2.5), 30.0) == 2.5
