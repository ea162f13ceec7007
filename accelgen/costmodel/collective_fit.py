"""Fit the communication terms (``collectives.py``) to measured collectives, and check the fit at
the message sizes an iteration produces.

**Points** (``read_collectives``): one file per call, either

- the standard output of ``nccl-tests`` (``all_reduce_perf``, ``sendrecv_perf``; several runs
  may follow each other in one file): the collective from the ``# Collective test starting:``
  line (or, for versions without it, from the file name), the rank count from the ``#  Rank``
  lines under ``# Using devices``, and from each result row the message ``size`` (bytes, first
  column) and the out-of-place ``time`` (us, sixth column);
- or a CSV with a header: ``collective`` (all_reduce or send_recv), ``ranks``, ``size_bytes`` and
  one of ``time_us``, ``time_ms``, ``time_s`` (other columns are ignored); or Vidur's profile
  format (``collective``, ``num_workers``, ``size`` in bytes, ``time_stats.<collective>.median``
  in ms, ``devices_per_node``), of which the rows with all ranks on one node are kept.

Bad input raises ``CollectiveFormatError`` naming the file, line and column.

**Fit** (``fit_all_reduce``, ``fit_send_recv``): the points are grouped into log-spaced size
bins (4 per octave; the bin's median size and time), which weighs every size range alike (a
profile with 8 KiB steps has most of its points above 8 MiB) and damps single outliers; then
least squares on log(predicted / measured) with a soft-L1 loss (small-message times jump between
clusters, and the fit should follow the bulk rather than their mean), from three starting
exponents, keeping the best. The all-reduce form has four free terms (latency floor, startup,
bus bandwidth at the largest size, exponent in [0.2, 1]); send/recv two (startup, bandwidth).

**Check** (``iteration_errors``): an iteration all-reduces N x hidden x 2 bytes; for N on a
log grid of 1..8,192 tokens (``TOKEN_GRID``) the measured point nearest each such size (within a
factor sqrt(2); sizes beyond the measured range are skipped) is compared with the fit:
error = predicted / measured - 1.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accelgen.core.specs import AllReduceFit, SendRecvFit
from accelgen.costmodel.collectives import all_reduce_time, ring_factor, send_recv_time

ALL_REDUCE, SEND_RECV = "all_reduce", "send_recv"
_OP_NAMES = {"all_reduce": ALL_REDUCE, "allreduce": ALL_REDUCE, "all_reduce_perf": ALL_REDUCE,
             "send_recv": SEND_RECV, "sendrecv": SEND_RECV, "sendrecv_perf": SEND_RECV,
             "p2p": SEND_RECV}
BINS_PER_OCTAVE = 4
MIN_SIZES = 4  # distinct size bins a fit needs
# Token counts of the iteration check: powers of two and 1.5 times them, 1..8,192.
TOKEN_GRID = tuple(sorted({2 ** i for i in range(14)} | {3 * 2 ** i for i in range(12)}))
MATCH_FACTOR = math.sqrt(2.0)  # a measured size stands for an iteration's within this factor


class CollectiveFormatError(ValueError):
    """A collectives file that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True)
