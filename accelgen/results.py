"""The results of one run, from either backend: logs, the run-output type, the results files.

The simulator (``accelgen.sim``) and the vLLM replay runner (``accelgen.vllm_integration``) both
log into an ``IterationLog``, turn their requests into a ``requests_frame``, return a
``RunOutput`` and write it with ``write_results``, so the metrics module and the notebooks read
both alike. This module imports neither backend. The files:

- ``requests.parquet``: one row per request (see ``REQUEST_COLUMNS``), with the list column
  ``token_times`` (seconds, one entry per emitted token).
- ``iterations.parquet``: one row per iteration (see ``ITERATION_COLUMNS``) plus the policy's
  diagnostic fields prefixed ``info_``.
- ``summary.json``: the metrics summary; ``config.json``: the resolved configuration.
- ``timing.parquet`` / ``timing.json``: wall-clock measurements (policy decision time per
  iteration, run time). They are kept apart because they are the only outputs that differ
  between two runs with the same inputs and seed; every other file is byte-identical.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from accelgen.costmodel.base import BatchShape
from accelgen.policies.base import InfoRow
from accelgen.request import Request, Status

ITERATION_COLUMNS = (
    "start", "latency", "forward_size", "prefill_tokens", "decode_tokens", "num_prefill_seqs",
    "batch_size", "prefill_attn", "decode_ctx", "kv_used_blocks", "kv_total_blocks",
    "kv_used_tokens", "num_preempted", "num_waiting", "num_running",
    "num_swapped", "swap_time",
)

REQUEST_COLUMNS = (
    "req_id", "arrival", "source", "online", "prompt_len", "output_len", "ttft_slo", "tbt_slo",
    "jct_slo", "status", "reject_reason", "num_output_tokens", "first_scheduled_time",
    "first_token_time", "finish_time", "num_preemptions", "token_times",
)


class IterationLog:
    """Column-wise append-only log; cheap enough for the simulator's hot loop."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.info: list[MutableMapping[str, float]] = []
        self.decision_time: list[float] = []

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, start: float, latency: float, shape: BatchShape, batch_size: int,
               kv_used_blocks: int, kv_total_blocks: int, kv_used_tokens: int,
               decision_time: float, num_preempted: int, num_waiting: int, num_running: int,
               num_swapped: int, swap_time: float, info: MutableMapping[str, float]) -> None:
        self.rows.append((
            start, latency, shape.prefill_tokens + shape.decode_seqs, shape.prefill_tokens,
            shape.decode_seqs, shape.prefill_seqs, batch_size, shape.prefill_attn,
            shape.decode_ctx, kv_used_blocks, kv_total_blocks, kv_used_tokens, num_preempted,
            num_waiting, num_running, num_swapped, swap_time))
        self.info.append(info)
        self.decision_time.append(decision_time)

    def to_frame(self) -> pd.DataFrame:
        df = pd.DataFrame.from_records(self.rows, columns=list(ITERATION_COLUMNS))
        if not len(df):
            return df
        info = pd.DataFrame.from_records(
            [r.as_dict() if isinstance(r, InfoRow) else r for r in self.info])
        if len(info.columns):
            info.columns = [f"info_{c}" for c in info.columns]
            df = pd.concat([df, info.astype("float64")], axis=1)
        return df


    def timing_frame(self) -> pd.DataFrame:
        times = np.asarray(self.decision_time, dtype=np.float64)
        return pd.DataFrame({"decision_time": times})


# The ``status`` column: ``finished``, ``cut`` or ``rejected`` (the last two with their reason in
# ``reject_reason``); logs written while requests are in flight show ``waiting``/``running``.
_STATUS_NAMES = {s: s.name.lower() for s in Status}


def requests_frame(requests: Iterable[Request], output_len: np.ndarray) -> pd.DataFrame:
    """One row per request (``REQUEST_COLUMNS``); ``output_len[req_id]`` is the output length the
    request was to emit (its served length: the trace's, stopped at max_model_len)."""
    rows = []
    for r in requests:
        rows.append((
            r.req_id, r.arrival, r.source, r.online, r.prompt_len, int(output_len[r.req_id]),
            r.ttft_slo, r.tbt_slo, r.jct_slo,
            _STATUS_NAMES[r.status],
            r.reject_reason, r.num_output_tokens, r.first_scheduled_time, r.first_token_time,
            r.finish_time, r.num_preemptions, list(r.token_times)))
    return pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))


def outcome_counts(summary: dict[str, Any]) -> str:
    """How the run's requests ended, for a command's closing line, e.g. ``200 requests: 197
    finished, 2 cut at max_model_len, 1 rejected``."""
    text = (f"{summary['num_requests']} requests: {summary['num_finished']} finished, "
            f"{summary['num_cut']} cut at max_model_len, {summary['num_rejected']} rejected")
    if summary.get("num_unfinished"):
        text += f", {summary['num_unfinished']} unfinished"
    return text


def _table(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(obj: Any) -> str:
    """Deterministic JSON (sorted keys, non-finite floats as null)."""
    return json.dumps(_finite(obj), indent=2, sort_keys=True, default=_json_default) + "\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_results(out_dir: Path | str, requests: pd.DataFrame, iterations: pd.DataFrame,
                  summary: dict[str, Any], config: dict[str, Any],
                  timing: pd.DataFrame | None = None,
                  timing_summary: dict[str, Any] | None = None) -> Path:
    """Write a results directory atomically: all files appear together or none do."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        pq.write_table(_table(requests), tmp / "requests.parquet")
        pq.write_table(_table(iterations), tmp / "iterations.parquet")
        (tmp / "summary.json").write_text(dumps(summary))
        (tmp / "config.json").write_text(dumps(config))
        if timing is not None:
            pq.write_table(_table(timing), tmp / "timing.parquet")
        if timing_summary is not None:
            (tmp / "timing.json").write_text(dumps(timing_summary))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@dataclass(slots=True)
class RunOutput:
    """One run of a trace, from the simulator (``accelgen.sim.runner.simulate``) or a real engine
    (``accelgen.vllm_integration.replay.replay``): the tables and mappings of the results files."""

    requests: pd.DataFrame  # requests.parquet
    iterations: pd.DataFrame  # iterations.parquet
    summary: dict[str, Any]  # summary.json
    timing: pd.DataFrame  # timing.parquet (wall-clock: differs between runs)
    timing_summary: dict[str, Any]  # timing.json
    config: dict[str, Any]  # config.json

    def write(self, out_dir: Path | str) -> Path:
        """Write the results directory (atomically, see ``write_results``)."""
        return write_results(out_dir, self.requests, self.iterations, self.summary, self.config,
                             self.timing, self.timing_summary)


def read_results(out_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    out = Path(out_dir)
    reqs = pq.read_table(out / "requests.parquet").to_pandas()
    its = pq.read_table(out / "iterations.parquet").to_pandas()
    summary = json.loads((out / "summary.json").read_text())
    timing = out / "timing.parquet"
    if timing.exists():
        its["decision_time"] = pq.read_table(timing).to_pandas()["decision_time"].to_numpy()
    return reqs, its, summary
