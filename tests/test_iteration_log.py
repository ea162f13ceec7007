"""The compact iteration log gives the table its rows make (ITERATION_COLUMNS, then info_*)."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import example, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import BatchShape
from accelgen.core.policy import InfoRow
from accelgen.results import ITERATION_COLUMNS, IterationLog

_KEYS = ("token_budget", "n_candidates", "slo_min", "swap_in")


def _reference(rows: list[tuple], infos: list[dict]) -> pd.DataFrame:
    """The table built from the rows as records (what the log must reproduce)."""
    df = pd.DataFrame.from_records(rows, columns=list(ITERATION_COLUMNS))
    info = pd.DataFrame.from_records(infos)
    if len(info.columns):
        info.columns = [f"info_{c}" for c in info.columns]
        df = pd.concat([df, info.astype("float64")], axis=1)
    return df


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf)
    return buf.getvalue()


_ROW_ARGS = (99.0, 0.03, BatchShape(), 1, 0, 491, 0, 0.0, 0, 0, 1, 0, 0.0, {})
_ROW = (99.0, 0.03, 0, 0, 0, 0, 1, 0.0, 0, 0, 491, 0, 0, 0, 1, 0, 0.0)

_info = st.dictionaries(st.sampled_from(_KEYS),
                        st.one_of(st.integers(0, 4096), st.floats(-1e6, 1e6)), max_size=4)


def _as_info_rows(infos: list[dict], as_row: list[bool]) -> list[Any]:
    """Each diagnostics dict chosen by ``as_row`` as an ``InfoRow``, rows with the same names
    sharing one index (as a policy's decisions do: the log's fast path)."""
    indexes: dict[tuple[str, ...], dict[str, int]] = {}
    out: list[Any] = []
    for info, row in zip(infos, as_row, strict=False):
        if row:
            index = indexes.setdefault(tuple(info), {k: i for i, k in enumerate(info)})
            out.append(InfoRow(index, np.array(list(info.values()), dtype=np.float64)))
        else:
            out.append(info)
    return out + infos[len(out):]


@settings(max_examples=60, deadline=None)
@given(infos=st.lists(_info, min_size=1, max_size=40), chunk=st.integers(1, 7),
       segment=st.integers(1, 9), frame_at=st.integers(0, 40), start=st.integers(1, 45),
       as_row=st.lists(st.booleans(), max_size=40))
def test_log_matches_records(infos: list[dict], chunk: int, segment: int, frame_at: int,
                             start: int, as_row: list[bool]) -> None:
    log = type("Small", (IterationLog,), {"CHUNK_ROWS": chunk, "SEGMENT_ROWS": segment})()
    rows = []
    for i, info in enumerate(_as_info_rows(infos, as_row)):
        shape = BatchShape()
        shape.add_prefill(3 + i, i)
        shape.add_decode(100 + i)
        log.append(0.5 * i, 0.02 + i * 1e-3, shape, 2, i, 491, 7 * i, 1e-6, i % 2, 10 - i % 3, 4,
                   0, 0.0, info)
        rows.append((0.5 * i, 0.02 + i * 1e-3, shape.forward_size, shape.prefill_tokens,
                     shape.decode_seqs, shape.prefill_seqs, 2, shape.prefill_attn,
                     shape.decode_ctx, i, 491, 7 * i, i % 2, 10 - i % 3, 4, 0, 0.0))
        assert log.row(-1) == rows[-1]
        if i == frame_at:  # a frame in the middle (a server's flushed log) changes nothing
            pd.testing.assert_frame_equal(log.to_frame(), _reference(rows, infos[:i + 1]))
    assert log.row(0) == rows[0]
    assert [log.row(i) for i in range(len(rows))] == rows
    want = _reference(rows, infos)
    got = log.to_frame()
    pd.testing.assert_frame_equal(got, want)
    assert _parquet(got) == _parquet(want)
    assert _parquet(log.to_frame()) == _parquet(want)  # a second call gives the same table
    # The rows from `start` on (what a server's log sink writes at a flush): the same rows,
    # before and after the log was joined, and an empty table past the end.
    log.append(*_ROW_ARGS)
    rows.append(_ROW)
    want = _reference(rows, [*infos, {}])
    tail = want.iloc[start:].reset_index(drop=True)
    got = log.to_frame(start)
    if start < len(rows):
        pd.testing.assert_frame_equal(got, tail)
        assert _parquet(log.to_frame()) == _parquet(want)
        pd.testing.assert_frame_equal(log.to_frame(start), tail)
    else:
        assert got.empty and list(got.columns) == list(ITERATION_COLUMNS)


@settings(max_examples=30, deadline=None)
@given(kinds=st.lists(st.sampled_from(["full", "full", "full", "part", "dict", "new"]),
                      min_size=1, max_size=60), chunk=st.integers(1, 9))
def test_a_policys_info_rows_make_the_records_table(kinds: list[str], chunk: int) -> None:
    """Runs of InfoRows with every logged name (one index, as a policy's decisions share),
    between rows with fewer names, dicts and a row bringing a new name."""
    log = type("Small", (IterationLog,), {"CHUNK_ROWS": chunk, "SEGMENT_ROWS": 2 * chunk})()
    full = {"token_budget": 0, "n_candidates": 1, "slo_min": 2}
    part = {"n_candidates": 0}
    rows, infos = [], []
    for i, kind in enumerate(kinds):
        if kind == "full":
            info: Any = InfoRow(full, np.array([512.0 + i, float(i), 0.5 * i]))
        elif kind == "part":
            info = InfoRow(part, np.array([-float(i)]))
        elif kind == "dict":
            info = {"slo_min": 0.25 * i, "token_budget": 7.0}
        else:
            info = {f"extra_{i}": float(i)}
        infos.append(dict(info))
        log.append(0.5 * i, 0.01, BatchShape(), 1, i, 491, 0, 0.0, 0, 0, 1, 0, 0.0, info)
        rows.append((0.5 * i, 0.01, 0, 0, 0, 0, 1, 0.0, 0, i, 491, 0, 0, 0, 1, 0, 0.0))
        if i % 7 == 3:
            pd.testing.assert_frame_equal(log.to_frame(), _reference(rows, infos))
    pd.testing.assert_frame_equal(log.to_frame(), _reference(rows, infos))


def test_info_rows_and_growth_after_to_frame() -> None:
    log = IterationLog()
    index = {"token_budget": 0, "n_urgent": 1}
    log.append(0.0, 0.1, BatchShape(), 1, 1, 8, 1, 0.0, 0, 0, 1, 0, 0.0,
               InfoRow(index, np.array([512.0, 3.0])))
    first = log.to_frame()
    log.append(0.1, 0.1, BatchShape(), 1, 1, 8, 1, 0.0, 0, 0, 1, 0, 0.0, {"token_budget": 256})
    df = log.to_frame()
    assert list(first["info_n_urgent"]) == [3.0]
    assert df["info_token_budget"].tolist() == [512.0, 256.0]
    assert math.isnan(df["info_n_urgent"].iloc[1])
    assert len(log.timing_frame()) == 2


def test_empty_log() -> None:
    df = IterationLog().to_frame()
    assert list(df.columns) == list(ITERATION_COLUMNS) and not len(df)


def test_batch_builder_decision_sets_every_field() -> None:
    """``BatchBuilder`` builds its ``Decision`` without the generated ``__init__``: it must equal
    ``Decision()`` field by field (a field added later fails here until it is set there too)."""
    from dataclasses import fields

    from accelgen.core.kvcache import BlockManager
    from accelgen.core.policy import Decision
    from accelgen.policies.common import BatchBuilder

    fast = BatchBuilder(BlockManager(8, 16), 64).decision
    for f in fields(Decision):
        assert getattr(fast, f.name) == getattr(Decision(), f.name), f.name


def test_short_log_holds_only_its_rows() -> None:
    """A few hundred iterations must not hold a segment's megabytes per column once framed (a
    test that keeps the results of many runs, e.g. hypothesis's failing examples, ran out of
    memory that way)."""
    log = IterationLog()
    for i in range(300):
        log.append(*_ROW_ARGS[:-1], {"token_budget": i})
    df = log.to_frame()
    for name in df.columns:
        values = df[name].to_numpy()
        owner = values if values.base is None else values.base
        assert owner.nbytes == 300 * 8, name


# Integers around every boundary of int8/16/32 (and beyond): the stored columns must widen.
_ints = st.one_of(st.integers(-130, 130), st.integers(-40_000, 40_000),
                  st.integers(-(2**40), 2**40), st.sampled_from([127, 128, 32767, 32768,
                                                                 2**31 - 1, 2**31, -(2**31) - 1]))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.tuples(_ints, _ints, _ints, _ints), min_size=1, max_size=30),
       chunk=st.integers(1, 5), segment=st.integers(1, 7))
def test_narrow_columns_hold_every_value(values: list[tuple[int, int, int, int]], chunk: int,
                                         segment: int) -> None:
    """Integer columns are stored in the narrowest type that holds them, widened (with the
    segments already stored) when a larger value comes: the table, every row and the written
    file are the int64 ones."""
    from accelgen.results import _write_iterations

    log = type("Small", (IterationLog,), {"CHUNK_ROWS": chunk, "SEGMENT_ROWS": segment})()
    rows = []
    for i, (a, b, c, e) in enumerate(values):
        shape = BatchShape()
        shape.add_decode(a)
        log.append(0.5 * i, 0.01, shape, b, c, 491, e, 0.0, 0, i, 1, 0, 0.0, {"x": float(i)})
        rows.append((0.5 * i, 0.01, 1, 0, 1, 0, b, 0.0, a, c, 491, e, 0, i, 1, 0, 0.0))
    assert [log.row(i) for i in range(len(rows))] == rows
    want = _reference(rows, [{"x": float(i)} for i in range(len(rows))])
    pd.testing.assert_frame_equal(log.to_frame(), want)
    narrow = log.to_frame(narrow=True)
    for name in ITERATION_COLUMNS:
        got, ref = narrow[name].to_numpy(), want[name].to_numpy()
        assert (got == ref).all(), name
        if ref.dtype == np.int64:  # the narrowest integer type holding the column
            fits = [t for t in (np.int8, np.int16, np.int32, np.int64)
                    if np.iinfo(t).min <= ref.min() and ref.max() <= np.iinfo(t).max]
            assert got.dtype == fits[0], name
    buf = io.BytesIO()
    _write_iterations(narrow, buf)  # type: ignore[arg-type]
    assert buf.getvalue() == _parquet(want)


def test_narrow_columns_are_written_as_the_int64_file_across_row_groups() -> None:
    """More rows than a row group: written one row group at a time, converted to int64 there,
    the file is the one ``write_table`` gives for the int64 table in one piece (so the row
    groups are pyarrow's default size)."""
    from accelgen.results import ROW_GROUP_ROWS, _write_iterations

    n = ROW_GROUP_ROWS + 3
    rng = np.random.default_rng(0)
    small = rng.integers(0, 100, n)
    info = rng.uniform(0, 1, n)
    info[::7] = math.nan
    counts = rng.integers(0, 5000, n).astype(np.float64)
    counts[::5] = math.nan
    want = pd.DataFrame({"start": np.arange(n) * 0.5, "batch_size": small,
                         "num_waiting": rng.integers(-(2**40), 2**40, n), "info_x": info,
                         "info_n": counts})
    narrow = want.astype({"batch_size": np.int8, "info_n": np.float32})
    buf = io.BytesIO()
    _write_iterations(narrow, buf)  # type: ignore[arg-type]
    assert pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata.num_row_groups == 2
    assert buf.getvalue() == _parquet(want)


def test_exact_floats_are_stored_narrow_and_given_back_as_float64() -> None:
    """A zero swap time stays float32 in the log and a count-valued diagnostic int8; a value
    neither can hold widens its column (every segment); the frame gives the logged values."""
    log = type("Small", (IterationLog,), {"CHUNK_ROWS": 3, "SEGMENT_ROWS": 4})()
    values = [0.0, 1.0, 4096.0, 7.0, math.nan, 2.0, 0.1, 3.0]  # 0.1 is not a float32
    for i, v in enumerate(values):
        log.append(0.25 * i, 0.01, BatchShape(), 1, 0, 8, 0, 0.0, 0, 0, 1, 0, 0.0,
                   {"count": float(i), "mixed": v})
    narrow = log.to_frame(narrow=True)
    assert narrow["swap_time"].dtype == np.float32 and narrow["info_count"].dtype == np.int8
    assert narrow["info_mixed"].dtype == np.float64 and narrow["start"].dtype == np.float32
    wide = log.to_frame()
    assert all(wide[c].dtype == np.float64 for c in ("swap_time", "info_count", "start"))
    np.testing.assert_array_equal(wide["info_mixed"].to_numpy(), np.array(values))
    assert wide["info_count"].tolist() == [float(i) for i in range(len(values))]


@settings(max_examples=100, deadline=None)
# (a name first seen after a block)
@example(steps=[("row", 0), ("block", 2), ("new", 1)], chunk=9, frame_at=30, min_block=1)
@example(steps=[("none", 3), ("none", 2), ("row", 0), ("none", 1)], chunk=9, frame_at=30, min_block=1)
@example(steps=[("row", 0), ("all", 2), ("block", 2), ("all", 3)], chunk=9, frame_at=30, min_block=1)
@given(steps=st.lists(st.tuples(st.sampled_from(["row", "row", "columns", "block", "dict",
                                                 "part", "new", "none", "all"]),
                                 st.integers(0, 5)),
                      min_size=1, max_size=30),
       chunk=st.integers(1, 9), frame_at=st.integers(0, 30), min_block=st.integers(1, 4))
def test_rows_given_as_columns_make_the_same_table(steps: list[tuple[str, int]], chunk: int,
                                                   frame_at: int, min_block: int) -> None:
    """``append_columns`` and ``append_block`` (the simulator's runs of decode iterations)
    between rows appended one by one: the table, the rows and the decision times of the same
    rows appended as tuples."""
    log = type("Small", (IterationLog,), {"CHUNK_ROWS": chunk, "SEGMENT_ROWS": 2 * chunk,
                                          "MIN_BLOCK_ROWS": min_block})()
    full = {"token_budget": 0, "n_candidates": 1, "slo_min": 2}
    part = {"n_candidates": 0}
    rows: list[tuple] = []
    infos: list[dict] = []
    times: list[float] = []
    for i, (kind, m) in enumerate(steps):
        first = len(rows)
        start = np.arange(first, first + m) * 0.5
        ctx = 100 + 3 * np.arange(m, dtype=np.int64)
        columns = (start, start * 1e-3 + 0.01, 3, 0, 3, 0, 3, 0.0, ctx, 40 + i, 491, ctx * 2,
                   0, i, 3, 0, 0.0)
        new = [(float(start[j]), float(start[j]) * 1e-3 + 0.01, 3, 0, 3, 0, 3, 0.0, int(ctx[j]),
                40 + i, 491, 2 * int(ctx[j]), 0, i, 3, 0, 0.0) for j in range(m)]
        if kind == "row":
            # (values past the names, as AccelGen's rows have: not logged)
            info: Any = InfoRow(full, np.array([512.0 + i, float(i), 0.25 * i, -1.0]))
            log.append(0.5 * first, 0.02, BatchShape(), 1, i, 491, 0, 1e-6 * i, 0, 0, 1, 0, 0.0,
                       info)
            new, row_infos, row_times = ([(0.5 * first, 0.02, 0, 0, 0, 0, 1, 0.0, 0, i, 491, 0,
                                           0, 0, 1, 0, 0.0)], [dict(info)], [1e-6 * i])
        elif kind == "block":
            values = np.column_stack([512.0 + np.arange(m), np.full(m, 1.0 * i),
                                      0.5 + np.arange(m) * 1e3, np.full(m, -1.0)])
            log.append_block(columns, m, 2e-6 * i, full, values)
            row_infos, row_times = [dict(InfoRow(full, v)) for v in values], [2e-6 * i] * m
        else:
            info = {"columns": InfoRow(full, [7.0, float(i), 0.125, -1.0]),
                    "part": InfoRow(part, np.array([-1.0 - i])),
                    "dict": {"slo_min": 0.5 * i, "token_budget": 7.0},
                    "new": {f"extra_{i}": float(i)}, "none": {},
                    "all": {"slo_min": 0.5 * i, "n_candidates": 3.0, "token_budget": 64.0 * i}}[kind]
            log.append_columns(columns, m, info)
            row_infos, row_times = [dict(info)] * m, [0.0] * m
        rows += new
        infos += row_infos
        times += row_times
        assert len(log) == len(rows)
        if rows and i % 3 == 2:  # (reading a row stores the blocks: not after every step)
            assert log.row(-1) == rows[-1]
        if i == frame_at and rows:
            pd.testing.assert_frame_equal(log.to_frame(), _reference(rows, infos))
    assert [log.row(i) for i in range(len(rows))] == rows
    if rows:
        want = _reference(rows, infos)
        pd.testing.assert_frame_equal(log.to_frame(), want)
        assert _parquet(log.to_frame()) == _parquet(want)
    assert list(log.decision_time) == times
