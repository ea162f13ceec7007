"""A soak of ``accelgen serve`` under faults: minutes of bursty load above the server's capacity,
clients that abort streams, malformed requests, SLOs nobody can meet, then SIGTERM with requests
in flight; and the checks that nothing was lost or leaked (``scripts/soak_serve.py``,
docs/vllm.md "A soak under faults").

The load (``plan``): ``rate x duration_s`` requests at gamma inter-arrival times of shape
``burstiness`` (``arrivals.request_times``), with the lengths and SLOs of
``sample_trace.mixed_slo_trace`` (TTFT SLOs of ``ttft_range``, TBT SLOs from ``tbt_choices``,
a share offline), each of one kind, drawn with ``seed``:

- ``normal``: a streamed token-id completion with its SLOs and ``req_id`` in ``vllm_xargs``;
- ``abort``: the same with ``max_tokens`` raised by ``ABORT_EXTRA_TOKENS``; the client closes
  the connection after its first 1-3 tokens (``abort_share``);
- ``malformed``: one of ``MALFORMED`` in turn (bad JSON, bad SLO fields, a bad header, a token
  id outside the vocabulary, no prompt, bad ``max_tokens``, an unknown model), each answered 4xx
  before the engine (``malformed_share``);
- ``impossible``: a well-formed request whose SLOs no step can meet (TTFT 1 ms, TBT 0.1 ms;
  ``impossible_share``): the policy rejects or serves it late, never an error.

At most ``max_in_flight`` requests are open at once (a request due while that many are open
waits for a slot). At ``duration_s`` the client stops sending, sends SIGTERM with requests in
flight, sends one more request every ``late_interval_s`` until the server has exited (at most
``late_requests``: what a client sees of a server that is stopping), and waits at most
``drain_timeout_s`` for the server to exit and the streams to end. Every ``rss_interval_s``
a sampler reads the resident memory of the server's process tree (``/proc``: the API server and
vLLM's engine core) and that the server still runs with the same process ids.

Checks (``evaluate``), each ``held`` or not with its numbers:

- ``no_5xx``: no HTTP status >= 500, in a response or in a stream's error event, but for the
  503 a stopping server answers a request that arrives after SIGTERM (``slo_http``'s
  ``SHUTTING_DOWN_*``: a refusal, counted as ``refused_at_shutdown``; the client's outcome is
  ``refused``, and like every refused request it is not in the plugin's logs);
- ``never_restarted``: the API server ran until SIGTERM, the engine core kept one process id;
- ``rss_growth``: each process's peak RSS after ``warmup_s`` is within ``rss_growth_limit`` of
  its RSS at ``warmup_s``;
- ``every_request_logged``: every request the server accepted (HTTP 200) is in the plugin's
  ``requests.parquet`` with the outcome the client saw (finished, aborted, rejected by the
  policy, unfinished at shutdown; a stream the client aborted after the engine had finished it
  counts as finished: ``abort_raced``; one it aborted after SIGTERM may have been ended by the
  shutdown grace period first), no refused request is there, and nothing else is
  (requests without a ``req_id`` are the warm-ups: as many as were sent);
- ``drained``: the scheduler's summary at shutdown (``shutdown_summary``) has every KV block
  free, no request in vLLM's tables, the plugin's or the policy's;
- ``logs_complete``: the server exited 0 within ``stop_limit_s`` of SIGTERM, the summary was
  written after the final log write and after the SIGTERM, and the log agrees with the
  summary's counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, confloat

from accelgen.core.specs import StrictModel
from accelgen.serving.arrivals import request_times
from accelgen.serving.bench import IDLE_REUSE_S, Outcome, StreamParser, first_model
from accelgen.vllm_integration.adapter_config import AUTO_REQ_ID_BASE
from accelgen.vllm_integration.logsink import ABORTED_REASON, has_log, read_log
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.shutdown_summary import read_summary
from accelgen.vllm_integration.slo_http import is_shutdown_refusal
from accelgen.workloads.prompts import prompt_token_ids

Share = confloat(ge=0.0, le=1.0)  # type: ignore[valid-type]
ABORT_EXTRA_TOKENS = 200  # an aborted stream asks for this many tokens more: it is cut, not done
IMPOSSIBLE_SLO = {"ttft_slo": 1e-3, "tbt_slo": 1e-4}  # below any step of any engine
VOCAB_SIZE = 1024  # the tiny model's
KINDS = ("normal", "abort", "malformed", "impossible")
# Every streamed request: token ids and a running usage in each event, so the client counts
# tokens exactly however the server packs them (as bench-serve does).
STREAM: dict[str, Any] = {
    "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
# The outcomes of the plugin's log a client outcome may pair with (``every_request_logged``).
MATCHES = {"finished": {"finished"}, "rejected": {"rejected"}, "cut": {"cut"},
           "aborted": {"aborted", "finished"}, "unfinished": {"unfinished", "aborted"}}


class SoakConfig(StrictModel):
    duration_s: PositiveFloat = 600.0
    rate: PositiveFloat  # requests per second
    burstiness: PositiveFloat = 0.5
    seed: int = 0
    abort_share: Share = 0.10  # type: ignore[valid-type]
    malformed_share: Share = 0.05  # type: ignore[valid-type]
    impossible_share: Share = 0.05  # type: ignore[valid-type]
    warmup_s: NonNegativeFloat = 60.0
    max_in_flight: PositiveInt = 256
    request_timeout_s: PositiveFloat = 300.0
    drain_timeout_s: PositiveFloat = 120.0
    late_requests: NonNegativeInt = 50  # at most; one every late_interval_s until the exit
    late_interval_s: PositiveFloat = 0.2
    # SIGTERM to exit: vLLM's --shutdown-timeout (30 s, accelgen serve's) plus the API server's
    # wait for connections to close (api_server.HTTP_CLOSE_TIMEOUT_S) plus slack.
    stop_limit_s: PositiveFloat = 40.0
    rss_interval_s: PositiveFloat = 2.0
    rss_growth_limit: PositiveFloat = 0.10
    num_warmups: NonNegativeInt = 2
    ttft_range: tuple[float, float] = (0.5, 2.0)
    tbt_choices: tuple[float, ...] = (0.1, 0.2, 0.4)
    req_id_base: NonNegativeInt = 0


@dataclass(slots=True)
class Planned:
    index: int
    kind: str
    arrival: float
    req_id: int
    max_tokens: int
    body: Any  # dict (JSON) or bytes (sent as is)
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=dict)
    abort_after: int = 0  # tokens before the client closes the stream (kind abort)
    prompt_len: int = 0  # >0: the body's prompt, made when it is sent (tens of thousands held)


@dataclass(slots=True)
class Seen:
    """What the client saw of one request."""

    index: int
    kind: str
    req_id: int
    phase: str = "load"  # load: sent before SIGTERM; late: after it
    sent: float = math.nan
    ended: float = math.nan
    http_status: int | None = None
    outcome: str = "unsent"  # finished, cut, rejected, aborted, refused, error, unfinished
    reason: str = ""
    tokens: int = 0
    in_flight_at_sigterm: bool = False
    at_shutdown: bool = False  # refused with the 503 of a server that is stopping


# Malformed requests, sent in turn: (body, path, headers) with REQ as the place of the req_id.
MALFORMED: tuple[tuple[Any, str, dict[str, str]], ...] = (
    (b'{"prompt": [5, 6, "REQ"', "/v1/completions", {}),
    ({"prompt": [5, 6, 7], "max_tokens": 4, "vllm_xargs": {"ttft_slo": -1}}, "/v1/completions",
     {}),
    ({"prompt": [5, 6, 7], "max_tokens": 4, "vllm_xargs": {"tbt_slo": "fast"}},
     "/v1/completions", {}),
    ({"prompt": [5, 6, 7], "max_tokens": 4, "vllm_xargs": {"ttf_slo": 0.5}}, "/v1/completions",
     {}),
    ({"prompt": [5, 6, 7], "max_tokens": 4}, "/v1/completions", {"X-AccelGen-SLO": "tbt_slo=x"}),
    ({"prompt": [5, VOCAB_SIZE + 7], "max_tokens": 4}, "/v1/completions", {}),
    ({"max_tokens": 4}, "/v1/completions", {}),
    ({"prompt": [5, 6, 7], "max_tokens": -3}, "/v1/completions", {}),
    ({"prompt": [5, 6, 7], "max_tokens": 4, "model": "no-such-model"}, "/v1/completions", {}),
    ({"messages": "not a list", "max_tokens": 4}, "/v1/chat/completions", {}),
)


def plan(cfg: SoakConfig, model: str) -> list[Planned]:
    """The requests of a soak, in arrival order (see the module docstring)."""
    n = max(1, round(cfg.rate * cfg.duration_s))
    trace = mixed_slo_trace(n=n, seed=cfg.seed, ttft_range=cfg.ttft_range,
                            tbt_choices=cfg.tbt_choices)
    arrival = request_times(n, cfg.rate, cfg.burstiness, cfg.seed)
    u = np.random.default_rng([cfg.seed, 1]).random(n)
    edges = np.cumsum([cfg.abort_share, cfg.malformed_share, cfg.impossible_share])
    kind_index = np.searchsorted(edges, u, side="right")  # 0 abort, 1 malformed, 2 impossible
    abort_after = np.random.default_rng([cfg.seed, 2]).integers(1, 4, n)
    out: list[Planned] = []
    n_malformed = 0
    for i, row in enumerate(trace.itertuples(index=False)):
        req_id = cfg.req_id_base + i
        k = int(kind_index[i])
        kind = ("abort", "malformed", "impossible", "normal")[k]
        xargs: dict[str, Any] = {"req_id": req_id, "ttft_slo": float(row.ttft_slo),
                                 "tbt_slo": float(row.tbt_slo), "jct_slo": float(row.jct_slo),
                                 "online": bool(row.online), "source": str(row.source),
                                 "predicted_output_len": int(row.predicted_output_len)}
        max_tokens = int(row.output_len)
        if kind == "malformed":
            body, path, headers = MALFORMED[n_malformed % len(MALFORMED)]
            n_malformed += 1
            if isinstance(body, bytes):
                body = body.replace(b"REQ", str(req_id).encode())
            else:
                body = {"model": model, **body}
                body["vllm_xargs"] = {**body.get("vllm_xargs", {}), "req_id": req_id}
            out.append(Planned(i, kind, float(arrival[i]), req_id, 4, body, path,
                               dict(headers)))
            continue
        if kind == "impossible":
            xargs.update(IMPOSSIBLE_SLO, online=True, jct_slo=math.inf)
        if kind == "abort":
            max_tokens += ABORT_EXTRA_TOKENS
        body = {"model": model, **STREAM, "max_tokens": max_tokens, "vllm_xargs": xargs}
        out.append(Planned(i, kind, float(arrival[i]), req_id, max_tokens, body,
                           abort_after=int(abort_after[i]) if kind == "abort" else 0,
                           prompt_len=int(row.prompt_len)))
    return out


# --------------------------------------------------------------------------------------------
# the server's processes


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux ``/proc``)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 1000:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children")
                             .read_text().split()]
    return out


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def process_role(pid: int, server_pid: int) -> str:
    """``api_server`` (the server's own process), ``engine_core`` (vLLM's engine process) or
    the process's name."""
    if pid == server_pid:
        return "api_server"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return "gone"
    if "EngineCor" in name or "EngineCor" in cmd:  # (comm is cut at 15 characters)
        return "engine_core"
    return name or "?"


