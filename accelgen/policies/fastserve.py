"""FastServe: skip-join multi-level feedback queue (MLFQ) with KV swapping.

- ``num_queues`` priority levels; level p has quantum ``base_quantum x 2^p`` (10 ms x 2^p).
- Skip-join: a new request enters the first level whose quantum covers its isolated prefill time
  (``view.cost.prefill_time``), so long prompts skip the top levels.
- Demotion: the iteration latencies a request is scheduled in accumulate at its level; once the
  sum exceeds the level's quantum it moves one level down (with a fresh account).
- Starvation: a request not served for ``starve_after`` seconds (3 s) is promoted to the top.
- Each iteration takes candidates (running, swapped and waiting alike) in strict priority order
  (level, then FCFS by the time it entered its level) until the batch holds ``max_batch_size`` (16)
  requests; new prompts (and recomputes) run whole, no chunking, at most ``max_prompt_tokens``
  (2048) prompt tokens per batch (a lone longer prompt may still run by itself, else it could never
  run).
- KV: paged blocks. A swapped-out request is swapped back in when it is selected; when the selected
  requests need more blocks than are free, the lowest-priority running requests outside the batch
  are swapped out to host memory (the engine charges blocks x block bytes / host-link bandwidth as
  time). If the host swap space is full, the victim is preempted for recompute instead.

Simplifications (also in docs/baselines.md): swaps happen at iteration boundaries exactly when
the next batch needs the blocks (FastServe's proactive swapping overlaps transfers with compute,
which the engine's serial charge does not model); within a level the order is FCFS, not by
remaining quantum.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, PositiveFloat, PositiveInt

from accelgen.costmodel.base import BatchShape
from accelgen.policies.base import Decision, Policy, PolicyParams, SchedulerView
from accelgen.request import Request, Status


class FastServeParams(PolicyParams):
    num_queues: PositiveInt = 5
    base_quantum: PositiveFloat = 0.010  # seconds; level p has base_quantum * 2**p
    starve_after: PositiveFloat = 3.0  # seconds without service before promotion to the top
    max_batch_size: PositiveInt = 16
    max_prompt_tokens: PositiveInt = 2048
    swap: bool = Field(True, description="swap victims to host; False: recompute them")


@dataclass(slots=True)
class MLFQState:
    level: int
    attained: float = 0.0  # execution time charged at the current level
    entered: float = 0.0  # when it entered the current level (FCFS key within a level)
    last_service: float = 0.0  # end of its last iteration (or its arrival)
    join_level: int = 0  # the level skip-join chose, for diagnostics and tests


def _shape(scheduled: list[tuple[Request, int]]) -> BatchShape:
    """The batch composition the engine will charge (same decode/prefill rule as the engine)."""
    shape = BatchShape()
    for r, n in scheduled:
        ctx = r.num_computed_tokens
        if n == 1 and r.num_output_tokens > 0 and ctx == r.num_tokens - 1:
            shape.add_decode(ctx)
        else:
            shape.add_prefill(n, ctx)
    return shape


def _priority(r: Request) -> tuple[int, float, int]:
    """Strict MLFQ order: level, then FCFS by the time it entered that level."""
    st: MLFQState = r.policy_state
    return st.level, st.entered, r.req_id


class FastServePolicy(Policy):
    name = "fastserve"
    Params = FastServeParams
    params: FastServeParams
    _compute_time: float = 0.0  # predicted compute latency of the last decided batch

    def quantum(self, level: int) -> float:
        return self.params.base_quantum * (1 << level)

    def join_level(self, prefill_time: float) -> int:
        for p in range(self.params.num_queues):
            if self.quantum(p) >= prefill_time:
                return p
        return self.params.num_queues - 1

    def state(self, r: Request, view: SchedulerView) -> MLFQState:
        st = r.policy_state
        if st is None:
            lvl = self.join_level(view.cost.prefill_time(r.prompt_len))
            st = r.policy_state = MLFQState(lvl, 0.0, r.arrival, r.arrival, lvl)
        return st

    def schedule(self, view: SchedulerView) -> Decision:
        p = self.params
        now = view.now
        kv = view.kv
        d = Decision()
        cands = [*view.running, *view.swapped, *view.waiting]
        promoted = 0
        for r in cands:
            st = self.state(r, view)
            if st.level > 0 and now - st.last_service >= p.starve_after:
                st.level, st.attained, st.entered, st.last_service = 0, 0.0, now, now
                promoted += 1
        cands.sort(key=_priority)

        free = kv.num_free_blocks
        free_swap = kv.num_free_swap_blocks
        chosen: set[int] = set()
        evicted: set[int] = set()
        prompt_tokens = 0
        # Eviction victims: running requests, lowest priority first (the end of ``cands``).
        victims = [r for r in reversed(cands) if r.status == Status.RUNNING]
        for r in cands:
            if len(d.scheduled) >= p.max_batch_size:
                break
            if r.req_id in evicted:
                continue
            n = r.num_new_tokens
            if r.status == Status.SWAPPED:
                # Blocks restored by the swap-in plus any block the next token needs.
                need = r.num_swapped_blocks + max(
                    0, -(-(r.num_computed_tokens + n) // kv.block_size) - r.num_swapped_blocks)
            else:
                need = kv.blocks_needed(r, n)
            is_prompt = n > 1 or r.status == Status.WAITING
            if is_prompt and prompt_tokens > 0 and prompt_tokens + n > p.max_prompt_tokens:
                continue
            if need > free:
                # Victims are committed only if together they make enough room.
                victims_r = self._victims_for(victims, r, chosen, evicted, need - free)
                if victims_r is None:
                    continue  # even evicting every lower-priority request does not make room
                for v in victims_r:
                    evicted.add(v.req_id)
                    if p.swap and v.num_blocks <= free_swap:
                        d.swap_out.append(v)
                        free_swap -= v.num_blocks
                    else:
                        d.preempted.append(v)
                    free += v.num_blocks
            if r.status == Status.SWAPPED:
                # Host space it frees is not reused in this decision: the engine applies every
                # swap-out before any swap-in.
                d.swap_in.append(r)
            free -= need
            chosen.add(r.req_id)
            if is_prompt:
                prompt_tokens += n
            d.scheduled.append((r, n))
        self._compute_time = view.cost.iteration_time(_shape(d.scheduled)) if d.scheduled else 0.0
        d.info["prompt_tokens"] = float(prompt_tokens)
        d.info["promoted"] = float(promoted)
        d.info["swap_out"] = float(len(d.swap_out))
        d.info["swap_in"] = float(len(d.swap_in))
        return d

    @staticmethod
    def _victims_for(victims: list[Request], r: Request, chosen: set[int], evicted: set[int],
                     blocks: int) -> list[Request] | None:
        """The lowest-priority running requests outside the batch, all of lower priority than
        ``r`` (``victims`` is ordered lowest priority first), that together hold at least
        ``blocks`` blocks; None if they cannot."""
        key = _priority(r)
        out: list[Request] = []
        got = 0
        for v in victims:
            if got >= blocks or _priority(v) <= key:
                break
            if v.req_id not in chosen and v.req_id not in evicted and v.num_blocks > 0:
                out.append(v)
                got += v.num_blocks
        return out if got >= blocks else None

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:
        end = view.now + latency
        last = self.params.num_queues - 1
        # A request's quantum is spent by execution, not by the host transfers of the iteration
        # (the engine adds swap time to the latency).
        spent = min(latency, self._compute_time)
        for r, _ in decision.scheduled:
            st: MLFQState = r.policy_state
            st.attained += spent
            st.last_service = end
            if st.attained > self.quantum(st.level) and st.level < last:
                st.level += 1
                st.attained = 0.0
                st.entered = end
