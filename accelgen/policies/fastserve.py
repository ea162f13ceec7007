"""FastServe (Wu et al., "Fast Distributed Inference Serving for Large Language Models", 2023):
skip-join multi-level feedback queue (MLFQ) with proactive KV swapping.

The paper gives the algorithm (skip-join MLFQ, iteration-level preemption, starvation prevention,
proactive KV cache management); its public artifact (LLMServe/FastServe, ``fastserve/scheduler.py``
class ``MLFQ``, run with ``--sched-policy sj-mlfq --proactive-offloading --use-skip-join``) fixes
what the paper leaves open. docs/baselines.md maps every rule below to its source.

- Levels: ``num_queues`` queues, level p has quantum ``base_quantum x quantum_ratio^p``
  (10 ms x 2^p).
- Skip-join: a new request joins the first level whose quantum covers its first iteration, the
  isolated prefill of its prompt (``view.cost.prefill_time``); a longer one joins the last level.
- Order: strict priority by level. Within a level, requests that have run stand at the head and
  new arrivals queue at the tail; a request keeps its place between iterations, so the running
  batch is not rotated at every quantum.
- Demotion: the latencies of the iterations a request runs in accumulate at its level; once the
  sum exceeds the level's quantum the request moves one level down, to the head, with a fresh
  account.
- Starvation: every ``starve_check_every`` decisions (1,000), every queued request not served for
  ``starve_after`` seconds (3 s; waiting counts from arrival) moves to the head of the top level.
- Batch: the highest-priority requests, in order, until ``max_batch_size`` (16) requests or a
  prompt that would take the batch's prompt tokens beyond ``max_prompt_tokens`` (2048): the batch
  stops there (head-of-line, as the artifact). No chunking: a prompt (or a recompute) runs whole;
  a prompt longer than the limit runs when no other prompt is in the batch. While less than
  ``pause_prefill_below`` (10 %) of the host swap space is free, requests that still need their
  prompt pass are passed over.
- KV (proactive swapping): a candidate whose blocks are not free swaps out requests holding
  device KV that rank below it, lowest priority first; a victim the host cannot take stays. A
  started request that cannot get its blocks waits, keeping its place, and the next candidate is
  considered; the first new prompt that cannot get its blocks stops the new prompts behind it.
  Only for the first request a decision can run are victims the host cannot take recomputed
  instead, so the head of the queues always runs. After the batch, ``free_block_reserve`` blocks
  (default one per batch slot) are kept free by swapping out more requests ranked below it.
  Swapped batch members are swapped in; when nothing was swapped out, swapped requests among the
  next ``max_batch_size`` queued ones are swapped in ahead of their turn while the reserve stays
  free.
- Swap transfers overlap compute in FastServe (separate copy streams); the simulator charges an
  iteration max(compute, transfer) by default (``sim.swap_overlap``).

Cost per decision: the queues are kept incrementally (sorted keys per KV residency), so a
decision reads the head of the queues, its victims and, under host pressure, the swapped requests
that might still fit; never the waiting queue. The periodic starvation check reads the requests
served in the last ``starve_after`` seconds and those below the top level, not the backlog that
stays starving from one check to the next.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass
from heapq import merge

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from accelgen.core.policy import (
    Decision,
    DecodeRunDecisions,
    DecodeSteps,
    InfoRow,
    KVView,
    Policy,
    PolicyParams,
    SchedulerView,
)
from accelgen.core.request import Request, Status
from accelgen.policies.common import decode_blocks_fit, empty_decision

# A request's place in the MLFQ is one integer: its level in the high bits, then a sequence
# number: head insertions count down from the middle, tail insertions count up from it.
_SEQ_BITS = 42
_SEQ_MID = 1 << (_SEQ_BITS - 1)


class FastServeParams(PolicyParams):
    num_queues: PositiveInt = 5
    base_quantum: PositiveFloat = 0.010  # seconds: the top level's quantum
    quantum_ratio: float = Field(2.0, gt=1.0)  # quantum of level p+1 / quantum of level p
    starve_after: PositiveFloat = 3.0  # seconds without service before promotion to the top
    starve_check_every: PositiveInt = 1000  # decisions between starvation checks
    max_batch_size: PositiveInt = 16
    max_prompt_tokens: PositiveInt = 2048
    swap: bool = Field(True, description="swap victims to host; False: recompute them")
    proactive: bool = Field(True, description="keep free_block_reserve blocks free and swap in "
                                              "high-priority requests ahead of their turn")
    free_block_reserve: NonNegativeInt | None = None  # default: max_batch_size blocks
    pause_prefill_below: float = Field(0.1, ge=0.0, le=1.0)  # free share of host swap space


@dataclass(slots=True)
class MLFQState:
    level: int
    attained: float = 0.0  # iteration time charged at the current level
    last_service: float = 0.0  # end of its last iteration (its arrival until it runs)
    join_level: int = 0  # the level skip-join chose
    key: int = -1  # its place in the queues; -1: not queued
    filed_as: Status = Status.WAITING  # the residency index holding it
    host_blocks: int = 0  # its host blocks while filed as swapped


class _Residency:
    """Queued requests of one KV residency (waiting, device or host), in MLFQ order."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[int] = []

    def add(self, key: int) -> None:
        insort(self.keys, key)

    def remove(self, key: int) -> None:
        del self.keys[bisect_left(self.keys, key)]


