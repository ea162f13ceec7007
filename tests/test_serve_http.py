"""SLOs over HTTP (the ASGI middleware) and the serving benchmark client, against in-process
fakes: no vLLM needed."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from accelgen.cli import main
from accelgen.results import read_results
from accelgen.serving.arrivals import request_times
from accelgen.serving.bench import BenchConfig, Outcome, StreamParser, base_url, bench_to_dir
from accelgen.vllm_integration.adapter_config import (
    AUTO_REQ_ID_BASE,
    MAX_SLO_S,
    SLODefaults,
    SLOError,
    parse_request_slo,
)
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.slo_http import SLOMiddleware, check_request, parse_slo_header

# --------------------------------------------------------------------------------------------
# the middleware, driven through the ASGI interface


class EchoApp:
    """Stands in for vLLM's app: answers 200 with the body it received."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        try:
            self.bodies.append(json.loads(body))
        except ValueError:
            self.bodies.append({"raw": body})
        length = dict(scope["headers"]).get(b"content-length")
        assert length is None or int(length) == len(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(app: Any, body: Any, headers: dict[str, str] | None = None, *, chunks: int = 1,
         method: str = "POST", path: str = "/v1/completions",
         app_object: Any = None) -> tuple[int, dict[str, Any] | None]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "headers": hdrs,
             "app": app_object}
    size = max(1, -(-len(raw) // chunks))
    parts = [raw[i:i + size] for i in range(0, len(raw), size)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that stays connected
        raise AssertionError

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(app(scope, receive, send))
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (json.loads(payload) if status != 200 else None)


BASE = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 4}


@pytest.mark.parametrize("xargs, field, fragment", [
    ({"ttft_slo": -1}, "ttft_slo", "ttft_slo=-1 must be > 0"),
    ({"ttft_slo": "abc"}, "ttft_slo", "ttft_slo='abc' is not a number"),
    ({"tbt_slo": float("nan")}, "tbt_slo", "tbt_slo=nan must be > 0"),
    ({"jct_slo": 1e300}, "jct_slo", "larger than"),
    ({"ttft_slo": True}, "ttft_slo", "ttft_slo=True is not a number"),
    ({"ttft_slo": 0}, "ttft_slo", "must be > 0"),
    ({"ttf_slo": 1.0}, "ttf_slo", "ttf_slo is not an SLO"),
    ({"online": "yes"}, "online", "online='yes' is not a boolean"),
    ({"predicted_output_len": 10**30}, "predicted_output_len", "predicted_output_len="),
    ({"req_id": -1}, "req_id", "req_id=-1"),
    ({"req_id": AUTO_REQ_ID_BASE}, "req_id", "req_id="),
    ({"source": "x" * 1000}, "source", "at most 200 characters"),
])
def test_bad_slos_are_refused_with_400_naming_the_field(xargs: dict, field: str,
                                                        fragment: str) -> None:
    app = EchoApp()
    status, err = call(SLOMiddleware(app), {**BASE, "vllm_xargs": xargs})
    assert status == 400 and err is not None
    assert err["error"]["param"] == f"vllm_xargs.{field}"
    assert fragment in err["error"]["message"] and err["error"]["code"] == 400
    assert err["error"]["type"] == "BadRequestError"
    assert app.bodies == []  # never reached the server


def test_good_requests_pass_unchanged() -> None:
    app = EchoApp()
    mw = SLOMiddleware(app)
    good = [{}, {"vllm_xargs": {"ttft_slo": 0.5, "tbt_slo": 0.05}},
            {"vllm_xargs": {"jct_slo": float("inf"), "online": False}},
            {"vllm_xargs": {"online": 1, "kv_transfer_params": "x", "other": [1, 2]}},
            {"vllm_xargs": {"ttft_slo": MAX_SLO_S, "req_id": 3}}]
    for extra in good:
        assert call(mw, {**BASE, **extra}, chunks=3)[0] == 200
    assert app.bodies == [{**BASE, **e} for e in good]
    assert json.loads(json.dumps(app.bodies[2]))["vllm_xargs"]["jct_slo"] == math.inf
    # Not JSON, not a POST, or not an object: vLLM's to judge.
    assert call(mw, b"{not json", chunks=2)[0] == 200
    assert call(mw, {**BASE, "vllm_xargs": [1]})[0] == 200
    assert call(mw, {**BASE, "vllm_xargs": {"ttft_slo": -1}}, method="GET")[0] == 200


def test_the_header_carries_slos_into_vllm_xargs() -> None:
    app = EchoApp()
    mw = SLOMiddleware(app)
    status, _ = call(mw, BASE, {"X-AccelGen-SLO": "ttft_slo=0.5, tbt_slo=0.05, online=true"})
    assert status == 200
    assert app.bodies[-1]["vllm_xargs"] == {"ttft_slo": 0.5, "tbt_slo": 0.05, "online": True}
    status, _ = call(mw, {**BASE, "vllm_xargs": {"ttft_slo": 0.5, "x": 1}},
                     {"X-AccelGen-SLO": "ttft_slo=0.5,jct_slo=inf"})
    assert status == 200
    assert app.bodies[-1]["vllm_xargs"] == {"ttft_slo": 0.5, "x": 1, "jct_slo": math.inf}
    for header, field, fragment in [
            ("ttft_slo=abc", "vllm_xargs.ttft_slo", "ttft_slo='abc' is not a number"),
            ("ttft_slo=nan", "vllm_xargs.ttft_slo", "must be > 0"),
            ("tbt=0.1", "header.tbt", "unknown key 'tbt'"),
            ("ttft_slo", "header", "not key=value")]:
        status, err = call(mw, BASE, {"X-AccelGen-SLO": header})
        assert status == 400 and err is not None, header
        assert err["error"]["param"] == field and fragment in err["error"]["message"], err
    status, err = call(mw, {**BASE, "vllm_xargs": {"ttft_slo": 1.0}},
                       {"X-AccelGen-SLO": "ttft_slo=2"})
    assert status == 400 and err is not None and "both" in err["error"]["message"]


def test_a_req_id_is_served_once() -> None:
    mw = SLOMiddleware(EchoApp())
    assert call(mw, {**BASE, "vllm_xargs": {"req_id": 7}})[0] == 200
    status, err = call(mw, {**BASE, "vllm_xargs": {"req_id": 7}})
    assert status == 400 and err is not None and "already served" in err["error"]["message"]
    assert call(mw, {**BASE, "vllm_xargs": {"req_id": 8}})[0] == 200


def test_one_rule_for_the_engine_and_http() -> None:
    """The middleware refuses exactly what the plugin's parser refuses (it calls it)."""
    cases = [{"ttft_slo": v} for v in (-1, 0, 0.1, "x", None, math.inf, math.nan, 2e6, 1)]
    cases += [{"online": v} for v in (True, 0, 1, 2, "true")]
    for xargs in cases:
        try:
            parse_request_slo(xargs, SLODefaults())
            engine_ok = True
        except SLOError:
            engine_ok = False
        try:
            check_request({"vllm_xargs": xargs}, None)
            http_ok = True
        except ValueError:
            http_ok = False
        assert engine_ok == http_ok, xargs


def test_header_parsing() -> None:
    assert parse_slo_header("ttft_slo=1, tbt_slo=0.1 ,online=false,") == {
        "ttft_slo": 1, "tbt_slo": 0.1, "online": False}
    assert parse_slo_header("jct_slo=inf")["jct_slo"] == math.inf
    assert parse_slo_header("source=\"alpaca\"")["source"] == "alpaca"


# --------------------------------------------------------------------------------------------
# bench-serve against a fake OpenAI-compatible server

GAP = 0.01  # seconds between the fake server's chunks
SEEN = web.AppKey("seen", list)


def _chunk(ids: list[int], finish: str | None = None, stop: Any = None,
           usage: int | None = None) -> bytes:
    body: dict[str, Any] = {"choices": [{"index": 0, "text": "", "token_ids": ids,
                                         "finish_reason": finish, "stop_reason": stop}]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    rid = body.get("vllm_xargs", {}).get("req_id")
    n = body["max_tokens"]
    request.app[SEEN].append(body)
    if rid == 3:
        return web.json_response({"error": {"message": "invalid vllm_xargs: ttft_slo=-1 must "
                                            "be > 0 seconds", "type": "BadRequestError",
                                            "param": "vllm_xargs.ttft_slo", "code": 400}},
                                 status=400)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if rid == 4:
        await resp.write(b'data: {"error": {"message": "Internal server error", "code": 500}}\n\n'
                         b"data: [DONE]\n\n")
        return resp
    if rid == 7:
        await resp.write(_chunk([], "length", "accelgen: rejected by policy accelgen: late", 0))
        await resp.write(b"data: [DONE]\n\n")
        return resp
    sent = 0
    plan = [2] + [1] * (n - 2) if n >= 2 else [n]  # the first chunk carries two tokens
    if rid == 6:
        plan = plan[:-2]  # the server stops early
    for i, k in enumerate(plan):
        await asyncio.sleep(GAP)
        sent += k
        last = i == len(plan) - 1
        await resp.write(_chunk(list(range(k)), "length" if last else None, usage=sent))
        if rid == 5 and sent >= 3:
            assert request.transport is not None
            request.transport.close()  # the connection breaks mid-stream
            return resp
    await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3, '
                     b'"completion_tokens": %d}}\n\ndata: [DONE]\n\n' % sent)
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "fake-model"}]})


