"""Building blocks shared by policies: a batch under construction with its own KV ledger."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from accelgen.core.kvcache import tokens_fitting
from accelgen.core.policy import Decision, KVView, SchedulerView
from accelgen.core.request import Request, Status


class BatchBuilder:
    """Tracks free blocks, token budget and victims while a policy forms one iteration.

    Nothing is applied to the real KV manager: the executor (simulator or vLLM) does that from
    the returned ``Decision``. ``blocks_needed`` only reads request state, which does not change
    until the decision is executed, so the ledger stays exact.
    """

    __slots__ = ("budget_left", "decision", "free_blocks", "kv", "preempted_ids", "scheduled_ids")

    def __init__(self, kv: KVView, token_budget: int) -> None:
        self.kv = kv
        self.free_blocks = kv.num_free_blocks
        self.budget_left = token_budget
        self.decision = empty_decision()
        self.scheduled_ids: set[int] = set()
        self.preempted_ids: set[int] = set()

    @property
    def num_scheduled(self) -> int:
        return len(self.decision.scheduled)

    def fits(self, req: Request, n: int, *, admission: bool = False) -> bool:
        need = self.kv.blocks_needed(req, n)
        reserve = self.kv.watermark_blocks if admission else 0
        return need <= self.free_blocks - reserve

    def add(self, req: Request, n: int, need: int | None = None) -> None:
        """Schedule ``n`` tokens of ``req``; ``need``: its ``blocks_needed(req, n)`` if known."""
        self.free_blocks -= self.kv.blocks_needed(req, n) if need is None else need
        self.budget_left -= n
        self.decision.scheduled.append((req, n))
        self.scheduled_ids.add(req.req_id)

    def max_tokens_in_free_kv(self, req: Request) -> int:
        """Most tokens of ``req`` whose KV fits in its last block plus the ledger's free blocks."""
        return tokens_fitting(req, self.free_blocks, self.kv.block_size)

    def preempt(self, req: Request) -> None:
        self.free_blocks += req.num_blocks
        self.decision.preempted.append(req)
        self.preempted_ids.add(req.req_id)

    def preempt_newest(self, running: list[Request], upto: int) -> Request | None:
        """Preempt the most recently admitted running request at index >= ``upto`` that is
        neither scheduled nor already preempted (vLLM's recompute victim rule)."""
        for i in range(len(running) - 1, upto - 1, -1):
            r = running[i]
            if r.req_id not in self.preempted_ids and r.req_id not in self.scheduled_ids:
                self.preempt(r)
                return r
        return None


