"""Earliest-deadline-first with a Sarathi-style token budget (a reference beyond the paper).

Every unfinished request has the deadline of its next token: arrival + TTFT SLO before its first
token, previous token + TBT SLO after it (offline requests: arrival + JCT SLO). Each iteration takes
candidates (running and waiting alike) in ascending deadline until the forward reaches the budget
(S_pf by default; decodes count too, so the forward never exceeds it): a decode takes one token, a
prompt a chunk of ``min(remaining, budget left, free KV)``. A waiting request is admitted only when
its whole remaining prompt fits in free KV (blocks are still allocated per chunk). A running request
that needs a block recomputes the running request with the latest deadline outside the batch (only
ones due later than itself); a new prompt never preempts. Unlike AccelGen there is no urgency test, no
SLO-derived budget and no two-resource packing: it isolates what deadline order alone buys.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections import deque

from pydantic import PositiveInt

from accelgen.core.iteration import Pivot
from accelgen.core.policy import (
    Decision,
    Policy,
    PolicyParams,
    SchedulerView,
    engine_seats,
    engine_token_budget,
)
from accelgen.core.request import Request, Status
from accelgen.policies.common import BatchBuilder, OrderedWaiting

# Two running requests whose last tokens came together keep the order of their next deadlines
# (that time plus each one's TBT SLO) at every later clock when their TBT SLOs are equal (then by
# req_id) or further apart than this: far more than the rounding of a clock a simulation reaches
# (a unit in the last place of 1e9 s is 1.2e-7 s).
ORDER_GAP_S = 1e-6
# A running request's deadline changes only when it emits a token, so only in an iteration of a
# recent decision: the last one in the simulator, the last two with vLLM's async scheduling
# (a step in flight when the next one is decided: its tokens come back after that decision).
RECENT_DECISIONS = 2
# Re-keyed one by one only while the recent decisions' requests times this are fewer than the
# running ones: each costs a few bisections, where sorting costs a key and a comparison or two.
REKEY_SHARE = 4


class EDFParams(PolicyParams):
    token_budget: PositiveInt | None = None  # default: the pivot forward size S_pf
    max_num_seqs: PositiveInt = 256


def next_deadline(r: Request) -> float:
    """Absolute deadline of the request's next output token."""
    if not r.online:
        return r.arrival + r.jct_slo
    if r.num_output_tokens == 0:
        return r.arrival + r.ttft_slo
    return r.last_token_time + r.tbt_slo


Keyed = tuple[float, int, Request]  # (next deadline, req_id, request)


class OrderedRunning:
    """The running requests sorted by ``(next_deadline, req_id)``, kept across decisions: a
    large running set (hundreds of requests beside a token budget of a few dozen) is not
    re-keyed and re-sorted at every decision, only the requests of the recent decisions
    (``RECENT_DECISIONS``) and the ones EDF preempted. Where those are a large share of the
    running set (``REKEY_SHARE``) the set is sorted anew, which costs less. ``sync`` checks
    the count against ``view.running`` and sorts anew when requests left or joined another
    way."""

    __slots__ = ("_keys", "_recent", "entries", "valid")

    def __init__(self) -> None:
        self.entries: list[Keyed] = []
        self._keys: dict[int, tuple[float, int]] = {}
        self._recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)
        self.valid = False  # False: sorted anew at the next sync

    def decided(self, decision: Decision) -> None:
        """Record a decision: the requests it scheduled or preempted change."""
        self._recent.append(decision)

    def sync(self, view: SchedulerView) -> list[Keyed]:
        """The running requests of ``view`` in deadline order."""
        entries, keys = self.entries, self._keys
        running = view.running
        changed = sum(len(d.scheduled) + len(d.preempted) for d in self._recent)
        if self.valid and changed * REKEY_SHARE < len(running):
            if not keys:  # (sorted anew last time: the keys are read off the order)
                keys.update((rid, (dl, rid)) for dl, rid, _ in entries)
            for d in self._recent:
                for r in itertools.chain((r for r, _ in d.scheduled), d.preempted):
                    old = keys.pop(r.req_id, None)
                    if old is not None:
                        del entries[bisect_left(entries, old)]
                    if r.status is Status.RUNNING:
                        entry = (next_deadline(r), r.req_id, r)
                        insort(entries, entry)
                        keys[r.req_id] = entry[:2]
            if len(entries) == len(running):
                return entries
        entries[:] = sorted((next_deadline(r), r.req_id, r) for r in running)
        keys.clear()
        self.valid = True
        return entries