@pytest.fixture
def fake_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", app[SEEN]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_bench_serve_records_every_end_state(tmp_path: Path,
                                             fake_server: tuple[str, list]) -> None:
    url, seen = fake_server
    trace = mixed_slo_trace(n=10, rate=50.0, seed=3)
    trace["output_len"] = 6
    cfg = BenchConfig(url=url + "/v1", max_concurrency=4, label="fake")
    run = bench_to_dir(trace, cfg, tmp_path / "out", trace_path="t.parquet")
    reqs, its, summary = read_results(tmp_path / "out")
    by_id = reqs.set_index("req_id")
    assert len(reqs) == 10 and len(its) == 0
    status = by_id["status"].to_dict()
    assert status[3] == "rejected"
    assert by_id.loc[3, "reject_reason"].startswith("HTTP 400: invalid vllm_xargs: ttft_slo=-1")
    assert status[4] == "rejected" and "HTTP 500 (in the stream)" in by_id.loc[4, "reject_reason"]
    assert status[5] == "unfinished" and by_id.loc[5, "num_output_tokens"] >= 3
    assert status[6] == "cut" and by_id.loc[6, "reject_reason"].startswith("length_cap: the "
                                                                           "server sent 4 of 6")
    assert status[7] == "rejected" and by_id.loc[7, "reject_reason"].startswith("accelgen: "
                                                                                "rejected")
    ok = [i for i in range(10) if i not in (3, 4, 5, 6, 7)]
    assert all(status[i] == "finished" for i in ok)
    for i in ok:
        times = by_id.loc[i, "token_times"]
        assert len(times) == 6 == by_id.loc[i, "num_output_tokens"]
        assert times[0] == times[1]  # two tokens in the first chunk share its time
        assert all(b - a > GAP / 2 for a, b in itertools.pairwise(times[1:]))
        assert by_id.loc[i, "first_token_time"] >= by_id.loc[i, "arrival"]
        assert by_id.loc[i, "finish_time"] >= times[-1]
    assert (summary["num_requests"], summary["num_finished"], summary["num_cut"],
            summary["num_rejected"], summary["num_unfinished"]) == (10, 5, 1, 3, 1)
    assert summary["http_status_counts"] == {"200": 9, "400": 1}
    # The first chunk's second token, in the five finished, the cut and the broken stream.
    assert summary["tokens_sharing_a_chunk"] == 7
    assert summary["policy"] == "fake" and summary["num_preemptions"] is None
    assert summary["model"] == "fake-model" and summary["url"] == url
    # What the server got: the trace's lengths, ignore_eos and SLOs, token-id prompts.
    warmups = [b for b in seen if "vllm_xargs" not in b]
    assert len(warmups) == 2 and seen[:2] == warmups  # sent first, without SLOs, not recorded
    sent = {b["vllm_xargs"]["req_id"]: b for b in seen[2:]}
    row = trace.set_index("req_id").loc[0]
    assert len(sent[0]["prompt"]) == row["prompt_len"] and sent[0]["ignore_eos"] is True
    assert sent[0]["max_tokens"] == 6 and sent[0]["stream"] is True
    assert sent[0]["vllm_xargs"]["ttft_slo"] == pytest.approx(row["ttft_slo"])
    assert run["config"]["bench_serve"]["url"] == url + "/v1"


