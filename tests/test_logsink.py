"""The plugin's on-disk logs (``vllm_integration.logsink``) with a fake source: no vLLM."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from accelgen.vllm_integration.logsink import (
    LogDelta,
    LogSink,
    _concat,
    _table,
    has_log,
    read_log,
)


class FakeSource:
    """Records grow like a scheduler's: ended requests and iterations append, in-flight ones
    change."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ended: list[dict] = []
        self.in_flight: list[dict] = []
        self.iterations: list[dict] = []
        self.sent = (0, 0)
        self.dirty = True
        self.deltas = 0

    def add(self, ended: int = 0, iterations: int = 0, in_flight: int = 0) -> None:
        with self.lock:
            n = len(self.ended)
            self.ended += [{"req_id": n + i, "status": "finished", "token_times": [0.1 * i]}
                           for i in range(ended)]
            m = len(self.iterations)
            # Iterations from the second batch on carry a policy's extra column.
            self.iterations += [{"start": float(m + i), **({"info_x": 1.0} if m else {})}
                                for i in range(iterations)]
            self.in_flight = [{"req_id": 1000 + i, "status": "unfinished", "token_times": []}
                              for i in range(in_flight)]
            self.dirty = True

    def log_delta(self) -> LogDelta | None:
        if not self.dirty:
            return None
        self.dirty = False
        self.deltas += 1
        a, b = self.sent
        self.sent = (len(self.ended), len(self.iterations))
        frame = pd.DataFrame
        return LogDelta(
            ended_requests=frame(self.ended[a:], columns=["req_id", "status", "token_times"]),
            in_flight=frame(self.in_flight, columns=["req_id", "status", "token_times"]),
            iterations=frame(self.iterations[b:]),
            timing=frame({"decision_time": [0.001] * (len(self.iterations) - b)}))


def read(d: Path, name: str) -> pd.DataFrame:
    return read_log(d / f"{name}.parquet")


def test_flush_is_incremental_and_in_flight_rows_are_replaced(tmp_path: Path) -> None:
    src = FakeSource()
    sink = LogSink(tmp_path / "logs", src, src.lock, interval_s=3600)
    assert sink.flush()  # the first flush writes the (empty) files
    assert len(read(tmp_path / "logs", "requests")) == 0
    assert not sink.flush()  # nothing changed: nothing written
    src.add(ended=3, iterations=2, in_flight=2)
    assert sink.flush()
    reqs = read(tmp_path / "logs", "requests")
    assert list(reqs["req_id"]) == [0, 1, 2, 1000, 1001]
    src.add(ended=2, iterations=3, in_flight=1)
    sink.flush()
    reqs = read(tmp_path / "logs", "requests")
    assert list(reqs["req_id"]) == [0, 1, 2, 3, 4, 1000]
    assert list(reqs.loc[reqs["req_id"] == 4, "token_times"].iloc[0]) == [0.1]
    its = read(tmp_path / "logs", "iterations")
    assert list(its["start"]) == [0, 1, 2, 3, 4]  # chunks with and without info_x concatenate
    assert its["info_x"].isna().tolist() == [True, True, False, False, False]
    assert len(read(tmp_path / "logs", "timing")) == 5
    assert not list((tmp_path / "logs").glob(".*"))  # no temporary files left
    with src.lock:
        sink.reset()
        src.ended, src.iterations, src.sent, src.dirty = [], [], (0, 0), True
    sink.flush()
    assert len(read(tmp_path / "logs", "iterations")) == 0


def test_background_writes_bound_what_a_crash_loses(tmp_path: Path) -> None:
    src = FakeSource()
    sink = LogSink(tmp_path, src, src.lock, interval_s=0.05)
    sink.start()
    try:
        src.add(ended=4, iterations=4)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # written within the interval (+ MIN_GAP_S)
            if has_log(tmp_path / "requests.parquet") and len(read(tmp_path, "requests")) == 4:
                break
            time.sleep(0.02)
        assert len(read(tmp_path, "requests")) == 4
    finally:
        sink.close()


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    src = FakeSource()
    sink = LogSink(tmp_path, src, src.lock, interval_s=3600)
    sink.merge_parts = 3  # parts merged while the reader reads
    src.add(in_flight=3)
    sink.flush()
    errors: list[Exception] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                n = len(read(tmp_path, "requests"))
                # One whole write: its ended requests and its in-flight ones, never a mix.
                if n % 50 != 3:
                    errors.append(AssertionError(f"{n} rows"))
            except Exception as exc:  # pragma: no cover - the failure this test looks for
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(40):
            src.add(ended=50, iterations=50, in_flight=3)
            sink.flush()
        sink.close()  # the parts joined into one file each, then removed
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert len(read(tmp_path, "requests")) == 40 * 50 + 3
    assert not (tmp_path / "parts").exists() and not list(tmp_path.glob(".*"))


