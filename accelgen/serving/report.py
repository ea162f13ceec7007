"""``bench-serve``'s result JSON in ``vllm bench serve``'s keys and definitions, plus the
per-request SLO attainment only a trace with SLOs can give.

vLLM's definitions (``vllm/benchmarks/serve.py`` and ``lib/endpoint_request_func.py``, 0.32),
which the numbers here follow, all from the moment a request was sent (after the client's
concurrency limit let it go):

- TTFT: until the first streamed event with choices;
- ITL: between consecutive events with choices, one value per event (an event carrying several
  tokens is one ITL, as in vLLM's client);
- E2EL (``latencies``): until the last event with choices;
- TPOT: ``(E2EL - TTFT) / (output tokens - 1)``, the first token excluded, for requests with
  more than one token; output tokens are counted tokens (``bench.StreamParser``), not events;
- goodput (``--goodput ttft:MS tpot:MS e2el:MS``): completed requests meeting every given
  threshold (a single-token request's TPOT counts as 0), per second of the run;
- ``client_queue_time``: from the request's arrival time to its sending (time spent behind the
  concurrency limit, plus the client's lateness).

A request is ``completed`` when its stream ended normally with at least one token (``finished``
or ``cut``); anything else is ``failed``. vLLM's client counts a stream that carried an event
with choices as completed even with no token, which is how the AccelGen plugin's rejections
look; here they are failed. Percentiles are NumPy's linear interpolation, as vLLM's; a metric
without values is ``null`` (vLLM writes 0).

Ours, beside them: ``slo_attainment_request`` (every request against its own SLOs from the
trace, measured from its arrival time, ``accelgen.metrics``), ``ttft_attainment``,
``tbt_attainment`` and ``slo_attainment_by_class``: the same per SLO class (the class names of
a named class set, ``--slo-classes``; else ``offline``, or ``online tbt_slo=<s>`` for each TBT
SLO of the online requests). A run without SLOs (``--no-slos``, or a random dataset without a
class set) has these keys null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, NonNegativeFloat, field_validator

from accelgen import metrics
from accelgen.core.specs import StrictModel

PercentileMetric = Literal["ttft", "tpot", "itl", "e2el", "client_queue_time",
                           "e2el_including_client_queue"]
GoodputMetric = Literal["ttft", "tpot", "e2el"]
PERCENTILE_METRICS: tuple[str, ...] = PercentileMetric.__args__  # type: ignore[attr-defined]
GOODPUT_METRICS: tuple[str, ...] = GoodputMetric.__args__  # type: ignore[attr-defined]
MS = 1000.0


def _default_metrics() -> list[PercentileMetric]:
    return ["ttft", "tpot", "itl", "e2el"]


class ReportConfig(StrictModel):
    # vLLM's default is ttft,tpot,itl; E2EL is always measured here, so it is reported too.
    percentile_metrics: list[PercentileMetric] = Field(default_factory=_default_metrics)
    metric_percentiles: list[float] = Field(default_factory=lambda: [99.0])
    goodput: dict[GoodputMetric, NonNegativeFloat] = Field(default_factory=dict)  # ms

    @field_validator("metric_percentiles")
    @classmethod
    def _percentiles(cls, value: list[float]) -> list[float]:
        bad = [p for p in value if not 0.0 <= p <= 100.0]
        if bad:
            raise ValueError(f"percentiles must be in [0, 100], got {bad}")
        return value


@dataclass(slots=True)
class RequestRecord:
    """One request as vLLM's client records it (times in seconds)."""

    success: bool
    prompt_len: int
    output_tokens: int = 0
    start_time: float = 0.0  # when it was sent, on the run's clock
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    queue_time: float = 0.0
    error: str = ""

    @property
    def tpot(self) -> float:
        """0 for a single-token request (vLLM's goodput rule); not a TPOT sample then."""
        n = self.output_tokens
        return (self.latency - self.ttft) / (n - 1) if n > 1 else 0.0


def request_record(*, status: str, reason: str, arrival: float, sent: float,
                   chunk_times: list[float], output_tokens: int, prompt_len: int
                   ) -> RequestRecord:
    """vLLM's record of one request from what the client saw."""
    ok = status in ("finished", "cut") and output_tokens > 0 and bool(chunk_times)
    if not ok:
        return RequestRecord(success=False, prompt_len=prompt_len,
                             start_time=sent if math.isfinite(sent) else 0.0,
                             error=reason or status)
    return RequestRecord(
        success=True, prompt_len=prompt_len, output_tokens=output_tokens, start_time=sent,
        ttft=chunk_times[0] - sent, itl=list(np.diff(chunk_times).tolist()),
        latency=chunk_times[-1] - sent, queue_time=max(0.0, sent - arrival))


