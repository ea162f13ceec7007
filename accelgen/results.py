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

import contextlib
import json
import math
import os
import shutil
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from accelgen.core.iteration import BatchShape
from accelgen.core.policy import InfoRow
from accelgen.core.request import Request, Status

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
    """Append-only iteration log, compact enough for a 17 M-iteration run: rows are appended as
    tuples (cheap in the simulator's hot loop), or as columns for a run of decode iterations
    (``append_columns``, ``append_block``: most rows of a run below capacity), and every
    ``CHUNK_ROWS`` rows are moved into typed numpy columns, stored in segments of
    ``SEGMENT_ROWS`` rows; the policy's diagnostics go into one float column per name (NaN where
    a row lacks it). ``to_frame`` gives the table the rows make (names, order, dtypes).

    Integer columns are stored in the narrowest of int8/16/32/64 that holds every value so far
    (a column is widened, all its segments, when a value does not fit): batch sizes, block and
    queue counts take 1-4 bytes instead of 8, which is most of a 17 M-row log (Orca on the paper
    trace). Float columns are stored in float32 while every value so far is one exactly (a swap
    time of zero, most prefill pair counts), else in float64; the diagnostics, most of
    AccelGen's and the Oracle's logs (21-25 a row), in the narrowest of int8/16/32 while every
    value is a whole number (counts, flags, budgets), else float32 or float64 the same way. ``to_frame`` gives
    int64 and float64 columns, or with ``narrow=True`` the stored ones (the simulator's results:
    ``write_results`` writes them as int64 and float64, the same values).

    Why segments of 8 MB: each is its own memory mapping, so the ones ``to_frame`` joins (column
    by column) go back to the system at once; small arrays would leave their memory in the
    allocator's heap and the peak would hold the log twice. The first segment holds only
    ``CHUNK_ROWS`` rows, and a joined column is exactly its rows, so a short run's log costs what
    its rows do (a few hundred iterations must not hold 8 MB a column)."""

    CHUNK_ROWS = 1 << 16
    SEGMENT_ROWS = 1 << 20
    # Fewer rows given as columns go in as tuples: a block costs about what a dozen tuple rows do
    # (its diagnostics, the columns of the tuple rows before it), and an overloaded run's decode
    # runs are a few steps each.
    MIN_BLOCK_ROWS = 16

    __slots__ = ("_block_rows", "_blocks", "_capacity", "_cols", "_dtypes", "_fast_index",
                 "_fast_rows", "_info", "_info_cols", "_info_dtypes", "_num_stored", "_rows",
                 "decision_time")

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []  # the rows not yet stored in the columns
        # Per ITERATION_COLUMNS entry: its segments (the same lengths in every column; the
        # last one partly filled). ``_capacity``: their total length, ``_num_stored``: rows.
        self._cols: list[list[np.ndarray]] = [[] for _ in ITERATION_COLUMNS]
        # The stored type of each column: the narrowest integer type so far, float32 or float64.
        self._dtypes: list[np.dtype[Any]] = [
            np.dtype(np.float32 if dt is np.float64 else np.int8) for dt in _ITERATION_DTYPES]
        self._capacity = 0
        self._num_stored = 0
        # Diagnostics by name, in first-seen order: the values of the rows not yet stored, and
        # segments aligned with ``_cols``.
        self._info: dict[str, array[float]] = {}
        self._info_cols: dict[str, list[np.ndarray]] = {}
        self._info_dtypes: dict[str, np.dtype[Any]] = {}
        # Rows of ``InfoRow``s with exactly the logged names (``_fast_index``), kept as their
        # value arrays until they are spread over the columns (``_spread``): a policy logs a
        # couple of dozen diagnostics every iteration.
        self._fast_index: dict[str, int] | None = None
        self._fast_rows: list[Any] = []
        # Rows not yet stored that came before ``_rows``, in order: tuple rows with their
        # diagnostics, and rows given as columns (``append_block``, which puts the tuple rows
        # before it here first); stored all together (``_store_blocks``).
        self._blocks: list[_Rows | _Columns] = []
        self._block_rows = 0
        self.decision_time: array[float] = array("d")

    def __len__(self) -> int:
        return self._num_stored + self._block_rows + len(self._rows)

    def append(self, start: float, latency: float, shape: BatchShape, batch_size: int,
               kv_used_blocks: int, kv_total_blocks: int, kv_used_tokens: int,
               decision_time: float, num_preempted: int, num_waiting: int, num_running: int,
               num_swapped: int, swap_time: float, info: MutableMapping[str, float]) -> None:
        rows = self._rows
        rows.append((
            start, latency, shape.prefill_tokens + shape.decode_seqs, shape.prefill_tokens,
            shape.decode_seqs, shape.prefill_seqs, batch_size, shape.prefill_attn,
            shape.decode_ctx, kv_used_blocks, kv_total_blocks, kv_used_tokens, num_preempted,
            num_waiting, num_running, num_swapped, swap_time))
        self.decision_time.append(decision_time)
        # (``_append_info``'s fast path inline: most rows repeat the last row's InfoRow names)
        if (type(info) is InfoRow and info._extra is None
                and info._index is self._fast_index):
            self._fast_rows.append(info._values)
        else:
            self._append_info(info, len(rows))
        if len(rows) >= self.CHUNK_ROWS:
            self._store()

    def append_rows(self, rows: Sequence[tuple[Any, ...]],
                    info: MutableMapping[str, float]) -> None:
        """``append`` of rows already in column order (what ``append`` builds from its
        arguments), each with no decision time and the diagnostics ``info``: the same log, for
        the simulator's runs of decode iterations."""
        done = 0
        while done < len(rows):
            part = rows[done:done + self.CHUNK_ROWS - len(self._rows)]
            done += len(part)
            base = len(self._rows)
            self._rows.extend(part)
            self.decision_time.frombytes(bytes(8 * len(part)))  # 0.0 each
            for i in range(len(part)):
                if (type(info) is InfoRow and info._extra is None
                        and info._index is self._fast_index):
                    self._fast_rows.extend(repeat(info._values, len(part) - i))
                    break
                self._append_info(info, base + i + 1)
            if len(self._rows) >= self.CHUNK_ROWS:
                self._store()

    def append_rows_each(self, rows: Sequence[tuple[Any, ...]], decision_times: Sequence[float],
                         infos: Sequence[MutableMapping[str, float]]) -> None:
        """``append`` of rows already in column order, each with its decision time and
        diagnostics: the same log, for the simulator's runs of decode iterations whose
        policy is asked at every one."""
        done = 0
        while done < len(rows):
            end = min(len(rows), done + self.CHUNK_ROWS - len(self._rows))
            base = len(self._rows)
            self._rows.extend(rows[done:end])
            self.decision_time.extend(decision_times[done:end])
            fast, index = self._fast_rows, self._fast_index
            for i in range(done, end):
                info = infos[i]
                if type(info) is InfoRow and info._extra is None and info._index is index:
                    fast.append(info._values)
                else:
                    self._append_info(info, base + i - done + 1)
                    fast, index = self._fast_rows, self._fast_index
            done = end
            if len(self._rows) >= self.CHUNK_ROWS:
                self._store()

    def append_rows_block(self, rows: Sequence[tuple[Any, ...]], decision_times: Sequence[float],
                          info_index: dict[str, int], info_values: np.ndarray) -> None:
        """``append_rows_each`` of rows whose diagnostics are the rows of ``info_values``,
        named by ``info_index`` (``InfoRow(info_index, info_values[i])`` each): a run of decode
        steps a policy decided in one call."""
        if info_index is not self._fast_index:  # (the first row sets the names up)
            self.append_rows_each(rows[:1], decision_times[:1],
                                  [InfoRow(info_index, info_values[0])])
            rows, decision_times, info_values = rows[1:], decision_times[1:], info_values[1:]
            if info_index is not self._fast_index:
                self.append_rows_each(rows, decision_times,
                                      [InfoRow(info_index, v) for v in info_values])
                return
        done = 0
        while done < len(rows):
            end = min(len(rows), done + self.CHUNK_ROWS - len(self._rows))
            self._rows.extend(rows[done:end])
            self.decision_time.extend(decision_times[done:end])
            self._fast_rows.extend(info_values[done:end])
            done = end
            if len(self._rows) >= self.CHUNK_ROWS:
                self._store()

    def append_columns(self, columns: Sequence[np.ndarray | float], num_rows: int,
                       info: MutableMapping[str, float]) -> None:
        """``append_rows`` of rows given as columns (``ITERATION_COLUMNS`` order, each an array
        of ``num_rows`` values or one value for every row): the same log, without a tuple per
        row (the simulator's runs of decode iterations are most of a long run's rows)."""
        if type(info) is InfoRow and info._extra is None:
            values = np.asarray(info._values, dtype=np.float64)
            self.append_block(columns, num_rows, 0.0, info._index,
                              np.broadcast_to(values, (num_rows, len(values))))
        elif (num_rows >= self.MIN_BLOCK_ROWS and len(info) == len(self._info)
              and all(key in self._info for key in info)):
            # (a dict with the log's names: the baselines' decisions, and none at all)
            index = {key: i for i, key in enumerate(info)}
            values = np.array(list(info.values()), dtype=np.float64)
            self.append_block(columns, num_rows, 0.0, index,
                              np.broadcast_to(values, (num_rows, len(values))), names_checked=True)
        else:
            self.append_rows(_as_rows(columns, num_rows), info)

    def append_block(self, columns: Sequence[np.ndarray | float], num_rows: int,
                     decision_time: float, info_index: dict[str, int],
                     info_values: np.ndarray, names_checked: bool = False) -> None:
        """``append_rows_block`` of rows given as columns (as ``append_columns`` takes them),
        each with the decision time ``decision_time``: stored at once where the diagnostics
        have the log's names (``info_index`` is the one of the last rows with all of them, or
        ``names_checked``), else row by row, which sets the names up."""
        if not num_rows:
            return
        if num_rows < self.MIN_BLOCK_ROWS or (info_index is not self._fast_index
                                              and not names_checked):
            self.append_rows_block(_as_rows(columns, num_rows), [decision_time] * num_rows,
                                   info_index, info_values)
            return
        self._block_the_rows()  # (the rows before these)
        self.decision_time.frombytes(np.full(num_rows, decision_time).tobytes())
        self._blocks.append(_Columns(num_rows, columns, info_index, info_values))
        self._block_rows += num_rows
        if self._block_rows >= self.CHUNK_ROWS:
            self._store_blocks()

    def _append_info(self, info: MutableMapping[str, float], num_rows: int) -> None:
        """Add one row's diagnostics; ``num_rows``: rows not yet stored, this one too."""
        row_index = None  # an InfoRow's names, for the rows after it
        if type(info) is InfoRow:
            if info._extra is None:
                if info._index is self._fast_index:
                    self._fast_rows.append(info._values)
                    return
                row_index = info._index
            info = info.as_dict()
        self._spread()
        cols = self._info
        complete = len(info) == len(cols)
        for key, value in info.items():
            col = cols.get(key)
            if col is None:  # a name first seen now: NaN in every earlier row
                self._store_blocks()  # (the rows given as columns lack it)
                col = cols[key] = array("d", _NAN_ROW) * (num_rows - 1)
                self._info_cols[key] = [np.full(len(seg), math.nan, np.float32)
                                        for seg in self._cols[0]]
                # (a name first seen after the first rows: NaN before, so float from the start)
                self._info_dtypes[key] = np.dtype(np.float32 if num_rows > 1 or self._cols[0]
                                                  else np.int8)
                complete = False
            col.append(value)
        if not complete:  # some names are missing from this row
            for col in cols.values():
                if len(col) < num_rows:
                    col.append(math.nan)
        # The next rows with this row's names, in the same index, take the fast path.
        self._fast_index = row_index if row_index is not None and len(info) == len(cols) else None

    def _spread(self) -> None:
        """The kept ``InfoRow`` values into the diagnostics' columns."""
        if not self._fast_rows:
            return
        index = self._fast_index
        assert index is not None
        block = np.array(self._fast_rows, dtype=np.float64)
        for key, i in index.items():
            self._info[key].frombytes(block[:, i].tobytes())
        self._fast_rows = []

    def _store(self) -> None:
        """Move the rows not yet stored (and their diagnostics) into the column segments."""
        self._block_the_rows()
        self._store_blocks()

    def _block_the_rows(self) -> None:
        """The tuple rows (and their diagnostics) into one more block."""
        rows = self._rows
        if not rows:
            return
        if self._fast_rows and len(self._fast_rows) == len(rows):
            # (every row's diagnostics kept as its InfoRow's values: kept so, not spread)
            assert self._fast_index is not None
            self._blocks.append(_Rows(len(rows), rows, fast_index=self._fast_index,
                                      fast_rows=self._fast_rows))
            self._fast_rows = []
        else:
            self._spread()
            self._blocks.append(_Rows(len(rows), rows, infos=self._info))
            self._info = {key: array("d") for key in self._info}
        self._block_rows += len(rows)
        self._rows = []

    def _store_blocks(self) -> None:
        """The blocks into the column segments, all at once: the tuple rows of every block
        converted together, the blocks of columns joined column by column (a run's blocks are
        a few to a few hundred rows each; per block, a numpy call a column would cost more
        than the rows)."""
        blocks = self._blocks
        if not blocks:
            return
        k = self._block_rows
        keys = list(self._info_cols)  # (every block has every name the log has)
        self._blocks = []
        self._block_rows = 0
        by_rows = [b for b in blocks if isinstance(b, _Rows)]
        by_columns = [b for b in blocks if isinstance(b, _Columns)]
        if not by_columns:  # (tuple rows only: most policies' logs)
            info = _rows_info(by_rows, keys)
            self._store_columns(_rows_columns(by_rows),
                                {key: info[j] for j, key in enumerate(keys)}, k)
            return
        # Where each kind of block's rows go among the ``k``.
        from_rows = np.repeat(np.array([isinstance(b, _Rows) for b in blocks]),
                              [b.num_rows for b in blocks])
        row_at, column_at = np.flatnonzero(from_rows), np.flatnonzero(~from_rows)
        lengths = [b.num_rows for b in by_columns]
        columns = [np.empty(k, dt) for dt in _ITERATION_DTYPES]
        info = np.empty((len(keys), k))
        if by_rows:
            for col, values in zip(columns, _rows_columns(by_rows), strict=True):
                col[row_at] = values
            info[:, row_at] = _rows_info(by_rows, keys)
        for j, col in enumerate(columns):
            parts = [b.columns[j] for b in by_columns]
            arrays = sum(isinstance(v, np.ndarray) for v in parts)
            if not arrays:
                col[column_at] = np.repeat(np.array(parts, dtype=col.dtype), lengths)
            else:
                col[column_at] = np.concatenate(
                    parts if arrays == len(parts) else
                    [v if isinstance(v, np.ndarray) else np.full(n, v, col.dtype)
                     for v, n in zip(parts, lengths, strict=True)])
        if keys:
            orders: dict[int, list[int]] = {}  # id(names) -> their positions in ``keys``
            parts = []
            for b in by_columns:
                order = orders.get(id(b.info_index))
                if order is None:
                    order = orders[id(b.info_index)] = [b.info_index[key] for key in keys]
                parts.append(b.info_values.T[order])
            info[:, column_at] = np.concatenate(parts, axis=1)
        self._store_columns(columns, {key: info[j] for j, key in enumerate(keys)}, k)

    def _store_columns(self, columns: list[np.ndarray], infos: dict[str, np.ndarray],
                       k: int) -> None:
        """Append ``k`` rows, given as one array per column and per diagnostic (every name the
        log has), to the column segments."""
        # Widen a column (every stored segment) whose type cannot hold the new values exactly.
        for j, values in enumerate(columns):
            dt = _column_type(self._dtypes[j], values)
            if dt != self._dtypes[j]:
                self._dtypes[j], self._cols[j] = dt, [seg.astype(dt) for seg in self._cols[j]]
        for key, info_values in infos.items():
            dt = _info_type(self._info_dtypes[key], info_values)
            if dt != self._info_dtypes[key]:
                self._info_dtypes[key] = dt
                self._info_cols[key] = [seg.astype(dt) for seg in self._info_cols[key]]
        done = 0
        while done < k:
            if self._num_stored == self._capacity:
                size = self.SEGMENT_ROWS if self._capacity else self.CHUNK_ROWS
                for segs, dt in zip(self._cols, self._dtypes, strict=True):
                    segs.append(np.empty(size, dtype=dt))
                for key, segs in self._info_cols.items():
                    dt = self._info_dtypes[key]
                    segs.append(np.full(size, math.nan, dt) if dt.kind == "f"
                                else np.zeros(size, dt))
                self._capacity += size
            last = len(self._cols[0][-1])
            off = self._num_stored - (self._capacity - last)
            take = min(k - done, last - off)
            for segs, values in zip(self._cols, columns, strict=True):
                segs[-1][off:off + take] = values[done:done + take]
            for key, values in infos.items():
                self._info_cols[key][-1][off:off + take] = values[done:done + take]
            done += take
            self._num_stored += take

    def _join(self) -> None:
        """Every row stored, each column in one array of exactly its rows (kept: a second
        ``to_frame``, e.g. of a log flushed while a server runs, copies nothing again)."""
        self._store()
        n = self._num_stored
        for segments in (*self._cols, *self._info_cols.values()):
            if len(segments) == 1 and len(segments[0]) == n:
                continue
            parts = segments[:-1]
            parts.append(segments[-1][:len(segments[-1]) - (self._capacity - n)])
            # A view of a partly filled segment would keep all of it: copy the rows.
            joined = parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
            segments[:] = [joined]  # the segments are freed here, column by column
        self._capacity = n

    def row(self, index: int) -> tuple[Any, ...]:
        """One logged row (``ITERATION_COLUMNS`` order, without the diagnostics)."""
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"iteration {index} not in a log of {n}")
        pending = i - self._num_stored - self._block_rows
        if pending >= 0:
            return self._rows[pending]
        self._store_blocks()
        s = 0
        while i >= len(self._cols[0][s]):
            i -= len(self._cols[0][s])
            s += 1
        return tuple(segs[s][i].item() for segs in self._cols)

    def to_frame(self, start: int = 0, *, narrow: bool = False) -> pd.DataFrame:
        """The rows from ``start`` on. The whole log (``start`` 0) shares the log's arrays (with
        ``narrow``: every column; else the float ones, the integer ones converted to int64); a
        later start (a server's log sink writing what is new) copies only those rows and leaves
        the segments as they are, so each flush costs its own rows, not the log's length."""
        if len(self) <= start:
            return pd.DataFrame.from_records([], columns=list(ITERATION_COLUMNS))
        if start:
            self._store()
            cols = [self._rows_from(segs, start) for segs in self._cols]
            infos = {key: self._rows_from(segs, start) for key, segs in self._info_cols.items()}
        else:
            self._join()
            cols = [segs[0] for segs in self._cols]
            infos = {key: segs[0] for key, segs in self._info_cols.items()}
        if not narrow:
            cols = [c.astype(dt, copy=False) for c, dt in zip(cols, _ITERATION_DTYPES, strict=True)]
            infos = {key: values.astype(np.float64, copy=False) for key, values in infos.items()}
        data: dict[str, Any] = dict(zip(ITERATION_COLUMNS, cols, strict=True))
        for key, values in infos.items():
            data[f"info_{key}"] = values
        # copy=False: the frame shares the arrays (pandas copy-on-write protects both).
        return pd.DataFrame(data, copy=False)

    def _rows_from(self, segments: list[np.ndarray], start: int) -> np.ndarray:
        """Stored rows ``start..`` of one column (only the last segment is partly filled)."""
        parts, offset, last = [], 0, len(segments) - 1
        for i, seg in enumerate(segments):
            length = len(seg) - (self._capacity - self._num_stored) if i == last else len(seg)
            if offset + length > start:
                parts.append(seg[max(start - offset, 0):length])
            offset += length
        return np.concatenate(parts)

    def timing_frame(self) -> pd.DataFrame:
        # One copy of the times: the frame takes the array (a dict's arrays are copied again
        # by default, 135 MB more at once on a 17 M-iteration run).
        times = np.array(self.decision_time, dtype=np.float64)
        return pd.DataFrame({"decision_time": times}, copy=False)


