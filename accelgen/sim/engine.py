"""The discrete-event serving loop.

One iteration = ask the policy for a decision, apply preemptions/swaps, allocate KV for the
scheduled tokens, charge the cost model's latency, emit tokens at the iteration's end. Arrivals
are admitted to the waiting queue whenever simulated time passes them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from accelgen.costmodel.base import BatchShape, CostModel
from accelgen.kvcache import BlockManager, never_fits_reason
from accelgen.policies.base import Pivot, Policy, SchedulerView
from accelgen.request import Request, Status
from accelgen.sim.recorder import IterationLog


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the interface contract."""


@dataclass(slots=True)
class SimulationResult:
    requests: list[Request]
    served_output_len: np.ndarray  # per req_id: tokens the request is to emit
    iterations: IterationLog
    end_time: float
    wall_time_s: float
    meta: dict[str, object] = field(default_factory=dict)


class Simulator:
    def __init__(
        self,
        requests: Sequence[Request],
        output_len: Sequence[int] | np.ndarray,
        policy: Policy,
        cost: CostModel,
        kv: BlockManager,
        pivot: Pivot,
        *,
        max_model_len: int,
        kv_bytes_per_token: int = 0,
        host_link_bandwidth: float = math.inf,
        add_scheduler_overhead: bool = False,
        swap_overlap: bool = True,
        max_iterations: int | None = None,
        progress: bool = False,
    ) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        n = len(self.requests)
        ids = [r.req_id for r in self.requests]
        if sorted(ids) != list(range(n)):
            raise ValueError("request ids must be 0..n-1")
        natural = np.asarray(output_len, dtype=np.int64)
        if natural.shape != (n,) or (n and natural.min() < 1):
            raise ValueError("output_len must give a positive length for every request id")
        # A sequence stops at max_model_len, as a real engine's length limit does.
        prompt = np.zeros(n, dtype=np.int64)
        for r in self.requests:
            prompt[r.req_id] = r.prompt_len
        self.served_output_len = np.minimum(natural, np.maximum(max_model_len - prompt, 0))
        self._target = self.served_output_len.tolist()
        self.policy = policy
        self.cost = cost
        self.kv = kv
        self.pivot = pivot
        self.max_model_len = max_model_len
        self.kv_bytes_per_token = kv_bytes_per_token
        self.host_link_bandwidth = host_link_bandwidth
        self.add_scheduler_overhead = add_scheduler_overhead
        # True: host transfers run beside the iteration's compute (a copy stream, as FastServe's
        # proactive swapping does), so an iteration takes max(compute, transfer), not the sum.
        self.swap_overlap = swap_overlap
        self.max_iterations = max_iterations
        self.progress = progress
        self.log = IterationLog()

    # ---------------------------------------------------------------------------------------
    def _reject_reason(self, r: Request) -> str:
        return never_fits_reason(r.prompt_len, self._target[r.req_id],
                                 max_model_len=self.max_model_len,
                                 num_blocks=self.kv.num_total_blocks, block_size=self.kv.block_size)

    def _finish(self, r: Request, now: float, status: Status, reason: str = "") -> None:
        self.kv.free(r)
        r.status = status
        r.finish_time = now
        r.reject_reason = reason
        self.policy.on_finish(r, now)

    def run(self) -> SimulationResult:
        wall0 = time.perf_counter()
        reqs, kv, policy, cost, log = self.requests, self.kv, self.policy, self.cost, self.log
        target = self._target
        waiting: list[Request] = []
        running: list[Request] = []
        swapped: list[Request] = []
        grant = policy.clairvoyant
        view = SchedulerView(
            now=0.0, waiting=waiting, running=running, swapped=swapped, kv=kv, cost=cost,
            pivot=self.pivot, max_model_len=self.max_model_len,
            true_output_len={r.req_id: target[r.req_id] for r in reqs} if grant else None,
            next_arrivals=reqs if grant else None,
        )
        n_total = len(reqs)
        n_done = 0
        next_idx = 0
        now = reqs[0].arrival if reqs else 0.0
        kv_used_tokens = 0  # computed tokens resident in device KV
        bar = _progress(n_total) if self.progress else None
        iteration = 0
        idle_decisions = 0
        add_overhead = self.add_scheduler_overhead
        swap_cost_per_block = (kv.block_size * self.kv_bytes_per_token / self.host_link_bandwidth
                               if self.host_link_bandwidth < math.inf else 0.0)

        while n_done < n_total:
            while next_idx < n_total and reqs[next_idx].arrival <= now:
                r = reqs[next_idx]
                next_idx += 1
                reason = self._reject_reason(r)
                if reason:
                    self._finish(r, r.arrival, Status.REJECTED, reason)
                    n_done += 1
                    continue
                r.queued_since = r.arrival
                waiting.append(r)
                policy.on_arrival(r, now)
            if not (waiting or running or swapped):
                if next_idx < n_total:
                    now = reqs[next_idx].arrival
                    continue
                break
            if self.max_iterations is not None and iteration >= self.max_iterations:
                n_done += self._reject_all(waiting, running, swapped, now,
                                           f"simulation stopped at max_iterations={self.max_iterations}")
                break

            view.now = now
            t0 = time.perf_counter()
            decision = policy.schedule(view)
            decide_s = time.perf_counter() - t0

            for r, why in decision.rejected:
                if r.status != Status.WAITING:
                    raise PolicyError(f"{policy.name}: can only reject waiting requests (req {r.req_id})")
                waiting.remove(r)
                self._finish(r, now, Status.REJECTED, why)
                n_done += 1
            for r in decision.preempted:
                if r.status != Status.RUNNING:
                    raise PolicyError(f"{policy.name}: preempted request {r.req_id} is not running")
                kv_used_tokens -= r.num_computed_tokens
                kv.free(r)
                r.num_computed_tokens = 0
                r.status = Status.WAITING
                r.num_preemptions += 1
                r.queued_since = now
                running.remove(r)
                waiting.insert(0, r)
            swap_blocks = 0
            for r in decision.swap_out:
                if r.status != Status.RUNNING:
                    raise PolicyError(f"{policy.name}: swap-out of non-running request {r.req_id}")
                swap_blocks += kv.swap_out(r)
                kv_used_tokens -= r.num_computed_tokens
                r.status = Status.SWAPPED
                running.remove(r)
                swapped.append(r)
            for r in decision.swap_in:
                if r.status != Status.SWAPPED:
                    raise PolicyError(f"{policy.name}: swap-in of non-swapped request {r.req_id}")
                swap_blocks += kv.swap_in(r)
                kv_used_tokens += r.num_computed_tokens
                r.status = Status.RUNNING
                swapped.remove(r)
                running.append(r)
            swap_s = swap_blocks * swap_cost_per_block
            for r, n_tokens in decision.reserve:
                if r.status not in (Status.WAITING, Status.RUNNING):
                    raise PolicyError(f"{policy.name}: reserve for finished request {r.req_id}")
                try:
                    kv.reserve(r, n_tokens)
                except RuntimeError as exc:
                    raise PolicyError(f"{policy.name}: {exc}") from None

            scheduled = decision.scheduled
            if not scheduled:
                if swap_s > 0:
                    now += swap_s
                    continue
                idle_decisions += 1
                if idle_decisions > 10_000:
                    raise PolicyError(f"{policy.name}: 10000 decisions in a row scheduled nothing")
                if decision.preempted or decision.rejected or decision.swap_out or decision.swap_in:
                    continue  # the state changed: ask again at the same time
                wake = decision.wake_at if decision.wake_at is not None else math.inf
                t_next = min(wake, reqs[next_idx].arrival if next_idx < n_total else math.inf)
                if t_next == math.inf:
                    n_done += self._reject_all(
                        waiting, running, swapped, now,
                        f"stalled: {policy.name} scheduled nothing and no arrivals remain")
                    break
                if t_next <= now:
                    raise PolicyError(f"{policy.name}: wake_at {t_next} is not after now {now}")
                now = t_next
                continue
            idle_decisions = 0

            shape = BatchShape()
            admitted = False
            for r, n in scheduled:
                if n <= 0 or n > r.num_new_tokens:
                    raise PolicyError(
                        f"{policy.name}: request {r.req_id} scheduled {n} tokens, "
                        f"{r.num_new_tokens} pending")
                if r.status == Status.WAITING:
                    r.status = Status.RUNNING
                    running.append(r)
                    admitted = True
                    if r.first_scheduled_time != r.first_scheduled_time:  # NaN: first time
                        r.first_scheduled_time = now
                elif r.status != Status.RUNNING:
                    raise PolicyError(f"{policy.name}: request {r.req_id} scheduled while {r.status.name}")
                ctx = r.num_computed_tokens
                if n == 1 and r.is_decode:
                    shape.add_decode(ctx)
                else:
                    shape.add_prefill(n, ctx)
                try:
                    kv.allocate(r, n)
                except RuntimeError as exc:
                    raise PolicyError(f"{policy.name}: {exc}") from None
            if admitted:
                waiting[:] = [r for r in waiting if r.status == Status.WAITING]

            compute = cost.iteration_time(shape)
            latency = ((max(compute, swap_s) if self.swap_overlap else compute + swap_s)
                       + (decide_s if add_overhead else 0.0))
            end = now + latency
            finished = False
            for r, n in scheduled:
                r.num_computed_tokens += n
                kv_used_tokens += n
                if r.num_computed_tokens == r.prompt_len + r.num_output_tokens:
                    r.num_output_tokens += 1
                    r.token_times.append(end)
                    if r.num_output_tokens == 1:
                        r.first_token_time = end
                    r.last_token_time = end
                    if r.num_output_tokens >= target[r.req_id]:
                        kv_used_tokens -= r.num_computed_tokens
                        self._finish(r, end, Status.FINISHED)
                        n_done += 1
                        finished = True
            if finished:
                running[:] = [r for r in running if r.status == Status.RUNNING]
                if bar is not None:
                    bar.n = n_done
                    bar.refresh()
            log.append(
                now, latency, shape, len(scheduled), kv.num_used_blocks, kv.num_total_blocks,
                kv_used_tokens, decide_s, len(decision.preempted), len(waiting), len(running),
                len(swapped), swap_s, decision.info)
            policy.on_step_end(view, decision, latency)
            now = end
            iteration += 1

        if bar is not None:
            bar.n = n_done
            bar.close()
        return SimulationResult(
            requests=sorted(reqs, key=lambda r: r.req_id),
            served_output_len=self.served_output_len,
            iterations=log,
            end_time=now,
            wall_time_s=time.perf_counter() - wall0,
        )

    def _reject_all(self, waiting: list[Request], running: list[Request], swapped: list[Request],
                    now: float, reason: str) -> int:
        n = 0
        for group in (waiting, running, swapped):
            for r in group:
                self._finish(r, now, Status.REJECTED, reason)
                n += 1
            group.clear()
        for r in self.requests:  # not yet arrived
            if r.status == Status.WAITING and not r.is_done and r.arrival > now:
                self._finish(r, r.arrival, Status.REJECTED, reason)
                n += 1
        return n


def _progress(total: int):  # pragma: no cover - cosmetic
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="simulate", mininterval=1.0)
