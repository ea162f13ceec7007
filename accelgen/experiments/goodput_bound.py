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

- with ``RemainingWork`` (a run that serves every request it admits: no horizon, no iteration
  limit, no noise, a policy that rejects none once admitted, as the Oracle's), ``end`` is also at
  least ``now`` plus the work still to do: every token an admitted request has still to emit
  comes from an iteration of its own, which takes at least the cost model's
  ``min_token_iteration_time`` and holds that request's KV blocks (its prompt and the tokens
  before) beside the others' within the cache. So the iterations still to come are at least
  the longest request's remaining tokens and at least the remaining block-iterations over the
  cache's blocks. On an overloaded trace the span is mostly still to come when most requests
  are already lost; without this the bound would wait for it.

So the final goodput is at most ``(requests - lost) / (window x ceil((end bound - start) /
window))``: the numerator only falls and the denominator only grows as the run goes on. Each
comparison is the one ``metrics.per_request`` makes, on the same floats (a later token's time is
at least ``now``, and subtracting the same arrival or token time keeps the order), so a request
counted lost is never good at the end, and a candidate stopped by the bound could not have won.
The work still to do is a bound in exact arithmetic; it is taken a millionth short
(``WORK_MARGIN``), far beyond the rounding of the simulator's clock over any run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accelgen.core.kvcache import never_fits_reason
from accelgen.core.request import Request, Status
from accelgen.metrics import GOODPUT_WINDOW_S, goodput_windows

# Stop only when the bound is below the best by more than a float's rounding of the mean that
# ``metrics.summarize`` takes (the bound divides once; the summary sums and divides).
RELATIVE_SLACK = 1e-9
# The work still to do is taken this much short, relative to the end it bounds.
WORK_MARGIN = 1e-6
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

    def __reduce__(self) -> tuple[type[CannotWin], tuple[float, float, int]]:
        # (a search's processes send it back: an exception pickles its message alone)
        return CannotWin, (self.bound, self.now, self.lost)


def _block_sum(x: int, block_size: int) -> int:
    """sum(c // block_size for c in range(x + 1)) (0 for x < 0)."""
    if x < 0:
        return 0
    q, rem = divmod(x, block_size)
    return block_size * q * (q - 1) // 2 + q * (rem + 1)


@dataclass(frozen=True, slots=True)
class Checked:
    """One check of a run (``GoodputBound``): the bound on its final goodput, the clock, the
    requests lost by then."""

    bound: float
    now: float
    lost: int


def below(bound: float, best: float) -> bool:
    """A run whose goodput is at most ``bound`` cannot beat ``best``."""
    return bound < best * (1.0 - RELATIVE_SLACK)


def first_stop(checks: Sequence[Checked], best: float) -> CannotWin | None:
    """Where the run whose checks were ``checks`` stops when checked against ``best``: its
    first check below it (None: it runs to its end, or to where ``checks`` end)."""
    for c in checks:
        if below(c.bound, best):
            return CannotWin(c.bound, c.now, c.lost)
    return None


@dataclass(frozen=True, slots=True)
class RemainingWork:
    """What the bound prices the work still to do with (module docstring), per request id: the
    tokens it will emit (``core.request.served_output_len``), its prompt, and whether the
    simulator admits it (``never_fits_reason``); the cache's blocks and block size; the cost
    model's ``min_token_iteration_time``. Only for a run that serves every request it admits."""

    served: Sequence[int]
    prompt: Sequence[int]
    admitted: Sequence[bool]
    num_blocks: int
    block_size: int
    min_token_iteration_s: float
    unstarted: Sequence[int]  # block_iterations(rid, 0), worked out once

    @classmethod
    def of(cls, requests: Sequence[Request], served: Sequence[int], *, num_blocks: int,
           block_size: int, max_model_len: int, min_token_iteration_s: float) -> RemainingWork:
        """``served``: by request id."""
        n = len(requests)
        prompt, admitted = [0] * n, [False] * n
        for r in requests:
            rid = r.req_id
            prompt[rid] = r.prompt_len
            admitted[rid] = not never_fits_reason(r.prompt_len, int(served[rid]),
                                                  max_model_len=max_model_len,
                                                  num_blocks=num_blocks, block_size=block_size)
        lengths = [int(x) for x in np.asarray(served, dtype=np.int64)]
        unstarted = [_block_sum(p + t - 2, block_size) - _block_sum(p - 2, block_size)
                     for p, t in zip(prompt, lengths, strict=True)]
        return cls(lengths, prompt, admitted, num_blocks, block_size, min_token_iteration_s,
                   unstarted)

    def block_iterations(self, rid: int, emitted: int) -> int:
        """The KV blocks request ``rid`` holds summed over the iterations that emit its tokens
        after the first ``emitted`` (token j, from 1, comes from an iteration that holds at least
        the blocks of its prompt and the j - 2 tokens before: floor((prompt + j - 2) / block))."""
        p, bs = self.prompt[rid], self.block_size
        return _block_sum(p + self.served[rid] - 2, bs) - _block_sum(p + emitted - 2, bs)


@dataclass(slots=True)
class _Tracked:
    request: Request
    gaps_checked: int = 0  # token times already compared with their predecessor


class GoodputBound:
    """The simulator's check (``Simulator(check=...)``): called with the clock and the requests
    in arrival order, raises ``CannotWin`` once the bound on the final goodput is below
    ``best``."""

    def __init__(self, best: float, window: float = GOODPUT_WINDOW_S,
                 work: RemainingWork | None = None) -> None:
        self.best = best
        self.window = window
        self.work = work if work is not None and work.min_token_iteration_s > 0.0 else None
        self.lost = 0
        self._end = -math.inf  # the last completion of a served request so far
        self._end_work = -math.inf  # the end that the work still to do implies (``work``)
        self._arrived = 0  # requests (in arrival order) taken into ``_open``
        self._open: list[_Tracked] = []  # arrived, neither lost nor done and met
        self._lost_running: list[Request] = []  # lost, still to be served: their end extends
        # Every check's bound, in order: they do not depend on ``best``, so the same run checked
        # against another best stops at the first of them below it (``first_stop``).
        self.checks: list[Checked] = []

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
        if self.work is not None:
            self._end_work = max(self._end_work, self._work_end(now, still, running))
        start = requests[0].arrival
        # (no completion yet: one window, as for a span of zero)
        windows = goodput_windows(start, max(self._end, self._end_work, start), self.window)
        return (n - self.lost) / (self.window * windows)

    def _work_end(self, now: float, still: list[_Tracked], running: list[Request]) -> float:
        """A lower bound on the run's last completion from the work its admitted requests have
        still to do (``RemainingWork``): -inf when none has any."""
        work = self.work
        assert work is not None
        served, admitted, unstarted = work.served, work.admitted, work.unstarted
        area = longest = 0
        for r in itertools.chain((t.request for t in still), running):
            rid = r.req_id
            if not admitted[rid]:  # (arrived, not yet taken in: the simulator rejects it)
                continue
            emitted = r.num_output_tokens
            steps = served[rid] - emitted
            if steps <= 0:
                continue
            area += work.block_iterations(rid, emitted) if emitted else unstarted[rid]
            if steps > longest:
                longest = steps
        if not longest:
            return -math.inf
        iterations = max(longest, -(-area // work.num_blocks))
        return (now + iterations * work.min_token_iteration_s) * (1.0 - WORK_MARGIN)

    def __call__(self, now: float, requests: Sequence[Request]) -> None:
        bound = self.bound(now, requests)
        self.checks.append(Checked(bound, now, self.lost))
        if below(bound, self.best):
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