class CollectivePoints:
    """Measured collectives: one entry per (collective, rank count, message size)."""

    op: np.ndarray  # ALL_REDUCE or SEND_RECV
    ranks: np.ndarray  # int
    nbytes: np.ndarray  # float, message size
    time_s: np.ndarray  # float
    source: str
    note: str = ""  # rows dropped and why

    def __len__(self) -> int:
        return len(self.op)

    def select(self, op: str, ranks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(sizes, times) of one collective (and rank count), in order of size."""
        m = self.op == op
        if ranks is not None:
            m &= self.ranks == ranks
        order = np.argsort(self.nbytes[m], kind="stable")
        return self.nbytes[m][order], self.time_s[m][order]

    def rank_counts(self, op: str) -> list[int]:
        return sorted({int(r) for r in self.ranks[self.op == op]})

    @staticmethod
    def concat(parts: list[CollectivePoints]) -> CollectivePoints:
        return CollectivePoints(
            np.concatenate([p.op for p in parts]), np.concatenate([p.ranks for p in parts]),
            np.concatenate([p.nbytes for p in parts]), np.concatenate([p.time_s for p in parts]),
            "; ".join(p.source for p in parts),
            "; ".join(p.note for p in parts if p.note))


def _op_name(name: str, where: str) -> str:
    op = _OP_NAMES.get(name.strip().lower())
    if op is None:
        raise CollectiveFormatError(f"{where}: collective {name!r} is not all_reduce or "
                                    "send_recv")
    return op


# ---- reading -------------------------------------------------------------------------------

def read_collectives(path: Path | str) -> CollectivePoints:
    """Measured collectives from ``nccl-tests`` output or a CSV (module docstring)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CollectiveFormatError(f"{path}: cannot read ({exc})") from None
    if _NCCL_TESTS.search(text):
        return _read_nccl_tests(path, text)
    return _read_csv(path, text)


# What only nccl-tests output has: its banner, its device list, or its column header.
_NCCL_TESTS = re.compile(r"^#\s*(Collective test starting|Using devices|nccl-tests version|"
                         r"\s*size\s+count\s+type)", re.MULTILINE)


_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)")
_START_LINE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


def _read_nccl_tests(path: Path, text: str) -> CollectivePoints:
    ops: list[str] = []
    ranks: list[int] = []
    sizes: list[float] = []
    times: list[float] = []
    op_from_name = next((v for k, v in _OP_NAMES.items() if k.endswith("_perf") and k in
                         path.name.lower()), None)
    op: str | None = op_from_name
    run_ranks: set[int] = set()
    in_devices = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        where = f"{path}, line {lineno}"
        m = _START_LINE.match(line)
        if m:
            op, run_ranks, in_devices = _op_name(m.group(1), where), set(), False
            continue
        if line.startswith("# Using devices"):
            run_ranks, in_devices = set(), True
            continue
        m = _RANK_LINE.match(line)
        if m and in_devices:
            run_ranks.add(int(m.group(1)))
            continue
        if line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) < 6 or not fields[0].isdigit():
            continue  # launcher chatter between runs
        if op is None:
            raise CollectiveFormatError(f"{where}: a result row before any '# Collective test "
                                        "starting:' line, and the file name names no "
                                        "all_reduce_perf or sendrecv_perf")
        if not run_ranks:
            raise CollectiveFormatError(f"{where}: a result row before any '#  Rank N ...' "
                                        "line under '# Using devices' (the rank count)")
        try:
            size, t_us = float(fields[0]), float(fields[5])
        except ValueError:
            raise CollectiveFormatError(f"{where}, column time (6th): {fields[5]!r} is not a "
                                        "number") from None
        if not (t_us > 0 and math.isfinite(t_us)):
            raise CollectiveFormatError(f"{where}, column time (6th): {fields[5]!r} must be a "
                                        "positive time in us")
        if size <= 0:
            continue  # nccl-tests prints 0-byte rows with -b 0; nothing to fit
        ops.append(op)
        ranks.append(len(run_ranks))
        sizes.append(size)
        times.append(t_us * 1e-6)
    if not ops:
        raise CollectiveFormatError(f"{path}: no nccl-tests result rows (size count type redop "
                                    "root time ...) found")
    return CollectivePoints(np.array(ops), np.array(ranks), np.array(sizes), np.array(times),
                            f"{path} (nccl-tests output)")


_TIME_COLUMNS = {"time_us": 1e-6, "time_ms": 1e-3, "time_s": 1.0}


