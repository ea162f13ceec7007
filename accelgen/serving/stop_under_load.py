"""SIGTERM to ``accelgen serve`` while requests keep arriving: does it stop in bounded time with
its logs complete? (``scripts/stop_under_load.py``, ``tests/test_serve_stop.py``.)

``clients`` closed-loop clients each send one streamed token-id completion after another (a
prompt of ``prompt_len`` tokens, ``ignore_eos``; client k of n asks for ``max_tokens`` * (1 +
k / 2n) tokens, so that the clients' requests do not end together and SIGTERM finds streams in
flight wherever it lands) to a server of its own;
after ``load_s`` seconds the server gets SIGTERM and the clients go on sending until it has
exited (at most ``stop_limit_s``; then it is killed). Each request ends, for the client, in one
outcome: ``finished``, ``unfinished`` (the stream ended without its tokens, or the connection
went), ``refused_shutting_down`` (HTTP 503 with the message of a server that is stopping),
``refused`` (another status below 500, or the connection refused because the server no longer
listens), ``error`` (a status of 500 or above, or an error event in the stream).

The report: the exit status and the seconds from SIGTERM to the exit (null: killed after
``stop_limit_s``), the outcomes before and after SIGTERM, the plugin's ``shutdown.json`` (every
KV block free, no request left) and whether it was written.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import PositiveFloat, PositiveInt

from accelgen.core.specs import StrictModel
from accelgen.serving.bench import IDLE_REUSE_S, Outcome, StreamParser, first_model
from accelgen.vllm_integration.shutdown_summary import read_summary
from accelgen.vllm_integration.slo_http import is_shutdown_refusal
from accelgen.workloads.prompts import prompt_token_ids

VOCAB_SIZE = 1024  # the tiny model's


class StopConfig(StrictModel):
    clients: PositiveInt = 24
    load_s: PositiveFloat = 8.0
    stop_limit_s: PositiveFloat = 90.0  # after SIGTERM, before the server is killed
    prompt_len: PositiveInt = 64
    max_tokens: PositiveInt = 64
    request_timeout_s: PositiveFloat = 300.0


async def _one(session: Any, url: str, body: dict[str, Any]) -> tuple[str, str]:
    import aiohttp

    out = Outcome()
    parser = StreamParser(out)
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                text = await resp.text()
                if is_shutdown_refusal(resp.status, text):
                    return "refused_shutting_down", text[:200]
                return ("error" if resp.status >= 500 else "refused"), f"HTTP {resp.status}"
            async for chunk in resp.content.iter_any():
                parser.feed(chunk, time.perf_counter())
    except aiohttp.ClientConnectorError as exc:  # nobody listens: the server has stopped
        return "refused", f"connection refused: {exc}"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return "unfinished", f"connection: {type(exc).__name__}"
    parser.finish(body["max_tokens"], time.perf_counter())
    if parser.error is not None:
        return "error", parser.error
    return ("finished" if out.status == "finished" else "unfinished"), out.reason


async def _load(base: str, cfg: StopConfig, stop: Any, exited: Any
                ) -> tuple[Counter[str], Counter[str], list[str], float]:
    """Run the clients; at ``load_s`` call ``stop()`` (non-blocking), keep sending until
    ``exited()``; returns the outcomes (before, after SIGTERM), a few examples and the time of
    SIGTERM."""
    import aiohttp

    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    examples: list[str] = []
    t_sigterm = [float("inf")]
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=cfg.clients + 4, keepalive_timeout=IDLE_REUSE_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = await first_model(session, base, {})
        url = base + "/v1/completions"
        deadline = [float("inf")]

        async def client(k: int) -> None:
            i = 0
            max_tokens = cfg.max_tokens + cfg.max_tokens * k // (2 * cfg.clients)
            while time.perf_counter() < deadline[0] and not exited():
                i += 1
                body = {"model": model, "prompt": prompt_token_ids(k * 10**6 + i, cfg.prompt_len,
                                                                   VOCAB_SIZE),
                        "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                        "return_token_ids": True, "temperature": 0.0}
                sent = time.perf_counter()
                outcome, why = await _one(session, url, body)
                (after if sent >= t_sigterm[0] else before)[outcome] += 1
                if outcome not in ("finished", "refused_shutting_down") and len(examples) < 8:
                    examples.append(f"{outcome}: {why[:160]}")
                if outcome in ("refused", "refused_shutting_down"):
                    await asyncio.sleep(0.05)  # no busy loop against a stopping server

        tasks = [asyncio.create_task(client(k)) for k in range(cfg.clients)]
        await asyncio.sleep(cfg.load_s)
        t_sigterm[0] = time.perf_counter()
        stop()
        deadline[0] = t_sigterm[0] + cfg.stop_limit_s + 5.0
        await asyncio.wait(tasks, timeout=cfg.stop_limit_s + 30.0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return before, after, examples, t_sigterm[0]


def stop_under_load(out: Path | str, cfg: StopConfig | None = None, *,
                    server_args: list[str] | None = None,
                    log: Any = lambda s: None) -> dict[str, Any]:
    """One server (tiny model, AccelGen, ``--log-dir out/plugin-logs``), its load, SIGTERM;
    returns the report (also ``out/report.json``)."""
    import shutil

    from accelgen.serving.bench import write_json
    from accelgen.vllm_integration.serve import ServerProcess

    cfg = cfg or StopConfig()
    out = Path(out)
    logs = out / "plugin-logs"
    if logs.exists():
        shutil.rmtree(logs)
    # Room for the longest client's prompt and reply.
    max_model_len = max(2048, cfg.prompt_len + cfg.max_tokens + cfg.max_tokens // 2)
    server = ServerProcess(["--tiny-dir", str(out / "tiny"), "--max-model-len", str(max_model_len),
                            "--log-dir", str(logs), *(server_args or [])],
                           log_path=out / "server.log", stop_timeout_s=cfg.stop_limit_s)
    t_exit = [float("nan")]
    with server:
        proc = server.proc
        log(f"stop-under-load: server ready at {server.url} (pid {proc.pid})")

        def stop() -> None:
            proc.send_signal(signal.SIGTERM)

        def exited() -> bool:
            if proc.poll() is not None:
                if t_exit[0] != t_exit[0]:
                    t_exit[0] = time.perf_counter()
                return True
            return False

        async def run() -> tuple[Counter[str], Counter[str], list[str], float]:
            watcher_done = asyncio.Event()

            async def watch() -> None:  # the exit time, to 50 ms
                while not exited():
                    await asyncio.sleep(0.05)
                watcher_done.set()

            w = asyncio.create_task(watch())
            res = await _load(server.url, cfg, stop, exited)
            w.cancel()
            return res

        before, after, examples, t_sigterm = asyncio.run(run())
        # The clients went on until the exit or stop_limit_s: a server still there now is
        # killed at once.
        server.stop_timeout_s = 1.0
        status = server.stop()
        if status is not None and t_exit[0] != t_exit[0]:
            t_exit[0] = time.perf_counter()
    stopped_s = t_exit[0] - t_sigterm
    summary = read_summary(logs)
    report = {
        "exit_status": status,
        "exit_after_sigterm_s": None if status is None or stopped_s > cfg.stop_limit_s
        else round(stopped_s, 2),
        "outcomes_before_sigterm": dict(sorted(before.items())),
        "outcomes_after_sigterm": dict(sorted(after.items())),
        "examples": examples,
        "shutdown_summary": summary,
        "server_log_tail": server.log_tail(15).splitlines(),
        "config": cfg.model_dump(mode="json"),
    }
    write_json(out / "report.json", report)
    return report


def closing_line(report: dict[str, Any], out: Path | str) -> str:
    s = report["shutdown_summary"]
    drained = (s is not None and s["kv_blocks_free"] == s["kv_blocks_total"]
               and s["tracked_requests"] == 0)
    stopped = report["exit_after_sigterm_s"]
    return (f"stop-under-load: wrote {Path(out) / 'report.json'}: exit "
            f"{report['exit_status']} "
            + (f"{stopped:.1f} s after SIGTERM" if stopped is not None else "NOT after SIGTERM "
               f"(killed after {report['config']['stop_limit_s']:g} s)")
            + f", before {json.dumps(report['outcomes_before_sigterm'])}, after "
            f"{json.dumps(report['outcomes_after_sigterm'])}, shutdown.json "
            + ("missing" if s is None else ("drained" if drained else "NOT drained")))
