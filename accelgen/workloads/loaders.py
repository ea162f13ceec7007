"""Readers for the public workload formats, each into arrays of token lengths.

Formats (exactly as published):

- Alpaca ``alpaca_data.json``: a JSON list of ``{instruction, input, output}``; prompt =
  instruction, plus a blank line and the input when the input is not empty; output = output.
- ShareGPT ``ShareGPT_V3_unfiltered_cleaned_split.json``: a JSON list of ``{id, conversations:
  [{from, value}, ...]}``; prompt = first turn, output = second turn (as vLLM's
  benchmark_serving). Conversations with fewer than two turns are not requests; they are counted.
- BookCorpus: text rows (a local text file: one row per line; a parquet file or the online
  dataset: the ``text`` column).
- Vidur / Sarathi-Serve length CSV: ``num_prefill_tokens,num_decode_tokens[,arrived_at]``; other
  columns are ignored.
- Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps (ISO dates
  or plain seconds) become seconds relative to the first row.

Malformed input raises :class:`WorkloadError` naming file, record (JSON index or CSV line) and
field. Text records whose prompt or output is empty (or whitespace only) are skipped and counted,
because real ShareGPT dumps contain them and they are not requests; CSV lengths must be positive
integers, since a zero there is a data error.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accelgen.workloads.errors import WorkloadError, where
from accelgen.workloads.tokenizer import Tokenizer


@dataclass
class Records:
    """Per-record natural lengths of a dataset that carries its own prompts and outputs."""

    origin: str
    prompt_len: np.ndarray  # int64
    output_len: np.ndarray  # int64, natural (before any cap)
    timestamps: np.ndarray | None = None  # float64 seconds from the first record
    tokenizer: str | None = None  # None: the lengths came from the file
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompt_len)


@dataclass
class TextRows:
    """Token counts of consecutive text rows (BookCorpus)."""

    origin: str
    counts: np.ndarray  # int64 tokens of " " + row (rows are joined with spaces)
    special_tokens: int  # tokens the tokenizer adds in front of a prompt (OPT's BOS)
    tokenizer: str
    skipped: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# sources of raw records: local JSON files or Hugging Face datasets


def read_json_list(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"workload file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: byte {exc.start}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: line {exc.lineno} column {exc.colno}: not valid JSON: "
                            f"{exc.msg}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: top level must be a JSON list of records, "
                            f"got {type(data).__name__}")
    return data


def hf_rows(name: str, split: str, data_files: str | None, limit: int | None) -> list[Any]:
    """Rows of a Hugging Face dataset (streamed, so only ``limit`` rows are fetched)."""
    try:
        import datasets  # optional: pip install 'accelgen[online]'
    except ImportError:
        raise WorkloadError(f"hf_dataset '{name}' needs the 'datasets' package (pip install "
                            "'accelgen[online]'); offline, give a local path instead") from None
    kwargs: dict[str, Any] = {"split": split, "streaming": True}
    if data_files is not None:
        kwargs["data_files"] = data_files
    try:
        ds = datasets.load_dataset(name, **kwargs)
        return list(itertools.islice(ds, limit) if limit else ds)
    except Exception as exc:  # network, auth, missing dataset: all mean "cannot load"
        raise WorkloadError(f"hf:{name}: could not load the dataset (offline or unknown "
                            f"name?): {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------------
# record validation helpers


def _obj(origin: str, i: int, rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise WorkloadError(f"{origin}: record {i}: expected a JSON object, "
                            f"got {type(rec).__name__}")
    return rec


def _text(origin: str, i: int, rec: dict[str, Any], key: str, label: str | None = None) -> str:
    name = label or key
    if key not in rec:
        raise WorkloadError(f"{where(origin, f'record {i}', name)}: missing")
    value = rec[key]
    if not isinstance(value, str):
        raise WorkloadError(f"{where(origin, f'record {i}', name)}: expected a string, "
                            f"got {type(value).__name__} {value!r:.40}")
    return value


def _tokenize(origin: str, prompts: list[str], outputs: list[str], tok: Tokenizer,
              skipped: dict[str, int]) -> Records:
    keep = [bool(p.strip()) and bool(o.strip()) for p, o in zip(prompts, outputs, strict=True)]
    n_empty = keep.count(False)
    if n_empty:
        skipped["empty_prompt_or_output"] = n_empty
    prompts = [p for p, k in zip(prompts, keep, strict=True) if k]
    outputs = [o for o, k in zip(outputs, keep, strict=True) if k]
    if not prompts:
        raise WorkloadError(f"{origin}: no usable records (skipped: {skipped})")
    return Records(origin, tok.count_batch(prompts, special=True),
                   tok.count_batch(outputs, special=False), None, tok.name, skipped)


# --------------------------------------------------------------------------------------------
# formats


def parse_alpaca(rows: Sequence[Any], origin: str, tok: Tokenizer) -> Records:
    prompts, outputs = [], []
    for i, raw in enumerate(rows):
        rec = _obj(origin, i, raw)
        instruction = _text(origin, i, rec, "instruction")
        extra = _text(origin, i, rec, "input")
        outputs.append(_text(origin, i, rec, "output"))
        prompts.append(f"{instruction}\n\n{extra}" if extra else instruction)
    return _tokenize(origin, prompts, outputs, tok, {})


def parse_sharegpt(rows: Sequence[Any], origin: str, tok: Tokenizer) -> Records:
    prompts, outputs = [], []
    short = 0
    for i, raw in enumerate(rows):
        rec = _obj(origin, i, raw)
        if "conversations" not in rec:
            raise WorkloadError(f"{where(origin, f'record {i}', 'conversations')}: missing")
        conv = rec["conversations"]
        if not isinstance(conv, list):
            raise WorkloadError(f"{where(origin, f'record {i}', 'conversations')}: expected a "
                                f"list of turns, got {type(conv).__name__}")
        if len(conv) < 2:
            short += 1  # not a request: nothing to answer
            continue
        texts = []
        for t in (0, 1):
            turn = conv[t]
            label = f"conversations[{t}].value"
            if not isinstance(turn, dict):
                raise WorkloadError(f"{where(origin, f'record {i}', f'conversations[{t}]')}: "
                                    f"expected an object, got {type(turn).__name__}")
            texts.append(_text(origin, i, turn, "value", label))
        prompts.append(texts[0])
        outputs.append(texts[1])
    skipped = {"conversations_under_2_turns": short} if short else {}
    return _tokenize(origin, prompts, outputs, tok, skipped)


def parse_text_rows(rows: Sequence[Any], origin: str, tok: Tokenizer,
                    column: str | None = None) -> TextRows:
    texts: list[str] = []
    blank = 0
    for i, raw in enumerate(rows):
        if column is not None:
            rec = _obj(origin, i, raw)
            raw = _text(origin, i, rec, column)
        if not raw.strip():
            blank += 1
            continue
        texts.append(" " + raw.strip())
    if not texts:
        raise WorkloadError(f"{origin}: no non-blank text rows")
    special = int(tok.count_batch([""], special=True)[0])
    return TextRows(origin, tok.count_batch(texts, special=False), special, tok.name,
                    {"blank_rows": blank} if blank else {})


def load_alpaca(path: Path, tok: Tokenizer, limit: int | None = None) -> Records:
    return parse_alpaca(read_json_list(path)[:limit], str(path), tok)


def load_sharegpt(path: Path, tok: Tokenizer, limit: int | None = None) -> Records:
    return parse_sharegpt(read_json_list(path)[:limit], str(path), tok)


def load_text_rows(path: Path, tok: Tokenizer, limit: int | None = None) -> TextRows:
    """BookCorpus rows: a text file (one row per line) or a parquet file with a ``text`` column
    (the Hugging Face dataset's parquet shards, as ``accelgen download`` fetches them)."""
    if Path(path).suffix == ".parquet":
        return parse_text_rows(read_parquet_text(Path(path), limit), str(path), tok)
    try:
        with path.open(encoding="utf-8") as fh:
            lines = [line.rstrip("\r\n") for line in itertools.islice(fh, limit)]
    except FileNotFoundError:
        raise FileNotFoundError(f"workload file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return parse_text_rows(lines, str(path), tok)


def read_parquet_text(path: Path, limit: int | None = None, column: str = "text") -> list[str]:
    """The first ``limit`` values of a parquet file's string column, read batch by batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"workload file not found: {path}") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise WorkloadError(f"{path}: not a parquet file: {exc}") from None
    names = pf.schema_arrow.names
    if column not in names:
        raise WorkloadError(f"{where(path, 'schema', column)}: missing column (have "
                            f"{', '.join(names)})")
    if not pa.types.is_string(pf.schema_arrow.field(column).type) and \
            not pa.types.is_large_string(pf.schema_arrow.field(column).type):
        raise WorkloadError(f"{where(path, 'schema', column)}: expected strings, got "
                            f"{pf.schema_arrow.field(column).type}")
    out: list[str] = []
    for batch in pf.iter_batches(columns=[column], batch_size=65536):
        values = batch.column(0).to_pylist()
        for i, v in enumerate(values):
            if v is None:
                raise WorkloadError(f"{where(path, f'row {len(out) + i}', column)}: null")
        out += values
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


# --------------------------------------------------------------------------------------------
# CSV formats


def _read_csv(path: Path, required: Sequence[str], limit: int | None) -> pd.DataFrame:
    try:
        # Read as text: numeric checks below report the offending line and value themselves.
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True,
                         nrows=limit)
    except FileNotFoundError:
        raise FileNotFoundError(f"workload file not found: {path}") from None
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"{path}: empty file (expected a header with "
                            f"{', '.join(required)})") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: not valid CSV: {exc}") from None
    df.columns = [str(c).strip() for c in df.columns]
    for col in required:
        if col not in df.columns:
            raise WorkloadError(f"{where(path, 'header', col)}: missing column "
                                f"(have {', '.join(df.columns)})")
    if df.empty:
        raise WorkloadError(f"{path}: no data rows")
    return df


def _line(i: int, header_lines: int = 1) -> str:
    return f"line {i + 1 + header_lines}"  # 1-based file line of data row i


def _lengths(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
    for i in np.flatnonzero(~np.isfinite(values)):
        raise WorkloadError(f"{where(path, _line(int(i)), col)}: not a number: {df[col].iloc[i]!r}")
    for i in np.flatnonzero(values != np.floor(values)):
        raise WorkloadError(f"{where(path, _line(int(i)), col)}: not an integer: {values[i]}")
    for i in np.flatnonzero(values <= 0):
        raise WorkloadError(f"{where(path, _line(int(i)), col)}: token count must be positive, "
                            f"got {int(values[i])}")
    return values.astype(np.int64)


def _check_monotonic(path: Path, col: str, t: np.ndarray, header_lines: int = 1) -> np.ndarray:
    for i in np.flatnonzero(np.diff(t) < 0):
        loc = where(path, _line(int(i) + 1, header_lines), col)
        raise WorkloadError(f"{loc}: timestamps must be non-decreasing (this record is at "
                            f"{t[i + 1]:.6f} s, the previous one at {t[i]:.6f} s, both relative "
                            "to the first record)")
    return t - t[0]


def load_vidur_csv(path: Path, limit: int | None = None) -> Records:
    df = _read_csv(path, ("num_prefill_tokens", "num_decode_tokens"), limit)
    prompt = _lengths(path, df, "num_prefill_tokens")
    output = _lengths(path, df, "num_decode_tokens")
    ts = None
    if "arrived_at" in df.columns:
        raw = pd.to_numeric(df["arrived_at"], errors="coerce").to_numpy(float)
        for i in np.flatnonzero(~np.isfinite(raw)):
            raise WorkloadError(f"{where(path, _line(int(i)), 'arrived_at')}: not a number: "
                                f"{df['arrived_at'].iloc[i]!r}")
        ts = _check_monotonic(path, "arrived_at", raw)
    return Records(str(path), prompt, output, ts, None, {})


def parse_timestamps(path: Path, col: str, values: pd.Series, header_lines: int = 1) -> np.ndarray:
    """Seconds from ISO dates (Azure's ``2023-11-16 18:15:46.6805900``) or from plain numbers."""
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.notna().all():
        t = numeric.to_numpy(float)
    else:
        stamps = pd.to_datetime(values, format="ISO8601", errors="coerce")
        for i in np.flatnonzero(stamps.isna().to_numpy()):
            loc = where(path, _line(int(i), header_lines), col)
            raise WorkloadError(f"{loc}: not a timestamp: {values.iloc[i]!r}")
        t = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(float)
    for i in np.flatnonzero(~np.isfinite(t)):
        loc = where(path, _line(int(i), header_lines), col)
        raise WorkloadError(f"{loc}: not a finite time")
    return _check_monotonic(path, col, t, header_lines)


def load_azure_csv(path: Path, limit: int | None = None) -> Records:
    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), limit)
    prompt = _lengths(path, df, "ContextTokens")
    output = _lengths(path, df, "GeneratedTokens")
    ts = parse_timestamps(path, "TIMESTAMP", df["TIMESTAMP"])
    return Records(str(path), prompt, output, ts, None, {})


def load_timestamps(path: Path) -> np.ndarray:
    """Replay timestamps: a CSV with ``arrived_at`` or ``TIMESTAMP``, or one number per line."""
    try:
        first = path.read_text(encoding="utf-8").split("\n", 1)[0].strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"timestamp file not found: {path}") from None
    header = [c.strip() for c in first.split(",")]
    for col in ("arrived_at", "TIMESTAMP"):
        if col in header:
            df = _read_csv(path, (col,), None)
            return parse_timestamps(path, col, df[col])
    # Headerless: one time per line (blank lines are not allowed: they would shift line numbers).
    lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    values = pd.Series([ln.strip() for ln in lines], dtype=str)
    return parse_timestamps(path, "timestamp", values, header_lines=0)
