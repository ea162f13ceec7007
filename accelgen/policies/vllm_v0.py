"""vLLM V0's default scheduler: prefill-only or decode-only iterations.

While prompts can be admitted (FCFS, stopping at the first that does not fit: head-of-line
blocking), an iteration runs whole prompts only; otherwise it decodes every running request.
Admission needs the whole prompt's blocks plus a 1 % watermark. Preemption recomputes the newest
running request, which goes back to the front of the queue.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from accelgen.core.iteration import Pivot
from accelgen.core.policy import (
    Decision,
    Policy,
    PolicyParams,
    SchedulerView,
    engine_seats,
    engine_token_budget,
)
from accelgen.policies.common import BatchBuilder


class VLLMV0Params(PolicyParams):
    max_num_batched_tokens: PositiveInt | None = None  # default max(max_model_len, 2048)
    max_num_seqs: PositiveInt = 256
    watermark: float = Field(0.01, ge=0.0, lt=1.0)


class VLLMV0Policy(Policy):
    name = "vllm-v0"
    Params = VLLMV0Params
    params: VLLMV0Params

    def largest_budget(self, pivot: Pivot) -> int | None:
        return self.params.max_num_batched_tokens

    def schedule(self, view: SchedulerView) -> Decision:
        budget = engine_token_budget(view, self.params.max_num_batched_tokens
                                     or max(view.max_model_len, 2048))
        seats = engine_seats(view, self.params.max_num_seqs)
        b = BatchBuilder(view.kv, budget)
        watermark = int(self.params.watermark * view.kv.num_total_blocks)
        n_running = len(view.running)
        for r in view.waiting:
            n = r.num_new_tokens
            if n > b.budget_left or n_running + b.num_scheduled >= seats:
                break
            if view.kv.blocks_needed(r, n) > b.free_blocks - watermark:
                break
            b.add(r, n)
        if not b.decision.scheduled:
            running = view.running
            for i, r in enumerate(running):
                if r.req_id in b.preempted_ids:
                    break
                while not b.fits(r, 1):
                    if b.preempt_newest(running, i + 1) is None:
                        b.preempt(r)
                        break
                if r.req_id in b.preempted_ids:
                    break
                b.add(r, 1)
        b.decision.info["token_budget"] = budget
        b.decision.info["prefill_phase"] = float(
            any(r.num_output_tokens == 0 or r.num_new_tokens > 1 for r, _ in b.decision.scheduled))
        return b.decision
