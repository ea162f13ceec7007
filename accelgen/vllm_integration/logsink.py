"""The plugin's logs in a directory, kept current while an engine serves (``log_dir``).

A server's scheduler lives in vLLM's engine-core process, which the user cannot reach; its
per-request and per-step records are only useful if they reach disk. ``LogSink`` writes
``requests.parquet``, ``iterations.parquet`` and ``timing.parquet`` (the simulator's schemas,
``accelgen.results``) into ``log_dir``:

- every ``interval_s`` while anything changed (a background thread, so an idle engine's last
  records are written too): a crash or ``SIGKILL`` loses at most that interval;
- soon after the engine runs out of requests in flight (``poke``), at most once a second;
- at shutdown (``close``), after the last step.

While the engine serves, each write adds parts to ``log_dir/parts/``: the rows that are new
since the previous write (``<name>-<write>-<write>.parquet``: the requests that ended, the steps
logged) and the requests still in flight (``requests-inflight-<write>.parquet``, status
``unfinished``; it replaces the previous write's). Each part is written to a temporary file and
renamed, and a reader takes the parts up to the newest in-flight file (``read_log``), so it
never sees a half-written write. Parts are merged as they accumulate (``MERGE_PARTS`` of one
size into one, ``<name>-<first write>-<last write>.parquet``, written before the parts it holds
are removed, which readers then skip), so a long-running server's folder holds a few dozen.
``close`` joins the parts of each file into ``<name>.parquet`` (one part in memory at a time,
via a temporary file and a rename) and removes them; the parts and the joined file hold the same
rows, in the same order, with the same columns.

The work per write is incremental, and so is the memory: the source (the scheduler) hands over
only the requests that ended and the steps logged since the previous write, as data frames built
while it holds its lock (the only time the engine waits for the sink), and a server's scheduler
then forgets them (``AdapterConfig.keep_logged_records``); the sink converts them to Arrow and
writes them in the background thread, outside that lock, and keeps nothing of them. Memory
follows the flush interval, not the length of the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
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
# The parts written while the engine serves (see the module docstring).
PARTS_DIR = "parts"
IN_FLIGHT_PART = "inflight"
# Shortest gap between two writes (s): a server going idle after every request must not write
# a part for each one.
MIN_GAP_S = 1.0
# Why a request is written as unfinished: vLLM finished it with FINISHED_ABORTED, or it was
# still in flight.
ABORTED_REASON = "aborted by vLLM (the client went away, or the server shut down)"
IN_FLIGHT_REASON = "in flight when the log was written"
# The plugin ended it: still in flight when the shutdown grace period (``shutdown_grace_s``
# after SIGTERM) was over.
SHUTDOWN_REASON = "unfinished at shutdown (still in flight when the grace period ended)"
# Row parts merged into one once this many of the same size (in writes merged) are the newest:
# a file has at most about MERGE_PARTS parts per size, sizes grow by this factor, and every row
# is rewritten once per size (a long-running server's folder holds a few dozen parts, not one
# per write).
MERGE_PARTS = 16
# Times a reader lists the parts again when a write or the final join removed one it listed.
READ_TRIES = 20


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
    # No pandas metadata: parts from different writes must concatenate (their pandas metadata
    # differ, e.g. in the info_ columns present).
    return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)


def _concat(tables: list[pa.Table]) -> pa.Table:
    # permissive: a part may lack a column (a step without the policy's info) or hold only
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


def _part_name(name: str, first: int, last: int | None = None) -> str:
    """A row part holding writes ``first..last`` (one write: ``first``), or the in-flight part
    of write ``first`` (``last`` None)."""
    if last is None:
        return f"{name}-{IN_FLIGHT_PART}-{first:06d}.parquet"
    return f"{name}-{first:06d}-{last:06d}.parquet"


def _listed_parts(log_dir: Path, name: str) -> tuple[list[Path], Path | None] | None:
    """The parts of one file as one write left them: the row parts in write order up to the
    newest in-flight part, and that part (None if the file has none); None: no parts (the
    joined file, if any, is the log)."""
    parts_dir = log_dir / PARTS_DIR
    try:
        names = os.listdir(parts_dir)
    except FileNotFoundError:
        return None
    rows = re.compile(rf"{re.escape(name)}-(\d+)-(\d+)\.parquet")
    flying = re.compile(rf"{re.escape(name)}-{IN_FLIGHT_PART}-(\d+)\.parquet")
    found: list[tuple[int, int, str]] = []
    in_flight: tuple[int, str] | None = None
    for n in names:
        if m := rows.fullmatch(n):
            found.append((int(m.group(1)), int(m.group(2)), n))
        elif (m := flying.fullmatch(n)) and (in_flight is None or int(m.group(1)) > in_flight[0]):
            in_flight = (int(m.group(1)), n)
    if not found and in_flight is None:
        return None
    if in_flight is not None:
        # Row parts newer than the newest in-flight part belong to a write still under way.
        found = [f for f in found if f[1] <= in_flight[0]]
    # A merged part is written before the parts it holds are removed: those are skipped.
    found.sort(key=lambda f: (f[0], -f[1]))
    kept: list[tuple[int, int, str]] = []
    for f in found:
        if kept and f[1] <= kept[-1][1]:
            continue
        kept.append(f)
    return ([parts_dir / n for _, _, n in kept],
            parts_dir / in_flight[1] if in_flight is not None else None)


def _read_table(path: Path) -> pa.Table:
    # Opened once: pyarrow (and pandas) given a path open it twice (metadata, then data), which
    # can pair two versions of a file the server is replacing.
    with open(path, "rb") as f:
        return pq.read_table(f)


def _read_parts(parts: list[Path], in_flight: Path | None) -> pa.Table:
    tables = [_read_table(p) for p in parts]
    if in_flight is not None:
        flying = _read_table(in_flight)
        if flying.num_rows or not tables:
            tables.append(flying)
    return _concat(tables)


def has_log(path: Path | str) -> bool:
    """Whether ``read_log(path)`` finds a log: the joined file, or parts of it."""
    path = Path(path)
    return path.exists() or _listed_parts(path.parent, path.name.removesuffix(".parquet")) \
        is not None


def read_log(path: Path | str) -> pd.DataFrame:
    """One log file (``<log_dir>/<name>.parquet``) as one write left it: while the engine serves
    (or after a crash), its parts; after the shutdown, the joined file. Every file is opened
    once (see ``_read_table``)."""
    path = Path(path)
    name = path.name.removesuffix(".parquet")
    for _ in range(READ_TRIES):
        listed = _listed_parts(path.parent, name)
        try:
            if listed is None:
                return _read_table(path).to_pandas()
            return _read_parts(*listed).to_pandas()
        except FileNotFoundError:
            # A later write replaced the in-flight part, or the final join removed the parts
            # (after writing the joined file): list again.
            if listed is None:
                raise
    raise RuntimeError(f"{path}: its parts kept changing while read ({READ_TRIES} tries)")


def read_logs(log_dir: Path | str) -> dict[str, pd.DataFrame]:
    """``{"requests": ..., "iterations": ..., "timing": ...}`` of a log directory."""
    return {name: read_log(Path(log_dir) / f"{name}.parquet") for name in FILES}


def join_parts(log_dir: Path, name: str) -> bool:
    """Write ``<log_dir>/<name>.parquet`` from its parts (one part in memory at a time; the
    columns of every part, as ``read_log`` concatenates them); False if it has none."""
    listed = _listed_parts(log_dir, name)
    if listed is None:
        return False
    parts, in_flight = listed
    files = list(parts)
    if in_flight is not None and (pq.read_metadata(in_flight).num_rows or not files):
        files.append(in_flight)
    _write_joined(files, log_dir / f"{name}.parquet")
    return True


def _write_joined(files: list[Path], path: Path) -> None:
    """The rows of ``files``, in order, as one Parquet file at ``path`` (via a temporary file
    and a rename), with the columns ``read_log`` gives them; one file in memory at a time."""
    schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    empty = schema.empty_table()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for f in files:
                table = _read_table(f)
                if table.num_rows:
                    # The part's columns promoted to the joint schema (missing ones null).
                    writer.write_table(_concat([empty, table]))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def remove_parts(log_dir: Path) -> None:
    """Remove the parts of every file. The folder is first renamed, so that a reader finds
    either all of a write's parts or none (then the joined files)."""
    parts_dir = log_dir / PARTS_DIR
    gone = log_dir / f".{PARTS_DIR}.{os.getpid()}.{threading.get_ident()}.removed"
    try:
        os.replace(parts_dir, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


class LogSink:
    """Keeps ``out_dir`` up to date with a ``LogSource``'s records (see the module docstring)."""

    def __init__(self, out_dir: Path | str, source: LogSource, lock: threading.RLock,
                 interval_s: float = 10.0) -> None:
        self.out_dir = Path(out_dir)
        self.source = source
        self.lock = lock  # the source's: held while its records are read
        self.interval_s = interval_s
        self._write_lock = threading.Lock()  # one write at a time (thread or close)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_write = 0.0
        self._reset_pending = False
        self._fresh = True  # nothing written yet: a previous run's files are still there
        # Per file, its row parts since the start (or reset), oldest first: (first write, last
        # write, how many single-write parts it holds); one write's in-flight part.
        self._parts: dict[str, list[tuple[int, int, int]]] = {name: [] for name in FILES}
        self.merge_parts = MERGE_PARTS
        self._in_flight: Path | None = None  # the newest in-flight part
        self._closed = False
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
        """Forget what was written (the source cleared its records); call under the source's
        lock. (Only flags it: the writer may be writing an earlier delta outside that lock.)"""
        self._reset_pending = True

    def close(self) -> None:
        """Stop the background thread, write the final state and join the parts into one file
        each (a closed sink writes nothing more)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._write_lock:
            if self._closed:
                return
            self._flush()
            self._closed = True
            for name in FILES:
                join_parts(self.out_dir, name)
            # (After every file is joined: a reader finds either the parts or the files.)
            remove_parts(self.out_dir)

    # -- writing -------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Collect the source's changes and write them as parts; False if nothing changed."""
        with self._write_lock:
            return False if self._closed else self._flush()

    def _flush(self) -> bool:
        with self.lock:  # the engine waits only while the source builds its delta
            delta = self.source.log_delta()
            reset, self._reset_pending = self._reset_pending, False
        if self._fresh or reset:
            # A previous run's (or the time before the reset's) parts and files go.
            remove_parts(self.out_dir)
            if self._fresh:
                for name in FILES:
                    with contextlib.suppress(FileNotFoundError):
                        (self.out_dir / f"{name}.parquet").unlink()
            self._fresh = False
            self._parts = {name: [] for name in FILES}
            self._in_flight = None
        if delta is None:
            return False
        write = self.writes + 1
        parts_dir = self.out_dir / PARTS_DIR
        parts_dir.mkdir(parents=True, exist_ok=True)
        frames = {"requests": delta.ended_requests, "iterations": delta.iterations,
                  "timing": delta.timing}
        for name, df in frames.items():
            if len(df) or not self._parts[name]:
                write_atomic(_table(df), parts_dir / _part_name(name, write, write))
                self._parts[name].append((write, write, 1))
        # The in-flight part last: it marks the write complete for readers (``_listed_parts``).
        path = parts_dir / _part_name("requests", write)
        write_atomic(_table(delta.in_flight), path)
        if self._in_flight is not None:
            with contextlib.suppress(FileNotFoundError):
                self._in_flight.unlink()
        self._in_flight = path
        self._last_write = time.monotonic()
        self.writes = write
        for name in FILES:
            self._merge(parts_dir, name)
        return True

    def _merge(self, parts_dir: Path, name: str) -> None:
        """While the newest ``merge_parts`` row parts of ``name`` hold as many writes each,
        merge them into one (written before they are removed: ``_listed_parts`` skips them)."""
        parts, k = self._parts[name], self.merge_parts
        while len(parts) >= k and len({size for _, _, size in parts[-k:]}) == 1:
            group = parts[-k:]
            first, last = group[0][0], group[-1][1]
            files = [parts_dir / _part_name(name, a, b) for a, b, _ in group]
            _write_joined(files, parts_dir / _part_name(name, first, last))
            for f in files:
                f.unlink()
            parts[-k:] = [(first, last, k * group[0][2])]

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
