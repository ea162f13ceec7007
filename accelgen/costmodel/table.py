"""Measured iteration-latency table (CSV) and the cost model fitted to it.

CSV format (``accelgen profile`` writes it; one row per measured iteration shape):

    # free-form metadata lines start with '#' (model, hardware, engine, date, ...)
    kind,prefill_tokens,prefill_seqs,prefill_ctx,decode_seqs,decode_ctx,latency_s
    prefill,512,1,0,0,0,0.0712
    prefill,512,1,2048,0,0,0.0950
    decode,0,0,0,32,16384,0.0266
    mixed,256,1,0,32,16384,0.0530

- ``kind``: ``prefill`` (prefill_tokens > 0, decode_seqs == 0), ``decode`` (prefill_tokens == 0,
  decode_seqs > 0) or ``mixed`` (both > 0).
- ``prefill_tokens``: new prompt tokens in the iteration, split as evenly as possible into
  ``prefill_seqs`` chunks (optional column; default 1 when prefill_tokens > 0), each with
  ``prefill_ctx`` tokens of prior context (0: a fresh prompt).
- ``decode_seqs``: decoding sequences; ``decode_ctx``: the SUM of their context lengths (as in
  ``BatchShape.decode_ctx``), at least one per sequence.
- ``latency_s``: iteration latency in seconds (a mean or median over repetitions).
- Any other column (e.g. ``latency_std_s``, ``repeats``) is ignored.

Fit (same structure as the analytic model, so that a batch is charged for what it contains):

    T(batch) = L(S_f) + c_causal * causal_pairs + c_ctx * ctx_pairs
               + c_seq * decode_seqs + c_kv * decode_ctx + c_dec * [decode_seqs > 0]

- T0(S), the prefill-only curve (rows with one fresh chunk), is averaged per size and made
  non-decreasing (pool adjacent violators); L(S) = T0(S) - c_causal * S(S+1)/2 is the rest of
  it, interpolated piecewise-linearly over the forward size S_f; below the smallest profiled
  size L is flat (weight streaming dominates there), beyond the largest it continues the last
  segment's slope (the quadratic attention part is extrapolated through c_causal).
- causal_pairs / ctx_pairs: query-key pairs inside the new chunks / against prior context,
  estimated from the batch aggregates as in ``analytic.py``.
- The c's are non-negative least squares on the relative error of the other rows (prefill with
  context, multi-chunk prefill, decode, mixed); c_causal is capped so L stays non-decreasing.
  A term no row constrains is 0, with a warning. Profile up to the largest forward size you
  will simulate.
"""

from __future__ import annotations

import bisect
import csv
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.base import CostModel

KINDS = ("prefill", "decode", "mixed")
REQUIRED_COLUMNS = ("kind", "prefill_tokens", "prefill_ctx", "decode_seqs", "decode_ctx",
                    "latency_s")
COLUMNS = ("kind", "prefill_tokens", "prefill_seqs", "prefill_ctx", "decode_seqs", "decode_ctx",
           "latency_s")


@dataclass(frozen=True, slots=True)
class ProfileRow:
    kind: str
    prefill_tokens: int
    prefill_seqs: int
    prefill_ctx: int
    decode_seqs: int
    decode_ctx: int
    latency_s: float

    def shape(self) -> BatchShape:
        s = BatchShape()
        if self.prefill_seqs > 0:
            base, extra = divmod(self.prefill_tokens, self.prefill_seqs)
            for i in range(self.prefill_seqs):
                s.add_prefill(base + (1 if i < extra else 0), self.prefill_ctx)
        s.decode_seqs = self.decode_seqs
        s.decode_ctx = self.decode_ctx
        return s


class ProfileFormatError(ValueError):
    """Bad profile CSV; the message names the file, line and column."""


def _kind_of(prefill_tokens: int, decode_seqs: int) -> str:
    if prefill_tokens > 0 and decode_seqs > 0:
        return "mixed"
    return "prefill" if prefill_tokens > 0 else "decode"


