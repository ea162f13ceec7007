"""vLLM V1's default scheduler (FCFS, chunked prefill, recompute preemption).

Running requests first in admission order, each taking its pending tokens up to the remaining
budget; when a running request's blocks do not fit, the newest running request is preempted
(recompute), possibly the request itself. Then, only if no preemption happened in this step,
waiting requests FCFS: a request is admitted when its whole remaining prompt fits in free KV
(SPEC section 5), but blocks are allocated per chunk; the queue stops at the first that does not
fit (head-of-line).
"""

from __future__ import annotations

from pydantic import PositiveInt

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
from accelgen.policies.common import BatchBuilder, decode_blocks_fit

_INFO_INDEX = {"token_budget": 0}


class VLLMParams(PolicyParams):
    token_budget: PositiveInt | None = None  # default: the pivot forward size S_pf
    max_num_seqs: PositiveInt = 256


class VLLMPolicy(Policy):
    name = "vllm"
    Params = VLLMParams
    params: VLLMParams

    def largest_budget(self, pivot: Pivot) -> int:
        return self.params.token_budget or pivot.s_pf

    def schedule(self, view: SchedulerView) -> Decision:
        budget = engine_token_budget(view, self.params.token_budget or view.pivot.s_pf)
        b = BatchBuilder(view.kv, budget)
        running = view.running
        blocks_needed = view.kv.blocks_needed
        for i, r in enumerate(running):
            if b.budget_left <= 0:
                break
            if r.req_id in b.preempted_ids:
                break  # everything from here on was preempted as a victim
            n = min(r.num_new_tokens, b.budget_left)
            need = blocks_needed(r, n)  # (preempting others frees blocks, not r's need)
            while need > b.free_blocks:
                if b.preempt_newest(running, i + 1) is None:
                    b.preempt(r)
                    break
            if r.req_id in b.preempted_ids:
                break
            b.add(r, n, need)
        if not b.decision.preempted:
            n_running = len(running)
            seats = engine_seats(view, self.params.max_num_seqs)
            for r in view.waiting:
                if b.budget_left <= 0 or n_running + b.num_scheduled >= seats:
                    break
                if not b.fits(r, r.num_new_tokens):
                    break
                b.add(r, min(r.num_new_tokens, b.budget_left))
        # (an InfoRow, not a dict: the iteration log keeps rows of one index without a lookup)
        b.decision.info = InfoRow(_INFO_INDEX, [float(budget)])
        return b.decision

    def after_decodes_while_blocks_fit(self) -> bool:
        return True  # (schedule_after_decodes below)

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # After decode steps alone, with no arrival, finish or preemption, ``schedule`` walks
        # the same running requests (the same prefix, when the budget cut it), one token each,
        # under the same budget; it preempts only where their new blocks exceed the free ones;
        # and the waiting queue's head, which did not fit in at least as many free blocks a
        # step ago (or the seat or budget limit it met), still does not. So the decision is
        # ``decision`` again unless the blocks run short (a decode step needs a new block
        # exactly when its computed tokens fill its blocks). ``on_step_end`` is a no-op here.
        return decision if decode_blocks_fit(view, decision) else self.schedule(view)