def test_unreachable_server_leaves_every_request_unfinished(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trace = mixed_slo_trace(n=3, rate=100.0, seed=1)
    with pytest.raises(ValueError, match=r"warm-up request 0 .* failed: unfinished: connection"):
        bench_to_dir(trace, BenchConfig(url=f"http://127.0.0.1:{port}", model="m"),
                     tmp_path / "out")
    assert not (tmp_path / "out").exists()
    run = bench_to_dir(trace, BenchConfig(url=f"http://127.0.0.1:{port}", model="m", num_warmups=0),
                       tmp_path / "out")
    df = run["requests"]
    assert (df["status"] == "unfinished").all()
    assert df["reject_reason"].str.startswith("connection: ").all()


def test_stream_parser_counts_tokens_without_token_ids() -> None:
    out = Outcome()
    p = StreamParser(out)
    # usage-only counting (continuous usage stats), then text-only counting, split events
    p.feed(b'data: {"choices": [{"text": "a"}], "usage": {"completion_tokens": 2}}\n\n', 1.0)
    p.feed(b'data: {"choices": [{"text": "b"}]}\n', 1.5)  # an event counts when it is complete
    p.feed(b'\n', 2.0)
    p.feed(b'data: {"choices": [{"text": "", "finish_reason": "length"}]}\r\n\r\n', 3.0)
    p.feed(b'data: {"choices": [], "usage": {"completion_tokens": 4}}\n\ndata: [DONE]\n\n', 3.5)
    p.finish(4, 4.0)
    assert out.token_times == [1.0, 1.0, 2.0, 2.0] and out.padded_tokens == 1
    assert out.status == "finished"
    assert base_url("http://h:1/v1/completions/") == "http://h:1"


# --------------------------------------------------------------------------------------------
# the result JSON (vLLM bench serve's keys), re-timed arrivals, the capacity search

VLLM_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "latencies", "input_lens", "output_lens", "ttfts",
             "itls", "start_times", "errors", "backend", "label", "model_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency")


