"""vLLM V1's priority scheduling (``scheduling_policy="priority"``), with each request's priority
taken from its SLO class.

Modelled on ``vllm/v1/core/sched/scheduler.py`` and ``request_queue.py`` of vLLM 0.32
(``Scheduler.schedule``, ``PriorityRequestQueue``, ``Request.__lt__``); what differs from the
FCFS mode that ``vllm.py`` models:

- **Waiting queue**: a heap ordered by ``(priority, arrival_time, request_id)``, smaller first. A
  preempted request goes back into the heap under its original arrival time (there is no
  "front" of a priority queue), not to the front as in FCFS.
- **Running requests** are still served in admission order (``self.running`` is a list; the
  priority does not reorder it), each taking its pending tokens up to the budget left.
- **Preemption** when a running request's new blocks do not fit: the victim is the running
  request with the largest ``(priority, arrival_time)`` (Python's ``max``: the first such one in
  running order), whether or not it was already scheduled in this step (a scheduled victim is
  unscheduled and its tokens go back to the budget), and possibly the request itself (then the
  running pass stops). Repeated until the blocks fit.
- **Admission** (waiting requests) only in a step without preemption, in heap order, while the
  budget lasts and fewer than ``max_num_seqs`` requests run; a request is admitted when its
  whole remaining prompt fits in free KV (vLLM's ``scheduler_reserve_full_isl``, on by default),
  and the first that does not fit stops admission (head-of-line). **A waiting request never
  preempts a running one**, however high its priority: vLLM preempts only in the running pass.

The priority (:func:`slo_priority`; vLLM: smaller runs first): an online request's TBT SLO in
whole milliseconds, so the tightest pace goes first (the 47 ms class before the 94 ms one, and so
on; one class per distinct SLO), and offline requests after every online one. Ties (same class)
go by arrival. This is how a vLLM user with SLO classes would use ``--scheduling-policy
priority``: the interactive, tight-pace traffic first, batch traffic last. The stock engine in
``accelgen replay --system stock --scheduling-policy priority`` and ``accelgen serve --system
stock --scheduling-policy priority`` gets the same numbers (``vllm_integration.scheduler``).
Ties on ``(priority, arrival)`` go by ``req_id`` here and by vLLM's request-id string there.
"""

from __future__ import annotations

import math

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
from accelgen.core.request import Request
from accelgen.policies.common import BatchBuilder, OrderedWaiting, decode_blocks_fit

# An offline request's priority: after every online one (vLLM priorities are plain integers).
OFFLINE_PRIORITY = 1_000_000
# An online request without a (finite, positive) TBT SLO: after every online class.
NO_TBT_PRIORITY = OFFLINE_PRIORITY - 1


def slo_priority(online: bool, tbt_slo: float) -> int:
    """vLLM priority of a request from its SLO class (smaller is served first): online requests
    by their TBT SLO in whole milliseconds (at least 0), offline ones last."""
    if not online:
        return OFFLINE_PRIORITY
    if not (math.isfinite(tbt_slo) and tbt_slo > 0):
        return NO_TBT_PRIORITY
    return min(round(tbt_slo * 1000.0), NO_TBT_PRIORITY - 1)


def request_priority(r: Request) -> int:
    return slo_priority(r.online, r.tbt_slo)


def _heap_key(r: Request) -> tuple[int, float]:
    return (request_priority(r), r.arrival)


class VLLMPriorityParams(PolicyParams):
    token_budget: PositiveInt | None = None  # default: the pivot forward size S_pf
    max_num_seqs: PositiveInt = 256


class VLLMPriorityPolicy(Policy):
    name = "vllm-priority"
    Params = VLLMPriorityParams
    params: VLLMPriorityParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        # vLLM's heap, kept across decisions: a waiting request's key never changes.
        self._waiting = OrderedWaiting(_heap_key)

    def on_arrival(self, req: Request, now: float) -> None:
        self._waiting.arrived.append(req)

    def largest_budget(self, pivot: Pivot) -> int:
        return self.params.token_budget or pivot.s_pf

    def schedule(self, view: SchedulerView) -> Decision:
        budget = engine_token_budget(view, self.params.token_budget or view.pivot.s_pf)
        waiting = self._waiting
        in_order = waiting.sync(view)  # False: requests reached the queue without the hooks
        b = BatchBuilder(view.kv, budget)
        live = list(view.running)  # vLLM's self.running: admission order, victims removed
        planned: dict[int, tuple[int, int]] = {}  # req_id -> (tokens, blocks) scheduled
        blocks_needed = view.kv.blocks_needed
        i = 0
        while i < len(live) and b.budget_left > 0:
            r = live[i]
            n = min(r.num_new_tokens, b.budget_left)
            need = blocks_needed(r, n)  # (preempting others frees blocks, not r's need)
            stopped = False
            while need > b.free_blocks:
                victim = max(live, key=_victim_key)
                at = live.index(victim)
                del live[at]
                if at < i:
                    i -= 1
                if victim.req_id in planned:
                    _unschedule(b, victim, planned.pop(victim.req_id))
                b.preempt(victim)
                if victim is r:
                    stopped = True
                    break
            if stopped:
                break  # r itself was the lowest priority: vLLM stops the running pass here
            b.add(r, n, need)
            planned[r.req_id] = (n, need)
            i += 1
        if not b.decision.preempted:
            queue = ((e[2] for e in waiting.entries) if in_order
                     else sorted(view.waiting, key=lambda r: (*_heap_key(r), r.req_id)))
            seats = engine_seats(view, self.params.max_num_seqs)
            for r in queue:
                if b.budget_left <= 0 or len(live) >= seats:
                    break
                if not b.fits(r, r.num_new_tokens):
                    break  # head-of-line: the whole remaining prompt must fit
                b.add(r, min(r.num_new_tokens, b.budget_left))
                live.append(r)
                waiting.admitted.append(r)
        waiting.preempted.extend(b.decision.preempted)
        b.decision.info["token_budget"] = budget
        return b.decision

    def after_decodes_while_blocks_fit(self) -> bool:
        return True  # (schedule_after_decodes below)

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # After decode steps alone with no arrival, finish or preemption (so nothing for the
        # heap to take in): ``schedule`` walks the same running requests, one token each, under
        # the same budget, and preempts only where their new blocks exceed the free ones; the
        # heap's head, which did not fit a step ago (or met the seat or budget limit), fits in
        # no more free blocks now. ``on_step_end`` is a no-op here.
        return decision if decode_blocks_fit(view, decision) else self.schedule(view)


def _victim_key(r: Request) -> tuple[int, float]:
    return (request_priority(r), r.arrival)


def _unschedule(b: BatchBuilder, r: Request, planned: tuple[int, int]) -> None:
    """Take ``r``'s tokens out of the batch being built (vLLM restores the budget when it
    preempts a request it had already scheduled in this step)."""
    n, need = planned
    b.decision.scheduled = [(q, k) for q, k in b.decision.scheduled if q is not r]
    b.scheduled_ids.discard(r.req_id)
    b.budget_left += n
    b.free_blocks += need