@dataclass(slots=True)
class Sample:
    t: float
    alive: bool
    rss_kib: dict[str, int]  # role -> RSS
    pids: dict[str, int]  # role -> pid


def sample(server_pid: int, alive: bool, t: float) -> Sample:
    rss: dict[str, int] = {}
    pids: dict[str, int] = {}
    for p in process_tree(server_pid):
        role = process_role(p, server_pid)
        kib = rss_kib(p)
        if kib is None or role == "gone":
            continue
        if role in pids:  # a second process of one role: keep both apart
            role = f"{role}#{p}"
        rss[role], pids[role] = kib, p
    return Sample(t, alive, rss, pids)


# --------------------------------------------------------------------------------------------
# the client


async def _send(session: Any, base: str, p: Planned, seen: Seen, t0: float,
                cfg: SoakConfig) -> None:
    import aiohttp

    seen.sent = time.perf_counter() - t0
    headers = {"Content-Type": "application/json", **p.headers}
    body = p.body
    if p.prompt_len:
        body = {**body, "prompt": prompt_token_ids(p.req_id, p.prompt_len, VOCAB_SIZE)}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    out = Outcome()
    parser = StreamParser(out)
    try:
        async with session.post(base + p.path, data=data, headers=headers) as resp:
            seen.http_status = resp.status
            if resp.status != 200:
                text = await resp.text()
                seen.at_shutdown = is_shutdown_refusal(resp.status, text)
                seen.outcome = "refused" if resp.status < 500 or seen.at_shutdown else "error"
                seen.reason = f"HTTP {resp.status}: {text[:300]}"
                return
            async for chunk in resp.content.iter_any():
                parser.feed(chunk, time.perf_counter() - t0)
                if (p.abort_after and len(out.token_times) >= p.abort_after
                        and out.finish_reason is None and not parser.done):
                    resp.close()  # the connection goes: vLLM sees the client leave
                    seen.outcome, seen.tokens = "aborted", len(out.token_times)
                    seen.reason = f"the client closed the stream after {seen.tokens} tokens"
                    return
        parser.finish(p.max_tokens, time.perf_counter() - t0)
        seen.tokens = len(out.token_times)
        if parser.error is not None:
            seen.outcome = "error" if _stream_code(parser.error) >= 500 else "rejected"
            seen.reason = parser.error
        elif (isinstance(parser.stop_reason, str)
              and parser.stop_reason.startswith("accelgen:")):
            seen.outcome, seen.reason = "rejected", parser.stop_reason
        else:
            seen.outcome, seen.reason = out.status, out.reason
            if out.status == "cut" and out.finish_reason in ("abort", None):
                # vLLM aborted it, or its API server closed the stream with no finish reason
                # at all: the server is stopping.
                seen.outcome = "unfinished"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        seen.outcome = "unfinished"
        seen.reason = f"connection: {type(exc).__name__}: {exc}".rstrip(": ")
    finally:
        seen.ended = time.perf_counter() - t0