def test_result_json_matches_a_hand_computation(tmp_path: Path,
                                                fake_server: tuple[str, list]) -> None:
    url, _ = fake_server
    trace = mixed_slo_trace(n=12, rate=40.0, seed=5)
    trace["output_len"] = trace["output_len_natural"] = np.arange(12) % 5 + 2  # 2..6 tokens
    # req_ids past the ones the fake fails on purpose.
    assert main(["bench-serve", "--url", url, "--trace", str(_write(trace, tmp_path)),
                 "--out", str(tmp_path / "out"), "--no-progress", "--save-detailed",
                 "--req-id-offset", "100",
                 "--request-rate", "50", "--burstiness", "0.5", "--seed", "3",
                 "--metric-percentiles", "50,90,99.5", "--goodput", "ttft:1000", "tpot:6",
                 "--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time"]) == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    for key in VLLM_KEYS:
        assert key in res, key
    for m in ("ttft", "tpot", "itl", "e2el", "client_queue_time"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99.5"):
            assert f"{stat}_{m}_ms" in res, (stat, m)
    reqs, _, summary = read_results(tmp_path / "out")
    n = len(trace)
    assert res["completed"] == n and res["failed"] == 0 and res["num_prompts"] == n
    assert res["request_rate"] == 50.0 and res["burstiness"] == 0.5
    # Re-timed arrivals: vLLM's normalisation puts the last one at n / rate.
    assert reqs["arrival"].max() == pytest.approx(n / 50.0)
    # Tokens, not events: the fake's first event carries two tokens.
    tokens = reqs.set_index("req_id").loc[trace["req_id"], "num_output_tokens"].to_numpy()
    order = np.argsort(reqs["arrival"].to_numpy(), kind="stable")
    assert res["output_lens"] == reqs["num_output_tokens"].to_numpy()[order].tolist()
    assert sorted(tokens.tolist()) == sorted(trace["output_len"].tolist())
    assert [len(x) for x in res["itls"]] == [k - 2 if k >= 2 else 0 for k in res["output_lens"]]
    # By hand, from the per-request records (vLLM's formulas).
    ttft = np.array(res["ttfts"])
    lat = np.array(res["latencies"])
    outl = np.array(res["output_lens"])
    itl = np.concatenate([np.array(x) for x in res["itls"]])
    tpot = (lat - ttft)[outl > 1] / (outl[outl > 1] - 1)
    np.testing.assert_allclose(ttft + [sum(x) for x in res["itls"]], lat)
    for m, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", lat)):
        assert res[f"mean_{m}_ms"] == pytest.approx(v.mean() * 1e3)
        assert res[f"median_{m}_ms"] == pytest.approx(np.median(v) * 1e3)
        assert res[f"p90_{m}_ms"] == pytest.approx(np.percentile(v, 90) * 1e3)
        assert res[f"p99.5_{m}_ms"] == pytest.approx(np.percentile(v, 99.5) * 1e3)
    good = int(np.sum((ttft <= 1.0) & (np.where(outl > 1, (lat - ttft) / np.maximum(outl - 1, 1),
                                                         0.0) <= 0.006)))
    assert 0 < good < n  # 10 ms per event, two tokens in the first: TPOT 0-8 ms
    assert res["request_goodput"] == pytest.approx(good / res["duration"])
    assert res["request_throughput"] == pytest.approx(n / res["duration"])
    assert res["total_output_tokens"] == int(outl.sum())
    # Ours beside them: the trace's per-request SLOs, overall and per class.
    assert res["slo_attainment_request"] == pytest.approx(summary["slo_attainment_request"])
    classes = res["slo_attainment_by_class"]
    assert sum(c["requests"] for c in classes.values()) == n
    assert set(classes) <= {"offline", "online tbt_slo=0.02", "online tbt_slo=0.05",
                            "online tbt_slo=0.1"}


def _write(trace: Any, tmp_path: Path) -> Path:
    from accelgen.workloads.trace import write_trace

    path = tmp_path / "trace.parquet"
    write_trace(trace.reset_index(drop=True), {"test": True}, path)
    return path


def test_request_times_follow_vllm() -> None:
    t = request_times(1000, 20.0, burstiness=1.0, seed=1)
    assert (np.diff(t) >= 0).all() and t[-1] == pytest.approx(1000 / 20.0)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential: CV 1
    bursty = np.diff(request_times(1000, 20.0, burstiness=0.25, seed=1))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, abs=0.3)  # gamma: CV 1/sqrt(k)
    # One shape for every rate (probes at several rates replay one pattern).
    np.testing.assert_allclose(request_times(50, 5.0, seed=2) * 5.0,
                               request_times(50, 40.0, seed=2) * 40.0)
    assert (request_times(5, math.inf) == 0).all()
    np.testing.assert_allclose(request_times(4, 2.0, burstiness=math.inf), [0.5, 1, 1.5, 2])
    with pytest.raises(ValueError, match="request rate must be > 0"):
        request_times(3, 0.0)


