"""Measured iteration latencies to calibrate a cost model on (``accelgen calibrate``).

Two sources, one result (a ``PointSet``: each point a batch composition, its layout and latency):

- **A CSV** in the profile-table format (``accelgen.costmodel.table``), as ``accelgen profile``
  writes it or typed in from a paper: columns ``prefill_tokens``, ``prefill_seqs``,
  ``prefill_ctx``, ``decode_seqs``, ``decode_ctx`` (the sum of the decodes' contexts), and the
  latency as ``latency_s`` or ``latency_ms``. Shape columns left out are 0 (``prefill_seqs``: 1
  when there are prefill tokens); ``kind`` is optional and checked when present; ``tp`` and
  ``pp`` give the layout a point was measured on (default: the deployment's). Other columns are
  ignored; ``#`` lines are comments.
- **A run's per-step log**: a results directory (``iterations.parquet`` and
  ``requests.parquet``) of a replay on a real engine (``accelgen replay``, the fidelity stage) or
  of a simulation. A step's latency is its **span**: from the moment the engine had work for it
  to its end, i.e. from the previous step's end while requests remained, or from the arrival
  that woke an idle engine. That is what the simulator charges for an iteration (it starts the
  next one at the previous one's end, or at the arrival), and it holds everything a real engine
  does between two steps: output processing, adding the arriving requests, waking up.

Bad input raises ``PointsError`` naming the file, the line (or row) and the column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from accelgen.core.iteration import BatchShape

if TYPE_CHECKING:  # a step log needs pandas; CSV points do not (a bare GPU machine's Python)
    import pandas as pd

KINDS = ("prefill", "decode", "mixed")
SHAPE_COLUMNS = ("prefill_tokens", "prefill_seqs", "prefill_ctx", "decode_seqs", "decode_ctx")
LATENCY_COLUMNS = {"latency_s": 1.0, "latency_ms": 1e-3}


class PointsError(ValueError):
    """Unusable calibration input; the message names the file, line or row, and column."""


def kind_of(shape: BatchShape) -> str:
    if shape.prefill_tokens > 0:
        return "mixed" if shape.decode_seqs > 0 else "prefill"
    return "decode"


@dataclass(frozen=True, slots=True)
class PointSet:
    """Measured iterations: shapes, layouts (TP, PP) and latencies (s), with where each came
    from (``where[i]``: ``file:line`` or ``file row k``)."""

    shapes: list[BatchShape]
    latency_s: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    where: list[str]
    source: str
    note: str = ""  # how the points were chosen (a step log: which steps were left out)

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def kinds(self) -> np.ndarray:
        return np.array([kind_of(s) for s in self.shapes])

    def take(self, idx: np.ndarray | list[int]) -> PointSet:
        idx = np.asarray(idx, dtype=np.int64)
        return PointSet([self.shapes[i] for i in idx], self.latency_s[idx], self.tp[idx],
                        self.pp[idx], [self.where[i] for i in idx], self.source, self.note)

    @classmethod
    def concat(cls, sets: list[PointSet]) -> PointSet:
        if len(sets) == 1:
            return sets[0]
        return cls([s for ps in sets for s in ps.shapes],
                   np.concatenate([ps.latency_s for ps in sets]),
                   np.concatenate([ps.tp for ps in sets]), np.concatenate([ps.pp for ps in sets]),
                   [w for ps in sets for w in ps.where], " + ".join(ps.source for ps in sets),
                   "; ".join(ps.note for ps in sets if ps.note))


def read_points(path: Path | str, tp: int = 1, pp: int = 1) -> PointSet:
    """A CSV of points, or a run's step log (a results directory or its
    ``iterations.parquet``); ``tp``/``pp``: the layout of points that do not state theirs."""
    path = Path(path)
    if path.is_dir() or path.suffix == ".parquet":
        return read_step_log(path.parent if path.suffix == ".parquet" else path, tp, pp)
    return read_points_csv(path, tp, pp)


def _number(text: str, where: str, col: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PointsError(f"{where}: column {col!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise PointsError(f"{where}: column {col!r}: {text!r} is not a finite number")
    return value


def _count(text: str, where: str, col: str, minimum: int = 0) -> int:
    value = _number(text, where, col)
    if not value.is_integer():
        raise PointsError(f"{where}: column {col!r}: {text!r} is not an integer")
    if value < minimum:
        raise PointsError(f"{where}: column {col!r}: {text} must be >= {minimum}")
    return int(value)


def _parse_row(raw: dict[str, str], where: str, latency_col: str, tp: int,
               pp: int) -> tuple[BatchShape, float, int, int]:
    def get(col: str) -> str | None:
        v = raw.get(col)
        return None if v is None or v.strip() == "" else v.strip()

    vals = {c: _count(v, where, c) for c in SHAPE_COLUMNS if (v := get(c)) is not None}
    p_tok, d_seq = vals.get("prefill_tokens", 0), vals.get("decode_seqs", 0)
    p_seqs = vals.get("prefill_seqs", 1 if p_tok > 0 else 0)
    p_ctx, d_ctx = vals.get("prefill_ctx", 0), vals.get("decode_ctx", 0)
    if p_tok == 0 and d_seq == 0:
        raise PointsError(f"{where}: columns 'prefill_tokens', 'decode_seqs': an iteration "
                          "needs prefill tokens or decode sequences")
    if (p_tok > 0) != (p_seqs > 0) or p_seqs > p_tok:
        raise PointsError(f"{where}: column 'prefill_seqs': {p_seqs} chunks cannot hold "
                          f"{p_tok} prefill tokens")
    if p_tok == 0 and p_ctx > 0:
        raise PointsError(f"{where}: column 'prefill_ctx': {p_ctx} without prefill tokens")
    if d_ctx < d_seq or (d_seq == 0 and d_ctx > 0):
        raise PointsError(f"{where}: column 'decode_ctx': {d_ctx} is the total context of "
                          f"{d_seq} decode sequences (>= 1 per sequence, 0 without decodes)")
    shape = BatchShape()
    if p_seqs:
        base, extra = divmod(p_tok, p_seqs)
        for i in range(p_seqs):
            shape.add_prefill(base + (1 if i < extra else 0), p_ctx)
    shape.decode_seqs, shape.decode_ctx = d_seq, d_ctx
    kind = get("kind")
    if kind is not None and kind.lower() != kind_of(shape):
        raise PointsError(f"{where}: column 'kind': {kind!r}, but prefill_tokens={p_tok} and "
                          f"decode_seqs={d_seq} make it {kind_of(shape)!r}")
    text = get(latency_col)
    if text is None:
        raise PointsError(f"{where}: column {latency_col!r} is empty")
    latency = _number(text, where, latency_col) * LATENCY_COLUMNS[latency_col]
    if latency <= 0:
        raise PointsError(f"{where}: column {latency_col!r}: {text} must be > 0")
    layout = [(_count(v, where, c, 1) if (v := get(c)) is not None else d)
              for c, d in (("tp", tp), ("pp", pp))]
    return shape, latency, layout[0], layout[1]


def read_points_csv(path: Path | str, tp: int = 1, pp: int = 1) -> PointSet:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a spreadsheet's BOM
    except FileNotFoundError:
        raise FileNotFoundError(f"points file not found: {path}") from None
    except UnicodeDecodeError:
        raise PointsError(f"{path}: not a text (CSV) file") from None
    numbered = [(i + 1, ln) for i, ln in enumerate(text.splitlines())
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise PointsError(f"{path}: no header and no rows")
    header_line, header = numbered[0]
    columns = [c.strip() for c in next(csv.reader([header]))]
    latency_cols = [c for c in LATENCY_COLUMNS if c in columns]
    if len(latency_cols) != 1:
        raise PointsError(f"{path}:{header_line}: needs one latency column, latency_s or "
                          f"latency_ms (header has: {', '.join(columns)})")
    if not {"prefill_tokens", "decode_seqs"} & set(columns):
        raise PointsError(f"{path}:{header_line}: needs a prefill_tokens or decode_seqs column "
                          f"(header has: {', '.join(columns)})")
    shapes, lat, tps, pps, where = [], [], [], [], []
    for lineno, line in numbered[1:]:
        values = next(csv.reader([line]))
        here = f"{path}:{lineno}"
        if len(values) != len(columns):
            raise PointsError(f"{here}: {len(values)} fields, the header has {len(columns)}")
        shape, latency, p_tp, p_pp = _parse_row(dict(zip(columns, values, strict=True)), here,
                                                latency_cols[0], tp, pp)
        shapes.append(shape)
        lat.append(latency)
        tps.append(p_tp)
        pps.append(p_pp)
        where.append(here)
    if not shapes:
        raise PointsError(f"{path}: a header but no rows")
    return PointSet(shapes, np.array(lat), np.array(tps, dtype=np.int64),
                    np.array(pps, dtype=np.int64), where, str(path))


_EPS = 1e-5  # s: how far a replay's two clocks (arrivals, step ends) may disagree


def busy_steps(its: pd.DataFrame, reqs: pd.DataFrame) -> np.ndarray:
    """For each step of a run's log, whether the engine still had work when it ended (a
    request that had arrived and not finished), i.e. whether the next step followed at once."""
    ran = reqs[np.isfinite(reqs["first_scheduled_time"].to_numpy(np.float64))]
    arrivals = np.sort(ran["arrival"].to_numpy(np.float64))
    finishes = np.sort(ran["finish_time"].to_numpy(np.float64))
    end = its["start"].to_numpy(np.float64) + its["latency"].to_numpy(np.float64)
    # A finish time is the end of the step that emitted the last token (a replay stamps it a
    # few microseconds before the step's measured end): a request finishing in this step counts
    # as gone, one arriving during it as present (_EPS: the clocks' disagreement).
    live = (np.searchsorted(arrivals, end + _EPS, side="right")
            - np.searchsorted(finishes, end + _EPS, side="right"))
    return live > 0


STEP_COLUMNS = ("start", "latency", "prefill_tokens", "decode_tokens", "num_prefill_seqs",
                "prefill_attn", "decode_ctx")


@dataclass(frozen=True, slots=True)
class StepLog:
    """A run's steps (``iterations``), their shapes and spans (the module docstring), and
    ``after_idle``: the steps that started an idle engine again."""

    iterations: pd.DataFrame
    shapes: list[BatchShape]
    span: np.ndarray
    after_idle: np.ndarray
    path: Path


def step_spans(its: pd.DataFrame, reqs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's span (end minus the moment the engine had work for it) and whether it
    followed an idle engine (then the span starts at the first arrival after the last step)."""
    ran = reqs[np.isfinite(reqs["first_scheduled_time"].to_numpy(np.float64))]
    arrivals = np.sort(ran["arrival"].to_numpy(np.float64))
    start = its["start"].to_numpy(np.float64)
    end = start + its["latency"].to_numpy(np.float64)
    busy = busy_steps(its, reqs)
    prev_end = np.concatenate([[-np.inf], end[:-1]])
    after_idle = np.concatenate([[True], ~busy[:-1]])
    # The first arrival after the previous step's end (the one that woke the engine); a replay's
    # clocks may put it a few microseconds after the step's start.
    k = np.searchsorted(arrivals, prev_end + _EPS, side="right")
    woke = arrivals[np.minimum(k, len(arrivals) - 1)] if len(arrivals) else start
    avail = np.where(after_idle, np.minimum(np.maximum(woke, prev_end), start), prev_end)
    return end - avail, after_idle