def _values(records: list[RequestRecord], metric: str) -> list[float]:
    done = [r for r in records if r.success]
    if metric == "ttft":
        return [r.ttft for r in done]
    if metric == "tpot":
        return [r.tpot for r in done if r.output_tokens > 1]
    if metric == "itl":
        return [x for r in done for x in r.itl]
    if metric == "e2el":
        return [r.latency for r in done]
    if metric == "client_queue_time":
        return [r.queue_time for r in done]
    if metric == "e2el_including_client_queue":
        return [r.latency + r.queue_time for r in done]
    raise ValueError(f"unknown metric {metric!r} (known: {', '.join(PERCENTILE_METRICS)})")


def percentile_word(p: float) -> str:
    """vLLM's key spelling: ``99`` -> ``p99``, ``99.9`` -> ``p99.9``."""
    return "p" + (str(int(p)) if int(p) == p else str(p))


def metric_stats(values: list[float], metric: str, percentiles: list[float]
                 ) -> dict[str, float | None]:
    """``mean_/median_/std_<metric>_ms`` and ``p<P>_<metric>_ms`` of ``values`` (seconds)."""
    if not values:
        out: dict[str, float | None] = {f"{k}_{metric}_ms": None
                                        for k in ("mean", "median", "std")}
        out.update({f"{percentile_word(p)}_{metric}_ms": None for p in percentiles})
        return out
    v = np.asarray(values, dtype=np.float64)
    out = {f"mean_{metric}_ms": float(v.mean() * MS), f"median_{metric}_ms":
           float(np.median(v) * MS), f"std_{metric}_ms": float(v.std() * MS)}
    out.update({f"{percentile_word(p)}_{metric}_ms": float(np.percentile(v, p) * MS)
                for p in percentiles})
    return out


def good_requests(records: list[RequestRecord], goodput: dict[GoodputMetric, float]) -> int:
    """Completed requests within every threshold of ``goodput`` (milliseconds)."""
    def good(r: RequestRecord) -> bool:
        value = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
        return all(value[k] <= ms / MS for k, ms in goodput.items())

    return sum(1 for r in records if r.success and good(r))


def vllm_result(records: list[RequestRecord], duration: float, cfg: ReportConfig, *,
                detailed: bool = False) -> dict[str, Any]:
    """vLLM's benchmark result keys for ``records`` over a run of ``duration`` seconds."""
    done = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    dur = max(duration, 1e-9)
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / dur,
        "request_goodput": (good_requests(records, cfg.goodput) / dur if cfg.goodput
                            else None),
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "latencies": [r.latency for r in records],
        "queue_times": [r.queue_time for r in records],
    }
    if detailed:
        out.update({
            "input_lens": [r.prompt_len for r in records],
            "output_lens": [r.output_tokens for r in records],
            "start_times": [r.start_time for r in records],
            "ttfts": [r.ttft for r in records],
            "itls": [r.itl for r in records],
            "errors": [r.error for r in records],
        })
    for metric in cfg.percentile_metrics:
        out.update(metric_stats(_values(records, metric), metric, cfg.metric_percentiles))
    return out


def slo_class(online: bool, tbt_slo: float) -> str:
    return f"online tbt_slo={tbt_slo:g}" if online else "offline"


def class_attainment(requests: pd.DataFrame, names: dict[int, str] | None = None
                     ) -> dict[str, dict[str, float | int]]:
    """Per SLO class: its number of requests and the share that met their SLOs (the rule of
    ``metrics.per_request``: rejected and unfinished requests miss). A class is the name
    ``names`` gives the request's req_id, or else ``slo_class`` of its online flag and TBT SLO."""
    if requests.empty:
        return {}
    pr = metrics.per_request(requests)
    if names is not None:
        keys = [names[int(r)] for r in pr["req_id"]]
    else:
        keys = [slo_class(bool(o), float(t)) for o, t in zip(pr["online"], pr["tbt_slo"],
                                                              strict=True)]
    met = pr["slo_met"].to_numpy(dtype=bool)
    out: dict[str, dict[str, float | int]] = {}
    for key in sorted(set(keys)):
        mask = np.fromiter((k == key for k in keys), dtype=bool, count=len(keys))
        out[key] = {"requests": int(mask.sum()), "slo_attainment": float(met[mask].mean())}
    return out


def json_safe(value: Any) -> Any:
    """NaN and infinities -> None (strict JSON), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value