@pytest.mark.parametrize(("args", "message"), [
    (["--goodput", "ttft=5"], "is not KEY:MILLISECONDS"),
    (["--goodput", "itl:5"], "unknown metric 'itl'"),
    (["--goodput", "ttft:-1"], "must be >= 0 ms"),
    (["--percentile-metrics", "ttft,foo"], "--percentile-metrics: unknown metrics"),
    (["--metric-percentiles", "50,101"], "percentiles must be in [0, 100]"),
    (["--find-capacity", "--request-rate", "3"], "leave out --request-rate"),
])
def test_bench_serve_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], message: str) -> None:
    trace = _write(mixed_slo_trace(n=3, seed=1), tmp_path)
    try:
        code = main(["bench-serve", "--url", "http://127.0.0.1:9", "--trace", str(trace),
                     "--out", str(tmp_path / "out"), *args])
    except SystemExit as exit_:  # refused by argparse itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_find_capacity_brackets_the_target(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The search alone, on a server stand-in whose attainment falls with the rate (1 up to
    7.3 req/s, then down) and which serves at most 20 req/s."""
    from accelgen.serving import capacity

    rates: list[float] = []
    offsets: list[int] = []

    def fake_bench(trace: Any, cfg: BenchConfig, out: Path, **_: Any) -> dict[str, Any]:
        rate = cfg.request_rate
        assert rate is not None
        rates.append(rate)
        offsets.append(cfg.req_id_offset)
        att = 1.0 if rate <= 7.3 else max(0.0, 1.0 - (rate - 7.3) / 10)
        out.mkdir(parents=True)
        return {"summary": {"slo_attainment_request": att},
                "result": {"request_throughput": min(rate, 20.0), "completed": 5, "failed": 0}}

    monkeypatch.setattr(capacity, "bench_to_dir", fake_bench)
    cfg = BenchConfig(url="http://x")
    cap = capacity.CapacityConfig(target=0.9, tolerance=0.05)
    res = capacity.find_capacity(mixed_slo_trace(n=5), cfg, cap, tmp_path / "cap")
    low, high = res["bracket"]["meets"], res["bracket"]["misses"]
    assert res["bracketed"] and low <= 8.3 < high <= low * 1.05  # 0.9 is met up to 8.3
    assert rates[:3] == [math.inf, 20.0, 10.0]  # saturation, its throughput, then halving
    assert offsets == [5 * k for k in range(len(rates))]  # new req_ids for every probe
    assert res["num_probes"] == len(rates) <= cap.max_probes
    assert json.loads((tmp_path / "cap" / "capacity.json").read_text())["bracket"]["meets"] == low
    # A server that meets the target even with every request at once has no finite capacity.
    monkeypatch.setattr(capacity, "bench_to_dir", lambda *a, **k: {
        "summary": {"slo_attainment_request": 1.0},
        "result": {"request_throughput": 3.0, "completed": 5, "failed": 0}})
    res = capacity.find_capacity(mixed_slo_trace(n=5), cfg, cap, tmp_path / "cap2")
    assert res["bracket"] == {"meets": "inf", "misses": None} and res["num_probes"] == 1


def test_chat_without_a_tokenizer_is_a_400_naming_the_field() -> None:
    from types import SimpleNamespace

    def app_state(skip: bool) -> Any:
        model_config = SimpleNamespace(skip_tokenizer_init=skip)
        return SimpleNamespace(state=SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=model_config)))

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for skip, path, status in ((True, "/v1/chat/completions", 400), (True, "/v1/completions", 200),
                               (False, "/v1/chat/completions", 200)):
        echo = EchoApp()
        code, err = call(SLOMiddleware(echo), body, path=path, app_object=app_state(skip))
        assert code == status, (skip, path)
        if status == 400:
            assert err is not None and err["error"]["param"] == "messages"
            assert "--skip-tokenizer-init" in err["error"]["message"] and not echo.bodies


def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_prompt() -> None:
    from types import SimpleNamespace

    model_config = SimpleNamespace(skip_tokenizer_init=False, get_vocab_size=lambda: 1024)
    app = SimpleNamespace(state=SimpleNamespace(vllm_config=SimpleNamespace(
        model_config=model_config)))
    for prompt, where in (([5, 1024], "prompt[1]"), ([[5], [6, 7, 99999]], "prompt[1][2]")):
        echo = EchoApp()
        code, err = call(SLOMiddleware(echo), {"model": "m", "prompt": prompt}, app_object=app)
        assert code == 400 and err is not None and err["error"]["param"] == "prompt"
        assert err["error"]["message"].startswith(f"{where}: token id") and not echo.bodies
    for prompt in ([5, 1023], "text", [[5], [6]], [], [-1]):  # fine here (vLLM judges [-1])
        code, _ = call(SLOMiddleware(EchoApp()), {"model": "m", "prompt": prompt}, app_object=app)
        assert code == 200, prompt


def test_req_id_offset_changes_only_the_ids_sent() -> None:
    from accelgen.serving.bench import request_body
    from accelgen.workloads.trace import to_requests

    reqs, _ = to_requests(mixed_slo_trace(n=3, seed=1))
    body = request_body(reqs[2], 4, BenchConfig(url="u", req_id_offset=1000), "m")
    assert body["vllm_xargs"]["req_id"] == 1002 and reqs[2].req_id == 2


class NotFoundApp:
    """vLLM's answer to a request naming a model it does not serve (0.32's message, after its
    error filter turned a path into ``<path>``), sent in two body parts."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        body = json.dumps({"error": {"message": "The model `gpt-4` does not exist. Valid "
                                                "aliases: <path>.", "type": "NotFoundError",
                                     "param": "model", "code": 404}}).encode()
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})