class EDFPolicy(Policy):
    name = "edf"
    Params = EDFParams
    params: EDFParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        # The waiting requests in deadline order: a waiting request's deadline does not change
        # while it waits (its next token's deadline is fixed). Indexed by the blocks each
        # needs, so the ones that do not fit in the free KV are passed over without a look.
        # The running set (at most max_num_seqs), kept in deadline order too, is merged with it.
        self._waiting = OrderedWaiting(next_deadline, by_need=True)
        self._running = OrderedRunning()

    def on_arrival(self, req: Request, now: float) -> None:
        self._waiting.arrived.append(req)

    def repeats(self, view: SchedulerView, decision: Decision) -> bool:
        # Under the simulator's conditions (a decode-only decision that admitted, rejected and
        # preempted nothing; then no arrival, no finish, no new block for the batch): with no
        # request waiting and every running request in the batch, EDF schedules the same batch
        # again (one token each within the budget; no new block, so no preemption), in the same
        # order while the deadlines keep theirs: a single request; or online requests whose last
        # tokens came together (each deadline that time plus its TBT SLO), in ascending TBT SLO,
        # equal ones by req_id, unequal ones more than ORDER_GAP_S apart.
        scheduled = decision.scheduled
        if view.waiting or view.swapped or len(scheduled) != len(view.running):
            return False
        if len(scheduled) == 1:
            return True
        prev: Request | None = None
        for r, _ in scheduled:
            if not r.online or r.last_token_time != view.now:
                return False
            if prev is not None:
                gap = r.tbt_slo - prev.tbt_slo
                if gap < 0.0 or (gap == 0.0 and r.req_id < prev.req_id) or 0.0 < gap <= ORDER_GAP_S:
                    return False
            prev = r
        return True

    def largest_budget(self, pivot: Pivot) -> int:
        return self.params.token_budget or pivot.s_pf

    def schedule(self, view: SchedulerView) -> Decision:
        waiting = self._waiting
        if not waiting.sync(view):
            return self._schedule_sorted(view)
        p = self.params
        budget = engine_token_budget(view, p.token_budget or view.pivot.s_pf)
        seats = engine_seats(view, p.max_num_seqs)
        b = BatchBuilder(view.kv, budget)
        running = self._running.sync(view)
        victims = running[::-1]  # running requests, latest deadline first
        queue = waiting.entries
        min_need = waiting.needs[0] if waiting.needs else 0
        n_live = len(view.running)
        ri = wi = 0
        nr, nw = len(running), len(queue)
        block_size = view.kv.block_size
        while b.budget_left > 0:
            if wi < nw:
                # Pass over, in one step, the waiting requests before the next running one that
                # may not start or do not fit in the free blocks (the admission test below
                # would pass over each of them; only a running request can free blocks).
                free = b.free_blocks
                if n_live >= seats or free < min_need:  # none may start, none fits
                    skip_to = nw
                else:
                    head = queue[wi][2]
                    skip_to = (waiting.fitting(wi, free) if head.status is Status.WAITING
                               and free < -(-(head.prompt_len + head.num_output_tokens)
                                            // block_size) else wi)
                if skip_to > wi:
                    wi = (skip_to if n_live >= seats or ri >= nr
                          else min(skip_to, bisect_left(queue, running[ri][:2], wi)))
            if ri < nr and (wi >= nw or running[ri] < queue[wi]):
                entry = running[ri]
                ri += 1
                if entry[2].status is not Status.RUNNING:  # (it left the running set unseen)
                    waiting.reset()
                    return self._schedule_sorted(view)
                if entry[1] not in b.preempted_ids:
                    self._add_running(b, victims, entry)
            elif wi < nw:
                _, _, r = queue[wi]
                wi += 1
                if r.status != Status.WAITING:  # the hooks were bypassed: decide by the definition
                    waiting.reset()
                    return self._schedule_sorted(view)
                if self._admit(b, r):
                    n_live += 1
            else:
                break
        return self._finish(b, view, victims, budget)

    def _schedule_sorted(self, view: SchedulerView) -> Decision:
        """The decision by the definition: every candidate sorted by deadline (used when the
        queue cannot be trusted: requests reached it without the hooks). The running order
        kept across decisions is sorted anew at the next one."""
        self._running.valid = False
        p = self.params
        budget = engine_token_budget(view, p.token_budget or view.pivot.s_pf)
        seats = engine_seats(view, p.max_num_seqs)
        b = BatchBuilder(view.kv, budget)
        keyed = sorted(((next_deadline(r), r.req_id, r) for r in (*view.running, *view.waiting)),
                       key=lambda x: (x[0], x[1]))
        # Victims: running requests, latest deadline first.
        victims = [(dl, rid, r) for dl, rid, r in reversed(keyed) if r.status == Status.RUNNING]
        n_live = len(view.running)
        for dl, rid, r in keyed:
            if b.budget_left <= 0:
                break
            if rid in b.preempted_ids:
                continue
            if r.status == Status.RUNNING:
                self._add_running(b, victims, (dl, rid, r))
            elif n_live < seats and self._admit(b, r):
                n_live += 1
        return self._finish(b, view, victims, budget)

    def _add_running(self, b: BatchBuilder, victims: list[tuple[float, int, Request]],
                     entry: tuple[float, int, Request]) -> None:
        """Schedule running request ``entry`` = (deadline, req_id, request) for its pending
        tokens within the budget; when its KV does not fit, cut a prompt chunk where free KV
        ends or recompute later-deadline running requests, and skip it if neither makes room."""
        dl, rid, r = entry
        n = min(r.num_new_tokens, b.budget_left)
        need = b.kv.blocks_needed(r, n)
        if need <= b.free_blocks:  # the common case: its KV fits as it is
            b.add(r, n, need)
            return
        while not b.fits(r, n):
            room = b.max_tokens_in_free_kv(r)
            if room > 0 and r.num_new_tokens > 1:
                n = min(n, room)  # cut a prompt chunk where free KV ends
            elif not self._preempt_later(b, victims, (dl, rid)):
                break
        if b.fits(r, n):
            b.add(r, n)

    def _admit(self, b: BatchBuilder, r: Request) -> bool:
        """Start waiting request ``r`` if its whole remaining prompt fits in free KV (as vLLM and
        Sarathi do; blocks are still allocated per chunk). Admitting on a first chunk alone
        overcommits KV and, under load, turns deadline order into a preemption storm (each
        recomputed request is the most overdue one and evicts the next)."""
        if not b.fits(r, r.num_new_tokens):
            return False
        b.add(r, min(r.num_new_tokens, b.budget_left))
        self._waiting.admitted.append(r)
        return True

    def _finish(self, b: BatchBuilder, view: SchedulerView,
                victims: list[tuple[float, int, Request]], budget: int) -> Decision:
        d = b.decision
        if not d.scheduled and view.running:  # cannot happen by the rule above; never stall
            for _, _, r in victims:
                if r.req_id not in b.preempted_ids:
                    b.preempt(r)
                    break
        self._waiting.preempted.extend(d.preempted)
        self._running.decided(d)
        d.info["token_budget"] = float(budget)
        return d

    @staticmethod
    def _preempt_later(b: BatchBuilder, victims: list[tuple[float, int, Request]],
                       key: tuple[float, int]) -> bool:
        """Recompute the latest-deadline running request outside the batch due after ``key``."""
        for dl, rid, v in victims:
            if (dl, rid) <= key:
                return False
            if rid not in b.preempted_ids and rid not in b.scheduled_ids:
                b.preempt(v)
                return True
        return False