def _stream_code(error: str) -> int:
    # StreamParser's "HTTP <code> (in the stream): ..."
    word = error.split()[1] if error.startswith("HTTP ") and len(error.split()) > 1 else ""
    return int(word) if word.isdigit() else 500


async def run_soak(cfg: SoakConfig, base: str, server_pid: int,
                   server_alive: Callable[[], bool], stop_server: Callable[[], int | None],
                   *, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the load against the server at ``base`` (see the module docstring). ``stop_server``
    sends SIGTERM and waits for the exit (it runs in a thread while the streams go on); returns
    the raw material of ``evaluate``."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    # Late requests and the aborts' reconnections must not wait behind the load's slots.
    connector = aiohttp.TCPConnector(limit=cfg.max_in_flight + cfg.late_requests + 8,
                                     keepalive_timeout=IDLE_REUSE_S)
    samples: list[Sample] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = await first_model(session, base, {})
        warm = 0
        for w in range(cfg.num_warmups):
            wp = Planned(-1, "warmup", 0.0, -1, 4, {"model": model, **STREAM, "max_tokens": 4,
                                                    "prompt": prompt_token_ids(10**6 + w, 32,
                                                                               VOCAB_SIZE)})
            ws = Seen(-1, "warmup", -1)
            await _send(session, base, wp, ws, time.perf_counter(), cfg)
            if ws.outcome != "finished":
                raise RuntimeError(f"warm-up request failed: {ws.outcome}: {ws.reason}")
            warm += 1
        planned = plan(cfg, model)
        seen = [Seen(p.index, p.kind, p.req_id) for p in planned]
        slots = asyncio.Semaphore(cfg.max_in_flight)
        tasks: dict[asyncio.Task[None], Seen] = {}
        waited = 0
        t0 = time.perf_counter()
        t0_epoch = time.time()
        stop_sampling = asyncio.Event()

        async def sampler() -> None:
            # Bounded: one sample per interval until told to stop, at most the soak's length
            # plus the drain over the interval.
            limit = int((cfg.duration_s + cfg.drain_timeout_s) / cfg.rss_interval_s) + 10
            for _ in range(limit):
                samples.append(sample(server_pid, server_alive(), time.perf_counter() - t0))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_sampling.wait(), cfg.rss_interval_s)
                if stop_sampling.is_set():
                    return

        async def one(p: Planned, s: Seen) -> None:
            async with slots:
                await _send(session, base, p, s, t0, cfg)

        sampler_task = asyncio.create_task(sampler())
        last_report = 0.0
        for p, s in zip(planned, seen, strict=True):
            delay = p.arrival - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() - t0 > cfg.duration_s + 5.0:
                break  # the client fell behind its plan: the soak ends on time anyway
            waited += slots.locked()
            task = asyncio.create_task(one(p, s))
            tasks[task] = s
            task.add_done_callback(tasks.pop)
            now = time.perf_counter() - t0
            if now - last_report >= 60.0:
                last_report = now
                log(f"soak: {now:.0f} s, {p.index + 1} sent, {len(tasks)} in flight")
        # SIGTERM with requests in flight; those still waiting for a slot are not sent (the
        # ones just created get to start first).
        await asyncio.sleep(0)
        for task, s in list(tasks.items()):
            if s.sent != s.sent:
                task.cancel()
        in_flight = [s for s in seen if s.sent == s.sent and s.ended != s.ended]
        for s in in_flight:
            s.in_flight_at_sigterm = True
        t_sigterm = time.perf_counter() - t0
        loop = asyncio.get_running_loop()
        stopping = loop.run_in_executor(None, stop_server)
        log(f"soak: SIGTERM at {t_sigterm:.0f} s with {len(in_flight)} requests in flight")
        late_seen: list[Seen] = []
        for k in range(cfg.late_requests):
            await asyncio.sleep(cfg.late_interval_s)
            if stopping.done() or not server_alive():
                break
            i = len(planned) + k
            lp = Planned(i, "normal", 0.0, cfg.req_id_base + i, 8, {
                "model": model, **STREAM, "max_tokens": 8,
                "prompt": prompt_token_ids(cfg.req_id_base + i, 32, VOCAB_SIZE),
                "vllm_xargs": {"req_id": cfg.req_id_base + i}})
            ls = Seen(i, "normal", lp.req_id, phase="late")
            late_seen.append(ls)
            task = asyncio.create_task(_send(session, base, lp, ls, t0, cfg))
            tasks[task] = ls
            task.add_done_callback(tasks.pop)
        try:
            exit_status = await asyncio.wait_for(asyncio.shield(stopping), cfg.drain_timeout_s)
        except TimeoutError:
            exit_status = None
        t_exit = time.perf_counter() - t0
        if tasks:
            await asyncio.wait(set(tasks), timeout=max(1.0, cfg.drain_timeout_s / 4))
        for task in list(tasks):
            task.cancel()
        for s in seen + late_seen:
            if s.sent == s.sent and s.ended != s.ended:
                s.outcome, s.reason = "unfinished", "the client gave up after the drain timeout"
                s.ended = time.perf_counter() - t0
        stop_sampling.set()
        await sampler_task
        with contextlib.suppress(Exception):
            await stopping  # (the thread ended, or ends with the process's own stop)
    return {"seen": seen, "late": late_seen, "samples": samples, "warmups": warm,
            "t_sigterm": t_sigterm, "t_exit": t_exit, "exit_status": exit_status,
            "in_flight_at_sigterm": len(in_flight), "client_waited": waited,
            "planned": len(planned), "model": model, "t0_epoch": t0_epoch}