def test_a_wrong_model_name_gets_a_404_naming_the_served_models() -> None:
    from types import SimpleNamespace

    models = SimpleNamespace(base_model_paths=[SimpleNamespace(name="accelgen-tiny"),
                                               SimpleNamespace(name="/tmp/m")],
                             lora_requests={"sql-lora": object()})
    app = SimpleNamespace(state=SimpleNamespace(openai_serving_models=models))
    code, err = call(SLOMiddleware(NotFoundApp()), {"model": "gpt-4", "prompt": "hi"},
                     app_object=app)
    assert code == 404 and err is not None and err["error"]["param"] == "model"
    assert err["error"]["message"] == ("The model `gpt-4` does not exist. This server serves: "
                                       "accelgen-tiny, /tmp/m, sql-lora (GET /v1/models lists "
                                       "them).")
    # Without the app's model list, vLLM's answer passes unchanged; so does any other 404.
    code, err = call(SLOMiddleware(NotFoundApp()), {"model": "gpt-4", "prompt": "hi"})
    assert code == 404 and err is not None and "<path>" in err["error"]["message"]


# --------------------------------------------------------------------------------------------
# request sets besides a trace: vLLM's random dataset, SLOs from a named class set


def test_the_random_dataset_draws_lengths_as_vllm_does() -> None:
    from accelgen.serving.datasets import random_dataset, with_slo_classes
    from accelgen.workloads.slo_classes import SLO_CLASS_SETS

    df = random_dataset(400, 100, 20, 0.5, seed=3)
    assert len(df) == 400 and (df["arrival"] == 0).all() and (df["req_id"] == np.arange(400)).all()
    assert df["prompt_len"].between(50, 150).all() and df["output_len"].between(10, 30).all()
    assert {df["prompt_len"].min(), df["prompt_len"].max()} == {50, 150}  # both ends reached
    assert (df["predicted_output_len"] == 20).all() and not df["online"].any()
    again, other = random_dataset(400, 100, 20, 0.5, seed=3), random_dataset(400, 100, 20, 0.5, 4)
    assert df.equals(again) and not df["prompt_len"].equals(other["prompt_len"])
    fixed = random_dataset(5, 7, 3, 0.0, seed=0)
    assert (fixed["prompt_len"] == 7).all() and (fixed["output_len"] == 3).all()
    for args, message in (((5, 7, 3, 1.0), r"in \[0, 1\)"), ((5, 1, 3, 0.5), "below 1"),
                          ((0, 7, 3, 0.0), "--num-prompts")):
        with pytest.raises(ValueError, match=message):
            random_dataset(*args, seed=0)  # type: ignore[misc]
    slod, names = with_slo_classes(df, "tiny-cpu", seed=3)
    assert with_slo_classes(df, "tiny-cpu", seed=3)[0].equals(slod)
    classes = {c.name: c for c in SLO_CLASS_SETS["tiny-cpu"]}
    counts = pd.Series(names).value_counts(normalize=True)
    for name, c in classes.items():
        assert counts[name] == pytest.approx(c.share, abs=0.07)
        rows = slod[[names[i] == name for i in slod["req_id"]]]
        assert (rows["online"] == c.online).all()
        if c.online:
            assert (rows["ttft_slo"] == c.ttft_slo).all() and (rows["tbt_slo"] == c.tbt_slo).all()
            np.testing.assert_allclose(rows["jct_slo"],
                                       c.ttft_slo + c.tbt_slo * (rows["output_len"] - 1))
        else:
            assert (rows["jct_slo"] == c.jct_slo).all() and np.isinf(rows["ttft_slo"]).all()
    with pytest.raises(ValueError, match="unknown SLO class set 'nope'"):
        with_slo_classes(df, "nope", seed=0)