_NAN_ROW = (math.nan,)
_FLOAT_COLUMNS = frozenset({"start", "latency", "prefill_attn", "swap_time"})


class _Rows(NamedTuple):
    """Rows of the log not yet stored, as tuples, with their diagnostics (every name the log
    has): a column per name (``infos``), or each row's InfoRow values (``fast_rows``, named by
    ``fast_index``)."""

    num_rows: int
    rows: list[tuple[Any, ...]]
    infos: Mapping[str, array[float]] | None = None
    fast_index: dict[str, int] | None = None
    fast_rows: list[Any] | None = None


class _Columns(NamedTuple):
    """Rows of the log not yet stored, as columns (``ITERATION_COLUMNS`` order, each an array
    or one value for every row), with a row of diagnostics each (``info_values``, its columns
    named by ``info_index``: every name the log has)."""

    num_rows: int
    columns: Sequence[np.ndarray | float]
    info_index: dict[str, int]
    info_values: np.ndarray


def _rows_columns(blocks: list[_Rows]) -> list[np.ndarray]:
    """The tuple rows of ``blocks``, in order, as one array per column (int64 or float64)."""
    rows = blocks[0].rows if len(blocks) == 1 else list(chain.from_iterable(b.rows for b in blocks))
    return [np.array(c, dtype=dt)
            for c, dt in zip(zip(*rows, strict=True), _ITERATION_DTYPES, strict=True)]