def test_close_writes_the_final_state_and_poke_wakes_the_writer(tmp_path: Path) -> None:
    src = FakeSource()
    sink = LogSink(tmp_path, src, src.lock, interval_s=3600)
    sink.start()
    src.add(ended=1)
    sink.poke()
    deadline = time.monotonic() + 30
    while not has_log(tmp_path / "requests.parquet") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(read(tmp_path, "requests")) == 1
    src.add(ended=2, in_flight=1)
    sink.close()
    assert list(read(tmp_path, "requests")["req_id"]) == [0, 1, 2, 1000]
    sink.start()  # a closed sink stays closed
    assert sink._thread is None


def test_a_failing_write_does_not_stop_the_writer(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    src = FakeSource()
    sink = LogSink(blocker / "logs", src, src.lock, interval_s=0.01)
    sink.start()
    src.add(ended=1)
    time.sleep(1.5)
    assert sink._thread is not None and sink._thread.is_alive()
    sink._stop.set()
    sink._wake.set()
    sink._thread.join()
    assert "could not write the scheduler logs" in caplog.text


def test_the_sink_keeps_nothing_and_the_joined_file_is_what_the_parts_were(
        tmp_path: Path) -> None:
    """Each write only adds parts (the sink holds no rows); the reader's view while serving,
    the joined files after ``close`` and the concatenation of every delta (what the sink used to
    keep in memory) are the same tables: rows, order, columns and their types."""
    src = FakeSource()
    sink = LogSink(tmp_path / "logs", src, src.lock, interval_s=3600)
    (tmp_path / "logs").mkdir()
    for name in ("requests", "iterations", "timing"):  # a previous run's files: replaced
        (tmp_path / "logs" / f"{name}.parquet").write_text("stale")
    deltas: list[LogDelta] = []
    real = src.log_delta

    def recording() -> LogDelta | None:
        d = real()
        if d is not None:
            deltas.append(d)
        return d

    src.log_delta = recording  # type: ignore[method-assign]
    sink.merge_parts = 2
    writes = [(0, 0, 0), (3, 2, 2), (0, 4, 1), (2, 0, 0), (1, 3, 2)] * 3
    for ended, its, flying in writes:
        src.add(ended=ended, iterations=its, in_flight=flying)
        assert sink.flush()
        assert not any(isinstance(v, (pa.Table, pd.DataFrame)) for v in vars(sink).values())
        # Merged two by two: a part per power of two at most, and the in-flight one.
        assert len(list((tmp_path / "logs" / "parts").iterdir())) <= 3 * 4 + 1
    expected = {
        "requests": _concat([_table(d.ended_requests) for d in deltas]
                            + [_table(deltas[-1].in_flight)]),
        "iterations": _concat([_table(d.iterations) for d in deltas]),
        "timing": _concat([_table(d.timing) for d in deltas])}
    parts = {name: pa.Table.from_pandas(read(tmp_path / "logs", name), preserve_index=False)
             for name in expected}
    sink.close()
    assert not (tmp_path / "logs" / "parts").exists()
    for name, table in expected.items():
        joined = pq.read_table(tmp_path / "logs" / f"{name}.parquet")
        for got in (parts[name], joined):
            assert got.replace_schema_metadata(None).equals(table), name
    assert list(read(tmp_path / "logs", "requests")["req_id"]) == [*range(18), 1000, 1001]


def test_a_reader_skips_the_parts_a_merged_part_holds(tmp_path: Path) -> None:
    """Between writing a merged part and removing the parts it holds, a reader sees both: it
    reads each row once."""
    from accelgen.vllm_integration.logsink import _part_name, _write_joined

    src = FakeSource()
    sink = LogSink(tmp_path, src, src.lock, interval_s=3600)
    for _ in range(3):
        src.add(ended=2, iterations=1, in_flight=1)
        sink.flush()
    before = read(tmp_path, "requests")
    parts = tmp_path / "parts"
    _write_joined([parts / _part_name("requests", w, w) for w in (2, 3)],
                  parts / _part_name("requests", 2, 3))
    assert len(list(parts.glob("requests-0*.parquet"))) == 4  # 1, 2, 3 and 2-3
    pd.testing.assert_frame_equal(read(tmp_path, "requests"), before)
    assert list(before["req_id"]) == [0, 1, 2, 3, 4, 5, 1000]
