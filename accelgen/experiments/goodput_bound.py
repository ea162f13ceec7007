"""An upper bound on a running simulation's final goodput, to stop an Oracle candidate that
cannot win (``oracle_search``).

Goodput (``metrics.summarize``, ``goodput_rps``) is the requests that met their SLOs over the
run's span in whole windows: ``good / (window x ceil((end - start) / window))``, where ``start``
is the first arrival and ``end`` the last completion of a served request. While the simulation
runs, at time ``now``:

- a request is **lost** when ``metrics.per_request`` cannot find it met whatever comes next: it
  was rejected; it is online and its first token came late, or has not come and ``now`` is past
  its TTFT SLO (the token will come at ``now`` or later, or never), or a gap between two of its
  tokens exceeded its TBT SLO, or it is still running and ``now`` is past its last token by more
  than its TBT SLO; it is offline and finished late, or is not done and ``now`` is past its JCT
  SLO. Every other request (not yet arrived included) may still be good;
- ``end`` is at least the last completion so far (of a lost request too: a late request
  still extends the span when it is served).

So the final goodput is at most ``(requests - lost) / (window x ceil((end so far - start) /
window))``: the numerator only falls and the denominator only grows as the run goes on. Each
comparison is the one ``metrics.per_request`` makes, on the same floats (a later token's time is
at least ``now``, and subtracting the same arrival or token time keeps the order), so a request
counted lost is never good at the end, and a candidate stopped by the bound could not have won.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from accelgen.core.request import Request, Status
from accelgen.metrics import GOODPUT_WINDOW_S, goodput_windows

# Stop only when the bound is below the best by more than a float's rounding of the mean that
# ``metrics.summarize`` takes (the bound divides once; the summary sums and divides).
RELATIVE_SLACK = 1e-9
_SERVED = (Status.FINISHED, Status.CUT)
_NEVER_SERVED = (Status.REJECTED, Status.UNFINISHED)


class CannotWin(Exception):
    """Raised by ``GoodputBound`` inside the simulation: the run's goodput cannot beat ``best``."""

    def __init__(self, bound: float, now: float, lost: int) -> None:
        super().__init__(f"goodput at most {bound:.6g} req/s (at {now:.6g} s, {lost} requests "
                         "lost)")
        self.bound = bound
        self.now = now
        self.lost = lost


@dataclass(slots=True)
class _Tracked:
    request: Request
    gaps_checked: int = 0  # token times already compared with their predecessor


class GoodputBound:
    """The simulator's check (``Simulator(check=...)``): called with the clock and the requests
    in arrival order, raises ``CannotWin`` once the bound on the final goodput is below
    ``best``."""

    def __init__(self, best: float, window: float = GOODPUT_WINDOW_S) -> None:
        self.best = best
        self.window = window
        self.lost = 0
        self._end = -math.inf  # the last completion of a served request so far
        self._arrived = 0  # requests (in arrival order) taken into ``_open``
        self._open: list[_Tracked] = []  # arrived, neither lost nor done and met
        self._lost_running: list[Request] = []  # lost, still to be served: their end extends

    def bound(self, now: float, requests: Sequence[Request]) -> float:
        """Update the lost requests and the span to ``now``; the bound on the final goodput."""
        n = len(requests)
        while self._arrived < n and requests[self._arrived].arrival <= now:
            self._open.append(_Tracked(requests[self._arrived]))
            self._arrived += 1
        running: list[Request] = []
        for r in self._lost_running:
            if r.status in _SERVED:
                self._end = max(self._end, r.finish_time)
            elif r.status not in _NEVER_SERVED:
                running.append(r)  # (still to be served)
        still: list[_Tracked] = []
        for tracked in self._open:
            r = tracked.request
            if r.status in _SERVED:
                self._end = max(self._end, r.finish_time)
            verdict = self._online(tracked, now) if r.online else self._offline(r, now)
            if verdict is None:
                still.append(tracked)
            elif not verdict:
                self.lost += 1
                if r.status not in _SERVED and r.status not in _NEVER_SERVED:
                    running.append(r)
        self._open = still
        self._lost_running = running
        if not n:
            return math.inf
        start = requests[0].arrival
        # (no completion yet: one window, as for a span of zero)
        windows = goodput_windows(start, max(self._end, start), self.window)
        return (n - self.lost) / (self.window * windows)

    def __call__(self, now: float, requests: Sequence[Request]) -> None:
        bound = self.bound(now, requests)
        if bound < self.best * (1.0 - RELATIVE_SLACK):
            raise CannotWin(bound, now, self.lost)

    @staticmethod
    def _offline(r: Request, now: float) -> bool | None:
        """True: met for good; False: lost; None: not known yet."""
        if r.status in _SERVED:
            return r.finish_time - r.arrival <= r.jct_slo
        if r.status in _NEVER_SERVED:
            return False
        return None if now - r.arrival <= r.jct_slo else False

    @staticmethod
    def _online(tracked: _Tracked, now: float) -> bool | None:
        r = tracked.request
        if r.status in _NEVER_SERVED:
            return False
        times = r.token_times
        k = len(times)
        if k == 0:
            return None if now - r.arrival <= r.ttft_slo else False
        if tracked.gaps_checked == 0:
            if not r.first_token_time - r.arrival <= r.ttft_slo:
                return False
            tracked.gaps_checked = 1
        slo = r.tbt_slo
        for i in range(tracked.gaps_checked, k):
            if not times[i] - times[i - 1] <= slo:
                return False
        tracked.gaps_checked = k
        if r.status in _SERVED:
            return True
        return None if now - times[k - 1] <= slo else False