def _bench(url: str, tmp_path: Path, name: str, *args: str) -> tuple[int, list[str], Path]:
    import contextlib
    import io

    out = tmp_path / name
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench-serve", "--url", url, "--out", str(out), "--no-progress",
                     "--save-result", "--num-warmups", "0", *args])
    return code, buf.getvalue().splitlines(), out


def test_bench_serve_random_dataset_with_each_option(tmp_path: Path,
                                                     fake_server: tuple[str, list]) -> None:
    url, seen = fake_server
    random = ["--dataset-name", "random", "--num-prompts", "40", "--random-input-len", "30",
              "--random-output-len", "4", "--random-range-ratio", "0.5", "--seed", "5"]
    # SLOs from a class set (req_ids past the fake's special ones).
    code, lines, out = _bench(url, tmp_path, "classes", *random, "--slo-classes", "tiny-cpu",
                              "--req-id-offset", "100")
    assert code == 0
    sent = seen[:]
    assert len(sent) == 40
    assert all(15 <= len(b["prompt"]) <= 45 and 2 <= b["max_tokens"] <= 6 for b in sent)
    assert {len(b["prompt"]) for b in sent} != {30}  # the range ratio spreads them
    assert all(b["vllm_xargs"]["predicted_output_len"] == 4 for b in sent)
    tbts = {b["vllm_xargs"].get("tbt_slo") for b in sent}
    assert tbts == {0.05, 0.1, math.inf} or tbts == {0.05, 0.1, None}
    res = json.loads((out / "result.json").read_text())
    assert res["completed"] == 40 and res["num_prompts"] == 40 and res["request_rate"] == "inf"
    assert set(res["slo_attainment_by_class"]) == {"interactive", "standard", "batch"}
    assert sum(v["requests"] for v in res["slo_attainment_by_class"].values()) == 40
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == {"name": "random", "seed": 5, "slo_classes": "tiny-cpu",
                                 "num_prompts": 40, "random_input_len": 30,
                                 "random_output_len": 4, "random_range_ratio": 0.5}
    assert "SLO attainment request" in lines[-2] and "interactive" in lines[-2]
    # The same options, the same requests (a seeded set).
    seen.clear()
    assert _bench(url, tmp_path, "again", *random, "--slo-classes", "tiny-cpu",
                  "--req-id-offset", "100")[0] == 0
    key = [(b["prompt"], b["max_tokens"], b["vllm_xargs"]) for b in sent]
    assert sorted(key, key=repr) == sorted([(b["prompt"], b["max_tokens"], b["vllm_xargs"])
                                            for b in seen], key=repr)
    # Without a class set: no SLOs sent, no attainment anywhere.
    seen.clear()
    code, lines, out = _bench(url, tmp_path, "plain", *random)
    assert code == 0 and len(seen) == 40 and not any("vllm_xargs" in b for b in seen)
    res = json.loads((out / "result.json").read_text())
    assert res["slo_attainment_request"] is None and res["slo_attainment_by_class"] is None
    assert not any("attainment" in line for line in lines)
    # Defaults: vLLM's (1000 prompts of 1024 tokens: too many here, so only the lengths).
    seen.clear()
    code, _, out = _bench(url, tmp_path, "defaults", "--dataset-name", "random",
                          "--num-prompts", "2", "--random-output-len", "2")
    assert code == 0 and [len(b["prompt"]) for b in seen] == [1024, 1024]


