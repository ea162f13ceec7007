"""The soak's checks (``serving.soak.evaluate``) on made-up runs: a clean run holds every check,
and each fault the soak looks for fails the check that names it. No server: the soak itself is
``scripts/soak_serve.py``."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from accelgen.serving.soak import Sample, Seen, SoakConfig, evaluate, plan, rss_growth
from accelgen.vllm_integration.adapter_config import AUTO_REQ_ID_BASE
from accelgen.vllm_integration.logsink import ABORTED_REASON, IN_FLIGHT_REASON, SHUTDOWN_REASON

CFG = SoakConfig(rate=10.0, duration_s=20.0, warmup_s=5.0)
T0 = 1_000_000.0  # the run's start, epoch seconds


def _run(tmp: Path) -> dict[str, Any]:
    """A clean run: 6 requests (finished, rejected, aborted, raced abort, refused, finished in
    flight at SIGTERM), one late request refused by the stopping engine, two warm-ups."""
    seen = [Seen(0, "normal", 0, outcome="finished", http_status=200, sent=1.0, ended=2.0),
            Seen(1, "impossible", 1, outcome="rejected", http_status=200, sent=2.0, ended=2.1),
            Seen(2, "abort", 2, outcome="aborted", http_status=200, sent=3.0, ended=3.5),
            Seen(3, "abort", 3, outcome="aborted", http_status=200, sent=4.0, ended=4.5),
            Seen(4, "malformed", 4, outcome="refused", http_status=400, sent=5.0, ended=5.0),
            Seen(5, "normal", 5, outcome="finished", http_status=200, sent=19.0, ended=21.0,
                 in_flight_at_sigterm=True),
            Seen(6, "normal", 6)]  # never sent (the soak ended first)
    late = [Seen(7, "normal", 7, phase="late", outcome="unfinished", http_status=200,
                 sent=20.2, ended=20.3)]
    rows = [(0, "finished", ""), (1, "rejected", "accelgen: rejected by policy accelgen: late"),
            (2, "unfinished", ABORTED_REASON), (3, "finished", ""), (5, "finished", ""),
            (AUTO_REQ_ID_BASE, "finished", ""), (AUTO_REQ_ID_BASE + 1, "finished", "")]
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    pd.DataFrame(rows, columns=["req_id", "status", "reject_reason"]).to_parquet(
        logs / "requests.parquet")
    summary = {"time": T0 + 20.5, "kv_blocks_total": 100, "kv_blocks_free": 100,
               "vllm_requests": 0, "waiting": 0, "running": 0, "tracked_requests": 0,
               "policy_live_requests": 0, "requests_by_status": {"finished": 5, "rejected": 1,
                                                                  "unfinished": 1},
               "unfinished_by_reason": {ABORTED_REASON: 1}, "iterations": 50,
               "log_writes": 4}
    (logs / "shutdown.json").write_text(json.dumps(summary))
    samples = [Sample(t, True, {"api_server": 300_000 + int(t), "engine_core": 900_000},
                      {"api_server": 10, "engine_core": 11}) for t in range(0, 20, 2)]
    return {"seen": seen, "late": late, "samples": samples, "warmups": 2, "t_sigterm": 20.0,
            "t_exit": 25.0, "exit_status": 0, "in_flight_at_sigterm": 1, "client_waited": 0,
            "planned": 7, "model": "m", "t0_epoch": T0}


def _failed(raw: dict[str, Any], tmp: Path) -> set[str]:
    report = evaluate(raw, tmp / "logs", CFG)
    return {name for name, c in report["checks"].items() if not c["held"]}


def test_a_clean_run_holds_every_check(tmp_path: Path) -> None:
    report = evaluate(_run(tmp_path), tmp_path / "logs", CFG)
    assert report["held"], json.dumps(report["checks"], indent=1, default=str)
    logged = report["checks"]["every_request_logged"]
    assert logged["abort_raced"] == 1
    assert logged["client_outcomes"] == {"aborted": 2, "finished": 2, "refused": 1,
                                         "rejected": 1}
    assert report["load"]["late_requests"] == {"200:unfinished": 1}


def _edit_log(tmp: Path, change: Any) -> None:
    path = tmp / "logs" / "requests.parquet"
    df = pd.read_parquet(path)
    change(df).to_parquet(path)


@pytest.mark.parametrize("fault, check", [
    ("5xx", "no_5xx"), ("5xx_in_stream", "no_5xx"), ("restart", "never_restarted"),
    ("server_died", "never_restarted"), ("rss", "rss_growth"),
    ("lost", "every_request_logged"), ("wrong_outcome", "every_request_logged"),
    ("refused_logged", "every_request_logged"), ("stray", "every_request_logged"),
    ("extra_warmup", "every_request_logged"), ("blocks", "drained"), ("policy", "drained"),
    ("no_summary", "drained"), ("exit", "logs_complete"), ("summary_early", "logs_complete"),
])
def test_each_fault_fails_its_check(tmp_path: Path, fault: str, check: str) -> None:
    raw = copy.deepcopy(_run(tmp_path))
    summary_path = tmp_path / "logs" / "shutdown.json"
    summary = json.loads(summary_path.read_text())
    if fault == "5xx":
        raw["seen"][0].http_status, raw["seen"][0].outcome = 500, "error"
    elif fault == "5xx_in_stream":
        raw["seen"][0].outcome = "error"  # an error event with a 5xx code in a 200 stream
    elif fault == "restart":
        raw["samples"][-1].pids["engine_core"] = 12
    elif fault == "server_died":
        raw["samples"][-1].alive = False
    elif fault == "rss":
        raw["samples"][-1].rss_kib["engine_core"] = int(900_000 * 1.11)
    elif fault == "lost":
        _edit_log(tmp_path, lambda df: df[df["req_id"] != 5])
    elif fault == "wrong_outcome":
        raw["seen"][0].outcome = "rejected"
    elif fault == "refused_logged":
        _edit_log(tmp_path, lambda df: pd.concat([df, pd.DataFrame(
            [(4, "finished", "")], columns=df.columns)]))
    elif fault == "stray":
        _edit_log(tmp_path, lambda df: pd.concat([df, pd.DataFrame(
            [(6, "finished", "")], columns=df.columns)]))
    elif fault == "extra_warmup":
        _edit_log(tmp_path, lambda df: pd.concat([df, pd.DataFrame(
            [(AUTO_REQ_ID_BASE + 2, "finished", "")], columns=df.columns)]))
    elif fault == "blocks":
        summary["kv_blocks_free"] = 99
    elif fault == "policy":
        summary["policy_live_requests"] = 1
    elif fault == "no_summary":
        summary_path.unlink()
    elif fault == "exit":
        raw["exit_status"] = None  # killed after the drain timeout
    elif fault == "summary_early":
        summary["time"] = T0 + 10.0  # a summary from before this SIGTERM
    if summary_path.exists() and fault != "no_summary":
        summary_path.write_text(json.dumps(summary))
    assert check in _failed(raw, tmp_path)


def test_in_flight_at_shutdown_is_a_logged_outcome(tmp_path: Path) -> None:
    """A request the drain did not finish is unfinished in the log and for the client: counted,
    not lost (the drain check then says what it still holds)."""
    raw = _run(tmp_path)
    raw["seen"][5].outcome = "unfinished"
    _edit_log(tmp_path, lambda df: df.assign(
        status=df["status"].where(df["req_id"] != 5, "unfinished"),
        reject_reason=df["reject_reason"].where(df["req_id"] != 5, IN_FLIGHT_REASON)))
    report = evaluate(raw, tmp_path / "logs", CFG)
    assert report["checks"]["every_request_logged"]["held"]
    assert report["checks"]["every_request_logged"]["log_outcomes"]["unfinished"] == 1


@pytest.mark.parametrize("in_flight, tokens, held", [(True, 0, True), (False, 0, False),
                                                      (True, 3, False)])
def test_a_stream_the_stopping_server_closed_before_the_engine_saw_it(
        tmp_path: Path, in_flight: bool, tokens: int, held: bool) -> None:
    """Accepted while the server was stopping, no token, not in the plugin's log: counted as
    never reaching the engine. The same absence is a loss for a request sent earlier or one
    that got tokens (the engine served it, so it must be logged)."""
    raw = _run(tmp_path)
    s = raw["seen"][5]
    s.outcome, s.tokens, s.in_flight_at_sigterm = "unfinished", tokens, in_flight
    _edit_log(tmp_path, lambda df: df[df["req_id"] != 5])
    logged = evaluate(raw, tmp_path / "logs", CFG)["checks"]["every_request_logged"]
    assert logged["held"] is held
    assert logged["unfinished_before_the_engine"] == int(held)


def test_rss_growth_is_measured_from_the_warmup_on() -> None:
    samples = [Sample(0.0, True, {"engine_core": 100}, {}),
               Sample(5.0, True, {"engine_core": 200}, {}),
               Sample(9.0, True, {"engine_core": 210}, {})]
    growth = rss_growth(samples, warmup_s=5.0)["engine_core"]
    assert math.isclose(growth["growth"], 0.05)


def test_the_plan_has_each_kind_in_its_share() -> None:
    planned = plan(SoakConfig(rate=50.0, duration_s=200.0), "m")
    assert len(planned) == 10_000
    share = {k: sum(p.kind == k for p in planned) / len(planned)
             for k in ("abort", "malformed", "impossible")}
    assert abs(share["abort"] - 0.10) < 0.01
    assert abs(share["malformed"] - 0.05) < 0.01 and abs(share["impossible"] - 0.05) < 0.01
    assert planned[-1].arrival == pytest.approx(200.0)
    ids = [p.req_id for p in planned]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("ended, held", [(20.3, True), (19.5, False)])
def test_a_stopping_servers_503_is_a_refusal_not_a_fault(tmp_path: Path, ended: float,
                                                         held: bool) -> None:
    """The 503 of a server that is stopping (``slo_http.SHUTTING_DOWN_*``) refuses a request
    answered after SIGTERM; the same answer before SIGTERM is a fault."""
    raw = _run(tmp_path)
    late = raw["late"][0]
    late.http_status, late.outcome, late.at_shutdown = 503, "refused", True
    late.sent, late.ended = ended - 0.1, ended
    report = evaluate(raw, tmp_path / "logs", CFG)
    assert report["checks"]["no_5xx"]["held"] is held
    assert report["checks"]["no_5xx"]["refused_at_shutdown"] == int(held)
    assert report["checks"]["every_request_logged"]["held"]


def test_an_exit_after_the_stop_limit_fails(tmp_path: Path) -> None:
    raw = _run(tmp_path)
    raw["t_exit"] = raw["t_sigterm"] + CFG.stop_limit_s + 1.0
    assert "logs_complete" in _failed(raw, tmp_path)


def test_an_abort_after_sigterm_may_meet_the_grace_period(tmp_path: Path) -> None:
    """The client closed a stream after SIGTERM that the grace period had ended (unfinished in
    the log): not a mismatch. Before SIGTERM the same pair is one."""
    raw = _run(tmp_path)
    s = raw["seen"][5]
    s.outcome = "aborted"
    _edit_log(tmp_path, lambda df: df.assign(
        status=df["status"].where(df["req_id"] != 5, "unfinished"),
        reject_reason=df["reject_reason"].where(df["req_id"] != 5, SHUTDOWN_REASON)))
    summary_path = tmp_path / "logs" / "shutdown.json"
    summary = json.loads(summary_path.read_text())
    summary["requests_by_status"] = {"finished": 4, "rejected": 1, "unfinished": 2}
    summary_path.write_text(json.dumps(summary))
    assert evaluate(raw, tmp_path / "logs", CFG)["checks"]["every_request_logged"]["held"]
    s.in_flight_at_sigterm = False
    assert "every_request_logged" in _failed(raw, tmp_path)
