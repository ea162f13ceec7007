"""The plugin's logs in a directory, kept current while an engine serves (``log_dir``).

A server's scheduler lives in vLLM's engine-core process, which the user cannot reach; its
per-request and per-step records are only useful if they reach disk. ``LogSink`` writes
``requests.parquet``, ``iterations.parquet`` and ``timing.parquet`` (the simulator's schemas,
``accelgen.results``) into ``log_dir``:

- every ``interval_s`` while anything changed (a background thread, so an idle engine's last
  records are written too): a crash or ``SIGKILL`` loses at most that interval;
- soon after the engine runs out of requests in flight (``poke``), at most once a second;
- at shutdown (``close``), after the last step.

Each file is written to a temporary file in ``log_dir`` and renamed over the old one, so a
reader that opens it once never sees a half-written file (``read_log``; the three files are each
consistent, and after a crash between two renames they may be one flush apart). Requests still
in flight are written with status ``unfinished``.

The work per flush is incremental: the source (the scheduler) hands over only the requests that
ended and the steps logged since the previous flush, as data frames built while it holds its
lock (the only time the engine waits for the sink); the sink converts them to Arrow tables,
keeps them, and concatenates them for each write, in the background thread, outside that lock
(Parquet encoding and writing also mostly without the GIL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger("vllm.accelgen")

FILES = ("requests", "iterations", "timing")
# Shortest gap between two writes (s): a server going idle after every request must not rewrite
# the whole log for each one.
MIN_GAP_S = 1.0
# Why a request is written as unfinished: vLLM finished it with FINISHED_ABORTED, or it was
# still in flight.
ABORTED_REASON = "aborted by vLLM (the client went away, or the server shut down)"
IN_FLIGHT_REASON = "in flight when the log was written"
# The plugin ended it: still in flight when the shutdown grace period (``shutdown_grace_s``
# after SIGTERM) was over.
SHUTDOWN_REASON = "unfinished at shutdown (still in flight when the grace period ended)"
# Chunks kept per file before they are merged into one (Arrow concatenation is zero-copy, but
# many small chunks make small Parquet pages).
MAX_CHUNKS = 64


@dataclass(slots=True)
class LogDelta:
    """What changed since the previous delta."""

    ended_requests: pd.DataFrame  # requests that ended (finished, rejected, unfinished)
    in_flight: pd.DataFrame  # every request still in flight (replaces the previous ones)
    iterations: pd.DataFrame  # new iteration rows
    timing: pd.DataFrame  # new timing rows


class LogSource(Protocol):
    """What the sink needs from a scheduler."""

    def log_delta(self) -> LogDelta | None:
        """Records added since the previous call (None: nothing changed); called under
        ``log_lock``."""
        ...


def _table(df: pd.DataFrame) -> pa.Table:
    # No pandas metadata: chunks from different flushes must concatenate (their pandas
    # metadata differ, e.g. in the info_ columns present).
    return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)


def _concat(tables: list[pa.Table]) -> pa.Table:
    # permissive: a chunk may lack a column (a step without the policy's info) or hold only
    # null-typed ones (no request in it has a token yet).
    return pa.concat_tables(tables, promote_options="permissive")


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` as Parquet at ``path`` via a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_log(path: Path | str) -> pd.DataFrame:
    """One log file as written at one moment. The file is opened once: pyarrow (and pandas)
    given a path open it twice (metadata, then data), which can pair two versions of a file
    the server is rewriting."""
    with open(path, "rb") as f:
        return pq.read_table(f).to_pandas()


def read_logs(log_dir: Path | str) -> dict[str, pd.DataFrame]:
    """``{"requests": ..., "iterations": ..., "timing": ...}`` of a log directory."""
    return {name: read_log(Path(log_dir) / f"{name}.parquet") for name in FILES}


class LogSink:
    """Keeps ``out_dir`` up to date with a ``LogSource``'s records (see the module docstring)."""

    def __init__(self, out_dir: Path | str, source: LogSource, lock: threading.RLock,
                 interval_s: float = 10.0) -> None:
        self.out_dir = Path(out_dir)
        self.source = source
        self.lock = lock  # the source's: held while its records are read
        self.interval_s = interval_s
        self._chunks: dict[str, list[pa.Table]] = {name: [] for name in FILES}
        self._in_flight: pa.Table | None = None
        self._write_lock = threading.Lock()  # one write at a time (thread or close)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_write = 0.0
        self._reset_pending = False
        self.writes = 0
        self._failed = False

    # -- engine side ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background writer (once; later calls do nothing)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="accelgen-log-sink",
                                            daemon=True)
            self._thread.start()

    def poke(self) -> None:
        """Write soon (the engine has no request in flight: its records are complete)."""
        self._wake.set()

    def reset(self) -> None:
        """Forget what was collected (the source cleared its records); call under the source's
        lock. (Only flags it: the writer may be converting an earlier delta outside that lock.)"""
        self._reset_pending = True

    def close(self) -> None:
        """Stop the background thread and write the final state."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()

    # -- writing -------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Collect the source's changes and rewrite the files; False if nothing changed."""
        with self._write_lock:
            with self.lock:  # the engine waits only while the source builds its delta
                delta = self.source.log_delta()
                reset, self._reset_pending = self._reset_pending, False
            if reset:
                self._chunks = {name: [] for name in FILES}
                self._in_flight = None
            if delta is None and not reset:
                return False
            if delta is not None:
                self._collect(delta)
            tables = self._tables()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for name, table in tables.items():
                write_atomic(table, self.out_dir / f"{name}.parquet")
            self._last_write = time.monotonic()
            self.writes += 1
            return True

    def _collect(self, delta: LogDelta) -> None:
        for name, df in (("requests", delta.ended_requests), ("iterations", delta.iterations),
                         ("timing", delta.timing)):
            if len(df) or not self._chunks[name]:
                chunks = self._chunks[name]
                chunks.append(_table(df))
                if len(chunks) > MAX_CHUNKS:
                    self._chunks[name] = [_concat(chunks).combine_chunks()]
        self._in_flight = _table(delta.in_flight) if len(delta.in_flight) else None

    def _tables(self) -> dict[str, pa.Table]:
        out = {name: _concat(chunks) for name, chunks in self._chunks.items()}
        if self._in_flight is not None:
            out["requests"] = _concat([out["requests"], self._in_flight])
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            gap = MIN_GAP_S - (time.monotonic() - self._last_write)
            if gap > 0 and self._stop.wait(gap):
                break
            try:
                self.flush()
                self._failed = False
            except Exception:  # never let logging take the engine down
                if not self._failed:
                    logger.exception("accelgen: could not write the scheduler logs to %s",
                                     self.out_dir)
                self._failed = True