def _parse_row(raw: dict[str, str | None], where: str) -> ProfileRow:
    def field(col: str) -> str:
        v = raw.get(col)
        if v is None or v.strip() == "":
            raise ProfileFormatError(f"{where}: column {col!r} is empty")
        return v.strip()

    def integer(col: str, minimum: int = 0) -> int:
        text = field(col)
        try:
            value = float(text)
        except ValueError:
            raise ProfileFormatError(f"{where}: column {col!r}: {text!r} is not a number") from None
        if not value.is_integer():
            raise ProfileFormatError(f"{where}: column {col!r}: {text!r} is not an integer")
        if value < minimum:
            raise ProfileFormatError(f"{where}: column {col!r}: {text} must be >= {minimum}")
        return int(value)

    kind = field("kind").lower()
    if kind not in KINDS:
        raise ProfileFormatError(f"{where}: column 'kind': {kind!r} is not one of {KINDS}")
    prefill_tokens = integer("prefill_tokens")
    has_seqs = raw.get("prefill_seqs") not in (None, "")
    prefill_seqs = integer("prefill_seqs") if has_seqs else (1 if prefill_tokens > 0 else 0)
    prefill_ctx = integer("prefill_ctx")
    decode_seqs = integer("decode_seqs")
    decode_ctx = integer("decode_ctx")
    text = field("latency_s")
    try:
        latency = float(text)
    except ValueError:
        raise ProfileFormatError(f"{where}: column 'latency_s': {text!r} is not a number") from None
    if not (math.isfinite(latency) and latency > 0):
        raise ProfileFormatError(f"{where}: column 'latency_s': {text} must be a positive number")

    expected = _kind_of(prefill_tokens, decode_seqs)
    if prefill_tokens == 0 and decode_seqs == 0:
        raise ProfileFormatError(f"{where}: empty iteration (prefill_tokens and decode_seqs are 0)")
    if kind != expected:
        raise ProfileFormatError(
            f"{where}: column 'kind': {kind!r} but prefill_tokens={prefill_tokens} and "
            f"decode_seqs={decode_seqs} make it {expected!r}")
    if (prefill_tokens > 0) != (prefill_seqs > 0) or prefill_seqs > prefill_tokens:
        raise ProfileFormatError(
            f"{where}: column 'prefill_seqs': {prefill_seqs} chunks cannot hold "
            f"{prefill_tokens} prefill tokens")
    if prefill_tokens == 0 and prefill_ctx > 0:
        raise ProfileFormatError(f"{where}: column 'prefill_ctx': {prefill_ctx} without prefill")
    if decode_ctx < decode_seqs or (decode_seqs == 0 and decode_ctx > 0):
        raise ProfileFormatError(
            f"{where}: column 'decode_ctx': {decode_ctx} is the total context of {decode_seqs} "
            f"decode sequences (needs >= 1 per sequence, 0 without decodes)")
    return ProfileRow(kind, prefill_tokens, prefill_seqs, prefill_ctx, decode_seqs, decode_ctx,
                      latency)


def read_profile_csv(path: Path | str) -> list[ProfileRow]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a spreadsheet's BOM
    except FileNotFoundError:
        raise FileNotFoundError(f"profile table not found: {path}") from None
    lines = text.splitlines()
    # Keep physical line numbers for messages while skipping '#' metadata and blank lines.
    numbered = [(i + 1, ln) for i, ln in enumerate(lines)
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise ProfileFormatError(f"{path}: no header and no rows")
    header_line, header = numbered[0]
    columns = [c.strip() for c in next(csv.reader([header]))]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ProfileFormatError(
            f"{path}:{header_line}: missing column(s) {', '.join(missing)} "
            f"(header has: {', '.join(columns)})")
    rows: list[ProfileRow] = []
    for lineno, line in numbered[1:]:
        values = next(csv.reader([line]))
        where = f"{path}:{lineno}"
        if len(values) != len(columns):
            raise ProfileFormatError(
                f"{where}: {len(values)} fields, header has {len(columns)}")
        rows.append(_parse_row(dict(zip(columns, values, strict=True)), where))
    if not rows:
        raise ProfileFormatError(f"{path}: header but no rows")
    return rows


def write_profile_csv(path: Path | str, rows: Iterable[ProfileRow],
                      metadata: dict[str, str] | None = None) -> None:
    path = Path(path)
    with path.open("w", newline="") as fh:
        for key, value in (metadata or {}).items():
            fh.write(f"# {key}: {value}\n")
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.kind, r.prefill_tokens, r.prefill_seqs, r.prefill_ctx, r.decode_seqs,
                        r.decode_ctx, f"{r.latency_s:.9g}"])