def _read_csv(path: Path, text: str) -> CollectivePoints:
    # '#' lines are comments (a file's provenance); blank lines are skipped.
    rows = [(lineno, next(csv.reader([line]))) for lineno, line in
            enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")]
    head_line, header = (rows[0][0], [h.strip() for h in rows[0][1]]) if rows else (1, [])
    col = {h: i for i, h in enumerate(header)}
    vidur = "num_workers" in col and "size" in col
    need = ["collective", "num_workers", "size"] if vidur else ["collective", "ranks", "size_bytes"]
    missing = [c for c in need if c not in col]
    if missing:
        raise CollectiveFormatError(
            f"{path}, line {head_line}: missing column(s) {', '.join(missing)} (a CSV needs collective, "
            "ranks, size_bytes and time_us, time_ms or time_s; or Vidur's num_workers, size and "
            "time_stats.<collective>.median)")
    unit_col = next((c for c in _TIME_COLUMNS if c in col), None)
    if not vidur and unit_col is None:
        raise CollectiveFormatError(f"{path}, line {head_line}: no time column (time_us, time_ms or "
                                    "time_s)")
    ops: list[str] = []
    ranks: list[int] = []
    sizes: list[float] = []
    times: list[float] = []
    dropped = 0
    for lineno, row in rows[1:]:
        where = f"{path}, line {lineno}"

        def cell(name: str, row: list[str] = row, where: str = where) -> str:
            i = col[name]
            if i >= len(row) or not row[i].strip():
                raise CollectiveFormatError(f"{where}, column {name}: empty")
            return row[i].strip()

        def number(name: str, cell=cell, where: str = where) -> float:
            v = cell(name)
            try:
                x = float(v)
            except ValueError:
                raise CollectiveFormatError(f"{where}, column {name}: {v!r} is not a "
                                            "number") from None
            if not (x > 0 and math.isfinite(x)):
                raise CollectiveFormatError(f"{where}, column {name}: {v!r} must be positive")
            return x

        op = _op_name(cell("collective"), f"{where}, column collective")
        if vidur:
            n = number("num_workers")
            if "devices_per_node" in col and number("devices_per_node") != n:
                dropped += 1  # ranks spread over several nodes: not a single-node TP/PP group
                continue
            tcol = f"time_stats.{op}.median"
            if tcol not in col:
                raise CollectiveFormatError(f"{path}, line {head_line}: missing column {tcol}")
            t = number(tcol) * 1e-3
            size = number("size")
        else:
            assert unit_col is not None
            n, size, t = number("ranks"), number("size_bytes"), number(unit_col)
            t *= _TIME_COLUMNS[unit_col]
        if n != int(n) or n < 2:
            raise CollectiveFormatError(f"{where}, column {'num_workers' if vidur else 'ranks'}"
                                        f": {n:g} must be an integer >= 2")
        ops.append(op)
        ranks.append(int(n))
        sizes.append(size)
        times.append(t)
    if not ops:
        raise CollectiveFormatError(f"{path}: no rows"
                                    + (" with all ranks on one node" if dropped else ""))
    note = (f"{dropped} rows with ranks on several nodes (devices_per_node < num_workers) "
            "dropped" if dropped else "")
    return CollectivePoints(np.array(ops), np.array(ranks), np.array(sizes), np.array(times),
                            f"{path} ({'Vidur profile' if vidur else 'CSV'})", note)


# ---- fitting -------------------------------------------------------------------------------

def size_bins(nbytes: np.ndarray, time_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median size and median time of each log-spaced size bin (``BINS_PER_OCTAVE``)."""
    key = np.floor(np.log2(nbytes) * BINS_PER_OCTAVE)
    bins = np.unique(key)
    s = np.array([np.median(nbytes[key == b]) for b in bins])
    t = np.array([np.median(time_s[key == b]) for b in bins])
    return s, t


def _check_enough(sb: np.ndarray, what: str) -> None:
    if len(sb) < MIN_SIZES:
        raise ValueError(f"{what}: {len(sb)} distinct message sizes (log bins), need at least "
                         f"{MIN_SIZES} to fit")


def fit_all_reduce(nbytes: np.ndarray, time_s: np.ndarray, ranks: int) -> AllReduceFit:
    """Fit the all-reduce form (``collectives.py``) to one rank count's points."""
    from scipy.optimize import least_squares

    sb, tb = size_bins(np.asarray(nbytes, float), np.asarray(time_s, float))
    _check_enough(sb, f"all_reduce over {ranks} ranks")
    ref = float(sb.max())
    x = sb / ref

    def model(p: np.ndarray) -> np.ndarray:
        lat, start, c = np.exp(p[:3])
        return np.maximum(lat, start + c * x ** p[3])

    small = float(np.median(tb[: max(1, len(tb) // 4)]))
    best = None
    for k0 in (0.6, 0.8, 1.0):
        p0 = np.array([math.log(small), math.log(small / 2), math.log(float(tb[-1])), k0])
        r = least_squares(lambda p: np.log(model(p) / tb), p0, loss="soft_l1", f_scale=0.05,
                          bounds=([-30.0, -30.0, -30.0, 0.2], [5.0, 5.0, 5.0, 1.0]))
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    lat, start, c = (float(v) for v in np.exp(best.x[:3]))
    return AllReduceFit(ranks=ranks, latency_s=lat, startup_s=start,
                        bus_bandwidth=ring_factor(ranks) * ref / c,
                        exponent=float(best.x[3]), ref_bytes=ref)


def fit_send_recv(nbytes: np.ndarray, time_s: np.ndarray) -> SendRecvFit:
    """Fit startup + size / bandwidth to send/recv points."""
    from scipy.optimize import least_squares

    sb, tb = size_bins(np.asarray(nbytes, float), np.asarray(time_s, float))
    _check_enough(sb, "send_recv")
    ref = float(sb.max())
    x = sb / ref

    def model(p: np.ndarray) -> np.ndarray:
        start, c = np.exp(p)
        return start + c * x

    p0 = np.array([math.log(float(tb[0])), math.log(float(tb[-1]))])
    r = least_squares(lambda p: np.log(model(p) / tb), p0, loss="soft_l1", f_scale=0.05)
    start, c = (float(v) for v in np.exp(r.x))
    return SendRecvFit(startup_s=start, bus_bandwidth=ref / c)


# ---- checking ------------------------------------------------------------------------------

def iteration_sizes(hidden_sizes: list[int] | tuple[int, ...], dtype_bytes: int = 2,
                    tokens: tuple[int, ...] = TOKEN_GRID) -> np.ndarray:
    """Message sizes of an iteration's all-reduces (N x hidden x dtype bytes) for each hidden
    size and N in ``tokens``."""
    return np.array(sorted({n * h * dtype_bytes for h in hidden_sizes for n in tokens}),
                    dtype=np.float64)


def nearest_points(nbytes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indices of the measured sizes nearest (log scale) to each of ``sizes``, within
    ``MATCH_FACTOR``, each index once, in order."""
    if len(nbytes) == 0:
        return np.zeros(0, dtype=np.int64)
    logs = np.log(nbytes)
    out: set[int] = set()
    for s in sizes:
        d = np.abs(logs - math.log(s))
        i = int(np.argmin(d))
        if d[i] <= math.log(MATCH_FACTOR):
            out.add(i)
    return np.array(sorted(out), dtype=np.int64)


def predict_all_reduce(fit: AllReduceFit, ranks: int, nbytes: np.ndarray) -> np.ndarray:
    return np.array([all_reduce_time(fit, ranks, float(s)) for s in nbytes])


def predict_send_recv(fit: SendRecvFit, nbytes: np.ndarray) -> np.ndarray:
    return np.array([send_recv_time(fit, float(s)) for s in nbytes])


@dataclass(frozen=True)
class FitCheck:
    """Errors (predicted / measured - 1) of one collective at one rank count."""

    op: str
    ranks: int
    iteration: np.ndarray  # at the iteration's message sizes (``iteration_errors``)
    iteration_bytes: np.ndarray  # their measured sizes
    all_points: np.ndarray  # every point within the iteration's size range

    @property
    def median_abs(self) -> float:
        return float(np.median(np.abs(self.iteration))) if len(self.iteration) else math.nan


def check_fit(op: str, ranks: int, nbytes: np.ndarray, time_s: np.ndarray,
              predicted: np.ndarray, sizes: np.ndarray) -> FitCheck:
    """A fit's errors at the iteration's sizes ``sizes`` and over all points in their range."""
    err = predicted / time_s - 1.0
    idx = nearest_points(nbytes, sizes)
    lo, hi = sizes.min() / MATCH_FACTOR, sizes.max() * MATCH_FACTOR
    in_range = (nbytes >= lo) & (nbytes <= hi)
    return FitCheck(op, ranks, err[idx], nbytes[idx], err[in_range])