def load_step_log(run_dir: Path | str) -> StepLog:
    """The steps of a results directory with their spans."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run_dir = Path(run_dir)
    its_path, req_path = run_dir / "iterations.parquet", run_dir / "requests.parquet"
    for p in (its_path, req_path):
        if not p.exists():
            raise FileNotFoundError(f"{run_dir}: no {p.name} (a results directory of "
                                    "`accelgen replay` or `accelgen simulate`)")
    try:
        its = pq.read_table(its_path).to_pandas()
        reqs = pq.read_table(req_path, columns=["arrival", "first_scheduled_time",
                                                 "finish_time"]).to_pandas()
    except (pa.ArrowInvalid, KeyError) as exc:
        raise PointsError(f"{run_dir}: unreadable results files: {exc}") from None
    missing = [c for c in STEP_COLUMNS if c not in its.columns]
    if missing:
        raise PointsError(f"{its_path}: missing column(s) {', '.join(missing)}")
    if not len(its):
        raise PointsError(f"{its_path}: no steps")
    start = its["start"].to_numpy(np.float64)
    if (np.diff(start) <= 0).any():
        k = int(np.argmax(np.diff(start) <= 0))
        raise PointsError(f"{its_path} row {k + 1}: column 'start' does not increase "
                          f"({start[k]} then {start[k + 1]})")
    cols = {c: its[c].to_numpy() for c in STEP_COLUMNS}
    shapes = []
    for i in range(len(its)):
        s = BatchShape(int(cols["prefill_tokens"][i]), int(cols["num_prefill_seqs"][i]),
                       float(cols["prefill_attn"][i]), int(cols["decode_tokens"][i]),
                       int(cols["decode_ctx"][i]))
        if s.forward_size <= 0:
            raise PointsError(f"{its_path} row {i}: an empty step (no prefill, no decode)")
        shapes.append(s)
    span, after_idle = step_spans(its, reqs)
    return StepLog(its, shapes, span, after_idle, its_path)


def read_step_log(run_dir: Path | str, tp: int = 1, pp: int = 1) -> PointSet:
    """The steps of a results directory as points, each with its span."""
    log = load_step_log(run_dir)
    n = len(log.shapes)
    note = (f"{n} steps of {run_dir}: step spans (from the previous step's end, or from the "
            f"arrival that woke the idle engine: {int(log.after_idle.sum())} steps, to the "
            "step's end)")
    return PointSet(log.shapes, log.span, np.full(n, tp, dtype=np.int64),
                    np.full(n, pp, dtype=np.int64), [f"{log.path} row {i}" for i in range(n)],
                    str(run_dir), note)