def _rows_info(blocks: list[_Rows], keys: list[str]) -> np.ndarray:
    """The diagnostics of ``blocks``' rows, in order, as an array of a row per name of
    ``keys``: consecutive blocks of InfoRow values with the same names converted together."""
    parts: list[np.ndarray] = []
    run: list[Any] = []  # (InfoRow values with ``run_index``'s names)
    run_index: dict[str, int] | None = None
    for b in [*blocks, None]:
        if b is not None and b.fast_rows is not None and b.fast_index is run_index:
            run.extend(b.fast_rows)
            continue
        if run_index is not None:
            # (an InfoRow's values may run past its names: AccelGen's rows have spare slots)
            parts.append(np.array(run, dtype=np.float64).T[[run_index[key] for key in keys]])
        run, run_index = [], None
        if b is None:
            break
        if b.fast_rows is not None:
            run, run_index = list(b.fast_rows), b.fast_index
        else:
            assert b.infos is not None
            parts.append(np.array([np.frombuffer(b.infos[key]) for key in keys],
                                  dtype=np.float64).reshape(len(keys), b.num_rows))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def _as_rows(columns: Sequence[np.ndarray | float], num_rows: int) -> list[tuple[Any, ...]]:
    """Rows (tuples of Python values) of columns as ``IterationLog.append_columns`` takes them."""
    return list(zip(*(c.tolist() if isinstance(c, np.ndarray) else repeat(c, num_rows)
                      for c in columns), strict=True))


