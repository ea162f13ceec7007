"""The discrete-event serving loop.

``Simulator.run`` repeats its named steps: ``_admit_arrivals`` (requests whose arrival time has
come join the waiting queue), ``_decide`` (the policy's decision), ``_apply`` (its rejections,
preemptions, swaps and reservations), then either ``_idle`` (nothing scheduled: the clock jumps
to the next event) or ``_form_batch`` (admit, allocate KV, the batch's shape) and ``_advance``
(charge the cost model's latency, emit tokens at the iteration's end, finish, log).
"""

from __future__ import annotations

import gc
import math
import sys
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from accelgen.core.iteration import BatchShape, Pivot
from accelgen.core.kvcache import BlockManager, never_fits_reason
from accelgen.core.policy import Decision, DecodeSteps, Policy, SchedulerView
from accelgen.core.request import Request, Status, length_cap_reason, served_output_len
from accelgen.costmodel.base import CostModel
from accelgen.results import IterationLog

# How often ``Simulator(check=...)`` is called: a check scans the requests still open, a few
# thousand iterations (a few simulated seconds under load) apart keep it off the loop's cost.
CHECK_EVERY_ITERATIONS = 2048


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the interface contract."""


@dataclass(slots=True)
class SimulationResult:
    requests: list[Request]
    requested_output_len: np.ndarray  # per req_id: the trace's output length
    served_output_len: np.ndarray  # per req_id: tokens it is to emit (stopped at max_model_len)
    iterations: IterationLog
    end_time: float
    wall_time_s: float
    meta: dict[str, object] = field(default_factory=dict)


class Simulator:
    # The serving loop's state, (re)set by ``_start``.
    _waiting: list[Request]
    _running: list[Request]
    _swapped: list[Request]
    _view: SchedulerView
    _now: float  # simulated time (s)
    _n_total: int
    _n_done: int  # requests that ended (finished, cut or rejected)
    _next_idx: int  # the next request (in arrival order) still to arrive
    _next_arrival: float  # its arrival time (inf: none left)
    _kv_used_tokens: int  # computed tokens resident in device KV
    _iteration: int
    _idle_decisions: int  # decisions in a row that scheduled nothing
    _decide_s: float  # wall time of the last decision
    # Asking runs still to ask step by step before the next decided run, and how many after the
    # next decided run that decides few steps (``DECIDED_RUN_WORTH``).
    _decided_skip: int
    _decided_backoff: int
    # The waiting queue's order as numbers, by req_id: arrivals join the back with increasing
    # ones, preempted requests the front with decreasing ones, so the queue is always sorted by
    # them and a request is found by bisection (``_remove``), not by a scan.
    _queue_key: list[int]
    _back_key: int
    _front_key: int
    _swap_cost_per_block: float
    _bar: Any

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
        horizon_s: float | None = None,
        progress: bool = False,
        planning_cost: CostModel | None = None,
        check: Callable[[float, Sequence[Request]], None] | None = None,
        check_every: int | None = None,
    ) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        n = len(self.requests)
        ids = [r.req_id for r in self.requests]
        if sorted(ids) != list(range(n)):
            raise ValueError("request ids must be 0..n-1")
        natural = np.asarray(output_len, dtype=np.int64)
        if natural.shape != (n,) or (n and natural.min() < 1):
            raise ValueError("output_len must give a positive length for every request id")
        prompt = np.zeros(n, dtype=np.int64)
        for r in self.requests:
            prompt[r.req_id] = r.prompt_len
        self.served_output_len = served_output_len(prompt, natural, max_model_len)
        self._target = self.served_output_len.tolist()
        self.requested_output_len = natural
        self._requested = natural.tolist()
        self.policy = policy
        self.cost = cost  # charges every iteration
        # What the policy's view plans with: ``cost`` unless given (a real engine's plugin that
        # planned with a model while the host ran at another speed: regime engine).
        self.planning_cost = cost if planning_cost is None else planning_cost
        self.kv = kv
        self.pivot = pivot
        self.max_model_len = max_model_len
        self.kv_bytes_per_token = kv_bytes_per_token
        self.host_link_bandwidth = host_link_bandwidth
        self.add_scheduler_overhead = add_scheduler_overhead
        # Whether to ask ``Policy.repeats`` at all (never with the decision time charged: a
        # repeated iteration takes no decision).
        self._may_repeat = (type(policy).repeats is not Policy.repeats
                            and not add_scheduler_overhead)
        # Whether the policy decides after a decode-only iteration faster than through
        # ``on_step_end`` and ``schedule`` (``Policy.schedule_after_decodes``; not with the
        # decision time charged: the step's bookkeeping would be charged with it).
        self._may_redecide = (type(policy).schedule_after_decodes
                              is not Policy.schedule_after_decodes
                              and not add_scheduler_overhead)
        # Whether that decision stays exactly while the decode steps' new blocks fit
        # (``Policy.after_decodes_while_blocks_fit``): the loop checks the blocks itself.
        self._redecide_on_blocks = self._may_redecide and policy.after_decodes_while_blocks_fit()
        # Whether the cost model prices a run of decode iterations at once
        # (``CostModel.decode_times``; ``_decode_run``).
        # (asked of an empty run: a noisy model prices runs where the model it wraps does)
        self._prices_decode_runs = cost.decode_times(1, np.zeros(0, dtype=np.int64)) is not None
        # Whether the redecided decode steps may run as ``_asking_decode_run``: the policy is
        # asked at every one but the requests take in the run at once
        # (``Policy.after_decodes_reads_blocks_only``, asked before every step).
        self._asks_in_runs = (self._may_redecide and not self._redecide_on_blocks
                              and self._prices_decode_runs
                              and type(policy).after_decodes_reads_blocks_only
                              is not Policy.after_decodes_reads_blocks_only)
        # Whether ``_repeat`` may take runs of decode iterations at once (``_decode_run``): the
        # policy is not told of each (``on_step_end`` is the base class's, which does nothing).
        self._repeats_in_runs = (self._may_repeat
                                 and type(policy).on_step_end is Policy.on_step_end)
        # Whether the policy may decide such a run's steps in one call
        # (``Policy.decide_decode_run``; it may still decline a run).
        self._decides_runs = (self._asks_in_runs and type(policy).decide_decode_run
                              is not Policy.decide_decode_run)
        # True: host transfers run beside the iteration's compute (a copy stream, as FastServe's
        # proactive swapping does), so an iteration takes max(compute, transfer), not the sum.
        self.swap_overlap = swap_overlap
        self.max_iterations = max_iterations
        self.horizon_s = horizon_s
        # Called with the clock and the requests (arrival order) every ``check_every``
        # iterations, before a decision; an exception it raises ends the run (an Oracle
        # candidate that cannot win: ``experiments.goodput_bound``).
        self.check = check
        self.check_every = CHECK_EVERY_ITERATIONS if check_every is None else check_every
        self.progress = progress
        self.log = IterationLog()

    # ---------------------------------------------------------------------------------------
    def _reject_reason(self, r: Request) -> str:
        return never_fits_reason(r.prompt_len, self._target[r.req_id],
                                 max_model_len=self.max_model_len,
                                 num_blocks=self.kv.num_total_blocks, block_size=self.kv.block_size)

    def _complete(self, r: Request, now: float) -> None:
        """``r`` emitted its last token: finished, or cut where its sequence hit max_model_len."""
        rid = r.req_id
        served, requested = self._target[rid], self._requested[rid]
        if served < requested:
            self._finish(r, now, Status.CUT,
                         length_cap_reason(r.prompt_len, requested, served, self.max_model_len))
        else:
            self._finish(r, now, Status.FINISHED)

    def _finish(self, r: Request, now: float, status: Status, reason: str = "") -> None:
        self.kv.free(r)
        r.status = status
        r.finish_time = now
        r.reject_reason = reason
        self.policy.on_finish(r, now)

    def run(self) -> SimulationResult:
        """Serve every request; one pass of the loop is one iteration (or one idle decision)."""
        with _collector_for_loop():
            return self._run()

    def _run(self) -> SimulationResult:
        wall0 = time.perf_counter()
        self._start()
        # The queues are mutated in place by every step: the same three lists throughout.
        waiting, running, swapped = self._waiting, self._running, self._swapped
        n_total = self._n_total
        max_iterations = math.inf if self.max_iterations is None else self.max_iterations
        horizon = math.inf if self.horizon_s is None else self.horizon_s
        policy, view = self.policy, self._view
        decided: Decision | None = None  # the next iteration's decision, when already made
        # (an int: the comparison below is made on every pass of the loop)
        check, next_check = self.check, sys.maxsize if self.check is None else self.check_every
        while self._n_done < n_total:
            if self._iteration >= next_check:
                next_check = self._iteration + self.check_every
                check(self._now, self.requests)  # type: ignore[misc]
            if decided is not None:
                decision, decided = decided, None
            else:
                if self._now >= horizon:
                    self._stop_at_horizon(horizon)
                    break
                if self._now >= self._next_arrival:
                    self._admit_arrivals()
                if not (waiting or running or swapped):
                    if self._next_arrival < math.inf:  # idle until the next arrival
                        self._now = self._next_arrival
                        continue
                    break
                if self._iteration >= max_iterations:
                    self._stop(f"simulation stopped at max_iterations={self.max_iterations}")
                    break
                decision = self._decide()
            # Most decisions only schedule: skip the step that would find nothing to apply.
            acts = (decision.rejected or decision.preempted or decision.swap_out
                    or decision.swap_in or decision.reserve)
            swap_s = self._apply(decision) if acts else 0.0
            if not decision.scheduled:
                if not self._idle(decision, swap_s):
                    break
                continue
            self._idle_decisions = 0
            shape = self._form_batch(decision.scheduled)
            n_done = self._n_done
            latency = self._advance(decision, shape, swap_s)
            if not acts and shape.prefill_seqs == 0 and self._n_done == n_done:
                if self._may_redecide:
                    decided = self._redecide(decision, latency, horizon, max_iterations)
                    continue
                if self._may_repeat:
                    policy.on_step_end(view, decision, latency)
                    view.now = self._now
                    if policy.repeats(view, decision):
                        self._repeat(decision, horizon, max_iterations)
                    continue
            policy.on_step_end(view, decision, latency)
        return self._result(wall0)

    # -- the loop's steps --------------------------------------------------------------------
    def _start(self) -> None:
        """Fresh queues, clock and counters, and the view the policy reads every decision."""
        reqs = self.requests
        self._waiting = []
        self._running = []
        self._swapped = []
        grant = self.policy.clairvoyant
        target = self._target
        self._view = SchedulerView(
            now=0.0, waiting=self._waiting, running=self._running, swapped=self._swapped,
            kv=self.kv, cost=self.planning_cost, pivot=self.pivot,
            max_model_len=self.max_model_len,
            true_output_len={r.req_id: target[r.req_id] for r in reqs} if grant else None,
            next_arrivals=reqs if grant else None,
        )
        self._n_total = len(reqs)
        self._n_done = 0
        self._next_idx = 0
        self._next_arrival = reqs[0].arrival if reqs else math.inf
        self._now = reqs[0].arrival if reqs else 0.0
        self._kv_used_tokens = 0
        self._iteration = 0
        self._idle_decisions = 0
        self._decide_s = 0.0
        self._decided_skip, self._decided_backoff = 0, 1
        self._queue_key = [0] * len(reqs)
        self._back_key = self._front_key = 0
        self._swap_cost_per_block = (
            self.kv.block_size * self.kv_bytes_per_token / self.host_link_bandwidth
            if self.host_link_bandwidth < math.inf else 0.0)
        self._bar = _progress(self._n_total) if self.progress else None

    def _admit_arrivals(self) -> None:
        """Requests whose arrival time has come join the waiting queue (or are rejected)."""
        reqs, n_total, now = self.requests, self._n_total, self._now
        i = self._next_idx
        while i < n_total and reqs[i].arrival <= now:
            r = reqs[i]
            i += 1
            reason = self._reject_reason(r)
            if reason:
                self._finish(r, r.arrival, Status.REJECTED, reason)
                self._n_done += 1
                continue
            r.queued_since = r.arrival
            self._back_key += 1
            self._queue_key[r.req_id] = self._back_key
            self._waiting.append(r)
            self.policy.on_arrival(r, now)
        self._next_idx = i
        self._next_arrival = reqs[i].arrival if i < n_total else math.inf

    def _decide(self) -> Decision:
        """The policy's decision at ``now``; its wall time (s) goes to ``_decide_s``."""
        view = self._view
        view.now = self._now
        t0 = time.perf_counter()
        decision = self.policy.schedule(view)
        self._decide_s = time.perf_counter() - t0
        return decision

    def _apply(self, decision: Decision) -> float:
        """Rejections, preemptions, swaps and KV reservations of ``decision``; returns the
        seconds of host transfer the swaps cost."""
        name, now, kv = self.policy.name, self._now, self.kv
        waiting, running, swapped = self._waiting, self._running, self._swapped
        for r, why in decision.rejected:
            if r.status != Status.WAITING:
                raise PolicyError(f"{name}: can only reject waiting requests (req {r.req_id})")
            _remove(waiting, [r], self._queue_key)
            self._finish(r, now, Status.REJECTED, why)
            self._n_done += 1
        for r in decision.preempted:
            if r.status != Status.RUNNING:
                raise PolicyError(f"{name}: preempted request {r.req_id} is not running")
            self._kv_used_tokens -= r.num_computed_tokens
            kv.free(r)
            r.num_computed_tokens = 0
            r.status = Status.WAITING
            r.num_preemptions += 1
            r.queued_since = now
            running.remove(r)
            self._front_key -= 1
            self._queue_key[r.req_id] = self._front_key
            waiting.insert(0, r)
        swap_blocks = 0
        for r in decision.swap_out:
            if r.status != Status.RUNNING:
                raise PolicyError(f"{name}: swap-out of non-running request {r.req_id}")
            swap_blocks += kv.swap_out(r)
            self._kv_used_tokens -= r.num_computed_tokens
            r.status = Status.SWAPPED
            running.remove(r)
            swapped.append(r)
        for r in decision.swap_in:
            if r.status != Status.SWAPPED:
                raise PolicyError(f"{name}: swap-in of non-swapped request {r.req_id}")
            swap_blocks += kv.swap_in(r)
            self._kv_used_tokens += r.num_computed_tokens
            r.status = Status.RUNNING
            swapped.remove(r)
            running.append(r)
        for r, n_tokens in decision.reserve:
            if r.status not in (Status.WAITING, Status.RUNNING):
                raise PolicyError(f"{name}: reserve for finished request {r.req_id}")
            try:
                kv.reserve(r, n_tokens)
            except RuntimeError as exc:
                raise PolicyError(f"{name}: {exc}") from None
        return swap_blocks * self._swap_cost_per_block

    def _idle(self, decision: Decision, swap_s: float) -> bool:
        """A decision that scheduled nothing: move the clock to the next event (the swaps'
        end, the policy's ``wake_at``, the next arrival) or ask again at once if the decision
        changed the state. Returns False when nothing can ever happen (the run stops)."""
        name = self.policy.name
        if swap_s > 0:
            self._now += swap_s
            return True
        self._idle_decisions += 1
        if self._idle_decisions > 10_000:
            raise PolicyError(f"{name}: 10000 decisions in a row scheduled nothing")
        if decision.preempted or decision.rejected or decision.swap_out or decision.swap_in:
            return True  # the state changed: ask again at the same time
        wake = decision.wake_at if decision.wake_at is not None else math.inf
        t_next = min(wake, self._next_arrival)
        if t_next == math.inf:
            self._stop(f"stalled: {name} scheduled nothing and no arrivals remain")
            return False
        if t_next <= self._now:
            raise PolicyError(f"{name}: wake_at {t_next} is not after now {self._now}")
        self._now = t_next
        return True

    def _form_batch(self, scheduled: list[tuple[Request, int]]) -> BatchShape:
        """Admit the scheduled waiting requests, allocate KV for every scheduled token, and
        return the iteration's composition for the cost model."""
        # Hot path (once per iteration): the request and block arithmetic is inlined (the rules
        # of ``Request.num_new_tokens``/``is_decode``, ``BatchShape.add_*`` and
        # ``BlockManager.allocate``), the shape is summed in locals in the same order.
        name, now, kv = self.policy.name, self._now, self.kv
        running = self._running
        block_size = kv.block_size
        free = kv.num_free_blocks
        prefill_tokens = prefill_seqs = decode_seqs = decode_ctx = 0
        prefill_attn = 0.0
        admitted: list[Request] = []
        for r, n in scheduled:
            ctx = r.num_computed_tokens
            out = r.num_output_tokens
            pending = r.prompt_len + out - ctx
            if n <= 0 or n > pending:
                raise PolicyError(
                    f"{name}: request {r.req_id} scheduled {n} tokens, {pending} pending")
            status = r.status
            if status is not _RUNNING:
                if status is not _WAITING:
                    raise PolicyError(
                        f"{name}: request {r.req_id} scheduled while {status.name}")
                r.status = _RUNNING
                running.append(r)
                admitted.append(r)
                if r.first_scheduled_time != r.first_scheduled_time:  # NaN: first time
                    r.first_scheduled_time = now
            if n == 1 and out > 0 and pending == 1:  # a decode step
                decode_seqs += 1
                decode_ctx += ctx
            else:
                prefill_tokens += n
                prefill_seqs += 1
                prefill_attn += n * (ctx + (n + 1) / 2)
            need = -(-(ctx + n) // block_size) - r.num_blocks
            if need > 0:
                if need > free:
                    kv.num_free_blocks = free
                    raise PolicyError(f"{name}: KV overflow: request {r.req_id} needs {need} "
                                      f"blocks, {free} free")
                free -= need
                r.num_blocks += need
        kv.num_free_blocks = free
        if admitted:
            _remove(self._waiting, admitted, self._queue_key)
        return BatchShape(prefill_tokens, prefill_seqs, prefill_attn, decode_seqs, decode_ctx)

    def _advance(self, decision: Decision, shape: BatchShape, swap_s: float) -> float:
        """Run the iteration: charge its latency, emit the tokens that complete at its end,
        finish the requests that are done, log it, and move the clock to its end. Returns its
        latency (the caller tells the policy, ``on_step_end``)."""
        decide_s = self._decide_s
        compute = self.cost.iteration_time(shape)
        latency = ((max(compute, swap_s) if self.swap_overlap else compute + swap_s)
                   + (decide_s if self.add_scheduler_overhead else 0.0))
        now = self._now
        end = now + latency
        target = self._target
        scheduled = decision.scheduled
        kv_used_tokens = self._kv_used_tokens
        finished = False
        for r, n in scheduled:
            computed = r.num_computed_tokens + n
            r.num_computed_tokens = computed
            kv_used_tokens += n
            out = r.num_output_tokens
            if computed == r.prompt_len + out:  # the sequence is computed: sample a token
                out += 1
                r.num_output_tokens = out
                r.token_times.append(end)
                if out == 1:
                    r.first_token_time = end
                r.last_token_time = end
                if out >= target[r.req_id]:
                    kv_used_tokens -= computed
                    self._complete(r, end)
                    self._n_done += 1
                    finished = True
        self._kv_used_tokens = kv_used_tokens
        running, waiting, kv = self._running, self._waiting, self.kv
        if finished:
            running[:] = [r for r in running if r.status == Status.RUNNING]
            if self._bar is not None:
                self._bar.n = self._n_done
                self._bar.refresh()
        total_blocks = kv.num_total_blocks
        self.log.append(
            now, latency, shape, len(scheduled), total_blocks - kv.num_free_blocks, total_blocks,
            kv_used_tokens, decide_s, len(decision.preempted), len(waiting), len(running),
            len(self._swapped), swap_s, decision.info)
        self._now = end
        self._iteration += 1
        return latency

    def _repeat(self, decision: Decision, horizon: float, max_iterations: float) -> None:
        """Run the decode-only ``decision`` again, iteration by iteration, without asking the
        policy (it declared, ``Policy.repeats``, that its decision stays the same), until an
        event that may change it: an arrival, a request finishing, a request of the batch
        needing a new KV block, the horizon or ``max_iterations``. Each iteration is the one
        the loop would run (same batch forming, latency, tokens, log row), with no decision
        time (and none is charged: not used with ``add_scheduler_overhead``). Orca serves one
        request at a time in the paper's setting: most of its 17 M iterations pass here."""
        scheduled = decision.scheduled
        view = self._view
        n_done = self._n_done
        while (self._now < self._next_arrival and self._now < horizon
               and self._iteration < max_iterations):
            if self._repeats_in_runs and self._decode_run(decision, horizon, max_iterations,
                                                          to_block_need=True):
                continue
            shape = self._decode_shape(scheduled)
            if shape is None:
                return  # a request's next token needs a new block: ask the policy
            view.now = self._now
            self._decide_s = 0.0
            latency = self._advance(decision, shape, 0.0)
            self.policy.on_step_end(view, decision, latency)
            if self._n_done != n_done:
                return

    def _redecide(self, decision: Decision, latency: float, horizon: float,
                  max_iterations: float) -> Decision | None:
        """After the decode-only ``decision`` ran (its ``on_step_end`` not yet called), let the
        policy take in the step and decide in one call (``Policy.schedule_after_decodes``) for
        as long as nothing else happens, and run its decision while it stays the same. Returns
        the first decision that differs (the loop runs it), or None once an event needs the
        loop's own steps: an arrival, a request finishing, the horizon, ``max_iterations``
        (``on_step_end`` then tells the policy of the last iteration). The Oracle serves one
        to three requests at a time for most of the paper's trace: most of its 6 M iterations
        pass here."""
        if self._redecide_on_blocks:
            return self._redecide_on_block_need(decision, latency, horizon, max_iterations)
        policy, view = self.policy, self._view
        scheduled = decision.scheduled
        # The next asking run's length: none before the decision has come back once, then
        # doubling (a run cut short at once costs its setup: under overload the decision often
        # changes within a few steps).
        run_steps = 0
        while (self._now < self._next_arrival and self._now < horizon
               and self._iteration < max_iterations):
            if (run_steps and self._asks_in_runs
                    and (policy.after_decodes_reads_blocks_only(decision)
                         or self._decides_run_alone(decision))):
                decided, ran, latency = self._asking_decode_run(decision, latency, horizon,
                                                                max_iterations, run_steps)
                if decided is not None:
                    return decided
                if ran:
                    run_steps = min(2 * run_steps, MAX_ASKING_RUN)
                    continue
            run_steps = run_steps or (FIRST_DECIDED_RUN if self._decides_runs
                                      and not self._decided_skip else MIN_DECODE_RUN)
            view.now = self._now
            t0 = time.perf_counter()
            decided = policy.schedule_after_decodes(view, decision, latency)
            self._decide_s = time.perf_counter() - t0
            if decided is not decision:
                return decided
            shape = self._decode_batch(scheduled)
            n_done = self._n_done
            latency = self._advance(decision, shape, 0.0)
            if self._n_done != n_done:
                break
        policy.on_step_end(view, decision, latency)
        return None

    def _decides_run_alone(self, decision: Decision) -> bool:
        """Whether to take an asking run of ``decision`` that the policy decides in one call
        although its asks one by one read more than the blocks (FastServe: its queue and the
        batch's computed tokens): its steps from the first it does not decide are asked one by
        one, outside the run. Within ``_decided_skip``, no (and one fewer to skip)."""
        if not (self._decides_runs and self.policy.decides_decode_run(decision)):
            return False
        if self._decided_skip:
            self._decided_skip -= 1
            return False
        return True

    def _asking_decode_run(self, decision: Decision, latency: float, horizon: float,
                           max_iterations: float,
                           most: int) -> tuple[Decision | None, int, float]:
        """``_redecide``'s iterations for a policy that reads only the batch's blocks while it
        keeps its decision (``Policy.after_decodes_reads_blocks_only``): it is asked before
        every iteration, as there, with the clock and the free blocks of that iteration and each
        request's new blocks given as they come, but the iterations' latencies come from the
        cost model at once (``CostModel.decode_times``) and the requests take in their tokens
        and times once, after the run (no request finishes within it, by its length; at most
        ``most`` iterations). Where the policy decides runs (``Policy.decide_decode_run``), the
        run's steps up to the first that would overflow the cache or reach the next arrival are
        asked in one call, the rest one by one. The same values, in the same order, as iteration
        by iteration. Returns the first decision that differs (or None), the iterations run (0:
        none possible, the caller runs the next) and the last one's latency."""
        scheduled = decision.scheduled
        kv = self.kv
        block_size = kv.block_size
        run = self._decode_run_start(scheduled, min(max_iterations - self._iteration, most))
        if run is None:
            return None, 0, latency
        steps, decode_ctx, first_need = run
        n = len(scheduled)
        grows: dict[int, list[Request]] = {}  # iteration -> the requests it gives a block
        for (r, _), j in zip(scheduled, first_need, strict=True):
            for k in range(j, steps, block_size):
                grows.setdefault(k, []).append(r)
        compute = self.cost.decode_times(n, decode_ctx + n * np.arange(steps, dtype=np.int64))
        assert compute is not None  # (``_asks_in_runs``: the model prices decode runs)
        run_latencies = self._run_latencies(compute)
        latencies = run_latencies.tolist()
        policy, view = self.policy, self._view
        ask, reads_blocks_only = policy.schedule_after_decodes, policy.after_decodes_reads_blocks_only
        perf = time.perf_counter
        until = min(self._next_arrival, horizon)
        free, now = kv.num_free_blocks, self._now
        starts: list[float] = []
        frees: list[int] = []
        infos: list[Any] = []
        decide: list[float] = []
        decided: Decision | None = None
        asked_ahead: Decision | None = None  # (the compiled run's next step, asked already)
        overflow = False
        first = 0
        decided_steps: DecidedSteps | None = None  # (the first steps, decided in one call)
        if self._decides_runs and policy.decides_decode_run(decision):
            if self._decided_skip:
                self._decided_skip -= 1
            else:
                got = self._decided_run(decision, latency, run_latencies, grows, first_need,
                                        until)
                if got is not None:
                    first, asked_ahead = got.steps, got.following
                    self._decide_s = got.decide_s
                if first:
                    assert got is not None
                    decided_steps = got
                    starts.extend(got.clock[:first].tolist())
                    free, now = int(got.free_after[first - 1]), float(got.clock[first])
                    latency = latencies[first - 1]
                # (a call that decides a few steps costs more than asking them one by one:
                # after one, the next asking runs are asked step by step, more of them after
                # each such call in a row)
                if first + (asked_ahead is not None) < DECIDED_RUN_WORTH:
                    self._decided_skip = self._decided_backoff
                    self._decided_backoff = min(2 * self._decided_backoff, MAX_DECIDED_SKIP)
                else:
                    self._decided_backoff = 1
        for k in range(first, steps):
            if asked_ahead is not None:
                asked, asked_ahead = asked_ahead, None
            else:
                if now >= until or (k and not reads_blocks_only(decision)):
                    break
                view.now = now
                kv.num_free_blocks = free
                t0 = perf()
                asked = ask(view, decision, latency)
                self._decide_s = perf() - t0
            if asked is not decision:
                decided = asked
                break
            grow = grows.get(k)
            if grow:
                if len(grow) > free:
                    overflow = True  # (``_decode_batch`` raises it below, as it would have)
                    break
                for r in grow:
                    r.num_blocks += 1
                free -= len(grow)
            starts.append(now)
            frees.append(free)
            infos.append(decision.info)
            decide.append(self._decide_s)
            latency = latencies[k]
            now += latency
        kv.num_free_blocks = free
        done = len(starts)
        if done:
            self.cost.took_decode_run(done)
            total = kv.num_total_blocks
            used = self._kv_used_tokens
            queues = (len(self._waiting), len(self._running), len(self._swapped))
            if first:
                assert decided_steps is not None
                self.log.append_block(
                    (decided_steps.clock[:first], run_latencies[:first], n, 0, n, 0, n, 0.0,
                     decode_ctx + n * np.arange(first, dtype=np.int64),
                     total - decided_steps.free_after[:first], total,
                     used + n * np.arange(1, first + 1, dtype=np.int64), 0, *queues, 0.0),
                    first, decided_steps.decide_s, *decided_steps.info)
            if done > first:
                self.log.append_rows_each(list(zip(
                    starts[first:], latencies[first:done], repeat(n), repeat(0), repeat(n),
                    repeat(0), repeat(n), repeat(0.0),
                    range(decode_ctx + n * first, decode_ctx + n * done, n),
                    [total - f for f in frees], repeat(total),
                    range(used + n * (first + 1), used + n * done + 1, n), repeat(0),
                    *(repeat(q) for q in queues), repeat(0.0))), decide, infos)
            _emit_run_tokens(scheduled, [*starts[1:], now])
            self._kv_used_tokens = used + n * done
            self._now = now
            self._iteration += done
        if overflow:
            self._decode_batch(scheduled)
        return decided, done, latency

    def _decided_run(self, decision: Decision, latency: float, latencies: np.ndarray,
                     grows: dict[int, list[Request]], first_need: list[int],
                     until: float) -> DecidedSteps | None:
        """``_asking_decode_run``'s first steps decided by the policy in one call
        (``Policy.decide_decode_run``): the steps before the first whose new blocks do not fit
        (there the loop asks, then finds them short) or that starts at or after ``until``
        (``latency``: the iteration's before the run). The batch's requests take in the new
        blocks of the steps decided the same. None where no step is left or the policy
        declines."""
        steps, free = len(latencies), self.kv.num_free_blocks
        need = np.zeros(steps, np.int64)  # new blocks per step
        for k, rs in grows.items():
            need[k] = len(rs)
        new_blocks = np.cumsum(need)
        # (the clock accumulated left to right, as ``now += latency`` adds them)
        clock = np.empty(steps + 1)
        clock[0] = self._now
        clock[1:] = latencies
        np.cumsum(clock, out=clock)
        last = min(int(np.searchsorted(new_blocks, free, side="right")),
                   int(np.searchsorted(clock[:steps], until, side="left")))
        if last < 1:
            return None
        free_after = free - new_blocks
        free_before = np.empty(last, np.int64)
        free_before[0] = free
        free_before[1:] = free_after[:last - 1]
        scheduled = decision.scheduled
        view = self._view
        view.now = self._now
        t0 = time.perf_counter()
        got = self.policy.decide_decode_run(view, decision, latency, DecodeSteps(
            clock[:last], latencies[:last], free_before,
            np.array([r.num_blocks for r, _ in scheduled], np.int64),
            np.array(first_need, np.int64), self.kv.block_size))
        decide_s = time.perf_counter() - t0
        if got is None:  # (not this run: asked step by step)
            return None
        done = len(got.info_values)
        if done:  # (the clock of the last step asked, as asking one by one leaves it)
            view.now = float(clock[done - 1])
        _take_new_blocks(scheduled, first_need, done, self.kv.block_size)
        return DecidedSteps(done, got.following, clock, free_after,
                            decide_s / max(done + (got.following is not None), 1),
                            (got.info_index, got.info_values))

    def _redecide_on_block_need(self, decision: Decision, latency: float, horizon: float,
                                max_iterations: float) -> Decision | None:
        """``_redecide`` for a policy whose decision after decode steps alone is the same
        exactly while their new blocks fit (``Policy.after_decodes_while_blocks_fit``): the
        blocks are counted here, in the pass that forms the batch, and the policy is asked
        only when they do not fit (the vLLM baselines' 4 M decode steps on the paper trace).
        The iterations are ``_redecide``'s, each with no decision time."""
        policy, view, kv = self.policy, self._view, self.kv
        scheduled = decision.scheduled
        block_size = kv.block_size
        while (self._now < self._next_arrival and self._now < horizon
               and self._iteration < max_iterations):
            run_latency = self._decode_run(decision, horizon, max_iterations)
            if run_latency:
                latency = run_latency
                continue
            view.now = self._now
            need = decode_ctx = 0
            for r, _ in scheduled:
                ctx = r.num_computed_tokens
                if ctx >= r.num_blocks * block_size:
                    need += 1
                decode_ctx += ctx
            if need > kv.num_free_blocks:
                t0 = time.perf_counter()
                decided = policy.schedule_after_decodes(view, decision, latency)
                self._decide_s = time.perf_counter() - t0
                if decided is not decision:
                    return decided
                shape = self._decode_batch(scheduled)
            else:
                if need:
                    for r, _ in scheduled:
                        if r.num_computed_tokens >= r.num_blocks * block_size:
                            r.num_blocks += 1
                    kv.num_free_blocks -= need
                self._decide_s = 0.0
                shape = BatchShape(0, 0, 0.0, len(scheduled), decode_ctx)
            n_done = self._n_done
            latency = self._advance(decision, shape, 0.0)
            if self._n_done != n_done:
                break
        policy.on_step_end(view, decision, latency)
        return None

    def _decode_run_start(self, scheduled: list[tuple[Request, int]],
                          most: float) -> tuple[int, int, list[int]] | None:
        """Whether ``scheduled`` can run as a run of decode iterations (each request one token
        further, none finishing, at most ``most`` iterations, at least ``MIN_DECODE_RUN``): its
        length, the batch's context now, and per request the run's first iteration that needs
        it a new block; None where it cannot."""
        target, block_size = self._target, self.kv.block_size
        steps = most
        decode_ctx = 0
        first_need = []
        for r, n in scheduled:
            out, ctx = r.num_output_tokens, r.num_computed_tokens
            if n != 1 or out < 1 or ctx + 1 != r.prompt_len + out:
                return None
            # (iterations that emit one of its tokens without finishing it)
            steps = min(steps, target[r.req_id] - out - 1)
            if steps < MIN_DECODE_RUN:
                return None
            decode_ctx += ctx
            first_need.append(r.num_blocks * block_size - ctx)
        return int(steps), decode_ctx, first_need

    def _run_latencies(self, compute: np.ndarray) -> np.ndarray:
        """``_advance``'s latency of each decode iteration of a run from its compute time (no
        transfer, no decision time): the same elementwise arithmetic."""
        return (np.maximum(compute, 0.0) if self.swap_overlap else compute + 0.0) + 0.0

    def _decode_run(self, decision: Decision, horizon: float, max_iterations: float,
                    to_block_need: bool = False) -> float:
        """``_redecide_on_block_need``'s iterations, several at once: while no request of the
        decode-only ``decision`` finishes, no new block is short and no arrival, horizon or
        ``max_iterations`` comes, each iteration is the same batch one token further on, so
        the requests are updated once for the whole run (their tokens, times, blocks) and
        only the clock, the latency and the log row are worked out per iteration: the same
        values, in the same order, as iteration by iteration. Returns the last iteration's
        latency, or 0.0 when no run of ``MIN_DECODE_RUN`` iterations is possible (the caller
        then runs the next iteration itself). ``to_block_need``: the run ends before the first
        iteration that needs a new block (``_repeat``'s runs)."""
        scheduled = decision.scheduled
        kv = self.kv
        block_size = kv.block_size
        run = self._decode_run_start(scheduled, max_iterations - self._iteration)
        if run is None:
            return 0.0
        steps, decode_ctx, first_need = run
        if to_block_need:
            steps = min(steps, *first_need)
            if steps < MIN_DECODE_RUN:
                return 0.0
        need = [0] * steps
        for j in first_need:
            for k in range(j, steps, block_size):
                need[k] += 1
        n = len(scheduled)
        until = min(self._next_arrival, horizon)
        if self._prices_decode_runs:
            contexts = decode_ctx + n * np.arange(steps, dtype=np.int64)
            times = self.cost.decode_times(n, contexts)
            assert times is not None  # (the model overrides it)
            return self._decode_run_at_once(decision, times, contexts, need, first_need, until)
        free = kv.num_free_blocks
        total_blocks = kv.num_total_blocks
        used_tokens = self._kv_used_tokens
        overlap = self.swap_overlap
        queues = (len(self._waiting), len(self._running), len(self._swapped))
        now = self._now
        iteration_time, log_append, info = self.cost.iteration_time, self.log.append, decision.info
        ends: list[float] = []
        latency = start = 0.0
        for k in range(steps):
            if now >= until or need[k] > free:
                break
            free -= need[k]
            shape = BatchShape(0, 0, 0.0, n, decode_ctx)
            compute = iteration_time(shape)
            latency = (max(compute, 0.0) if overlap else compute + 0.0) + 0.0
            used_tokens += n
            log_append(now, latency, shape, n, total_blocks - free, total_blocks, used_tokens,
                       0.0, 0, *queues, 0.0, info)
            start = now
            now += latency
            ends.append(now)
            decode_ctx += n
        if not ends:
            return 0.0
        self._end_decode_run(scheduled, first_need, ends, start, free, used_tokens)
        return latency

    def _decode_run_at_once(self, decision: Decision, compute: np.ndarray, ctx: np.ndarray,
                            need: list[int], first_need: list[int], until: float) -> float:
        """``_decode_run`` with the iterations' compute times known for the whole run (a
        deterministic cost model's ``decode_times``): the clock, the run's end (the arrival or
        horizon, the first new block that does not fit) and the log rows as arrays. Every value
        is the one the iteration by iteration loop gives: the latencies are the same
        elementwise arithmetic, the clock the same sums in the same order (a running sum)."""
        kv, n = self.kv, len(decision.scheduled)
        latency = self._run_latencies(compute)
        steps = len(latency)
        clock = np.empty(steps + 1)
        clock[0] = self._now
        clock[1:] = latency
        np.cumsum(clock, out=clock)  # clock[j]: iteration j's start, clock[j + 1] its end
        new_blocks = np.cumsum(np.asarray(need, dtype=np.int64))
        free = kv.num_free_blocks
        done = min(int(np.searchsorted(clock[:steps], until, side="left")),
                   int(np.searchsorted(new_blocks, free, side="right")))
        if done == 0:
            return 0.0
        self.cost.took_decode_run(done)
        total_blocks = kv.num_total_blocks
        used_tokens = self._kv_used_tokens + n * np.arange(1, done + 1, dtype=np.int64)
        used_blocks = total_blocks - free + new_blocks[:done]
        self.log.append_columns(
            (clock[:done], latency[:done], n, 0, n, 0, n, 0.0, ctx[:done], used_blocks,
             total_blocks, used_tokens, 0, len(self._waiting), len(self._running),
             len(self._swapped), 0.0), done, decision.info)
        self._end_decode_run(decision.scheduled, first_need, clock[1:done + 1].tolist(),
                             float(clock[done - 1]), free - int(new_blocks[done - 1]),
                             int(used_tokens[-1]))
        return float(latency[done - 1])

    def _end_decode_run(self, scheduled: list[tuple[Request, int]], first_need: list[int],
                        ends: list[float], last_start: float, free: int,
                        used_tokens: int) -> None:
        """A run of decode iterations ending at ``ends`` (each iteration's end) taken in:
        every request of the batch one token further per iteration (its times, its new
        blocks), the KV counts, the clock and the iteration count where the iteration by
        iteration loop leaves them (the view at the last iteration's start)."""
        _emit_run_tokens(scheduled, ends)
        _take_new_blocks(scheduled, first_need, len(ends), self.kv.block_size)
        self.kv.num_free_blocks = free
        self._kv_used_tokens = used_tokens
        self._now = ends[-1]
        self._view.now = last_start
        self._iteration += len(ends)
        self._decide_s = 0.0

    def _decode_batch(self, scheduled: list[tuple[Request, int]]) -> BatchShape:
        """``_form_batch`` of decode steps of running requests (one token each; what the
        redecided batch is): a new KV block for each request whose computed tokens fill its
        blocks, the same checks on KV, the same shape, in one pass."""
        kv = self.kv
        block_size = kv.block_size
        free = kv.num_free_blocks
        decode_ctx = 0
        for r, _ in scheduled:
            ctx = r.num_computed_tokens
            if ctx >= r.num_blocks * block_size:
                if free < 1:
                    kv.num_free_blocks = free
                    raise PolicyError(f"{self.policy.name}: KV overflow: request {r.req_id} "
                                      f"needs 1 blocks, {free} free")
                free -= 1
                r.num_blocks += 1
            decode_ctx += ctx
        kv.num_free_blocks = free
        return BatchShape(0, 0, 0.0, len(scheduled), decode_ctx)

    def _decode_shape(self, scheduled: list[tuple[Request, int]]) -> BatchShape | None:
        """``_form_batch`` of decode steps of running requests that need no new KV block: the
        shape alone (None if a request needs a block)."""
        block_size = self.kv.block_size
        decode_ctx = 0
        for r, _ in scheduled:
            ctx = r.num_computed_tokens
            if ctx >= r.num_blocks * block_size:
                return None
            decode_ctx += ctx
        return BatchShape(0, 0, 0.0, len(scheduled), decode_ctx)

    def _stop(self, reason: str) -> None:
        """End the run early: every request not done yet is rejected with ``reason``."""
        self._n_done += self._reject_all(self._waiting, self._running, self._swapped, self._now,
                                         reason)

    def _stop_at_horizon(self, horizon: float) -> None:
        """The clock reached ``sim.horizon_s``: every request not done yet (queued, in
        progress, or arriving later) ends ``unfinished``, its KV freed, with the reason."""
        for r in self.requests:
            if r.is_done:
                continue
            where = ("arrives after the horizon" if r.arrival >= horizon
                     else f"{r.num_output_tokens} of {self._target[r.req_id]} tokens emitted")
            self.kv.free(r)
            r.status = Status.UNFINISHED
            r.reject_reason = f"horizon: simulation stopped at sim.horizon_s={horizon:g} s ({where})"
            self._n_done += 1
        self._waiting.clear()
        self._running.clear()
        self._swapped.clear()
        self._next_idx = self._n_total
        self._next_arrival = math.inf

    def _result(self, wall0: float) -> SimulationResult:
        if self._bar is not None:
            self._bar.n = self._n_done
            self._bar.close()
        return SimulationResult(
            requests=sorted(self.requests, key=lambda r: r.req_id),
            requested_output_len=self.requested_output_len,
            served_output_len=self.served_output_len,
            iterations=self.log,
            end_time=self._now,
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


def _emit_run_tokens(scheduled: list[tuple[Request, int]], ends: list[float]) -> None:
    """Every request of a run of decode iterations ending at ``ends`` one token further per
    iteration: its computed and output tokens, its token times."""
    done = len(ends)
    for r, _ in scheduled:
        r.num_computed_tokens += done
        r.num_output_tokens += done
        r.token_times.extend(ends)
        r.last_token_time = ends[-1]


def _take_new_blocks(scheduled: list[tuple[Request, int]], first_need: list[int], done: int,
                     block_size: int) -> None:
    """Every request of a run of ``done`` decode iterations holds the blocks it was given: one
    at its first need (``first_need``, an iteration of the run) and every ``block_size`` after."""
    for (r, _), j in zip(scheduled, first_need, strict=True):
        if done > j:
            r.num_blocks += (done - j - 1) // block_size + 1


class DecidedSteps(NamedTuple):
    """The steps of a decode run a policy decided in one call (``Simulator._decided_run``): how
    many were decided the same, the next step's decision where the call made it, the run's
    clock (each step's start, then the end) and free blocks after each step, each decided
    step's share of the call's wall time, and their diagnostics (names, a row each)."""

    steps: int
    following: Decision | None
    clock: np.ndarray
    free_after: np.ndarray
    decide_s: float
    info: tuple[dict[str, int], np.ndarray]


_RUNNING, _WAITING = Status.RUNNING, Status.WAITING
# The fewest iterations ``Simulator._decode_run`` runs at once: below it, the run's setup costs
# about what the iterations would.
MIN_DECODE_RUN = 4
# The longest asking run (``Simulator._asking_decode_run``): its latencies are priced at once.
MAX_ASKING_RUN = 512
# A decided run (``Simulator._decided_run``) pays for its layout when it decides at least this
# many steps; after one that decides fewer, up to this many asking runs are asked step by step.
DECIDED_RUN_WORTH = 4
MAX_DECIDED_SKIP = 32
# The first asking run's length for such a policy (then doubling): a decided run stops where the
# decision changes, and under overload a decode-only stretch lasts a few dozen iterations.
FIRST_DECIDED_RUN = 64

# The collector's thresholds during the loop (Python's defaults: 700, 10, 10).
LOOP_GC_THRESHOLDS = (100_000, 50, 100)


@contextmanager
def _collector_for_loop() -> Iterator[None]:
    """Python's cyclic collector, tuned for the loop. The loop allocates millions of short-lived
    containers (batch lists, shapes, log rows) and few cycles; with the default thresholds the
    collector ran ~16 K times in one 20K-request run and traversed everything alive at every
    full collection (the trace, the requests, the log). Here the objects alive when the loop
    starts are set aside (``gc.freeze``) and the young generation is collected every 100 K
    allocations, the older ones more rarely; both are restored afterwards (docs/simulator.md,
    *Performance*). Results are the same: the collector frees only unreachable objects."""
    thresholds = gc.get_threshold()
    # (a caller's own frozen objects stay frozen: then nothing is frozen or thawed here)
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(*LOOP_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()


def _remove(queue: list[Request], members: list[Request], queue_key: list[int]) -> None:
    """Remove ``members`` from ``queue`` (sorted by ``queue_key``), keeping the order of the
    rest. Policies admit from the head of the waiting queue, in its order, far more often than
    not: then it is one cut of a prefix. Otherwise each is found by bisection on its key: EDF,
    AccelGen and FastServe admit from anywhere in a queue that reaches ~13-19 K requests in the
    paper's setting, where a scan cost EDF 13% of its run."""
    k = len(members)
    if queue[:k] == members:  # (identity: requests compare by identity)
        del queue[:k]
        return
    def key(r: Request) -> int:
        return queue_key[r.req_id]
    for r in members:
        i = bisect_left(queue, queue_key[r.req_id], key=key)
        if i == len(queue) or queue[i] is not r:
            raise RuntimeError(f"waiting queue out of order at request {r.req_id}")
        del queue[i]


def _progress(total: int):  # pragma: no cover - cosmetic
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="simulate", mininterval=1.0)
