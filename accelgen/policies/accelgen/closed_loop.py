"""The closed loop (SPEC 13; ``docs/accelgen.md``, *Closed loop*): every measured iteration corrects
the cost model the decision plans with and feeds the recent distribution of its errors; the decision
then plans against its SLOs shrunk by the margin that keeps a whole request on time with the
attainment it aims for. Plain Python, run once per iteration (``AccelGenPolicy.on_step_end``),
nothing here imports numba; a run of decode steps decided in one compiled call takes in its steps
with the same arithmetic there (``loop_step.take_in``, on ``state``)."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from accelgen.policies.accelgen.state import EXACT_RATIO, IQR_SD, LOOP_STATE

_NORMAL = NormalDist()
# (``ClosedLoop.state``'s order: the record a compiled decode run takes in steps with)
assert LOOP_STATE.names == ("correction", "margin", "median", "sd", "quantile", "z", "lsum", "weight",
                            "target", "i", "n", "since", "observed", "ln", "every")


class ClosedLoop:
    """The scale of every latency the decision predicts, ``correction x (1 + margin)``:

    - ``correction``: an exponentially weighted mean of measured / predicted (weight ``weight`` per
      iteration; warm-started at 1, the calibration), so that drift is followed and old steps
      forgotten;
    - ``margin``: a request meets its SLO only if its first token and every next one do
      (``metrics``), so each of its ``tokens + 1`` deadlines may be missed with probability
      ``(1 - target) / (tokens + 1)`` at most, ``tokens`` the mean output length of the last
      ``window`` online requests finished (before the first, the iterations seen so far, which no
      running request has outlived). The margin, a decode's iteration, is that quantile of the
      corrected model's relative error (measured / (correction x predicted)), read from a
      lognormal fit of the last ``window`` errors (median and interquartile range of their logs:
      such a quantile lies far beyond what a window of a few hundred shows), at least 0. The fit
      itself goes to the decision too (``scales``): a prompt's first token, a deadline over N
      iterations, is planned with the quantile of their sum (``rank.prompt_stretch``), and a prompt
      at risk borrows its decodes' margin (``rank.borrow``).

    With exact predictions the ratio is 1, the correction stays 1, every error is 0 and the scale is
    exactly 1: the open loop's plans."""

    __slots__ = ("_errors", "_i", "_lengths", "_li", "_ln", "_lsum", "_n", "_since", "_z",
                 "correction", "every", "margin", "median", "observed", "quantile", "sd",
                 "target", "weight")

    def __init__(self, target: float, weight: float, window: int, every: int = 8) -> None:
        self.target, self.weight, self.every = target, weight, every
        self.correction, self.margin = 1.0, 0.0
        self.median = self.sd = 0.0  # the fit of the log errors
        self._errors = np.zeros(window)  # log errors of the corrected model
        self._i = self._n = self._since = 0
        self._lengths = np.zeros(window)  # output tokens of the last online requests finished
        self._li = self._ln = 0
        self._lsum = 0.0  # (their sum)
        self.observed = 0  # iterations taken in
        self.quantile = target  # the per-iteration quantile the margin was last read at
        self._z = _NORMAL.inv_cdf(target)  # (its standard normal quantile)

    @property
    def errors(self) -> np.ndarray:
        """The window of log errors (a compiled decode run takes in its steps there: ``state``)."""
        return self._errors

    def state(self) -> tuple[float | int, ...]:
        """What a compiled decode run takes in steps with (``loop_step.take_in``), in the order of
        ``state.LoopState``'s fields; ``set_state`` takes it back."""
        return (self.correction, self.margin, self.median, self.sd, self.quantile, self._z,
                self._lsum, self.weight, self.target, self._i, self._n, self._since, self.observed,
                self._ln, self.every)

    def set_state(self, values: tuple[Any, ...]) -> None:
        """The state a compiled decode run left (``state``'s order; the window was written in
        place)."""
        (self.correction, self.margin, self.median, self.sd, self.quantile, self._z, self._lsum,
         self.weight, self.target, self._i, self._n, self._since, self.observed, self._ln,
         self.every) = values

    @property
    def scale(self) -> float:
        return self.correction * (1.0 + self.margin)

    @property
    def scales(self) -> tuple[float, float, float, float, float, float]:
        """What the decision plans with (``Workspace.set_scales``): the correction, the decodes' TBT
        shrink, the fit (median, spread, a deadline's quantile) and the risk."""
        return (self.correction, 1.0 / (1.0 + self.margin), self.median, self.sd, self._z,
                1.0 - self.target if self.sd > 0.0 else 0.0)

    @property
    def tbt_shrink(self) -> float:
        """An online decode's TBT SLO x this is what its iteration is planned within."""
        return 1.0 / (1.0 + self.margin)

    @property
    def tokens(self) -> float:
        """The iterations a request lives through, as the margin counts them."""
        return self._tokens(self.observed)

    def _tokens(self, observed: int) -> float:
        if self._ln:
            return self._lsum / self._ln
        return float(max(observed, 1))

    def at_rest(self) -> bool:
        """Whether exact predictions leave the plan as it is: no correction, no margin, a fit of
        zero errors (``observe`` of a ratio of 1 then changes nothing the decision reads)."""
        return (self.correction == 1.0 and self.margin == 0.0 and self.median == 0.0
                and self.sd == 0.0)

    def observe_exact(self, n: int) -> None:
        """``n`` iterations predicted exactly, taken in while ``at_rest``: the state ``n`` calls
        of ``observe`` with a ratio of 1 leave (zero errors into the window; the fits on their
        schedule, of which only the last one's quantile remains: at rest every fit is of
        zero median and spread, as the window's quartiles stay zero)."""
        size = len(self._errors)
        since, count, observed, last_fit = self._since, self._n, self.observed, 0
        for _ in range(n):
            count = count + 1 if count < size else size
            observed += 1
            since += 1
            if since >= self.every or count < self.every:
                since, last_fit = 0, observed
        if n >= size:
            self._errors[:] = 0.0
        else:
            end = self._i + n
            self._errors[self._i:min(end, size)] = 0.0
            self._errors[:max(end - size, 0)] = 0.0
        self._i = (self._i + n) % size
        self._n, self._since, self.observed = count, since, observed
        if last_fit:
            self._fit(last_fit)

    def finished(self, output_tokens: int) -> None:
        """An online request finished with ``output_tokens`` tokens (0: never started, not counted)."""
        if output_tokens > 0:
            self._lsum += output_tokens - float(self._lengths[self._li])
            self._lengths[self._li] = output_tokens
            self._li = (self._li + 1) % len(self._lengths)
            self._ln = min(self._ln + 1, len(self._lengths))

    def observe(self, predicted: float, measured: float) -> bool:
        """One iteration: the cost model's (uncorrected) latency of its batch and the latency it
        took. Returns whether the correction or the margin changed."""
        if not (predicted > 0.0 and measured > 0.0 and math.isfinite(predicted)
                and math.isfinite(measured)):
            return False
        before = (self.correction, self.margin, self.median, self.sd)
        ratio = measured / predicted
        if abs(ratio - 1.0) <= EXACT_RATIO:
            ratio = 1.0
        error = math.log(ratio / self.correction)
        self.correction += self.weight * (ratio - self.correction)
        errors, n = self._errors, len(self._errors)
        errors[self._i] = error
        self._i = (self._i + 1) % n
        self._n = min(self._n + 1, n)
        self.observed += 1
        self._since += 1
        # (a fit of the window every few iterations: a partition, a few microseconds; the
        # compiled take-in of a decode run's steps, ``loop_step.take_in``, repeats this)
        if self._since >= self.every or self._n < self.every:
            self._since = 0
            self._fit(self.observed)
        return (self.correction, self.margin, self.median, self.sd) != before

    def _fit(self, observed: int) -> None:
        """Fit the window (its last ``_n`` errors); the quantile from the request length, as
        ``tokens`` counts it after ``observed`` iterations."""
        m = self._n
        lo, mid, hi = (m - 1) // 4, (m - 1) // 2, (3 * (m - 1)) // 4
        e = np.partition(self._errors[:m], (lo, mid, hi))
        median, sd = float(e[mid]), float(e[hi] - e[lo]) / IQR_SD
        # (a request's deadlines: its first token's and each next token's)
        q = 1.0 - (1.0 - self.target) / (max(self._tokens(observed), 1.0) + 1.0)
        if q != self.quantile:
            self.quantile, self._z = q, _NORMAL.inv_cdf(q)
        self.median, self.sd = median, sd
        margin = math.expm1(median + self._z * sd)
        self.margin = margin if margin > 0.0 else 0.0