_ITERATION_DTYPES = tuple(np.float64 if c in _FLOAT_COLUMNS else np.int64
                          for c in ITERATION_COLUMNS)
_INT_TYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def _int_holding(dt: np.dtype[Any], values: np.ndarray, types: tuple[np.dtype[Any], ...]
                 ) -> np.dtype[Any] | None:
    """The narrowest of ``types``, at least as wide as ``dt``, that holds every (whole) value;
    None if none does."""
    lo, hi = (values.min().item(), values.max().item()) if values.size else (0, 0)
    for t in types:
        lim = np.iinfo(cast(Any, t))
        if t.itemsize >= dt.itemsize and lim.min <= lo and hi <= lim.max:
            return t
    return None


def _exact_float32(values: np.ndarray) -> bool:
    """Whether every float64 value is a float32 exactly (NaN too)."""
    return bool(np.array_equal(values.astype(np.float32).astype(np.float64), values,
                               equal_nan=True))


def _float_type(dt: np.dtype[Any], values: np.ndarray) -> np.dtype[Any]:
    """float32 while it and every value so far is one exactly, else float64."""
    return _FLOAT32 if dt == _FLOAT32 and _exact_float32(values) else _FLOAT64


def _column_type(dt: np.dtype[Any], values: np.ndarray) -> np.dtype[Any]:
    """The type an iteration column stored as ``dt`` needs to also hold ``values`` exactly."""
    if dt.kind == "i":
        return _int_holding(dt, values, _INT_TYPES) or _INT_TYPES[-1]
    return _float_type(dt, values)


