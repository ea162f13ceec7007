"""DeepSpeed-FastGen's Dynamic SplitFuse (the scheduler of DeepSpeed-MII's ragged batching).

Per iteration, one ragged forward of at most ``token_budget`` tokens (MII's
``max_ragged_batch_size``) and ``max_num_seqs`` sequences (``max_ragged_sequence_count``):

1. decodes first, one token each, in admission order; a decode whose next block does not fit is
   skipped this iteration (MII ``continue``s);
2. then prompt chunks FCFS: a prompt that was split continues first (MII puts the remainder at the
   front of its buffer), then new or recomputing prompts in queue order. Each takes
   ``min(remaining prompt, budget left)`` tokens, so the forward is filled to exactly the budget
   while prompt work exists. A prompt is scheduled only when its *whole remaining* prompt fits in
   the free KV (MII's deadlock guard); the first prompt that does not fit stops the queue.
3. if nothing at all could be scheduled while work exists, flush (recompute) the last
   KV-holding request, as the SPEC prescribes. MII itself flushes every request in that case
   (``reset_request_status``); ``deadlock_flush: all`` reproduces that.

FastGen's own default budget is 768; the paper (and this default) uses the pivot forward size S_pf.
"""

from __future__ import annotations

from itertools import chain
from typing import Literal

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
from accelgen.policies.common import BatchBuilder, decode_blocks_fit, is_prefilling


class FastGenParams(PolicyParams):
    token_budget: PositiveInt | None = None  # default: the pivot forward size S_pf
    max_num_seqs: PositiveInt = 512
    deadlock_flush: Literal["last", "all"] = "last"


class FastGenPolicy(Policy):
    name = "fastgen"
    Params = FastGenParams
    params: FastGenParams

    def largest_budget(self, pivot: Pivot) -> int:
        return self.params.token_budget or pivot.s_pf

    def schedule(self, view: SchedulerView) -> Decision:
        p = self.params
        budget = engine_token_budget(view, p.token_budget or view.pivot.s_pf)
        seats = engine_seats(view, p.max_num_seqs)
        b = BatchBuilder(view.kv, budget)
        running = view.running
        for r in running:
            if b.budget_left <= 0 or b.num_scheduled >= seats:
                break
            if not is_prefilling(r) and b.fits(r, 1):
                b.add(r, 1)
        # Split prompts (running, partially prefilled) continue before any new prompt starts.
        # (chained, not copied: the waiting queue reaches ~19 K requests in the paper's setting
        # and the loop below stops at its first prompt that does not fit)
        prompts = chain([r for r in running if is_prefilling(r)], view.waiting)
        gated = 0
        for r in prompts:
            if b.budget_left <= 0 or b.num_scheduled >= seats:
                break
            if not b.fits(r, r.num_new_tokens):
                gated = 1  # the whole remaining prompt does not fit: the queue stops here
                break
            b.add(r, min(r.num_new_tokens, b.budget_left))
        d = b.decision
        if not d.scheduled and running:
            # Deadlock: no decode block and no whole prompt fits. Free KV by recomputing.
            victims = running if p.deadlock_flush == "all" else running[-1:]
            for r in reversed(victims):  # newest first, so the oldest ends at the queue front
                b.preempt(r)
        d.info["token_budget"] = float(budget)
        d.info["kv_gate_stop"] = float(gated)
        return d

    def after_decodes_while_blocks_fit(self) -> bool:
        return True  # (schedule_after_decodes below)

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # After decode steps alone with no arrival, finish or flush: ``schedule`` walks the same
        # decodes under the same budget and seat limit; a decode it skipped (its block did not
        # fit) finds no more free blocks now, and neither does the prompt that stopped the
        # queue (or the budget or seats stop it again), so the diagnostics are the same too;
        # only a scheduled decode whose new block no longer fits changes the decision (it is
        # skipped). ``on_step_end`` is a no-op here.
        return decision if decode_blocks_fit(view, decision) else self.schedule(view)
