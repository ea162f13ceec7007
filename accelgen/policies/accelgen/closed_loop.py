"""The closed loop (SPEC 13; ``docs/accelgen.md``, *Closed loop*): every measured iteration corrects
the cost model the decision plans with and feeds the recent distribution of its errors; the decision
then plans against its SLOs shrunk by the error quantile of the attainment it aims for. Plain Python,
run once per iteration (``AccelGenPolicy.on_step_end``), nothing here imports numba."""

from __future__ import annotations

import math

import numpy as np

# Two evaluations of one formula (the decision's compiled one, the simulator's) may round apart;
# a ratio this close to 1 is an exact prediction.
EXACT = 1e-9


class ClosedLoop:
    """The scale of every latency the decision predicts, ``correction x (1 + margin)``:

    - ``correction``: an exponentially weighted mean of measured / predicted (weight ``weight`` per
      iteration; warm-started at 1, the calibration), so that drift is followed and old steps
      forgotten;
    - ``margin``: the ``target`` quantile of the last ``window`` relative errors of the corrected
      model (measured / (correction x predicted) - 1), at least 0: an iteration planned within
      SLO / (1 + margin) by the corrected model meets its SLO with about that probability.

    With exact predictions the ratio is 1, the correction stays 1, every error is 0 and the scale is
    exactly 1: the open loop's plans."""

    __slots__ = ("_errors", "_i", "_n", "_since", "correction", "every", "margin", "observed", "target",
                 "weight")

    def __init__(self, target: float, weight: float, window: int, every: int = 8) -> None:
        self.target, self.weight, self.every = target, weight, every
        self.correction, self.margin = 1.0, 0.0
        self._errors = np.zeros(window)
        self._i = self._n = self._since = 0
        self.observed = 0  # iterations taken in

    @property
    def scale(self) -> float:
        return self.correction * (1.0 + self.margin)

    def observe(self, predicted: float, measured: float) -> bool:
        """One iteration: the cost model's (uncorrected) latency of its batch and the latency it
        took. Returns whether the scale changed."""
        if not (predicted > 0.0 and measured > 0.0 and math.isfinite(predicted)
                and math.isfinite(measured)):
            return False
        before = self.scale
        ratio = measured / predicted
        if abs(ratio - 1.0) <= EXACT:
            ratio = 1.0
        error = ratio / self.correction - 1.0
        self.correction += self.weight * (ratio - self.correction)
        errors, n = self._errors, len(self._errors)
        errors[self._i] = error
        self._i = (self._i + 1) % n
        self._n = min(self._n + 1, n)
        self.observed += 1
        self._since += 1
        # (a quantile of the window every few iterations: a few microseconds each time)
        if self._since >= self.every or self._n < self.every:
            self._since = 0
            m = self._n
            k = min(max(math.ceil(self.target * m) - 1, 0), m - 1)
            q = float(np.partition(errors[:m], k)[k])
            self.margin = q if q > 0.0 else 0.0
        return self.scale != before