_SWAPPED, _WAITING = Status.SWAPPED, Status.WAITING
# A decision's diagnostics (``FastServePolicy.schedule``), in its order.
_INFO_INDEX = {name: i for i, name in enumerate(("prompt_tokens", "promoted", "swap_out", "swap_in"))}
_NO_KEY = 1 << 128  # above every key


def _no_info() -> InfoRow:
    """``schedule``'s diagnostics of a decision that hands the batch back, all zero (as a row
    of shared names, which the iteration log takes without a dict per step)."""
    return InfoRow(_INFO_INDEX, [0.0] * len(_INFO_INDEX))


def _only_batch_in_view(view: SchedulerView, batch: list[tuple[Request, int]]) -> bool:
    """Whether nothing waits or is swapped out and every running request is in ``batch``."""
    return not view.waiting and not view.swapped and len(view.running) == len(batch)


class FastServePolicy(Policy):
    name = "fastserve"
    Params = FastServeParams
    params: FastServeParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._by_key: dict[int, Request] = {}
        self._index = {s: _Residency() for s in (Status.WAITING, Status.RUNNING, Status.SWAPPED)}
        self._head_seq = _SEQ_MID
        self._tail_seq = _SEQ_MID
        self._arrivals: list[Request] = []
        self._touched: list[Request] = []  # victims and early swap-ins of the last decision
        self._paused = False  # whether the last decision passed over requests awaiting a prompt pass
        self._decisions = 0
        self._swap_capacity: int | None = None  # host swap blocks, read at the first decision
        self._swapped_sizes: list[int] = []  # host blocks of every swapped request, ascending
        # When requests were last served (or arrived): (time, [(request, n), ...]) ascending,
        # so a starvation check reads only the last starve_after seconds of it.
        self._served: list[tuple[float, list[tuple[Request, int]]]] = []
        self._quanta = [self.quantum(p) for p in range(self.params.num_queues)]

    # -- levels -----------------------------------------------------------------------------------
    def quantum(self, level: int) -> float:
        return self.params.base_quantum * self.params.quantum_ratio ** level

    def join_level(self, prefill_time: float) -> int:
        for p in range(self.params.num_queues):
            if self.quantum(p) >= prefill_time:
                return p
        return self.params.num_queues - 1

    # -- the queues -------------------------------------------------------------------------------
    def _file(self, r: Request, level: int, *, head: bool) -> None:
        st: MLFQState = r.policy_state
        if head:
            self._head_seq -= 1
            seq = self._head_seq
        else:
            self._tail_seq += 1
            seq = self._tail_seq
        st.level, st.key = level, (level << _SEQ_BITS) | seq
        self._by_key[st.key] = r
        self._enter(r, st)

    def _unfile(self, r: Request) -> None:
        st: MLFQState = r.policy_state
        self._leave(st)
        del self._by_key[st.key]
        st.key = -1

    def _move(self, r: Request) -> None:
        """File ``r`` under its present KV residency, keeping its place."""
        st: MLFQState = r.policy_state
        if st.key >= 0 and st.filed_as != r.status:
            self._leave(st)
            self._enter(r, st)

    def _enter(self, r: Request, st: MLFQState) -> None:
        st.filed_as = r.status
        self._index[r.status].add(st.key)
        if r.status == Status.SWAPPED:
            st.host_blocks = r.num_swapped_blocks
            insort(self._swapped_sizes, st.host_blocks)

    def _leave(self, st: MLFQState) -> None:
        self._index[st.filed_as].remove(st.key)
        if st.filed_as == Status.SWAPPED:
            sizes = self._swapped_sizes
            del sizes[bisect_left(sizes, st.host_blocks)]

    def _admit(self, r: Request, view: SchedulerView) -> None:
        lvl = self.join_level(view.cost.prefill_time(r.prompt_len))
        r.policy_state = MLFQState(lvl, 0.0, r.arrival, lvl)
        self._file(r, lvl, head=False)
        insort(self._served, (r.arrival, [(r, 0)]), key=_first)

    def _sync(self, view: SchedulerView) -> None:
        """File new arrivals; move the requests the last decision changed to the index of their
        present KV residency."""
        for r in self._arrivals:
            if not r.is_done:
                self._admit(r, view)
        self._arrivals.clear()
        for r in self._touched:
            self._move(r)
        self._touched.clear()
        if len(self._by_key) != len(view.waiting) + len(view.running) + len(view.swapped):
            # Requests that reached the queues without ``on_arrival`` (a caller driving
            # ``schedule`` directly): adopt them in queue order.
            for r in (*view.running, *view.swapped, *view.waiting):
                if r.policy_state is None:
                    self._admit(r, view)

    def _promote_starving(self, now: float) -> int:
        """Every queued request not served for ``starve_after`` moves to the head of the top
        level, in its present order: the queue becomes [starving ones, in order] + [the
        others, in order], all starving ones at level 0. Only requests whose place changes are
        refiled: the starving ones at lower levels go to the top level's tail (behind the
        starving ones already there), then the top level's others behind them; the same order
        as refiling every starving request at the head, without a pass over a backlog that
        stays starving from check to check (~19 K requests in the paper's setting)."""
        limit = self.params.starve_after
        by_key = self._by_key
        fresh = self._recently_served(now)
        promoted = len(by_key) - len(fresh)
        if promoted == 0:
            return 0
        top = 1 << _SEQ_BITS  # keys below it: level 0
        lower = sorted(k for ix in self._index.values() for k in ix.keys[bisect_left(ix.keys, top):]
                       if now - by_key[k].policy_state.last_service >= limit)
        lower.extend(sorted(st.key for r in fresh if (st := r.policy_state).key < top))
        for k in lower:
            r = by_key[k]
            self._unfile(r)
            self._file(r, 0, head=False)
        return promoted

    def _recently_served(self, now: float) -> list[Request]:
        """The queued requests served (or arrived) less than ``starve_after`` ago, from the
        service log (``_served``: (time, batch) ascending), whose older part is dropped."""
        limit = self.params.starve_after
        served = self._served
        del served[:bisect_left(served, True, key=lambda e: now - e[0] < limit)]
        fresh: dict[int, Request] = {}
        for _, batch in served:
            for r, _ in batch:
                st = r.policy_state
                if st.key >= 0 and now - st.last_service < limit:
                    fresh[r.req_id] = r
        if len(served) > 2 * len(fresh) + 1024:  # a long starve_after keeps every batch
            served[:] = sorted(((r.policy_state.last_service, [(r, 0)]) for r in fresh.values()),
                               key=_first)
        return list(fresh.values())

    # -- the decision -----------------------------------------------------------------------------
    def schedule(self, view: SchedulerView) -> Decision:
        p = self.params
        self._sync(view)
        self._decisions += 1
        promoted = (self._promote_starving(view.now)
                    if self._decisions % p.starve_check_every == 0 else 0)
        kv = view.kv
        by_key, index = self._by_key, self._index
        d = empty_decision()

        if self._swap_capacity is None:
            self._swap_capacity = kv.num_free_swap_blocks + sum(r.num_swapped_blocks
                                                                for r in view.swapped)
        paused = self._paused = self._prefill_paused(kv)
        reserve = ((p.max_batch_size if p.free_block_reserve is None else p.free_block_reserve)
                   if p.proactive and p.swap else 0)
        # The candidates: the device, host and waiting indexes merged in key order, by hand (one
        # cursor and one end per index; ~12 candidates a decision). Dropping an index from the
        # merge (after a candidate could not get its blocks) sets its end to its cursor: the
        # others go on from where they are.
        device_keys = index[Status.RUNNING].keys
        host_keys = index[Status.SWAPPED].keys
        wait_keys = index[Status.WAITING].keys
        d_at = h_at = w_at = 0
        d_end, h_end = len(device_keys), len(host_keys)
        w_end = 0 if paused else len(wait_keys)
        room = _Room(self, d, kv, device_keys)
        batch: list[Request] = []
        prompt_tokens = 0
        # A request needing `unreachable` blocks or more cannot get them: no more could be
        # found for one ahead of it, and fewer victims rank below it.
        unreachable = 1 << 62
        max_batch, block_size, evicted = p.max_batch_size, kv.block_size, room.evicted
        while len(batch) < max_batch:
            key = device_keys[d_at] if d_at < d_end else _NO_KEY
            if h_at < h_end and host_keys[h_at] < key:
                key = host_keys[h_at]
                if w_at < w_end and wait_keys[w_at] < key:
                    key = wait_keys[w_at]
                    w_at += 1
                else:
                    h_at += 1
            elif w_at < w_end and wait_keys[w_at] < key:
                key = wait_keys[w_at]
                w_at += 1
            elif key == _NO_KEY:
                break
            else:
                d_at += 1
            r = by_key[key]
            if evicted and r.req_id in evicted:
                continue  # made room for a request ahead of it
            # Device blocks it needs to run its n pending tokens, including any it must
            # swap back in (kv.blocks_needed's rule, inlined: ~12 candidates a decision).
            computed = r.num_computed_tokens
            n = r.prompt_len + r.num_output_tokens - computed
            swapped = r.status is _SWAPPED
            need = -(-(computed + n) // block_size)
            if swapped:
                if need < r.num_swapped_blocks:
                    need = r.num_swapped_blocks
            else:
                need -= r.num_blocks
                if need < 0:
                    need = 0
            if need >= unreachable:
                if r.status is _WAITING:
                    w_end = w_at  # new prompts queue head-of-line (see _narrow)
                    if h_end > h_at and self._host_closed(unreachable, room):
                        h_end = h_at
                continue
            plan = None
            if need > room.free:
                # Until something runs, victims the host cannot take may be recomputed, so that
                # the head of the queues always runs; afterwards a request that cannot get its
                # blocks waits, keeping its place, and the next one is considered.
                if not batch:
                    plan = (room.plan(need, key, recompute=False)
                            or room.plan(need, key, recompute=True))
                elif not p.swap or need <= room.free + room.free_swap:
                    plan = room.plan(need, key, recompute=False)
                else:
                    room.reach = room.free + room.free_swap
                if plan is None:
                    unreachable = min(need, room.reach + 1)
                    if r.status is _WAITING or unreachable <= 1:
                        w_end = w_at
                    if h_end > h_at and self._host_closed(unreachable, room):
                        h_end = h_at
                    continue
            prompt = n > 1 or r.num_output_tokens == 0  # it needs a prompt pass
            if prompt and prompt_tokens > 0 and prompt_tokens + n > p.max_prompt_tokens:
                break  # head-of-line: nothing behind it joins this batch
            if plan is not None:
                room.commit(plan)
            room.free -= need
            if prompt:
                prompt_tokens += n
            batch.append(r)
            if swapped:
                d.swap_in.append(r)
            d.scheduled.append((r, n))
        if room.free < reserve and batch:
            plan = room.plan(reserve, batch[-1].policy_state.key, recompute=False)
            if plan is not None:
                room.commit(plan)
        if (p.proactive and p.swap and not d.swap_out and not d.preempted
                and self._swapped_sizes and room.free - self._swapped_sizes[0] >= reserve):
            # Swap in ahead of their turn the swapped requests among the next queued ones.
            in_batch = {r.req_id for r in batch}
            quota = p.max_batch_size
            for key in _in_order([ix.keys for ix in index.values()]):
                if quota <= 0:
                    break
                r = by_key[key]
                if r.req_id in in_batch:
                    continue
                quota -= 1
                if r.status == Status.SWAPPED and room.free - r.num_swapped_blocks >= reserve:
                    room.free -= r.num_swapped_blocks
                    d.swap_in.append(r)

        self._touched.extend(d.swap_out)
        self._touched.extend(d.preempted)
        self._touched.extend(d.swap_in)
        d.info["prompt_tokens"] = float(prompt_tokens)
        d.info["promoted"] = float(promoted)
        d.info["swap_out"] = float(len(d.swap_out))
        d.info["swap_in"] = float(len(d.swap_in))
        return d

    def _host_closed(self, unreachable: int, room: _Room) -> bool:
        """After a candidate could not get its blocks (``unreachable``: the fewest blocks that
        cannot be found now), whether no swapped request can still run: each needs at least its
        own blocks, and the host must take whatever makes room; when not even one block can be
        found, only requests that need none can still run. (New prompts queue head-of-line: the
        first that cannot get its KV stops them, as the batch stops at the first request over
        its limits; and none when not even one block can be found.)"""
        smallest = self._swapped_sizes[0]
        return (unreachable <= 1 or smallest >= unreachable
                or (self.params.swap and smallest > room.free + room.free_swap))

    # -- hooks ------------------------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> None:
        self._arrivals.append(req)  # filed at the next decision, which has the cost model

    def on_finish(self, req: Request, now: float) -> None:
        st = req.policy_state
        if isinstance(st, MLFQState) and st.key >= 0:
            self._unfile(req)

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # Below capacity a request often decodes alone, or with the whole queue in its batch,
        # for thousands of steps: then ``schedule`` would pick the same batch in the same order
        # (every queued request is in it, on the device, and the blocks of their next tokens
        # are free, so no victim is sought and no swap-in is possible) and nothing else. That
        # is checked here instead of running the candidates' merge.
        self._took(decision, view.now, latency)  # (``view.now``: the step's end, here)
        if not self._same_batch_again(view, decision):
            return self.schedule(view)
        self._decisions += 1
        self._paused = self._prefill_paused(view.kv)
        decision.info = _no_info()
        return decision

    def after_decodes_reads_blocks_only(self, decision: Decision) -> bool:
        # (an ask reads the batch's computed tokens for their next blocks: a run of such asks
        # would read them stale; ``decide_decode_run`` takes the run's blocks as given)
        return False

    def decides_decode_run(self, decision: Decision) -> bool:
        return self._queue_is_batch(decision.scheduled)

    def decide_decode_run(self, view: SchedulerView, decision: Decision, latency: float,
                          run: DecodeSteps) -> DecodeRunDecisions | None:
        # ``schedule_after_decodes`` at each step, up to the first step whose ask could decide
        # otherwise or change the queues' order: a member's quantum used up (a demotion), or a
        # starvation check due. Until then each ask only takes in the step (``_took``: the
        # time served, no demotion) and finds the same batch (the queue is the batch, on the
        # device, in key order, its next blocks free: the run gives only steps whose blocks
        # fit). That step is left to be asked on its own, with nothing of it taken in here.
        batch = decision.scheduled
        if not (_only_batch_in_view(view, batch) and self._queue_is_batch(batch)):
            return None
        states: list[MLFQState] = [r.policy_state for r, _ in batch]
        last_level = self.params.num_queues - 1
        # (per member still below the last level: the quantum its attained time must stay within)
        watched = [(st, self._quanta[st.level]) for st in states if st.level < last_level]
        every = self.params.starve_check_every
        served = self._served
        latencies = run.latencies.tolist()
        clock = run.clock.tolist()
        need = self._run_block_need(run)
        free = run.free_blocks.tolist()
        done = 0
        for k, end in enumerate(clock):
            step_latency = latency if k == 0 else latencies[k - 1]
            if ((self._decisions + 1) % every == 0 or need[k] > free[k]
                    or any(st.attained + step_latency > quantum for st, quantum in watched)):
                break
            served.append((end, batch))
            for st in states:
                st.last_service = end
                st.attained += step_latency
            self._decisions += 1
            done += 1
        if not done:
            return None
        self._paused = self._prefill_paused(view.kv)
        decision.info = _no_info()
        return DecodeRunDecisions(_INFO_INDEX, np.zeros((done, len(_INFO_INDEX))), None)

    @staticmethod
    def _run_block_need(run: DecodeSteps) -> list[int]:
        """The new KV blocks each step of ``run`` gives the batch."""
        steps = len(run.clock)
        need = np.zeros(steps, np.int64)
        for first in run.first_need.tolist():
            need[first:steps:run.block_size] += 1
        return need.tolist()

    def _queue_is_batch(self, batch: list[tuple[Request, int]]) -> bool:
        """Whether every queued request is in ``batch``, in key order, on the device, with no
        arrival to file and no request touched by the last decision (what
        ``_same_batch_again`` checks that decode steps do not change)."""
        if self._arrivals or self._touched or len(self._by_key) != len(batch):
            return False
        last = -1
        for r, _ in batch:
            st: MLFQState = r.policy_state
            if st.key <= last or st.filed_as is not Status.RUNNING or r.status is not Status.RUNNING:
                return False
            last = st.key
        return True

    def _prefill_paused(self, kv: KVView) -> bool:
        """Whether requests that still need their prompt pass are passed over: less than
        ``pause_prefill_below`` of the host swap space is free."""
        p, capacity = self.params, self._swap_capacity
        return (p.swap and capacity is not None and capacity > 0
                and kv.num_free_swap_blocks < p.pause_prefill_below * capacity)

    def _same_batch_again(self, view: SchedulerView, decision: Decision) -> bool:
        """Whether ``schedule`` would now return ``decision``'s batch (its decode steps again, as
        ``schedule_after_decodes`` is called after them), in its order, and nothing else: no
        arrival to file, no request touched, no starvation check due, every queued request in
        the batch and on the device, in key order, and their next tokens' new blocks free."""
        batch = decision.scheduled
        if ((self._decisions + 1) % self.params.starve_check_every == 0
                or not _only_batch_in_view(view, batch) or not self._queue_is_batch(batch)):
            return False
        return decode_blocks_fit(view, decision)

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:
        self._took(decision, view.now + latency, latency)

    def _took(self, decision: Decision, end: float, latency: float) -> None:
        """``decision``'s step ended at ``end`` after ``latency`` seconds."""
        self._served.append((end, decision.scheduled))  # ends only grow: stays in order
        last = self.params.num_queues - 1
        quanta = self._quanta
        # Unfinished members keep their place (at the head of their level, unless requests that
        # could not run this time stand before them); a demoted one goes to the head of the
        # next level, in batch order (the last member is filed first).
        for r, _ in reversed(decision.scheduled):
            st: MLFQState = r.policy_state
            st.last_service = end
            if st.key < 0:
                continue  # finished in this iteration
            st.attained += latency
            level = st.level
            if st.attained > quanta[level] and level < last:  # demoted
                st.attained = 0.0
                self._unfile(r)
                self._file(r, level + 1, head=True)
            elif st.filed_as is not r.status:  # admitted or swapped in: now on the device
                self._leave(st)
                self._enter(r, st)


class _Room:
    """Device blocks for one decision: the free ones, and victims to make more. Victims are the
    requests holding device KV, lowest priority first (``keys``: the device index, ascending),
    each taken once; one goes to host memory if it fits there, else it stays unless recompute
    is allowed."""

    __slots__ = ("by_key", "cursor", "decision", "evicted", "free", "free_swap", "keys", "reach",
                 "swap")

    def __init__(self, policy: FastServePolicy, decision: Decision, kv: KVView,
                 keys: list[int]) -> None:
        self.by_key = policy._by_key
        self.swap = policy.params.swap
        self.decision = decision
        self.keys = keys
        self.cursor = len(keys)  # keys[cursor:] have been taken or passed over
        self.free = kv.num_free_blocks
        self.free_swap = kv.num_free_swap_blocks
        self.evicted: set[int] = set()
        self.reach = 0  # after a failed plan: the most blocks it could have freed

    def plan(self, need: int, above: int, *, recompute: bool) -> _Plan | None:
        """Victims ranked below ``above`` that bring the free blocks to ``need``, or None."""
        got, free_swap = self.free, self.free_swap
        victims: list[tuple[Request, bool]] = []  # (victim, to host)
        i = self.cursor
        keys, by_key = self.keys, self.by_key
        while got < need and i > 0 and keys[i - 1] > above:
            i -= 1
            v = by_key[keys[i]]
            if v.num_blocks == 0:
                continue
            if self.swap and v.num_blocks <= free_swap:
                victims.append((v, True))
                free_swap -= v.num_blocks
            elif recompute or not self.swap:
                victims.append((v, False))
            else:
                continue  # the host cannot take it: it stays
            got += v.num_blocks
        if got < need:
            self.reach = got
            return None
        return _Plan(victims, i, got, free_swap)

    def commit(self, plan: _Plan) -> None:
        d = self.decision
        for v, to_host in plan.victims:
            (d.swap_out if to_host else d.preempted).append(v)
            self.evicted.add(v.req_id)
        self.cursor, self.free, self.free_swap = plan.cursor, plan.free, plan.free_swap


@dataclass(slots=True)
class _Plan:
    victims: list[tuple[Request, bool]]
    cursor: int
    free: int
    free_swap: int


def _in_order(streams: list[list[int]]) -> Iterator[int]:
    """The keys of several ascending lists in one ascending order."""
    live = [s for s in streams if s]
    if len(live) == 1:
        return iter(live[0])
    return merge(*live)


def _first(entry: tuple[float, object]) -> float:
    return entry[0]
