"""Orca: iteration-level FCFS scheduling with a max-sequence-length KV reservation.

Per iteration: every running request (a decode step, or its whole prompt if it was admitted but
never run), then waiting requests FCFS until the batch (8) is full. No token budget, no chunking:
a prompt is processed whole in one iteration, mixed with decodes. Admission reserves KV for
``max_seq_len`` tokens (the paper's 8K) up front through ``Decision.reserve``, so the block manager
itself counts the reservation as allocated (faithful to Orca's contiguous pre-allocation; it is what
limits Orca's concurrency). The queue stops at the first request whose reservation does not fit
(head-of-line). No preemption.

The reservation is ``min(max_seq_len, max_model_len, total KV)`` tokens: a sequence never grows past
``max_model_len`` (the engine stops it there), and a reservation larger than the whole cache would
admit nothing. With ``max_seq_len >= max_model_len`` (the paper's setting) a request therefore never
needs a block beyond its reservation. With a smaller ``max_seq_len`` a long sequence can outgrow it;
it then takes blocks on demand, and only if even that is impossible for every running request is the
newest one recomputed (a safety valve Orca does not have; it shows as the request's preemption count).
"""

from __future__ import annotations

from pydantic import PositiveInt

from accelgen.core.kvcache import blocks_for
from accelgen.core.policy import Decision, Policy, PolicyParams, SchedulerView
from accelgen.policies.common import empty_decision


class OrcaParams(PolicyParams):
    max_batch_size: PositiveInt = 8  # the paper's (and Orca's) setting
    max_seq_len: PositiveInt = 8192  # tokens of KV reserved per request at admission


class OrcaPolicy(Policy):
    name = "orca"
    Params = OrcaParams
    params: OrcaParams

    def reservation_tokens(self, view: SchedulerView) -> int:
        cap = view.kv.num_total_blocks * view.kv.block_size
        return min(self.params.max_seq_len, view.max_model_len, cap)

    def schedule(self, view: SchedulerView) -> Decision:
        # Orca runs ~4x as many iterations as vLLM (batches of at most 8 whole prompts), so its
        # decision keeps the KV ledger in locals (BatchBuilder's rules, inlined): no token
        # budget, free blocks charged per scheduled request.
        kv = view.kv
        block_size = kv.block_size
        reserve = self.reservation_tokens(view)
        max_batch = self.params.max_batch_size
        free = kv.num_free_blocks
        d = empty_decision()
        scheduled = d.scheduled
        running = view.running
        for r in running:
            if len(scheduled) >= max_batch:
                break
            computed = r.num_computed_tokens
            n = r.prompt_len + r.num_output_tokens - computed  # 1 for a decode; a prompt whole
            need = -(-(computed + n) // block_size) - r.num_blocks
            if need <= free:
                if need > 0:
                    free -= need
                scheduled.append((r, n))
        overflow = 0
        if running and not scheduled:
            # Only reachable when max_seq_len < max_model_len and every running request has
            # outgrown its reservation with no free block left: free the newest to make progress.
            free += running[-1].num_blocks
            d.preempted.append(running[-1])
            overflow = 1
        for r in view.waiting:
            if len(scheduled) >= max_batch or overflow:
                break
            if r.num_output_tokens == 0 and r.prompt_len + 1 > reserve:
                # The prompt plus its first output token can never fit in one reservation.
                d.rejected.append((r, f"orca: prompt of {r.prompt_len} tokens exceeds the "
                                      f"{reserve}-token max-length reservation"))
                continue
            # A request recomputed by the safety valve may already be longer than max_seq_len.
            tokens = max(reserve, r.num_new_tokens + 1)
            need = blocks_for(tokens, block_size)
            if need > free:
                break  # FCFS head-of-line: the next request waits for a whole reservation
            d.reserve.append((r, tokens))
            free -= need
            # The reservation already covers the whole prompt: no further blocks to charge.
            scheduled.append((r, r.num_new_tokens))
        d.info["reserved_tokens"] = float(reserve)
        return d

    def repeats(self, view: SchedulerView, decision: Decision) -> bool:
        # Under the simulator's conditions (a decode-only decision that admitted, rejected and
        # preempted nothing; then no arrival, no finish, no new block for the batch) Orca
        # decides the same: the running requests are the same, in the same order, and the
        # scheduled ones need no block; the free blocks cannot grow until a request finishes,
        # so a running request or the waiting queue's head that did not fit still does not
        # (head-of-line), and the batch limit and the reservation are the same.
        return True