def test_no_slos_reports_no_attainment_and_lines_stay_short(
        tmp_path: Path, fake_server: tuple[str, list]) -> None:
    """A trace with 60 distinct TBT SLOs (60 classes): with SLOs the attainment line gives their
    count, not each; with --no-slos nothing is judged. Every printed line <= 200 characters."""
    from accelgen.cli.bench_serve import MAX_LINE

    url, seen = fake_server
    trace = mixed_slo_trace(n=60, rate=200.0, seed=2, output_range=(3, 5),
                            online_share=1.0, tbt_choices=list(np.arange(1, 61) * 0.01))
    path = _write(trace, tmp_path)
    code, lines, out = _bench(url, tmp_path, "slos", "--trace", str(path),
                              "--req-id-offset", "100")
    # (the output path is the user's: a line is short but for it)
    assert code == 0 and all(len(line.replace(str(out), "OUT")) <= MAX_LINE for line in lines), lines
    summary = json.loads((out / "summary.json").read_text())
    n_classes = len(summary["slo_attainment_by_class"])
    assert n_classes > 30 and f"({n_classes} SLO classes" in lines[-2]
    assert lines[-1].startswith(f"bench-serve: wrote {out} (requests.parquet, summary.json, "
                                "result.json): ")
    seen.clear()
    code, lines, out = _bench(url, tmp_path, "no-slos", "--trace", str(path), "--no-slos")
    assert code == 0 and all(len(line.replace(str(out), "OUT")) <= MAX_LINE for line in lines)
    assert len(seen) == 60 and not any("vllm_xargs" in b for b in seen)
    assert not any("attainment" in line for line in lines)
    res = json.loads((out / "result.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    for key in ("slo_attainment_request", "ttft_attainment", "tbt_attainment",
                "jct_attainment", "slo_attainment_by_class"):
        assert res[key] is None and summary[key] is None, key
    assert res["completed"] == 60 and res["median_ttft_ms"] is not None


@pytest.mark.parametrize(("args", "message"), [
    ([], "give the requests: --trace FILE or --dataset-name random"),
    (["--dataset-name", "trace"], "--dataset-name trace needs --trace FILE"),
    (["--dataset-name", "random", "--trace", "t.parquet"], "leave out --dataset-name random"),
    (["--dataset-name", "random", "--random-range-ratio", "1"], "must be in [0, 1)"),
    (["--dataset-name", "random", "--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--dataset-name", "random", "--random-input-len", "1", "--random-range-ratio", "0.5"],
     "below 1"),
    (["--dataset-name", "random", "--slo-classes", "nope"], "invalid choice: 'nope'"),
    (["--dataset-name", "random", "--find-capacity"], "--find-capacity searches the rate"),
    (["--trace", "TRACE", "--random-input-len", "5"], "--random-input-len: options of "
                                                       "--dataset-name random"),
])
def test_bench_serve_refuses_bad_dataset_options(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 args: list[str], message: str) -> None:
    trace = _write(mixed_slo_trace(n=3, seed=1), tmp_path)
    args = [str(trace) if a == "TRACE" else a for a in args]
    try:
        code = main(["bench-serve", "--url", "http://127.0.0.1:9", "--out",
                     str(tmp_path / "out"), *args])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
