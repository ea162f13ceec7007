"""Replay a trace against an OpenAI-compatible server and record every streamed token.

Each trace request is sent when its arrival time comes (wall clock from the start of the run) as a
streaming completion (``POST /v1/completions``, ``stream: true``) with

- a prompt of the trace's length: token ids (``prompt: [ids]``, the same ids ``accelgen replay``
  uses) or text (about one token per word; ``workloads.prompts``);
- ``max_tokens`` = the trace's output length and ``ignore_eos: true``, so the server generates
  exactly that many tokens;
- its SLOs in ``vllm_xargs`` (``ttft_slo``, ``tbt_slo``, ``jct_slo``, ``online``, ``source``,
  ``predicted_output_len``, ``req_id``): what the AccelGen plugin reads (``--no-slos`` leaves
  them out, for servers that refuse unknown fields);
- ``return_token_ids`` and ``stream_options.continuous_usage_stats`` (vLLM's), which make the
  token count of every chunk exact.

Arrival times are the trace's, or new ones at ``request_rate`` (``arrivals.request_times``,
vLLM bench serve's recipe). Before the run, ``num_warmups`` short requests (no SLOs, not
recorded) go one at a time. The client counts tokens, not events: a server whose stream falls
behind its engine packs several tokens into one event, and each event's ``token_ids``
(``return_token_ids``) or its running ``usage`` (``continuous_usage_stats``) says how many.
Every token gets the time its event arrived (tokens that share an event share its time), on the
trace's clock (0 = the start of the run), so TTFT in the results files includes the time the
request waited for the client's connection limit or in the server's queues, as a user would see
it. At most ``max_concurrency`` requests are open at once; a request that arrives while that
many are open waits for one to finish (``client_waited_requests`` in the summary counts them).
The time of every event with choices is kept too (``Outcome.chunk_times``): vLLM's metrics
(``report``) are per event and from the moment a request was sent.

Every request ends in exactly one state:

- ``finished``: the stream ended with ``[DONE]`` after ``max_tokens`` tokens;
- ``cut``: it ended normally with fewer (reason ``length_cap: ...``);
- ``rejected``: an HTTP error status (reason ``HTTP 400: <the server's message>``), an error
  event in the stream, or a request the server's scheduler rejected (its ``stop_reason``, e.g.
  ``accelgen: rejected by policy ...``);
- ``unfinished``: the connection failed or broke, or the stream ended without ``[DONE]``.

Results are the simulator's files (``requests.parquet``, ``summary.json`` from
``accelgen.metrics``, ``config.json``), so ``accelgen.metrics`` and the notebooks read a served
run like a simulated one. A client sees no iterations: ``iterations.parquet`` is empty and
``num_preemptions`` is null (the plugin's own logs, ``accelgen serve --log-dir``, have both).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from accelgen import metrics
from accelgen.core.request import Request, Status
from accelgen.core.specs import StrictModel
from accelgen.results import ITERATION_COLUMNS, requests_frame, write_results
from accelgen.serving.arrivals import request_times
from accelgen.serving.report import (
    ReportConfig,
    RequestRecord,
    class_attainment,
    json_safe,
    request_record,
    vllm_result,
)
from accelgen.vllm_integration.adapter_config import request_extra_args
from accelgen.workloads.prompts import prompt_text, prompt_token_ids
from accelgen.workloads.trace import to_requests

API_KEY_ENV = "OPENAI_API_KEY"
WARMUP_SEED = 10**6  # prompt seeds of the warm-up requests (the trace's ids are far below)
# How long the fault-checking clients (the soak, the stop under load) keep an idle connection to
# reuse it. vLLM's API server closes one idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s); aiohttp keeps
# them 15 s, so a request sent on a connection the server is closing at that moment ends with
# "Server disconnected" without the server ever reading it: seen in a soak on a loaded host, 25
# requests of a burst at once, a client's artefact that reads as the server dropping requests.
IDLE_REUSE_S = 2.0


class BenchConfig(StrictModel):
    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    model: str | None = None  # None: the first model the server lists (GET /v1/models)
    prompt: Literal["tokens", "text"] = "tokens"
    vocab_size: PositiveInt = 1024  # token-id prompts draw ids from [3, vocab_size)
    send_slos: bool = True
    # Added to every req_id sent (vllm_xargs.req_id): a server refuses a req_id it has served,
    # so a second replay of a trace on one server needs other ids. Results keep the trace's ids.
    req_id_offset: NonNegativeInt = 0
    max_concurrency: PositiveInt = 256
    request_timeout_s: PositiveFloat = 600.0
    limit: PositiveInt | None = None  # replay only the first N requests of the trace
    label: str = "server"  # summary["policy"]: what the server runs, for grouping results
    # Short requests sent one after another before the run and not recorded, so that a fresh
    # server's one-off start-up costs (first forward passes) do not land on the trace's first
    # requests (as `accelgen replay` does).
    num_warmups: NonNegativeInt = 2
    # None: the trace's own arrival times. A rate: new arrival times at that many requests per
    # second (inf: all at time 0), with gamma inter-arrival times of shape `burstiness` drawn
    # with `seed` (vLLM bench serve's --request-rate / --burstiness / --seed; arrivals.py).
    request_rate: PositiveFloat | None = None
    burstiness: PositiveFloat = 1.0
    seed: int = 0
    report: ReportConfig = Field(default_factory=ReportConfig)


def base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/v1`` or ``http://h:p/v1/completions`` -> ``http://h:p``."""
    url = url.rstrip("/")
    for suffix in ("/v1/completions", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


@dataclass(slots=True)
class Outcome:
    """What the client saw of one request (times in seconds on the run's clock)."""

    sent: float = math.nan
    token_times: list[float] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)  # events with choices (vLLM's chunks)
    finish_time: float = math.nan
    status: str = "unfinished"  # finished, cut, rejected, unfinished
    reason: str = ""
    http_status: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # the server's count (usage.prompt_tokens)
    usage_tokens: int | None = None  # the server's completion_tokens
    padded_tokens: int = 0  # tokens the server counted in no chunk of their own
    waited: bool = False  # waited for a free connection slot