class OrderedWaiting:
    """The waiting requests sorted by ``(key(request), req_id)``, kept across decisions, for a
    policy whose key does not change while a request waits (a deadline fixed at arrival or at
    the last token; a priority and an arrival time: any comparable value): updated on
    arrival, admission and preemption instead of re-sorted at every
    decision (the queue reaches ~19 K requests in the paper's setting).

    The policy reports arrivals (``arrived``, from ``on_arrival``) and its own admissions and
    preemptions (``admitted``, ``preempted``); ``sync`` applies them at the next decision and
    checks the result against ``view.waiting``, rebuilding it when requests reached the queue
    another way. ``needs`` holds the KV blocks each queued request needs to start (its whole
    sequence so far: a waiting request holds none), ascending; with ``by_need``, ``fitting``
    finds the first entry from a given one on that needs at most a given number of blocks."""

    __slots__ = ("_by_need", "_key", "_members", "admitted", "arrived", "entries", "needs",
                 "preempted")

    def __init__(self, key: Callable[[Request], Any], *, by_need: bool = False) -> None:
        self._key = key
        self.entries: list[tuple[Any, int, Request]] = []  # (key, req_id, request), ascending
        self.needs: list[int] = []
        self._by_need = NeedIndex() if by_need else None
        self._members: dict[int, tuple[tuple[Any, int], int]] = {}  # req_id -> (key, need)
        self.arrived: list[Request] = []
        self.admitted: list[Request] = []
        self.preempted: list[Request] = []

    def sync(self, view: SchedulerView) -> bool:
        """Apply the changes since the last decision; True if ``entries`` now hold exactly the
        waiting requests. False: they did not (the queue is rebuilt from ``view.waiting``, and
        the caller decides by its definition once)."""
        block_size = view.kv.block_size
        for r in self.admitted:
            if r.status != Status.WAITING:
                self._remove(r)
        self.admitted.clear()
        for group in (self.arrived, self.preempted):
            for r in group:
                if r.status == Status.WAITING and r.req_id not in self._members:
                    self._add(r, block_size)
            group.clear()
        if len(self.entries) == len(view.waiting):
            return True
        self.reset()
        for r in view.waiting:
            self._add(r, block_size)
        return False

    def reset(self) -> None:
        self.entries.clear()
        self.needs.clear()
        self._members.clear()
        self.admitted.clear()
        if self._by_need is not None:
            self._by_need.clear()

    def fitting(self, start: int, free_blocks: int) -> int:
        """The position of the first entry at or after position ``start`` that needs at most
        ``free_blocks`` blocks to start (``len(entries)`` if none); needs ``by_need``."""
        assert self._by_need is not None, "OrderedWaiting(by_need=True) keeps the need index"
        entries = self.entries
        if start >= len(entries):
            return len(entries)
        first = self._by_need.first(entries[start][:2], free_blocks)
        return len(entries) if first is None else bisect_left(entries, first[:2], start)

    def _add(self, r: Request, block_size: int) -> None:
        key = (self._key(r), r.req_id)
        need = -(-(r.prompt_len + r.num_output_tokens) // block_size)
        entry = (*key, r)
        insort(self.entries, entry)
        insort(self.needs, need)
        self._members[r.req_id] = (key, need)
        index = self._by_need
        if index is not None:
            if need > index.max_need:  # a larger cache than seen so far: rebuild
                self._by_need = index = NeedIndex(2 * need + 1)
                for e in self.entries:
                    index.add(e, self._members[e[1]][1])
            else:
                index.add(entry, need)

    def _remove(self, r: Request) -> None:
        member = self._members.pop(r.req_id, None)
        if member is not None:
            key, need = member
            del self.entries[bisect_left(self.entries, key)]
            del self.needs[bisect_left(self.needs, need)]
            if self._by_need is not None:
                self._by_need.remove(key, need)


class NeedIndex:
    """Queue entries ``(key, req_id, request)`` grouped by the KV blocks they need, answering
    "the first entry at or after ``key`` that needs at most ``free`` blocks" in O(log^2 n)
    instead of a pass over the entries that do not fit (thousands per decision once ~19 K
    requests wait and only a few blocks are free).

    A Fenwick tree over needs: node ``i`` (1-based, need + 1) holds, in key order, the entries
    whose need + 1 lies in ``(i - (i & -i), i]``, so the needs ``<= free`` are the union of the
    ``O(log)`` nodes on the prefix path of ``free + 1``. Each entry sits in ``O(log)`` nodes."""

    __slots__ = ("_nodes",)

    def __init__(self, max_need: int = 1023) -> None:
        self._nodes: list[list[tuple[float, int, Request]]] = [[] for _ in range(max_need + 2)]

    @property
    def max_need(self) -> int:
        return len(self._nodes) - 2

    def clear(self) -> None:
        for node in self._nodes:
            node.clear()

    def add(self, entry: tuple[float, int, Request], need: int) -> None:
        nodes = self._nodes
        i = need + 1
        while i < len(nodes):
            insort(nodes[i], entry)
            i += i & -i

    def remove(self, key: tuple[float, int], need: int) -> None:
        nodes = self._nodes
        i = need + 1
        while i < len(nodes):
            node = nodes[i]
            del node[bisect_left(node, key)]
            i += i & -i

    def first(self, key: tuple[float, int],
              free: int) -> tuple[float, int, Request] | None:
        """The first entry ``>= key`` needing at most ``free`` blocks, or None."""
        nodes = self._nodes
        best = None
        i = min(free + 1, len(nodes) - 1)
        while i > 0:
            node = nodes[i]
            j = bisect_left(node, key)
            if j < len(node) and (best is None or node[j] < best):
                best = node[j]
            i -= i & -i
        return best


def decode_blocks_fit(view: SchedulerView, decision: Decision) -> bool:
    """Whether the KV blocks that the decode steps of ``decision`` need for their next token fit
    in the free ones (a decode step needs a block exactly when its computed tokens fill its
    blocks): for a policy's ``schedule_after_decodes`` whose decision after decode steps alone
    changes only when they do not."""
    block_size = view.kv.block_size
    need = 0
    for r, _ in decision.scheduled:
        if r.num_computed_tokens >= r.num_blocks * block_size:
            need += 1
    return need <= view.kv.num_free_blocks


def empty_decision() -> Decision:
    """``Decision()`` without the generated ``__init__`` and its six default factories (a
    baseline decision in the simulator takes a few microseconds; that was a fifth of it)."""
    d = _new(Decision)
    d.scheduled = []
    d.preempted = []
    d.swap_out = []
    d.swap_in = []
    d.reserve = []
    d.rejected = []
    d.info = {}
    d.wake_at = None
    return d


_new = object.__new__


def is_prefilling(req: Request) -> bool:
    """A running request whose next forward pass is (the rest of) a prompt chunk."""
    return req.num_new_tokens > 1 or req.num_output_tokens == 0