def _info_type(dt: np.dtype[Any], values: np.ndarray) -> np.dtype[Any]:
    """The type a diagnostic stored as ``dt`` needs to also hold ``values`` exactly: the
    narrowest of int8/16/32 while every value is a whole number (most are counts and flags),
    else float32 while every value is one exactly (from int32 only if the stored ones are too),
    else float64. Never narrower than ``dt``."""
    if dt.kind == "i":
        if bool(np.all(np.isfinite(values))) and bool(np.all(values == np.round(values))):
            return _int_holding(dt, values, _INT_TYPES[:3]) or _FLOAT64
        if dt.itemsize > 2:  # int32 values may not all be float32s
            return _FLOAT64
        dt = _FLOAT32
    return _float_type(dt, values)


# Rows per row group of a written parquet file: pyarrow's default (``write_table`` without
# ``row_group_size``), which ``_write_iterations`` must reproduce to write the same bytes.
ROW_GROUP_ROWS = 1 << 20


# The ``status`` column: ``finished``, ``cut`` or ``rejected`` (the last two with their reason in
# ``reject_reason``); logs written while requests are in flight show ``waiting``/``running``.
_STATUS_NAMES = {s: s.name.lower() for s in Status}


def requests_frame(requests: Iterable[Request], output_len: np.ndarray | Mapping[int, int], *,
                   share_token_times: bool = False) -> pd.DataFrame:
    """One row per request (``REQUEST_COLUMNS``); ``output_len[req_id]`` is the output length the
    request was to emit (its served length: the trace's, stopped at max_model_len).

    ``share_token_times``: each row's ``token_times`` is a view of the request's own array, not
    a copy (a finished simulation: 17 M token times are not held twice). Only for requests that
    emit no more tokens: an array shared with a live view cannot grow (``BufferError``)."""
    rows: list[tuple[Any, ...]] = []
    as_array = _shared_times if share_token_times else _copied_times
    for r in requests:
        rows.append((
            r.req_id, r.arrival, r.source, r.online, r.prompt_len, int(output_len[r.req_id]),
            r.ttft_slo, r.tbt_slo, r.jct_slo,
            _STATUS_NAMES[r.status],
            r.reject_reason, r.num_output_tokens, r.first_scheduled_time, r.first_token_time,
            r.finish_time, r.num_preemptions,
            # A float64 array per request (a list of Python floats costs 4x the memory); an
            # empty one as [], so a column with no tokens at all keeps its list<null> type.
            as_array(r.token_times) if len(r.token_times) else []))
    return pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))