def request_body(req: Request, max_tokens: int, cfg: BenchConfig, model: str) -> dict[str, Any]:
    prompt: Any = (prompt_token_ids(req.req_id, req.prompt_len, cfg.vocab_size)
                   if cfg.prompt == "tokens" else prompt_text(req.req_id, req.prompt_len))
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0.0, "stream": True, "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if cfg.send_slos:
        # inf (no such deadline) goes as JSON's non-standard Infinity, which vLLM's server reads.
        xargs = request_extra_args(req)
        if xargs.get("req_id") is not None:
            xargs["req_id"] += cfg.req_id_offset
        body["vllm_xargs"] = xargs
    return body


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "detail" in data:
            return str(data["detail"])
    return text.strip()[:500]


class StreamParser:
    """Server-sent events of one streamed completion -> token times and the end state."""

    def __init__(self, out: Outcome) -> None:
        self.out = out
        self.buffer = b""
        self.done = False
        self.error: str | None = None
        self.stop_reason: Any = None
        self.counted = 0

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._data(line[5:].strip(), now)

    def _data(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            self.error = f"unreadable stream event {payload[:200]!r}"
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            err = chunk["error"]
            code = err.get("code") if isinstance(err, dict) else None
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = f"HTTP {code or '?'} (in the stream): {msg}"
            return
        usage = chunk.get("usage") or {}
        choices = chunk.get("choices") or []
        n = 0
        if choices:
            self.out.chunk_times.append(now)
            choice = choices[0]
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                n = len(ids)
            elif usage.get("completion_tokens") is not None:
                n = max(0, int(usage["completion_tokens"]) - self.counted)
            elif choice.get("text"):
                n = 1
            if choice.get("finish_reason") is not None:
                self.out.finish_reason = str(choice["finish_reason"])
                self.stop_reason = choice.get("stop_reason")
        if n:
            self.out.token_times.extend([now] * n)
            self.counted += n
        if usage.get("completion_tokens") is not None:
            self.out.usage_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            self.out.prompt_tokens = int(usage["prompt_tokens"])

    def finish(self, max_tokens: int, now: float) -> None:
        out = self.out
        out.finish_time = now
        if self.error is not None:
            out.status, out.reason = "rejected", self.error
            return
        if not self.done:
            out.status, out.reason = "unfinished", "the stream ended before [DONE]"
            return
        missing = (out.usage_tokens or 0) - len(out.token_times)
        if missing > 0:  # counted by the server in no chunk of their own (no token ids sent)
            out.token_times.extend([out.token_times[-1] if out.token_times else now] * missing)
            out.padded_tokens = missing
        n = len(out.token_times)
        if n >= max_tokens:
            out.status = "finished"
        elif isinstance(self.stop_reason, str) and n == 0:
            out.status, out.reason = "rejected", self.stop_reason
        else:
            out.status = "cut"
            out.reason = (f"length_cap: the server sent {n} of {max_tokens} tokens "
                          f"(finish_reason={out.finish_reason}"
                          + (f", stop_reason={self.stop_reason!r})" if self.stop_reason else ")"))


async def _one(session: Any, url: str, headers: dict[str, str], body: dict[str, Any],
               max_tokens: int, out: Outcome, t0: float) -> None:
    import aiohttp

    out.sent = time.perf_counter() - t0
    parser = StreamParser(out)
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            out.http_status = resp.status
            if resp.status != 200:
                out.finish_time = time.perf_counter() - t0
                out.status = "rejected"
                out.reason = f"HTTP {resp.status}: {_error_message(await resp.text())}"
                return
            async for data in resp.content.iter_any():
                parser.feed(data, time.perf_counter() - t0)
        parser.finish(max_tokens, time.perf_counter() - t0)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        out.finish_time = time.perf_counter() - t0
        out.status = "unfinished"
        out.reason = f"connection: {type(exc).__name__}: {exc}".rstrip(": ")


async def warm_up(session: Any, url: str, headers: dict[str, str], cfg: BenchConfig,
                  model: str) -> None:
    """``cfg.num_warmups`` short requests, one at a time, without SLOs or req_id."""
    for i in range(cfg.num_warmups):
        warm = Request(req_id=WARMUP_SEED + i, arrival=0.0, prompt_len=64)
        body = request_body(warm, 4, cfg.model_copy(update={"send_slos": False}), model)
        out = Outcome()
        await _one(session, url, headers, body, 4, out, time.perf_counter())
        if out.status != "finished":
            raise ValueError(f"warm-up request {i} to {url} failed: {out.status}: {out.reason}")


async def first_model(session: Any, base: str, headers: dict[str, str]) -> str:
    async with session.get(f"{base}/v1/models", headers=headers) as resp:
        if resp.status != 200:
            raise ValueError(f"{base}/v1/models answered HTTP {resp.status}; give --model")
        data = await resp.json()
    models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    if not models:
        raise ValueError(f"{base}/v1/models lists no model; give --model")
    return str(models[0])


async def run_requests(reqs: list[Request], max_tokens: np.ndarray, cfg: BenchConfig, *,
                       progress: bool = False) -> tuple[list[Outcome], str, float]:
    """Send every request at its arrival time; returns the outcomes (in ``reqs`` order), the
    model name used and the wall time of the run."""
    import aiohttp

    base = base_url(cfg.url)
    headers = {"Content-Type": "application/json"}
    if os.environ.get(API_KEY_ENV):
        headers["Authorization"] = f"Bearer {os.environ[API_KEY_ENV]}"
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency)
    outcomes = [Outcome() for _ in reqs]
    bar = _progress(len(reqs)) if progress else None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = cfg.model or await first_model(session, base, headers)
        url = f"{base}/v1/completions"
        await warm_up(session, url, headers, cfg, model)
        slots = asyncio.Semaphore(cfg.max_concurrency)
        # Built before the clock starts, so that sending a request costs only the send.
        bodies = [request_body(r, int(n), cfg, model) for r, n in zip(reqs, max_tokens,
                                                                       strict=True)]
        t0 = time.perf_counter()

        async def send(i: int) -> None:
            req = reqs[i]
            delay = req.arrival - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            body = bodies[i]
            outcomes[i].waited = slots.locked()
            async with slots:
                await _one(session, url, headers, body, int(max_tokens[i]), outcomes[i], t0)
            if bar is not None:
                bar.update(1)

        await asyncio.gather(*(send(i) for i in range(len(reqs))))
        wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return outcomes, model, wall


