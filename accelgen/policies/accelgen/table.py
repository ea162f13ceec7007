"""AccelGen's mirror of the live requests: the record array the compiled decision reads, kept in
step by the policy's hooks, its active slots and its dormant queue (``docs/accelgen.md``, *One
decision*, step 1, and *A long queue*). Live requests occupy rows ``0..n-1`` (a removal moves the
last row into the hole): a slot is valid within one decision only, ``req_id`` across hooks."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from accelgen.core.request import Request, Status
from accelgen.policies.accelgen.state import DORMANT, LOST_OFFSET, REQUEST, UNCOUNTED

if TYPE_CHECKING:
    from accelgen.policies.accelgen.build import Build

_RUNNING = Status.RUNNING


def _dynamic(slots: list[int], reqs: list[Request]) -> np.ndarray:
    """The fields of ``reqs`` that change as they run, a row each (slot, output tokens, computed tokens,
    blocks, running, last token time), in one float64 array to hand to compiled code (integers below
    2**53 are exact)."""
    return np.array([(s, r.num_output_tokens, r.num_computed_tokens, r.num_blocks,
                      r.status is _RUNNING, r.last_token_time) for s, r in zip(slots, reqs, strict=True)],
                    dtype=np.float64).reshape(-1, 6)


class RequestTable:
    """Rows of ``REQUEST`` indexed by slot; ``objs[slot]`` is the request itself."""

    rows: np.recarray
    active: np.ndarray  # slots of the active requests, ascending (the first ``n_active``)
    dormant_queue: np.recarray  # DORMANT records by key: ``n_dormant`` from ``dormant_lo`` on
    gone: np.ndarray  # ``final`` of the counted dormant entries that left (the first ``n_gone``)
    if TYPE_CHECKING:  # self.prompt etc.: a view of one field of ``rows`` each (``_alloc``)
        def __getattr__(self, field: str) -> np.ndarray: ...

    def __init__(self, capacity: int = 1024, kernels: Build | None = None) -> None:
        # The compiled kernels the table's updates run (``build.load()``, which
        # builds on this module: handed in, not imported). None: a table for its layout only.
        self.kernels = kernels
        self.n = 0
        self.capacity = 0
        self.objs: list[Request] = []
        self.slot_of: dict[int, int] = {}
        self.num_unplanned = 0  # offline requests whose JCT plan is still to be made
        self.dormancy = False  # set by the policy (``AccelGenPolicy``)
        self.n_active = self.n_dormant = 0
        # The dormant queue lives in the middle of an array twice the table's capacity, so that
        # an entry joins or leaves by moving the shorter side (lost prompts leave from the head,
        # arrival order, and join near the tail): positions [dormant_lo, dormant_lo + n_dormant).
        # What moved since the decision last looked: positions [dirty_lo, dirty_hi), and the
        # ``final`` of each counted entry that left (``gone``, the first ``n_gone``).
        self.dormant_lo = 0
        self.dirty_lo, self.dirty_hi, self.n_gone = 0, 0, 0
        self.reindex = False  # derive every entry again (the decision's parameters changed)
        # (deadline, req_id) of waiting online active requests: the next to turn dormant first
        self._watch: list[tuple[float, int]] = []
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        rows = np.zeros(capacity, dtype=REQUEST).view(np.recarray)
        active = np.zeros(capacity, dtype=np.int64)
        dormant = np.zeros(2 * capacity, dtype=DORMANT).view(np.recarray)
        lo, m = capacity - self.n_dormant // 2, self.n_dormant
        if self.capacity:
            rows[: self.n] = self.rows[: self.n]
            active[: self.n_active] = self.active[: self.n_active]
            dormant[lo: lo + m] = self.dormant_queue[self.dormant_lo: self.dormant_lo + m]
        self.rows, self.active, self.dormant_queue = rows, active, dormant
        self._rows_plain = rows.view(np.ndarray)  # (a recarray's row access runs Python code)
        self.dormant_lo = lo
        self.gone = np.zeros(capacity, dtype=np.int64)
        self.n_gone, self.reindex = 0, True  # (positions moved: every entry again)
        self._watch_slots = np.zeros(capacity, dtype=np.int64)  # (``_read``'s output)
        plain = dormant.view(np.ndarray)
        self._dormant_plain = plain  # (moving slices of a recarray costs microseconds more)
        self.dormant_key, self.dormant_slot = plain["key"], plain["slot"]
        self.dormant_final = plain["final"]
        for name in REQUEST.names or ():
            setattr(self, name, rows[name])
        self.capacity = capacity

    # -- membership ----------------------------------------------------------------------------
    def add(self, r: Request) -> int:
        if r.req_id in self.slot_of:
            return self.slot_of[r.req_id]
        if self.n == self.capacity:
            self._alloc(2 * self.capacity)
        s = self.n
        self.n += 1
        self.objs.append(r)
        self.slot_of[r.req_id] = s
        fixed = {"req_id": r.req_id, "prompt": r.prompt_len, "pred_out": r.predicted_output_len,
                 "arrival": r.arrival, "ttft": r.ttft_slo, "tbt": r.tbt_slo, "jct": r.jct_slo,
                 "online": r.online, "off_first": math.nan, "off_step": math.nan}
        self.rows[s] = tuple(fixed.get(name, 0) for name in REQUEST.names or ())  # (``_read``: the rest)
        if not r.online:
            self.num_unplanned += 1
        self.active[self.n_active] = s  # (the largest slot: the list stays sorted)
        self.n_active += 1
        self._read(_dynamic([s], [r]))
        self._watch_if_waiting(s)
        return s

    def remove(self, req_id: int) -> None:
        s = self.slot_of.pop(req_id, None)
        if s is None:
            return
        if not self.online[s] and math.isnan(self.off_first[s]):
            self.num_unplanned -= 1
        self._leave(s)
        last = self.n - 1
        if s != last:  # move the last live request into the hole
            moved_dormant = bool(self.dormant[last])
            self._leave(last)
            rows = self._rows_plain
            rows[s] = rows[last]
            moved = self.objs[last]
            self.objs[s] = moved
            self.slot_of[moved.req_id] = s
            (self._dormant_insert if moved_dormant else self._active_insert)(s)
        self.objs.pop()
        self.n = last

    def rebuild(self, reqs: list[Request]) -> None:
        """Start over from the given live requests (used when hooks were missed)."""
        keep = {r.req_id for r in reqs}
        for rid in [rid for rid in self.slot_of if rid not in keep]:
            self.remove(rid)
        slots = np.array([self.add(r) for r in reqs], dtype=np.int64)  # (the known ones: their slot)
        self._read(_dynamic(slots.tolist(), reqs))
        # Every request active again (the sweep before the next decision finds the dormant ones).
        self.n_active, self.n_dormant, self.reindex = self.n, 0, True
        self.dormant_lo, self.n_gone = self.capacity, 0
        self.active[: self.n] = np.arange(self.n)
        self.dormant[: self.n] = False
        self._watch = []
        for s in range(self.n):
            self._watch_if_waiting(s)

    # -- dynamic fields ------------------------------------------------------------------------
    def _read(self, values: np.ndarray, lost_rule: bool = False) -> int:
        """Write ``_dynamic``'s rows and the deadlines (and ``lost``, with ``lost_rule``). Returns how many
        of them wait or are dormant (their slots in ``_watch_slots``)."""
        return self._kernels().read_rows(self.rows, values, lost_rule, self._watch_slots)

    def _kernels(self) -> Build:
        if self.kernels is None:
            raise RuntimeError("RequestTable: no compiled kernels; construct it with "
                               "kernels=build.load()")
        return self.kernels

    def refresh(self, reqs: list[Request]) -> None:
        """Re-read the dynamic fields of ``reqs`` (those a step changed) in one compiled pass."""
        get = self.slot_of.get
        # (``_dynamic`` inlined: this runs after every step)
        values = [(s, r.num_output_tokens, r.num_computed_tokens, r.num_blocks,
                   r.status is _RUNNING, r.last_token_time)
                  for r in reqs if (s := get(r.req_id)) is not None]
        if not values:
            return
        self._rewatch(self._read(np.array(values, dtype=np.float64), lost_rule=True))

    def advance_decodes(self, batch: list[tuple[Request, int]], slots: np.ndarray,
                        now: float) -> None:
        """``refresh`` of ``batch`` (its slots the head of ``slots``) after it ran as decode steps alone
        (``Policy.schedule_after_decodes``): one more token each at ``now``, only the blocks re-read."""
        blocks, slot_of = self.blocks, self.slot_of
        for r, _ in batch:  # (the backend may have given it a block for this token)
            blocks[slot_of[r.req_id]] = r.num_blocks
        self._rewatch(self._kernels().decode_rows(self.rows, slots, len(batch), now,
                                                  self._watch_slots))

    def _rewatch(self, k: int) -> None:
        """After a read, the ``k`` slots in ``_watch_slots`` that wait or are dormant."""
        if k and self.dormancy:  # dormant requests that run again; preempted ones to watch
            for s in self._watch_slots[:k].tolist():
                if self.dormant[s] and self.running[s]:
                    self._dormant_delete(s)
                    self._active_insert(s)
                else:
                    self._watch_if_waiting(s)

    # -- active and dormant requests -----------------------------------------------------------
    def sweep(self, now: float) -> None:
        """Waiting online requests whose deadline passed before ``now`` turn dormant."""
        watch = self._watch
        while watch and watch[0][0] < now:
            deadline, rid = heapq.heappop(watch)
            s = self.slot_of.get(rid)
            if (s is not None and not self.running[s] and not self.dormant[s]
                    and self.deadline[s] == deadline):
                self._active_delete(s)
                self._dormant_insert(s)

    def next_sweep(self) -> float:
        """The clock past which ``sweep`` has an entry to look at (it may be stale): the earliest
        deadline it watches; infinite when it watches none."""
        return self._watch[0][0] if self._watch else math.inf

    def _watch_if_waiting(self, s: int) -> None:
        if self.dormancy and self.online[s] and not self.running[s] and not self.dormant[s]:
            heapq.heappush(self._watch, (float(self.deadline[s]), int(self.req_id[s])))

    def _leave(self, s: int) -> None:
        if self.dormant[s]:
            self._dormant_delete(s)
        else:
            self._active_delete(s)

    def _active_insert(self, s: int) -> None:
        a, n = self.active, self.n_active
        p = int(a[:n].searchsorted(s))  # (the method: np.searchsorted's wrapper costs more)
        a[p + 1: n + 1] = a[p:n]
        a[p] = s
        self.n_active = n + 1
        self.dormant[s] = False

    def _active_delete(self, s: int) -> None:
        a, n = self.active, self.n_active
        p = int(a[:n].searchsorted(s))
        a[p: n - 1] = a[p + 1: n]
        self.n_active = n - 1

    def _dormant_position(self, key: float, s: int) -> int:
        """Where (key, s) is, or goes, in the dormant queue (equal keys by slot)."""
        keys, lo, hi = self.dormant_key, self.dormant_lo, self.dormant_lo + self.n_dormant
        p = lo + int(keys[lo:hi].searchsorted(key))
        while p < hi and keys[p] == key and self.dormant_slot[p] < s:
            p += 1
        return p

    def _dormant_insert(self, s: int) -> None:
        key = float(self.arrival[s]) + LOST_OFFSET
        q, lo = self._dormant_plain, self.dormant_lo
        hi = lo + self.n_dormant
        p = self._dormant_position(key, s)
        # The shorter side moves, if it has room (one side always has: the array is twice the
        # table's capacity).
        if lo > 0 and (p - lo < hi - p or hi == len(q)):
            q[lo - 1: p - 1] = q[lo:p]
            self.dormant_lo = lo = lo - 1
            p -= 1
            self._moved(lo, p + 1)
        else:
            q[p + 1: hi + 1] = q[p:hi]
            self._moved(p, hi + 1)
        self.dormant_key[p], self.dormant_slot[p], self.dormant_final[p] = key, s, UNCOUNTED
        self.n_dormant += 1
        self.dormant[s] = True

    def _dormant_delete(self, s: int) -> None:
        q, lo = self._dormant_plain, self.dormant_lo
        hi = lo + self.n_dormant
        p = self._dormant_position(float(self.arrival[s]) + LOST_OFFSET, s)
        final = int(self.dormant_final[p])
        if final != UNCOUNTED:
            if self.n_gone == len(self.gone):  # (more than the decision tracks: start over)
                self.reindex, self.n_gone = True, 0
            self.gone[self.n_gone] = final
            self.n_gone += 1
        if p - lo < hi - 1 - p:
            q[lo + 1: p + 1] = q[lo:p]
            self.dormant_lo = lo + 1
            self._moved(lo, p + 1)
        else:
            q[p: hi - 1] = q[p + 1: hi]
            self._moved(p, hi)
        self.n_dormant -= 1
        self.dormant[s] = False

    def _moved(self, lo: int, hi: int) -> None:
        """Entries at positions [lo, hi) changed since the decision last looked."""
        if self.dirty_lo >= self.dirty_hi:
            self.dirty_lo, self.dirty_hi = lo, hi
        else:
            self.dirty_lo, self.dirty_hi = min(self.dirty_lo, lo), max(self.dirty_hi, hi)

    def seen(self) -> None:
        """The decision has taken in every change to the dormant queue."""
        self.dirty_lo = self.dirty_hi = self.n_gone = 0
        self.reindex = False

    def plan_offline(self, chunk_len: float, t_max: float, preempt_term: float) -> None:
        """The JCT plan of offline requests that have none yet (paper section 4.3; ``docs/accelgen.md``,
        *One decision*, step 3): the k-th iteration is due at arrival + k (T_r + T_max), cumulative, so
        running late (early) shrinks (grows) the next allowance, as in the paper."""
        n = self.n
        todo = np.flatnonzero(~self.online[:n] & np.isnan(self.off_first[:n]))
        nck = np.ceil(self.prompt[todo] / chunk_len)
        s_g = np.maximum(self.pred_out[todo], 1)
        t_e = nck * t_max + s_g * (t_max + preempt_term)
        t_r = (self.jct[todo] - t_e) / (nck + s_g)
        self.off_first[todo] = self.arrival[todo] + nck * (t_r + t_max)
        self.off_step[todo] = t_r + t_max + preempt_term
        self._kernels().set_deadlines(self.rows, todo)
        self.num_unplanned = 0
