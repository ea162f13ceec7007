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

import pytest
from aiohttp import web

from accelgen.results import read_results
from accelgen.serving.bench import BenchConfig, Outcome, StreamParser, base_url, bench_to_dir
from accelgen.vllm_integration.config import (
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
         method: str = "POST") -> tuple[int, dict[str, Any] | None]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": "/v1/completions", "headers": hdrs}
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
    run = bench_to_dir(trace, BenchConfig(url=f"http://127.0.0.1:{port}", model="m", warmup=0),
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