_STATUS = {"finished": Status.FINISHED, "cut": Status.CUT}


def results_frames(reqs: list[Request], max_tokens: np.ndarray, outcomes: list[Outcome]
                   ) -> pd.DataFrame:
    """``requests.parquet`` rows: the trace's request fields with what the client saw."""
    for r, o in zip(reqs, outcomes, strict=True):
        r.token_times = array("d", o.token_times)
        r.num_output_tokens = len(o.token_times)
        r.first_token_time = o.token_times[0] if o.token_times else math.nan
        r.last_token_time = o.token_times[-1] if o.token_times else math.nan
        r.finish_time = o.finish_time
        r.status = _STATUS.get(o.status, Status.REJECTED)
        r.reject_reason = o.reason
    target = {r.req_id: int(n) for r, n in zip(reqs, max_tokens, strict=True)}
    df = requests_frame(reqs, target)
    # A Request has no unfinished state (it is the absence of an end); the column has.
    df["status"] = [o.status for o in outcomes]
    return df


def summarize(df: pd.DataFrame, outcomes: list[Outcome], cfg: BenchConfig, model: str,
              wall: float) -> dict[str, Any]:
    its = pd.DataFrame({c: pd.Series(dtype="float64") for c in ITERATION_COLUMNS})
    # s_pf only scales per-iteration utilisation, and a client sees no iterations.
    summary = metrics.summarize(df, its, s_pf=1)
    lag = np.array([o.sent - a for o, a in zip(outcomes, df["arrival"], strict=True)
                    if math.isfinite(o.sent)])
    served_prompt = [o.prompt_tokens for o in outcomes if o.prompt_tokens is not None]
    summary.update({
        "backend": "serve", "url": base_url(cfg.url), "model": model,
        "policy": cfg.label,
        "num_preemptions": None,  # invisible to a client
        "http_status_counts": {str(k): v for k, v in
                               sorted(Counter(o.http_status for o in outcomes
                                              if o.http_status is not None).items())},
        "client_waited_requests": int(sum(o.waited for o in outcomes)),
        "send_lag_p50_s": float(np.median(lag)) if lag.size else math.nan,
        "send_lag_max_s": float(lag.max()) if lag.size else math.nan,
        "prompt_tokens_served": int(sum(served_prompt)),
        "prompt_len_mismatches": int(sum(o.prompt_tokens is not None and o.prompt_tokens != p
                                         for o, p in zip(outcomes, df["prompt_len"],
                                                         strict=True))),
        "tokens_without_chunk": int(sum(o.padded_tokens for o in outcomes)),
        # Tokens that came in the same chunk as the token before them: the server sent several
        # at once (its stream falls behind the engine when the machine is busy), so the client
        # sees a 0 gap where the engine had a step; the plugin's logs have the engine's times.
        "tokens_sharing_a_chunk": int(sum(_shared(o.token_times) for o in outcomes)),
        "bench_wall_time_s": wall,
    })
    return summary