def _copied_times(times: Any) -> np.ndarray:
    return np.array(times, dtype=np.float64)


def _shared_times(times: array[float]) -> np.ndarray:
    return np.frombuffer(times, dtype=np.float64)


def outcome_counts(summary: dict[str, Any]) -> str:
    """How the run's requests ended, for a command's closing line, e.g. ``200 requests: 197
    finished, 2 cut at max_model_len, 1 rejected``."""
    text = (f"{summary['num_requests']} requests: {summary['num_finished']} finished, "
            f"{summary['num_cut']} cut at max_model_len, {summary['num_rejected']} rejected")
    if summary.get("num_unfinished"):
        text += f", {summary['num_unfinished']} unfinished"
    return text


def _table(df: pd.DataFrame) -> pa.Table:
    """``df`` as the table ``from_pandas`` gives. A ``token_times`` column of float64 arrays
    (``requests_frame``) is built from its values in one array and their offsets:
    ``from_pandas`` would grow its own copy of 17 M values (a paper-size run) to twice their
    size and hold both, and its allocator keeps the memory after the table is gone."""
    lists = _float_lists(df["token_times"]) if "token_times" in df.columns else None
    if lists is None:
        return pa.Table.from_pandas(df, preserve_index=False)
    first, offsets, values = lists
    # The schema and its pandas metadata: what ``from_pandas`` gives for one row with times.
    schema = pa.Table.from_pandas(df.iloc[[first]], preserve_index=False).schema
    rest = pa.Table.from_pandas(df.drop(columns="token_times"), preserve_index=False)
    columns = list(rest.columns)
    at = df.columns.get_loc("token_times")
    if not isinstance(at, int) or rest.schema.types != [*schema.types[:at], *schema.types[at + 1:]]:
        return pa.Table.from_pandas(df, preserve_index=False)
    columns.insert(at, pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(values, from_pandas=True)))  # (NaN as null, as there)
    return pa.Table.from_arrays(columns, schema=schema)