def standard_grid(max_tokens: int = 8192) -> list[tuple[int, int, int, int, int]]:
    """Shapes worth profiling: (prefill_tokens, prefill_seqs, prefill_ctx, decode_seqs,
    decode_ctx). Prefill-only sizes 16..max_tokens, chunks over prior context, decode batches
    over context lengths, a few mixed batches and a few batches of several prompts."""
    sizes = sorted({*[16, 32, 64, 96], *range(128, max_tokens + 1, 128)})
    grid = [(s, 1, 0, 0, 0) for s in sizes if s <= max_tokens]
    for chunk in (64, 256, 512, 1024, 2048):
        for ctx in (1024, 4096, 8192):
            if chunk <= max_tokens and chunk + ctx <= 2 * max_tokens:
                grid.append((chunk, 1, ctx, 0, 0))
    for batch in (1, 8, 32, 64, 128, 256):
        for per_seq in (128, 512, 1024, 2048, 4096):
            grid.append((0, 0, 0, batch, batch * per_seq))
    for chunk, batch, per_seq in ((256, 32, 1024), (512, 64, 512), (512, 16, 2048),
                                  (1024, 128, 1024)):
        grid.append((chunk, 1, 0, batch, batch * per_seq))
    for tokens, seqs in ((1024, 4), (2048, 2), (2048, 8), (4096, 4)):
        if tokens <= max_tokens:
            grid.append((tokens, seqs, 0, 0, 0))
    return grid


def rows_from_cost_model(cost: CostModel,
                         grid: Sequence[tuple[int, int, int, int, int]] | None = None
                         ) -> list[ProfileRow]:
    """A synthetic profile table (tests, and a template for ``accelgen profile``)."""
    rows = []
    for pt, ps, pc, ds, dc in grid if grid is not None else standard_grid():
        r = ProfileRow(_kind_of(pt, ds), pt, ps, pc, ds, dc, 0.0)
        rows.append(ProfileRow(r.kind, pt, ps, pc, ds, dc, cost.iteration_time(r.shape())))
    return rows


def _isotonic(y: list[float], w: list[float]) -> list[float]:
    """Weighted non-decreasing least-squares fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for yi, wi in zip(y, w, strict=True):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for m, _, n in blocks:
        out.extend([m] * int(n))
    return out


def _tri(n: int) -> float:
    """Causal query-key pairs of one fresh n-token chunk."""
    return n * (n + 1) * 0.5


def _is_base(r: ProfileRow) -> bool:
    return r.kind == "prefill" and r.prefill_ctx == 0 and r.prefill_seqs == 1


def _interp(xs: list[int], ys: list[float], tail_slope: float, x: int) -> float:
    """Piecewise-linear; flat below xs[0], ``tail_slope`` beyond xs[-1]."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] + (x - xs[-1]) * tail_slope
    i = bisect.bisect_right(xs, x)
    x0, y0 = xs[i - 1], ys[i - 1]
    return y0 + (ys[i] - y0) * (x - x0) / (xs[i] - x0)