def _shared(times: list[float]) -> int:
    return int(np.count_nonzero(np.diff(times) == 0)) if len(times) > 1 else 0


def timed_trace(trace: pd.DataFrame, cfg: BenchConfig) -> pd.DataFrame:
    """The requests to send, in arrival order: the trace's first ``cfg.limit``, at their own
    arrival times or at new ones for ``cfg.request_rate``."""
    df = trace.sort_values(["arrival", "req_id"], kind="stable")
    if cfg.limit is not None:
        df = df.head(cfg.limit)
    if cfg.request_rate is not None:
        df = df.assign(arrival=request_times(len(df), cfg.request_rate, cfg.burstiness,
                                             cfg.seed))
    return df


def records(df: pd.DataFrame, outcomes: list[Outcome]) -> list[RequestRecord]:
    """vLLM's per-request records (``report``) of a run."""
    return [request_record(status=o.status, reason=o.reason, arrival=float(a), sent=o.sent,
                           chunk_times=o.chunk_times, output_tokens=len(o.token_times),
                           prompt_len=int(o.prompt_tokens if o.prompt_tokens is not None
                                          else p))
            for o, a, p in zip(outcomes, df["arrival"], df["prompt_len"], strict=True)]


def result_json(df: pd.DataFrame, outcomes: list[Outcome], summary: dict[str, Any],
                cfg: BenchConfig, *, detailed: bool = False) -> dict[str, Any]:
    """The ``--save-result`` document: vLLM bench serve's setup and result keys, then ours."""
    rate = cfg.request_rate
    head: dict[str, Any] = {
        "backend": "openai", "label": cfg.label, "model_id": summary["model"],
        "tokenizer_id": None, "num_prompts": len(df),
        # "trace": the trace's own arrival times (vLLM's timed traces say so by self-timing).
        "request_rate": "trace" if rate is None else ("inf" if math.isinf(rate) else rate),
        "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
    }
    ours = {k: summary[k] for k in (
        "num_requests", "num_finished", "num_cut", "num_rejected", "num_unfinished",
        "slo_attainment_request", "ttft_attainment", "tbt_attainment", "jct_attainment",
        "slo_attainment_by_class", "http_status_counts", "tokens_sharing_a_chunk")}
    body = vllm_result(records(df, outcomes), summary["bench_wall_time_s"], cfg.report,
                       detailed=detailed)
    return json_safe({**head, **body, **ours})