def _float_lists(column: pd.Series) -> tuple[int, np.ndarray, np.ndarray] | None:
    """A column of 1-d float64 arrays (an empty one may be ``[]``) as its first row with
    values, the offsets (int32, as a list column's) and the values; None for any other column
    (``from_pandas`` decides its type), one without values (its type is list<null>) or one with
    more values than 32-bit offsets hold."""
    entries = column.tolist()
    sizes = np.zeros(len(entries) + 1, dtype=np.int64)
    for i, times in enumerate(entries):
        if isinstance(times, np.ndarray):
            if times.dtype != np.float64 or times.ndim != 1:
                return None
        elif not (isinstance(times, list) and not times):
            return None
        sizes[i + 1] = len(times)
    offsets = np.cumsum(sizes)
    if not len(entries) or offsets[-1] == 0 or offsets[-1] > np.iinfo(np.int32).max:
        return None
    first = int(np.flatnonzero(sizes)[0]) - 1
    values = np.concatenate([times for times in entries if len(times)])
    return first, offsets.astype(np.int32), values


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


# Stored column types that ``_write_iterations`` widens (to float64 for a diagnostic or a float
# column, else to int64).
_NARROW_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.float32))


def _wide_type(column: str, dt: np.dtype[Any]) -> type:
    return np.float64 if column.startswith("info_") or dt.kind == "f" else np.int64


