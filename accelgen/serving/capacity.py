"""``bench-serve --find-capacity``: the highest request rate at which a served trace still meets
a target SLO attainment, found by probing the server over HTTP.

The method of vLLM's former ``bench sweep serve_sla``: one run with every request at time 0
(``request_rate`` inf) measures the server's saturated request throughput, which is the first
rate probed; from there the rate doubles (while the target is met) or halves (while it is missed)
until one probe meets the target and another misses it, then bisects that bracket until its
upper end is within ``tolerance`` of its lower end or ``max_probes`` probes have run. Every probe
replays the same requests with the same arrival pattern scaled to its rate
(``arrivals.request_times``: same seed, same shape), so probes differ in rate only; probe ``k``
sends the trace's req_ids plus ``k`` times the number of requests (``req_id_offset``), since a
server refuses a req_id it has served.

The attainment is ``slo_attainment_request`` by default (each request against its own SLOs from
the trace; ``metrics``), or any share metric of the summary (``ttft_attainment``, ...). The search
assumes attainment falls as the rate rises; on a noisy machine two probes of nearby rates can
disagree, and the bracket is then only as good as one probe per rate.

Each probe's results files and result JSON go to ``<out>/rate-<rate>/``; ``<out>/capacity.json``
holds every probe (rate, attainment, throughput, counts) and the bracket found.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import PositiveFloat, PositiveInt, confloat

from accelgen.core.specs import StrictModel
from accelgen.serving.bench import BenchConfig, bench_to_dir, write_json

CapacityMetric = Literal["slo_attainment_request", "ttft_attainment", "tbt_attainment",
                         "jct_attainment", "slo_attainment_distserve"]
GROWTH = 2.0  # factor between probes until the target is bracketed


class CapacityConfig(StrictModel):
    target: confloat(gt=0.0, le=1.0) = 0.9  # type: ignore[valid-type]
    metric: CapacityMetric = "slo_attainment_request"
    tolerance: PositiveFloat = 0.1  # stop when high <= low * (1 + tolerance)
    max_probes: PositiveInt = 12  # the saturation run included


def rate_name(rate: float) -> str:
    return "rate-inf" if math.isinf(rate) else f"rate-{rate:.3f}"


def find_capacity(trace: pd.DataFrame, cfg: BenchConfig, cap: CapacityConfig,
                  out: Path | str, *, progress: bool = False,
                  on_probe: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Probe ``cfg.url`` with ``trace`` at several rates; returns (and writes to
    ``out/capacity.json``) the probes and the bracket."""
    out = Path(out)
    probes: list[dict[str, Any]] = []

    n = len(trace) if cfg.limit is None else min(cfg.limit, len(trace))

    def probe(rate: float) -> bool:
        name = rate_name(rate)
        # Each probe sends the trace's requests again: other req_ids, which the server has not
        # served yet (it refuses one it has).
        offset = cfg.req_id_offset + len(probes) * n
        run = bench_to_dir(trace, cfg.model_copy(update={"request_rate": rate,
                                                         "req_id_offset": offset}),
                           out / name, progress=progress, result_path=out / name / "result.json")
        s, r = run["summary"], run["result"]
        value = s[cap.metric]
        met = bool(value >= cap.target) if math.isfinite(value) else False
        row = {"request_rate": "inf" if math.isinf(rate) else rate, "dir": name,
               cap.metric: value, "meets_target": met,
               "request_throughput": r["request_throughput"], "completed": r["completed"],
               "failed": r["failed"], "median_ttft_ms": r.get("median_ttft_ms"),
               "median_tpot_ms": r.get("median_tpot_ms")}
        probes.append(row)
        if on_probe is not None:
            on_probe(row)
        return met

    low: float | None = None  # highest rate that met the target
    high: float | None = None  # lowest rate that missed it
    if probe(math.inf):
        low = math.inf
    else:
        high = math.inf
        rate = max(float(probes[0]["request_throughput"]), 1e-3)
        while len(probes) < cap.max_probes:
            if probe(rate):
                low = rate
            else:
                high = rate
            if low is not None and not math.isinf(high):
                if high <= low * (1.0 + cap.tolerance):
                    break
                rate = (low + high) / 2.0
            elif low is None:
                rate = rate / GROWTH
            else:
                rate = rate * GROWTH
    result = {
        "target": cap.target, "metric": cap.metric, "tolerance": cap.tolerance,
        "num_probes": len(probes), "probes": probes,
        # The bracket: the highest rate that met the target and the lowest that missed it
        # (null: none did; "inf": every request at once still met it).
        "capacity_rps": _rate(low), "bracket": {"meets": _rate(low), "misses": _rate(high)},
        "bracketed": low is not None and high is not None and not math.isinf(high),
    }
    write_json(out / "capacity.json", result)
    return result


def _rate(rate: float | None) -> float | str | None:
    if rate is None:
        return None
    return "inf" if math.isinf(rate) else rate
