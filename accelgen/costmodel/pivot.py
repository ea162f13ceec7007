"""Pivot forward size S_pf (SPEC section 3) and the largest forward size that fits a time.

The paper: "as the forward size increases, throughput improves and nearly saturates [...]. The
throughput increase becomes less than 3 % beyond this value" (pivot forward size). The rule here:
sweep prefill-only forward sizes S = step, 2 step, ..., max_size (one request, no prior context,
as the paper's measurement); throughput is S / T(S) tokens/s; S_pf is the smallest S beyond which
no larger size in the sweep improves throughput by more than ``tolerance``:

    max_{S' >= S} thr(S') <= (1 + tolerance) * thr(S).

On a curve that rises and then flattens (or declines, as attention grows quadratically) this is
"within tolerance of the plateau maximum". Looking only at larger sizes keeps the rule sensible
on measured, non-monotone curves (wave-quantisation bumps).
"""

from __future__ import annotations

from dataclasses import dataclass

from accelgen.core.iteration import Pivot
from accelgen.costmodel.base import CostModel

# The paper's reported pivots (section 4.2), keyed by default deployment name. Shown beside the
# computed values, never used in computation.
PAPER_PIVOTS: dict[str, int] = {"opt-13b": 768, "opt-175b": 1280}

DEFAULT_MAX_SIZE = 8192  # the paper's forward-size sweep went up to 7168


@dataclass(frozen=True, slots=True)
class SweepPoint:
    size: int
    time_s: float

    @property
    def throughput(self) -> float:
        return self.size / self.time_s


def sweep(cost: CostModel, step: int = 32, max_size: int = DEFAULT_MAX_SIZE) -> list[SweepPoint]:
    if step <= 0 or max_size < step:
        raise ValueError(f"need 0 < step <= max_size, got step={step}, max_size={max_size}")
    return [SweepPoint(s, cost.forward_time(s)) for s in range(step, max_size + 1, step)]


def pivot_from_sweep(points: list[SweepPoint], tolerance: float = 0.03) -> Pivot:
    if not points:
        raise ValueError("empty forward-size sweep")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    for p in points:
        if not p.time_s > 0:
            raise ValueError(f"forward time at size {p.size} is {p.time_s}; must be > 0")
    # Suffix maxima: the best throughput reachable at or beyond each size.
    best_after = [0.0] * len(points)
    best = 0.0
    for i in range(len(points) - 1, -1, -1):
        best = max(best, points[i].throughput)
        best_after[i] = best
    for p, b in zip(points, best_after, strict=True):
        if b <= (1.0 + tolerance) * p.throughput:
            return Pivot(s_pf=p.size, t_pf=p.time_s)
    raise AssertionError("unreachable: the last point always satisfies the rule")


def find_pivot(cost: CostModel, tolerance: float = 0.03, step: int = 32,
               max_size: int = DEFAULT_MAX_SIZE) -> Pivot:
    """Pivot of ``cost`` on multiples of ``step`` (use the KV block size) up to ``max_size``."""
    return pivot_from_sweep(sweep(cost, step, max_size), tolerance)


def budget_for_time(cost: CostModel, t: float, limit: int = 1 << 24) -> int:
    """Largest forward size S with ``forward_time(S) <= t`` (0 if not even one token fits).

    Binary search; relies on forward_time being non-decreasing in S (true of both cost models).
    ``limit`` caps the answer for very loose times.
    """
    if cost.forward_time(1) > t:
        return 0
    lo, hi = 1, 2
    while hi < limit and cost.forward_time(hi) <= t:
        lo, hi = hi, hi * 2
    hi = min(hi, limit)
    if cost.forward_time(hi) <= t:
        return hi
    while hi - lo > 1:  # invariant: T(lo) <= t < T(hi)
        mid = (lo + hi) // 2
        if cost.forward_time(mid) <= t:
            lo = mid
        else:
            hi = mid
    return lo