def _write_iterations(iterations: pd.DataFrame, path: Path) -> None:
    """Write the iteration table with its integer columns as int64 and its float columns as
    float64: the file ``write_table`` gives for that table. Narrower columns
    (``IterationLog.to_frame(narrow=True)``) are converted one row group at a time, column by
    column, so a 17 M-row log is never held wide whole (nor as a second table)."""
    narrow: dict[Any, Any] = {c: _wide_type(str(c), dt) for c, dt in iterations.dtypes.items()
                              if dt in _NARROW_TYPES}
    if not narrow or not len(iterations):
        pq.write_table(_table(iterations.astype(narrow)), path)
        return
    schema = _table(iterations.iloc[:0].astype(narrow)).schema  # names, types, pandas metadata
    columns = [(iterations[c].to_numpy(), narrow.get(c)) for c in iterations.columns]
    with pq.ParquetWriter(path, schema) as writer:
        for a in range(0, len(iterations), ROW_GROUP_ROWS):
            # (no name holds a row group's arrays: they go when it is written, not while the
            # next one is built)
            writer.write_table(pa.Table.from_arrays(
                [pa.array(values[a:a + ROW_GROUP_ROWS] if wide is None
                          else values[a:a + ROW_GROUP_ROWS].astype(wide), from_pandas=True)
                 for values, wide in columns], schema=schema))


def write_results(out_dir: Path | str, requests: pd.DataFrame, iterations: pd.DataFrame,
                  summary: dict[str, Any], config: dict[str, Any],
                  timing: pd.DataFrame | None = None,
                  timing_summary: dict[str, Any] | None = None) -> Path:
    """Write a results directory atomically: all files appear together or none do."""
    with _atomic_dir(out_dir) as tmp:
        pq.write_table(_table(requests), tmp / "requests.parquet")
        # Arrow's allocator keeps what the writer of a 17 M-value column freed (~150 MB on the
        # paper trace) for its next allocations; numpy's (the iteration table's) cannot use it.
        pa.default_memory_pool().release_unused()
        _write_iterations(iterations, tmp / "iterations.parquet")
        (tmp / "summary.json").write_text(dumps(summary))
        (tmp / "config.json").write_text(dumps(config))
        if timing is not None:
            pq.write_table(_table(timing), tmp / "timing.parquet")
        if timing_summary is not None:
            (tmp / "timing.json").write_text(dumps(timing_summary))
    return Path(out_dir)


@contextlib.contextmanager
def _atomic_dir(out_dir: Path | str) -> Iterator[Path]:
    """A scratch directory beside ``out_dir`` to write into; it replaces ``out_dir`` when the
    block ends, or is removed when the block raises (no half-written results directory)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


@dataclass(slots=True)
class StoredRun:
    """A run already in a results directory (``src``): its summary and config read back, its
    tables left in their files. ``write`` copies those files byte for byte beside the summary
    and config as they are now (a run reused under another name, e.g. the Oracle's floor)."""

    src: Path
    summary: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def read(cls, src: Path | str) -> StoredRun:
        src = Path(src)
        try:
            return cls(src, json.loads((src / "summary.json").read_text()),
                       json.loads((src / "config.json").read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{src}: not a readable results directory ({exc})") from None

    def write(self, out_dir: Path | str) -> Path:
        """Write the results directory (atomically, as ``write_results`` does)."""
        with _atomic_dir(out_dir) as tmp:
            for name in ("requests.parquet", "iterations.parquet", "timing.parquet",
                         "timing.json"):
                if (self.src / name).exists() or name.startswith(("requests", "iterations")):
                    shutil.copyfile(self.src / name, tmp / name)
            (tmp / "summary.json").write_text(dumps(self.summary))
            (tmp / "config.json").write_text(dumps(self.config))
        return Path(out_dir)


def read_results(out_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    out = Path(out_dir)
    reqs = pq.read_table(out / "requests.parquet").to_pandas()
    its = pq.read_table(out / "iterations.parquet").to_pandas()
    summary = json.loads((out / "summary.json").read_text())
    timing = out / "timing.parquet"
    if timing.exists():
        its["decision_time"] = pq.read_table(timing).to_pandas()["decision_time"].to_numpy()
    return reqs, its, summary