class ProfileCostModel(CostModel):
    """Iteration latency interpolated from a measured profile table."""

    name = "profile"

    TERMS = ("causal attention", "prefill over prior context", "decode sequences",
             "decode context", "decode fixed cost")

    def __init__(self, rows: Sequence[ProfileRow], source: str = "<rows>") -> None:
        self.source = source
        base: dict[int, list[float]] = {}
        for r in rows:
            if _is_base(r):
                base.setdefault(r.prefill_tokens, []).append(r.latency_s)
        if len(base) < 2:
            raise ProfileFormatError(
                f"{source}: needs prefill rows (one chunk, prefill_ctx 0) at two or more "
                f"prefill_tokens sizes to build the forward-size curve; found {len(base)}")
        sizes = sorted(base)
        t0 = _isotonic([sum(base[s]) / len(base[s]) for s in sizes],
                       [float(len(base[s])) for s in sizes])
        others = [r for r in rows if not _is_base(r)]
        # The causal-attention cost per pair is the part of T0 that a batch of several chunks
        # (or with decodes) does not pay; the cap keeps the remaining curve non-decreasing.
        cap = min((t0[i + 1] - t0[i]) / (_tri(sizes[i + 1]) - _tri(sizes[i]))
                  for i in range(len(sizes) - 1))
        coef, usable = self._fit_terms(others, sizes, t0, cap)
        (self.coef_causal_pair, self.coef_ctx_pair, self.coef_decode_seq,
         self.coef_decode_ctx, self.coef_decode_fixed) = (float(c) for c in coef)
        self.unfitted = [n for n, ok in zip(self.TERMS, usable, strict=True) if not ok]
        if self.unfitted:
            warnings.warn(f"{source}: no rows constrain {', '.join(self.unfitted)}; those terms "
                          "are 0 (add decode, mixed, multi-chunk or prefill_ctx rows)",
                          stacklevel=2)
        # L(S) = T0(S) - causal pairs of one S-token chunk: the rest of a prefill-only iteration.
        self._sizes = sizes
        self._lin = [t - self.coef_causal_pair * _tri(s) for s, t in zip(sizes, t0, strict=True)]
        self._tail_slope = (self._lin[-1] - self._lin[-2]) / (sizes[-1] - sizes[-2])

    @staticmethod
    def _fit_terms(others: Sequence[ProfileRow], sizes: list[int], t0: list[float],
                   cap: float) -> tuple[np.ndarray, np.ndarray]:
        """Non-negative least squares (relative error) of the terms in TERMS on the residual
        latency - T0(S_f) of the non-base rows."""
        coef = np.zeros(len(ProfileCostModel.TERMS))
        if not others:
            return coef, np.zeros(len(coef), dtype=bool)
        feats, resid = [], []
        for r in others:
            s = r.shape()
            n = s.forward_size
            causal = min(s.prefill_attn, _tri(s.prefill_tokens))
            scale = 1.0 / r.latency_s
            feats.append([-(_tri(n) - causal) * scale, (s.prefill_attn - causal) * scale,
                          s.decode_seqs * scale, s.decode_ctx * scale,
                          (1.0 if s.decode_seqs > 0 else 0.0) * scale])
            resid.append((r.latency_s - _interp(sizes, t0, 0.0, n)) * scale)
        # Imported here: scipy.optimize adds ~0.3 s to every simulation's start, and only profile
        # tables with mixed rows need it.
        from scipy.optimize import nnls

        a, b = np.asarray(feats), np.asarray(resid)
        norms = np.linalg.norm(a, axis=0)
        usable = norms > 0
        if usable.any():
            sol, _ = nnls(a[:, usable] / norms[usable], b)
            coef[usable] = sol / norms[usable]
        if coef[0] > cap:  # refit the others with the causal coefficient at its cap
            coef[0] = cap
            rest = usable.copy()
            rest[0] = False
            if rest.any():
                sol, _ = nnls(a[:, rest] / norms[rest], b - a[:, 0] * cap)
                coef[rest] = sol / norms[rest]
        return coef, usable

    @classmethod
    def from_csv(cls, path: Path | str) -> ProfileCostModel:
        return cls(read_profile_csv(path), source=str(path))

    def iteration_time(self, shape: BatchShape) -> float:
        # Hot path: one bisect and a few multiply-adds.
        p_tok = shape.prefill_tokens
        d_seq = shape.decode_seqs
        n = p_tok + d_seq
        if n <= 0:
            return 0.0
        t = _interp(self._sizes, self._lin, self._tail_slope, n)
        if p_tok > 0:
            attn = shape.prefill_attn
            causal = p_tok * (p_tok + 1) * 0.5
            if causal > attn:
                causal = attn
            t += causal * self.coef_causal_pair + (attn - causal) * self.coef_ctx_pair
        if d_seq > 0:
            t += (self.coef_decode_fixed + d_seq * self.coef_decode_seq
                  + shape.decode_ctx * self.coef_decode_ctx)
        return t

    @property
    def profiled_sizes(self) -> list[int]:
        return list(self._sizes)

    def __repr__(self) -> str:
        return (f"ProfileCostModel({self.source}, {len(self._sizes)} sizes "
                f"{self._sizes[0]}..{self._sizes[-1]})")