# Summary keys judged against the requests' SLOs: null in a run without SLOs (``--no-slos``).
ATTAINMENT_KEYS = ("slo_attainment_iteration", "slo_attainment_request", "jct_attainment",
                   "ttft_attainment", "tbt_attainment", "slo_attainment_distserve",
                   "goodput_rps", "slo_classes", "slo_attainment_by_class")


def bench_to_dir(trace: pd.DataFrame, cfg: BenchConfig, out: Path | str, *,
                 progress: bool = False, trace_path: str | None = None,
                 result_path: Path | str | None = None,
                 save_detailed: bool = False,
                 slo_classes: dict[int, str] | None = None,
                 dataset: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replay ``trace`` against ``cfg.url`` and write the results directory ``out`` (and the
    result JSON to ``result_path``, if given). ``slo_classes``: each request's SLO class name by
    req_id (per-class attainment by name, else by online/TBT); ``dataset``: how the requests were
    made (``config.json``). Without SLOs sent (``cfg.send_slos`` false) nothing is judged against
    SLOs: the attainment keys are null."""
    df = timed_trace(trace, cfg)
    reqs, _ = to_requests(df)
    max_tokens = df["output_len"].to_numpy(np.int64)
    outcomes, model, wall = asyncio.run(run_requests(reqs, max_tokens, cfg, progress=progress))
    req_df = results_frames(reqs, max_tokens, outcomes)
    summary = summarize(req_df, outcomes, cfg, model, wall)
    summary["slo_attainment_by_class"] = class_attainment(req_df, slo_classes)
    if not cfg.send_slos:
        summary.update(dict.fromkeys(ATTAINMENT_KEYS))
    config: dict[str, Any] = {"bench_serve": cfg.model_dump(mode="json"), "model": model}
    if trace_path is not None:
        config["trace"] = trace_path
    if dataset is not None:
        config["dataset"] = dataset
    its = pd.DataFrame({c: pd.Series(dtype="float64") for c in ITERATION_COLUMNS})
    result = result_json(req_df, outcomes, summary, cfg, detailed=save_detailed)
    write_results(out, req_df, its, summary, config,
                  timing_summary={"bench_wall_time_s": wall})
    if result_path is not None:
        write_json(Path(result_path), result)
    return {"requests": req_df, "summary": summary, "config": config, "result": result}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Strict JSON, written to a temporary file and renamed (no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _progress(total: int) -> Any:  # pragma: no cover - cosmetic
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="bench-serve", mininterval=1.0)