# --------------------------------------------------------------------------------------------
# checks


def log_outcome(status: str, reason: str) -> str:
    """The outcome of one row of the plugin's ``requests.parquet``."""
    if status == "unfinished":
        return "aborted" if reason == ABORTED_REASON else "unfinished"
    return status


def rss_growth(samples: list[Sample], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per process role: RSS at the first sample after ``warmup_s`` and the peak after it."""
    after = [s for s in samples if s.t >= warmup_s and s.alive]
    out: dict[str, dict[str, float]] = {}
    if not after:
        return out
    for role, base in after[0].rss_kib.items():
        peak = max(s.rss_kib.get(role, 0) for s in after)
        out[role] = {"at_warmup_mib": base / 1024, "peak_mib": peak / 1024,
                     "last_mib": after[-1].rss_kib.get(role, 0) / 1024,
                     "growth": peak / base - 1.0 if base else math.inf}
    return out


def evaluate(raw: dict[str, Any], log_dir: Path | str, cfg: SoakConfig, *,
             other_ranges: dict[str, tuple[int, int, int]] | None = None,
             other_warmups: int = 0) -> dict[str, Any]:
    """The checks of the module docstring. ``other_ranges``: req_id ranges the server also
    served before the soak (name -> (low, high, requests sent)), e.g. a capacity search's;
    ``other_warmups``: requests without a req_id sent before the soak."""
    log_dir = Path(log_dir)
    # Requests sent after SIGTERM count for the 5xx check; in the logs they need not be (vLLM's
    # engine core refuses a request that arrives while it stops before its scheduler sees it).
    seen: list[Seen] = [s for s in raw["seen"] if s.outcome != "unsent"]
    late: list[Seen] = raw["late"]
    checks: dict[str, dict[str, Any]] = {}

    statuses = Counter(s.http_status for s in seen + late if s.http_status is not None)
    # A stopping server's 503 (``slo_http.SHUTTING_DOWN_*``) after SIGTERM refuses a request, as
    # a 4xx does: no server fault. The same answer before SIGTERM is one.
    at_shutdown = [s for s in seen + late if s.at_shutdown and s.ended >= raw["t_sigterm"]]
    n5xx = sum(v for k, v in statuses.items() if k >= 500) - len(at_shutdown) + sum(
        s.outcome == "error" and (s.http_status or 0) < 500 for s in seen + late)
    checks["no_5xx"] = {"held": n5xx == 0, "num_5xx": n5xx,
                        "refused_at_shutdown": len(at_shutdown),
                        "http_status_counts": {str(k): v for k, v in sorted(statuses.items())}}

    samples: list[Sample] = raw["samples"]
    before = [s for s in samples if s.t < raw["t_sigterm"]]
    engine_pids = sorted({pid for s in samples for role, pid in s.pids.items()
                          if role.startswith("engine_core")})
    server_pids = sorted({s.pids.get("api_server", -1) for s in before})
    checks["never_restarted"] = {
        "held": bool(before) and all(s.alive for s in before) and len(engine_pids) == 1
        and len(server_pids) == 1 and server_pids[0] != -1,
        "samples_before_sigterm": len(before), "server_pids": server_pids,
        "engine_core_pids": engine_pids}

    growth = rss_growth(samples[: len(before)], cfg.warmup_s)
    main_roles = {r: g for r, g in growth.items() if r in ("api_server", "engine_core")}
    checks["rss_growth"] = {
        "held": len(main_roles) == 2 and all(g["growth"] <= cfg.rss_growth_limit
                                             for g in main_roles.values()),
        "limit": cfg.rss_growth_limit, "by_process": growth}

    requests = read_log(log_dir / "requests.parquet") if has_log(log_dir / "requests.parquet") \
        else pd.DataFrame(columns=["req_id", "status", "reject_reason"])
    logged = {int(r): log_outcome(str(st), str(why or "")) for r, st, why in zip(
        requests["req_id"], requests["status"], requests["reject_reason"], strict=True)}
    ids = requests["req_id"].to_numpy(dtype=np.int64)
    accepted = [s for s in seen if s.http_status == 200]
    refused = [s for s in seen if s.http_status is not None and s.http_status != 200]
    unanswered = [s for s in seen if s.http_status is None]
    pairs: Counter[str] = Counter()
    bad: list[dict[str, Any]] = []
    raced = 0
    never_reached = 0
    for s in accepted:
        got = logged.get(s.req_id)
        pairs[f"{s.outcome}->{got}"] += 1
        if (got is None and s.outcome == "unfinished" and s.tokens == 0
                and s.in_flight_at_sigterm):
            # Accepted by the API server while it was stopping, never handed to the engine:
            # no scheduler saw it (counted, not a loss).
            never_reached += 1
            continue
        if (s.outcome == "aborted" and got == "unfinished" and s.in_flight_at_sigterm
                and s.ended >= raw["t_sigterm"]):
            # The client closed the stream after SIGTERM, as the grace period ended it.
            pass
        elif got is None or got not in MATCHES.get(s.outcome, set()):
            if len(bad) < 20:
                bad.append({"req_id": s.req_id, "kind": s.kind, "client": s.outcome,
                            "log": got, "reason": s.reason[:200]})
        elif s.outcome == "aborted" and got == "finished":
            raced += 1
    refused_logged = [s.req_id for s in refused if s.req_id in logged]
    # A request the client never got an answer for (the connection went) may or may not have
    # reached the engine: it counts only if it is logged, with an outcome that says it ended.
    unanswered_logged = {s.req_id: logged[s.req_id] for s in unanswered if s.req_id in logged}
    ours = {s.req_id for s in accepted} | set(unanswered_logged)
    soak_lo = cfg.req_id_base
    soak_hi = cfg.req_id_base + raw["planned"]
    in_soak = (ids >= soak_lo) & (ids < soak_hi)
    stray = sorted(set(ids[in_soak].tolist()) - ours)[:20]
    ranges = {"soak": {"logged": int(in_soak.sum()), "client_accepted": len(accepted)}}
    # A late request the engine did take in is logged like any other.
    late_ok = [s for s in late if s.req_id not in logged
               or logged[s.req_id] in MATCHES.get(s.outcome, set())]
    known = in_soak | np.isin(ids, [s.req_id for s in late])
    ranges_ok = True
    for name, (lo, hi, sent) in (other_ranges or {}).items():
        inside = (ids >= lo) & (ids < hi)
        known |= inside
        ranges[name] = {"logged": int(inside.sum()), "sent": sent}
        ranges_ok &= int(inside.sum()) == sent
    auto = ids >= AUTO_REQ_ID_BASE
    known |= auto
    warmups = raw["warmups"] + other_warmups
    ranges["warmups"] = {"logged": int(auto.sum()), "sent": warmups}
    unknown = sorted(ids[~known].tolist())[:20]
    client_counts = Counter(s.outcome for s in seen)
    log_counts = Counter(logged[r] for r in ours if r in logged)
    accepted_counts = Counter(s.outcome for s in accepted)
    checks["every_request_logged"] = {
        "held": not bad and not refused_logged and not stray and not unknown and ranges_ok
        and len(late_ok) == len(late)
        and int(auto.sum()) == warmups
        and all(v in ("aborted", "unfinished", "finished", "rejected")
                for v in unanswered_logged.values()),
        "client_outcomes": dict(sorted(client_counts.items())),
        "client_outcomes_accepted": dict(sorted(accepted_counts.items())),
        "log_outcomes": dict(sorted(log_counts.items())),
        "client_to_log": dict(sorted(pairs.items())), "abort_raced": raced,
        "unfinished_before_the_engine": never_reached,
        "mismatches": bad, "refused_but_logged": refused_logged[:20],
        "unanswered_but_logged": len(unanswered_logged), "not_sent_by_client": stray,
        "unknown_req_ids": unknown, "ranges": ranges}

    summary = read_summary(log_dir)
    if summary is None:
        checks["drained"] = {"held": False, "why": "no shutdown.json: the engine did not reach "
                             "its shutdown (killed?)"}
        checks["logs_complete"] = {"held": False, "exit_status": raw["exit_status"],
                                   "why": "no shutdown.json"}
    else:
        checks["drained"] = {
            "held": summary["kv_blocks_free"] == summary["kv_blocks_total"]
            and summary["vllm_requests"] == 0 and summary["waiting"] == 0
            and summary["running"] == 0 and summary["tracked_requests"] == 0
            and summary["policy_live_requests"] in (0, None),
            **{k: summary[k] for k in ("kv_blocks_total", "kv_blocks_free", "vllm_requests",
                                       "waiting", "running", "tracked_requests",
                                       "policy_live_requests")}}
        file_status = Counter(requests["status"].tolist())
        after_sigterm = summary["time"] >= raw["t0_epoch"] + raw["t_sigterm"] - 1.0
        mtime = (log_dir / "requests.parquet").stat().st_mtime
        stopped_s = raw["t_exit"] - raw["t_sigterm"]
        checks["logs_complete"] = {
            "held": raw["exit_status"] == 0 and after_sigterm and stopped_s <= cfg.stop_limit_s
            and mtime <= (log_dir / "shutdown.json").stat().st_mtime
            and dict(file_status) == summary["requests_by_status"],
            "exit_status": raw["exit_status"],
            "exit_after_sigterm_s": stopped_s, "stop_limit_s": cfg.stop_limit_s,
            "summary_after_sigterm": after_sigterm,
            "log_status_counts": dict(sorted(file_status.items())),
            "summary_status_counts": summary["requests_by_status"],
            "unfinished_by_reason": summary["unfinished_by_reason"],
            "iterations": summary["iterations"], "log_writes": summary["log_writes"]}

    by_kind: dict[str, Counter[str]] = {}
    at_sigterm: dict[str, Counter[str]] = {}  # of them, those in flight at SIGTERM
    for s in raw["seen"]:
        if s.outcome != "unsent":
            by_kind.setdefault(s.kind, Counter())[s.outcome] += 1
            if s.in_flight_at_sigterm:
                at_sigterm.setdefault(s.kind, Counter())[s.outcome] += 1
    late_counts = Counter(f"{s.http_status}:{s.outcome}" + (":logged" if s.req_id in logged
                                                             else "") for s in late)
    return {
        "held": all(c["held"] for c in checks.values()),
        "checks": checks,
        "load": {"planned": raw["planned"], "sent": sum(s.outcome != "unsent"
                                                        for s in raw["seen"]),
                 "duration_s": cfg.duration_s, "rate": cfg.rate,
                 "achieved_rate": (sum(s.outcome != "unsent" for s in raw["seen"])
                                   / max(raw["t_sigterm"], 1e-9)),
                 "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
                 "client_waited_for_a_slot": raw["client_waited"],
                 "in_flight_at_sigterm": raw["in_flight_at_sigterm"],
                 "in_flight_at_sigterm_outcomes": dict(sorted(Counter(
                     s.outcome for s in raw["seen"] if s.in_flight_at_sigterm).items())),
                 "by_kind_in_flight_at_sigterm": {k: dict(sorted(v.items()))
                                                  for k, v in sorted(at_sigterm.items())},
                 "late_requests": dict(sorted(late_counts.items()))},
        "config": cfg.model_dump(mode="json"),
    }


def seen_frame(raw: dict[str, Any]) -> pd.DataFrame:
    """Every request the client handled (load and late), one row each."""
    return pd.DataFrame([asdict(s) for s in raw["seen"] + raw["late"]
                         if s.outcome != "unsent"])


# --------------------------------------------------------------------------------------------
# one soak, start to end

CAPACITY_ID_BASE = 10**9  # req_ids of the capacity search's requests (the soak's are below)


class CapacitySearch(StrictModel):
    """``bench-serve --find-capacity`` before the soak, on the same server and with the soak's
    request mix (``mixed_slo_trace`` of ``requests`` requests, the soak's SLO ranges)."""

    requests: PositiveInt = 100
    seed: int = 3
    # search: the highest rate meeting ``target``; saturation: the throughput of the search's
    # first probe alone (every request at once), a quicker estimate.
    estimate: Literal["search", "saturation"] = "search"
    target: confloat(gt=0.0, le=1.0) = 0.9  # type: ignore[valid-type]
    tolerance: PositiveFloat = 0.1
    max_probes: PositiveInt = 12


def search_capacity(url: str, out: Path, cfg: SoakConfig, search: CapacitySearch
                    ) -> dict[str, Any]:
    """The capacity search's result (``capacity.find_capacity``), with the requests it sent."""
    from accelgen.serving.bench import BenchConfig
    from accelgen.serving.capacity import CapacityConfig, find_capacity

    trace = mixed_slo_trace(n=search.requests, seed=search.seed, ttft_range=cfg.ttft_range,
                            tbt_choices=cfg.tbt_choices)
    bench = BenchConfig(url=url, req_id_offset=CAPACITY_ID_BASE, num_warmups=2)
    probes = 1 if search.estimate == "saturation" else search.max_probes
    res = find_capacity(trace, bench, CapacityConfig(target=search.target,
                                                     tolerance=search.tolerance,
                                                     max_probes=probes), out)
    if search.estimate == "saturation" or res["capacity_rps"] == "inf":
        # Every request at once still met the target: the server's capacity is its throughput
        # under that load (the first probe's), not an arrival rate.
        res["capacity_rps"] = float(res["probes"][0]["request_throughput"])
    res["requests_sent"] = res["num_probes"] * search.requests
    res["warmups_sent"] = res["num_probes"] * bench.num_warmups
    return res


def soak(out: Path | str, cfg: SoakConfig | None = None, *, load_factor: float = 1.2,
         capacity_rps: float | None = None, search: CapacitySearch | None = None,
         server_args: list[str] | None = None,
         log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Start ``accelgen serve`` (tiny model, ``--log-dir out/plugin-logs``, ``server_args``),
    find its capacity (``search``) unless ``capacity_rps`` is given, run the soak at
    ``load_factor`` times it (``cfg.rate`` is replaced) and return the report (also written to
    ``out/report.json``, the client's requests to ``out/client.parquet``). The server is always
    stopped."""
    import shutil
    import signal

    from accelgen.serving.bench import write_json
    from accelgen.vllm_integration.serve import ServerProcess

    out = Path(out)
    logs = out / "plugin-logs"
    if logs.exists():
        shutil.rmtree(logs)  # a previous soak's files would pass for this one's
    base_cfg = cfg or SoakConfig(rate=1.0)
    server = ServerProcess(["--tiny-dir", str(out / "tiny"), "--max-model-len", "2048",
                            "--log-dir", str(logs), "--log-flush-interval", "5",
                            *(server_args or [])],
                           log_path=out / "server.log",
                           stop_timeout_s=base_cfg.drain_timeout_s)
    t_start = time.perf_counter()
    with server:
        ready_s = time.perf_counter() - t_start
        log(f"soak: server ready after {ready_s:.0f} s at {server.url} (pid {server.proc.pid})")
        capacity: dict[str, Any] | None = None
        search = search or CapacitySearch()
        if capacity_rps is None:
            capacity = search_capacity(server.url, out / "capacity", base_cfg, search)
            found = capacity["capacity_rps"]
            if not isinstance(found, float):
                raise RuntimeError(f"the capacity search found no finite capacity ({found}); "
                                   "give the capacity")
            capacity_rps = found
            log(f"soak: capacity {capacity_rps:.2f} req/s ({capacity['num_probes']} probes)")
        cfg = base_cfg.model_copy(update={"rate": load_factor * capacity_rps})
        proc = server.proc
        raw = asyncio.run(run_soak(
            cfg, server.url, proc.pid, lambda: proc.poll() is None,
            lambda: server.stop(signal.SIGTERM), log=log))
    other = ({"capacity_search": (CAPACITY_ID_BASE, AUTO_REQ_ID_BASE,
                                  capacity["requests_sent"])} if capacity else {})
    report = evaluate(raw, logs, cfg, other_ranges=other,
                      other_warmups=capacity["warmups_sent"] if capacity else 0)
    report["capacity_rps"] = capacity_rps
    report["load_factor"] = load_factor
    report["capacity_search"] = ({"estimate": search.estimate,
                                  **{k: capacity[k] for k in ("capacity_rps", "bracket",
                                                              "num_probes", "probes")}}
                                 if capacity else None)
    report["server"] = {"args": server.args, "ready_s": ready_s,
                        "wall_s": time.perf_counter() - t_start}
    seen_frame(raw).to_parquet(out / "client.parquet", index=False)
    write_json(out / "report.json", report)
    return report


def closing_line(report: dict[str, Any], out: Path | str) -> str:
    """One line: what was written, the counts, the checks."""
    c = report["checks"]
    log = c["every_request_logged"]
    rss = c["rss_growth"]["by_process"]
    growth = ", ".join(f"{r} {g['growth'] * 100:+.1f} %" for r, g in sorted(rss.items())
                       if r in ("api_server", "engine_core"))
    failed = [name for name, v in c.items() if not v["held"]]
    return (f"soak: wrote {Path(out) / 'report.json'}: {report['load']['sent']} requests at "
            f"{report['load']['rate']:.1f} req/s ({report['load_factor']:g} x "
            f"{report['capacity_rps']:.1f}), client {log['client_outcomes']}, "
            f"5xx {c['no_5xx']['num_5xx']}, RSS {growth}; "
            + ("all checks held" if not failed else f"FAILED: {', '.join(failed)}"))
