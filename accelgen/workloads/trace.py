"""The trace file: one row per request, Parquet (and CSV on request).

Columns, in this order (docs/workloads.md explains each):

    req_id int64 (0..n-1 in arrival order), arrival float64 (s, non-decreasing), source str,
    prompt_len, prompt_len_natural int64, prompt_truncated bool,
    output_len (capped), output_len_natural int64, output_capped bool,
    ttft_slo, tbt_slo, jct_slo float64 (s; +inf where a request has no such SLO), online bool,
    predicted_output_len int64 (S_g: the source's mean capped output, never the request's own)

The Parquet file's schema metadata key ``accelgen.trace`` holds JSON with the tokenizer, the seed,
the workload config and generation statistics. Writes are atomic (temporary file in the same
directory, then ``os.replace``) and byte-identical for the same inputs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from accelgen.core.request import Request
from accelgen.workloads.errors import WorkloadError, where

META_KEY = b"accelgen.trace"
FORMAT = "accelgen-trace/1"
INT, FLOAT, BOOL, STR = pa.int64(), pa.float64(), pa.bool_(), pa.string()
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("req_id", INT),
    ("arrival", FLOAT),
    ("source", STR),
    ("prompt_len", INT),
    ("prompt_len_natural", INT),
    ("prompt_truncated", BOOL),
    ("output_len", INT),
    ("output_len_natural", INT),
    ("output_capped", BOOL),
    ("ttft_slo", FLOAT),
    ("tbt_slo", FLOAT),
    ("jct_slo", FLOAT),
    ("online", BOOL),
    ("predicted_output_len", INT),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def to_table(df: pd.DataFrame, meta: dict[str, Any]) -> pa.Table:
    arrays = [pa.array(np.asarray(df[name]) if typ != STR else df[name].astype(str).tolist(),
                       type=typ) for name, typ in COLUMNS]
    # sort_keys + fixed separators: the metadata bytes depend only on the content.
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    schema = pa.schema(list(COLUMNS), metadata={META_KEY: blob.encode()})
    return pa.Table.from_arrays(arrays, schema=schema)


def write_trace(df: pd.DataFrame, meta: dict[str, Any], path: Path | str,
                csv: bool = False) -> list[Path]:
    """Write ``path`` (Parquet) and, with ``csv``, the same rows as ``path`` with ``.csv``."""
    path = Path(path)
    table = to_table(df, meta)  # validates types before anything touches the disk
    written = [path]
    _atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    if csv:
        csv_path = path.with_suffix(".csv")
        _atomic(csv_path, lambda tmp: df.loc[:, list(COLUMN_NAMES)].to_csv(tmp, index=False))
        written.append(csv_path)
    return written


def read_trace_metadata(path: Path | str) -> dict[str, Any]:
    """The ``accelgen.trace`` metadata of a Parquet trace ({} for CSV)."""
    path = Path(path)
    if path.suffix == ".csv":
        return {}
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[META_KEY]) if META_KEY in meta else {}


# --------------------------------------------------------------------------------------------
# loading and validation


def _fail(path: Path, row: int | None, col: str, msg: str) -> WorkloadError:
    return WorkloadError(f"{where(path, None if row is None else f'row {row}', col)}: {msg}")


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if len(idx) else None


def _column(path: Path, df: pd.DataFrame, name: str, typ: pa.DataType) -> np.ndarray:
    raw = df[name]
    if typ == STR:
        bad = _first(raw.isna().to_numpy())
        if bad is not None:
            raise _fail(path, bad, name, "missing value")
        return raw.astype(str).to_numpy()
    if typ == BOOL:
        if raw.dtype == bool:
            return raw.to_numpy()
        mapped = raw.astype(str).str.strip().str.lower().map(
            {"true": True, "false": False, "1": True, "0": False})
        bad = _first(mapped.isna().to_numpy())
        if bad is not None:
            raise _fail(path, bad, name, f"not a boolean: {raw.iloc[bad]!r}")
        return mapped.to_numpy(bool)
    values = pd.to_numeric(raw, errors="coerce").to_numpy(float)
    bad = _first(np.isnan(values))
    if bad is not None:
        raise _fail(path, bad, name, f"not a number: {raw.iloc[bad]!r}")
    if typ == INT:
        bad = _first(~np.isfinite(values) | (values != np.floor(values)))
        if bad is not None:
            raise _fail(path, bad, name, f"not an integer: {raw.iloc[bad]!r}")
        return values.astype(np.int64)
    return values


def validate_trace(df: pd.DataFrame, path: Path | str = "<trace>") -> pd.DataFrame:
    """Check the schema and the invariants; return a frame with exact dtypes and column order."""
    path = Path(path)
    missing = [name for name in COLUMN_NAMES if name not in df.columns]
    if missing:
        raise _fail(path, None, missing[0], f"missing column (needs {', '.join(COLUMN_NAMES)})")
    cols = {name: _column(path, df, name, typ) for name, typ in COLUMNS}
    n = len(df)

    def check(mask: np.ndarray, col: str, msg: str) -> None:
        bad = _first(mask)
        if bad is not None:
            raise _fail(path, bad, col, f"{msg} (got {cols[col][bad]!r})")

    check(cols["req_id"] != np.arange(n), "req_id", "ids must be 0..n-1 in row order")
    arrival = cols["arrival"]
    check(~np.isfinite(arrival) | (arrival < 0), "arrival", "must be finite and >= 0")
    check(np.concatenate([[False], np.diff(arrival) < 0]), "arrival", "must be non-decreasing")
    for col in ("prompt_len", "prompt_len_natural", "output_len", "output_len_natural",
                "predicted_output_len"):
        check(cols[col] < 1, col, "must be >= 1")
    check(cols["prompt_len"] > cols["prompt_len_natural"], "prompt_len",
          "exceeds prompt_len_natural")
    check(cols["prompt_truncated"] != (cols["prompt_len"] < cols["prompt_len_natural"]),
          "prompt_truncated", "disagrees with prompt_len < prompt_len_natural")
    check(cols["output_len"] > cols["output_len_natural"], "output_len",
          "exceeds output_len_natural")
    check(cols["output_capped"] != (cols["output_len"] < cols["output_len_natural"]),
          "output_capped", "disagrees with output_len < output_len_natural")
    online = cols["online"]
    for col in ("ttft_slo", "tbt_slo"):
        v = cols[col]
        check(~(v > 0), col, "must be > 0")
        check(online & ~np.isfinite(v), col, "online requests need a finite SLO")
    jct = cols["jct_slo"]
    check(~(np.isfinite(jct) & (jct > 0)), "jct_slo", "must be finite and > 0")
    out = pd.DataFrame(cols, columns=list(COLUMN_NAMES))
    return out


def load_trace(path: Path | str) -> pd.DataFrame:
    """Read and validate a trace (``.parquet`` or ``.csv``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    try:
        df = pd.read_csv(path) if path.suffix == ".csv" else pq.read_table(path).to_pandas()
    except (pa.ArrowInvalid, pd.errors.ParserError, pd.errors.EmptyDataError,
            UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: not a readable trace file: {exc}") from None
    return validate_trace(df, path)


def to_requests(df: pd.DataFrame) -> tuple[list[Request], np.ndarray]:
    """Requests for a simulator or engine run, and the true output lengths *separately* (only the
    simulator's bookkeeping and the Oracle may see those)."""
    reqs = [
        Request(req_id=int(r.req_id), arrival=float(r.arrival), prompt_len=int(r.prompt_len),
                source=str(r.source), ttft_slo=float(r.ttft_slo), tbt_slo=float(r.tbt_slo),
                jct_slo=float(r.jct_slo), online=bool(r.online),
                predicted_output_len=int(r.predicted_output_len))
        for r in df.itertuples(index=False)
    ]
    return reqs, df["output_len"].to_numpy(np.int64).copy()
