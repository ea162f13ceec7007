"""Measurements, the profile CSV they become, and the pivot read from them.

Timings on a shared machine are noisy, so every shape is measured in several interleaved passes
(pass 1 over all shapes, then pass 2, ...): a burst of load from another process then hits one
sample of many shapes rather than every sample of one shape, and the median discards it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accelgen.core.iteration import Pivot
from accelgen.core.specs import Deployment
from accelgen.costmodel.pivot import DEFAULT_MAX_SIZE, SweepPoint, find_pivot, pivot_from_sweep
from accelgen.costmodel.table import COLUMNS, ProfileCostModel, ProfileRow
from accelgen.profiling.grid import Shape

EXTRA_COLUMNS = ("latency_min_s", "latency_max_s", "repeats")


@dataclass(slots=True)
class Measurement:
    shape: Shape
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def row(self) -> ProfileRow:
        return self.shape.row(self.median)


def interleaved(shapes: Sequence[Shape], run_once: Callable[[Shape], float], repeats: int,
                warmup: int = 1, progress: Callable[[str], None] | None = None
                ) -> list[Measurement]:
    """``warmup`` untimed passes, then ``repeats`` timed passes over all shapes."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = [Measurement(s) for s in shapes]
    for p in range(warmup + repeats):
        for m in out:
            t = run_once(m.shape)
            if not (math.isfinite(t) and t > 0):
                raise RuntimeError(f"{m.shape}: measured latency {t}")
            if p >= warmup:
                m.samples.append(t)
        if progress is not None:
            tag = "warm-up" if p < warmup else f"{p - warmup + 1}/{repeats}"
            progress(f"pass {tag} done ({len(shapes)} shapes)")
    return out


def write_profile(path: Path | str, measurements: Sequence[Measurement],
                  metadata: dict[str, object]) -> Path:
    """The profile CSV (``accelgen.costmodel.table`` format) plus min/max/repeats columns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {k}: {v}" for k, v in metadata.items()]
    lines.append(",".join((*COLUMNS, *EXTRA_COLUMNS)))
    for m in measurements:
        r = m.row()
        lines.append(",".join([
            r.kind, str(r.prefill_tokens), str(r.prefill_seqs), str(r.prefill_ctx),
            str(r.decode_seqs), str(r.decode_ctx), f"{r.latency_s:.9g}",
            f"{min(m.samples):.9g}", f"{max(m.samples):.9g}", str(len(m.samples))]))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


@dataclass(frozen=True, slots=True)
class PivotReport:
    """S_pf / T_pf as the simulator computes them from the table (``model``), and the same rule
    applied to the measured fresh-prefill points alone (``measured``)."""

    model: Pivot
    measured: Pivot
    tolerance: float
    step: int
    max_size: int
    curve: list[SweepPoint]  # measured fresh-prefill points, by size

    def lines(self) -> list[str]:
        return [f"S_pf = {self.model.s_pf} tokens, T_pf = {self.model.t_pf * 1e3:.3f} ms "
                f"(interpolated table, sizes {self.step}..{self.max_size} step {self.step}, "
                f"tolerance {self.tolerance:g})",
                f"profiled points only: S_pf = {self.measured.s_pf}, "
                f"T_pf = {self.measured.t_pf * 1e3:.3f} ms"]


def pivot_max_size(max_model_len: int, block_size: int) -> int:
    """The sweep range of ``accelgen.costmodel.factory.deployment_pivot``."""
    size = min(DEFAULT_MAX_SIZE, max_model_len)
    size -= size % block_size
    return max(size, block_size)


def pivot_report(rows: Sequence[ProfileRow], max_model_len: int, block_size: int = 32,
                 tolerance: float | None = None) -> PivotReport:
    """The shared pivot rule on a profile, with the simulator's sweep range and step."""
    tol = Deployment().pivot_tolerance if tolerance is None else tolerance
    cost = ProfileCostModel(rows, source="<profile>")
    max_size = pivot_max_size(max_model_len, block_size)
    model = find_pivot(cost, tolerance=tol, step=block_size, max_size=max_size)
    base: dict[int, list[float]] = {}
    for r in rows:
        if r.kind == "prefill" and r.prefill_seqs == 1 and r.prefill_ctx == 0:
            base.setdefault(r.prefill_tokens, []).append(r.latency_s)
    curve = [SweepPoint(s, statistics.fmean(base[s])) for s in sorted(base)]
    measured = pivot_from_sweep(curve, tol)
    return PivotReport(model, measured, tol, block_size, max_size, curve)
