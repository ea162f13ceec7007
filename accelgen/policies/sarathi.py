"""Sarathi-Serve: stall-free batching with chunked prefills under a token budget.

Per iteration: every running decode (decodes are never stalled by the budget), then the ongoing
(partially prefilled) prompts, then new prompts FCFS; a prompt chunk is the smaller of its
remaining tokens and the budget left after the decodes. A new prompt is admitted only when its
whole prompt fits in free KV above a 1 % watermark, at most ``max_num_seqs`` run at once, and the
queue stops at the first prompt that does not fit. Preemption recomputes the newest request.

``system_slo`` gives the system-wide-SLO variant: the budget becomes S_pf x SLO / T_pf, the
paper's rule for one SLO shared by every request. ``order: slack`` orders new prompts by their
TTFT slack instead of FIFO (the paper's FIFO-vs-slack measurement, figure 7).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from accelgen.core.iteration import Pivot
from accelgen.core.policy import (
    Decision,
    InfoRow,
    Policy,
    PolicyParams,
    SchedulerView,
    engine_seats,
    engine_token_budget,
)
from accelgen.core.request import Request
from accelgen.policies.common import BatchBuilder, OrderedWaiting, decode_blocks_fit, is_prefilling

_INFO_INDEX = {"token_budget": 0}


class SarathiParams(PolicyParams):
    token_budget: PositiveInt | None = None  # default: S_pf (Sarathi's own default is 512)
    system_slo: PositiveFloat | None = None  # seconds; overrides token_budget
    max_num_seqs: PositiveInt = 128
    watermark: float = Field(0.01, ge=0.0, lt=1.0)
    order: Literal["fifo", "slack"] = "fifo"


def system_slo_budget(s_pf: int, t_pf: float, slo: float, block_size: int) -> int:
    return max(block_size, int(s_pf * slo / t_pf))


class SarathiPolicy(Policy):
    name = "sarathi"
    Params = SarathiParams
    params: SarathiParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        # order: slack: the waiting requests by TTFT deadline, kept across decisions (all
        # slacks fall at the same rate, so their order is the deadlines' order).
        self._slack_order = (OrderedWaiting(_ttft_deadline) if self.params.order == "slack"
                             else None)

    def largest_budget(self, pivot: Pivot) -> int | None:
        # Decodes first (at most one per running request, never stalled), then prompts while
        # the budget lasts: at most max(budget, running requests) tokens, and vLLM's
        # max_num_batched_tokens is at least its max_num_seqs. (The system-SLO budget needs the
        # KV block size: none given.)
        p = self.params
        return None if p.system_slo is not None else p.token_budget or pivot.s_pf

    def token_budget(self, view: SchedulerView) -> int:
        p = self.params
        if p.system_slo is not None:
            return engine_token_budget(view, system_slo_budget(
                view.pivot.s_pf, view.pivot.t_pf, p.system_slo, view.kv.block_size))
        return engine_token_budget(view, p.token_budget or view.pivot.s_pf)

    def schedule(self, view: SchedulerView) -> Decision:
        budget = self.token_budget(view)
        b = BatchBuilder(view.kv, budget)
        running = view.running
        blocks_needed = view.kv.blocks_needed
        # Decodes first: never stalled (within the engine's batch limit, where one is set),
        # preempting the newest request when KV runs out.
        decode_room = view.max_num_batched_tokens
        for i, r in enumerate(running):
            if r.req_id in b.preempted_ids or is_prefilling(r):
                continue
            if decode_room is not None and b.num_scheduled >= decode_room:
                break
            need = blocks_needed(r, 1)  # (preempting others frees blocks, not r's need)
            while need > b.free_blocks:
                if b.preempt_newest(running, i + 1) is None:
                    b.preempt(r)
                    break
            if r.req_id not in b.preempted_ids:
                b.add(r, 1, need)
        # Ongoing prefills continue before any new prompt starts.
        for i, r in enumerate(running):
            if b.budget_left <= 0:
                break
            if r.req_id in b.preempted_ids or not is_prefilling(r):
                continue
            n = min(r.num_new_tokens, b.budget_left)
            while not b.fits(r, n):
                room = b.max_tokens_in_free_kv(r)
                if room > 0:
                    n = min(n, room)  # cut the chunk where free KV ends
                elif b.preempt_newest(running, i + 1) is None:
                    b.preempt(r)
                    break
            if r.req_id not in b.preempted_ids:
                b.add(r, n)
        watermark = int(self.params.watermark * view.kv.num_total_blocks)
        n_live = len(running) - len(b.decision.preempted)
        admitted = None
        if self.params.order == "fifo":
            queue: Iterable[Request] = view.waiting
        elif self._slack_order is not None and self._slack_order.sync(view):
            queue = _by_slack(self._slack_order.entries, view.now)
            admitted = self._slack_order.admitted
        else:
            queue = sorted(view.waiting, key=lambda r: (r.arrival + r.ttft_slo - view.now,
                                                        r.req_id))
        seats = engine_seats(view, self.params.max_num_seqs)
        for r in queue:
            if b.budget_left <= 0 or n_live >= seats:
                break
            if view.kv.blocks_needed(r, r.num_new_tokens) > b.free_blocks - watermark:
                break
            b.add(r, min(r.num_new_tokens, b.budget_left))
            n_live += 1
            if admitted is not None:
                admitted.append(r)
        if self._slack_order is not None:
            self._slack_order.preempted.extend(b.decision.preempted)
        # (an InfoRow, not a dict: the iteration log keeps rows of one index without a lookup)
        b.decision.info = InfoRow(_INFO_INDEX, [float(budget)])
        return b.decision

    def after_decodes_while_blocks_fit(self) -> bool:
        # (schedule_after_decodes below: FIFO only)
        return self._slack_order is None and self.params.order == "fifo"

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # FIFO, after decode steps alone with no arrival, finish or preemption: ``schedule``
        # gives every running decode its token again; the budget left after them is the same,
        # so an ongoing prompt that got no chunk gets none; the waiting queue's head, which did
        # not fit in at least as many free blocks a step ago (or met the seat or budget limit),
        # still does not; and it preempts only where the decodes' new blocks exceed the free
        # ones. So the decision is ``decision`` again unless the blocks run short (a decode step
        # needs a new block exactly when its computed tokens fill its blocks). (Slack order
        # keeps its own queue state: asked every time.) ``on_step_end`` is a no-op here.
        if self._slack_order is not None or self.params.order != "fifo":
            return super().schedule_after_decodes(view, decision, latency)
        return decision if decode_blocks_fit(view, decision) else self.schedule(view)

    def on_arrival(self, req: Request, now: float) -> None:
        if self._slack_order is not None:
            self._slack_order.arrived.append(req)


def _ttft_deadline(r: Request) -> float:
    return r.arrival + r.ttft_slo


def _by_slack(entries: list[tuple[float, int, Request]], now: float) -> Iterator[Request]:
    """The waiting requests by ``(deadline - now, req_id)``, from ``entries`` sorted by
    ``(deadline, req_id)``: the same order, except where two deadlines round to the same slack
    (subtraction is monotone, so such ties are neighbours): those go by req_id, as sorting by
    slack puts them."""
    i, n = 0, len(entries)
    while i < n:
        slack = entries[i][0] - now
        j = i + 1
        while j < n and entries[j][0] - now == slack:
            j += 1
        if j == i + 1:
            yield entries[i][2]
        else:
            yield from (r for _, _, r in sorted(entries[i:j], key=lambda e: e[1]))
        i = j
