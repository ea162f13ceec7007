"""Capacity by search (SPEC 13, "Engine capacity with a resolution"): per (system, repeat) the
rates are placed where that system's knee is, not on a fixed grid.

The method of ``bench-serve --find-capacity`` (``accelgen.serving.capacity``), with the probe
left to the caller (a replay inside vLLM, or a simulation) and its steps stated as fractions:
from a start rate the rate grows by ``factor`` while the target is met and shrinks by it while
it is missed (the coarse pass), until one probe meets and another misses; then the bracket is
bisected (geometric mean) until its upper end is within ``tolerance`` of its lower end. The
first repeat of a system starts at ``start`` with the coarse factor; a later repeat starts at the
capacity the previous repeat found, with the fine factor, since repeats of one system differ
by a few per cent, not by a factor (its later steps, while still not bracketed, take the
coarse factor: a repeat far from the previous one is not chased in small steps). Rates are kept
inside ``[floor, ceiling]``: a miss at the floor or a meet at the ceiling ends the search with a
bound.

**Capacity** of a search: its probes' request-level attainment against their rates through
``metrics.sweep_capacity`` (the highest rate meeting the target, interpolated towards the next
probed rate), so a bracketed search gives a value inside its final bracket, and the same
definition as the fixed-grid sweeps of regime ``capacity``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field, PositiveInt

from accelgen import metrics
from accelgen.core.specs import StrictModel


class SearchSpec(StrictModel):
    """How a capacity search places its rates (module docstring)."""

    coarse_factor: float = Field(1.5, gt=1.0)  # the first repeat's step until bracketed
    fine_factor: float = Field(1.12, gt=1.0)  # a later repeat's first step
    tolerance: float = Field(0.1, gt=0.0)  # stop once misses <= meets x (1 + tolerance)
    max_probes: PositiveInt = 7  # per (system, repeat)
    # The simulator's first probe, x the plan's capacity estimate (the engine's first probe of a
    # system is the simulator's capacity of that system with the engine's noise, seed 0).
    start_load: float = Field(2.0, gt=0.0)
    # Rates are kept within [min_load, max_load] x the plan's capacity estimate.
    min_load: float = Field(0.25, gt=0.0)
    max_load: float = Field(32.0, gt=0.0)


def round_rate(rate: float) -> float:
    """A probed rate, to 3 significant digits (the trace and directory names carry it)."""
    return float(f"{rate:.3g}")


@dataclass(slots=True)
class Probe:
    rate: float
    attainment: float
    met: bool


@dataclass(slots=True)
class CapacitySearch:
    """One (system, repeat)'s search: ``next_rate`` says where to probe (None: done), ``record``
    takes the probe's attainment."""

    start: float
    factor: float  # the first step's
    coarse: float  # every later step's until bracketed
    tolerance: float
    max_probes: int
    floor: float
    ceiling: float
    target: float
    probes: list[Probe] = field(default_factory=list)
    _next: float | None = None
    _stop: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.ceiling:
            raise ValueError(f"need 0 < floor <= ceiling, got {self.floor}, {self.ceiling}")
        self._next = round_rate(min(max(self.start, self.floor), self.ceiling))

    @property
    def done(self) -> bool:
        return self._next is None

    @property
    def stopped_by(self) -> str:
        """Why the search ended: ``bracketed``, ``max_probes``, ``floor``, ``ceiling``."""
        return self._stop

    def next_rate(self) -> float | None:
        return self._next

    def bracket(self) -> tuple[float | None, float | None]:
        """(highest rate that met the target, lowest rate above it that missed)."""
        met = [p.rate for p in self.probes if p.met]
        low = max(met) if met else None
        miss = [p.rate for p in self.probes if not p.met and (low is None or p.rate > low)]
        return low, (min(miss) if miss else None)

    def record(self, rate: float, attainment: float) -> None:
        if self._next is None or rate != self._next:
            raise ValueError(f"probe at {rate} recorded, {self._next} was asked for")
        met = math.isfinite(attainment) and attainment >= self.target
        self.probes.append(Probe(rate, attainment, met))
        self._next = self._advance(rate, met)

    def _advance(self, rate: float, met: bool) -> float | None:
        low, high = self.bracket()
        if low is not None and high is not None and high <= low * (1.0 + self.tolerance):
            return self._end("bracketed")
        if len(self.probes) >= self.max_probes:
            return self._end("max_probes")
        if low is not None and high is not None:
            nxt = round_rate(math.sqrt(low * high))
            if nxt in (low, high):  # the 3-digit grid cannot split it further
                return self._end("bracketed")
            return nxt
        f = self.factor if len(self.probes) == 1 else self.coarse
        if low is None:  # only misses so far
            if rate <= self.floor:
                return self._end("floor")
            return round_rate(max(rate / f, self.floor))
        if rate >= self.ceiling:
            return self._end("ceiling")
        return round_rate(min(rate * f, self.ceiling))

    def _end(self, why: str) -> float | None:
        self._stop = why
        return None

    def capacity(self) -> tuple[float, str]:
        """``metrics.sweep_capacity`` over the probes: (rate, where)."""
        if not self.probes:
            return math.nan, "no_data"
        return metrics.sweep_capacity(np.array([p.rate for p in self.probes]),
                                      np.array([p.attainment for p in self.probes]),
                                      self.target)

    def as_dict(self) -> dict[str, object]:
        cap, where = self.capacity()
        low, high = self.bracket()
        return {"start": self.start, "factor": self.factor, "stopped_by": self._stop,
                "capacity_rps": cap, "where": where, "bracket": [low, high],
                "probes": [{"rate": p.rate, "attainment": p.attainment, "met": p.met}
                           for p in self.probes]}


def new_search(spec: SearchSpec, start: float, estimate: float, target: float, *,
               first: bool) -> CapacitySearch:
    """A (system, repeat)'s search from ``start``: the coarse factor for a system's first
    repeat, the fine one for the next repeats."""
    return CapacitySearch(start=start, factor=spec.coarse_factor if first else spec.fine_factor,
                          coarse=spec.coarse_factor, tolerance=spec.tolerance, max_probes=spec.max_probes,
                          floor=round_rate(spec.min_load * estimate),
                          ceiling=round_rate(spec.max_load * estimate), target=target)


def next_start(search: CapacitySearch, fallback: float) -> float:
    """Where the next repeat starts: this repeat's capacity (its bound when not bracketed)."""
    cap, _ = search.capacity()
    if math.isfinite(cap) and cap > 0:
        return cap
    return search.floor if search.probes else fallback
