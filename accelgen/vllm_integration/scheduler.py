"""vLLM V1 schedulers that run an accelgen policy (``AccelGenScheduler``) or stock vLLM
scheduling with the same recording (``InstrumentedScheduler``).

Use: ``LLM(..., scheduler_cls="accelgen.vllm_integration.scheduler.AccelGenScheduler")``, the
same string in ``EngineArgs(scheduler_cls=...)`` or the OpenAI server's ``--scheduler-cls``
(``accelgen serve`` sets it); the policy and SLO defaults come from
``accelgen.vllm_integration.adapter_config``.

How a policy decision reaches vLLM without copying vLLM's ``schedule()`` (vLLM 0.32.0,
``vllm/v1/core/sched/scheduler.py``):

- The policy sees mirrors (``accelgen.core.request.Request``) of vLLM's ``waiting`` and ``running``
  queues in their order, and a KV view over vLLM's block pool.
- Victims the policy names are preempted first with vLLM's own ``_preempt_request`` (recompute:
  blocks freed, request back at the front of ``waiting``).
- The engine's limits are inputs of the policy's plan: ``SchedulerView.max_num_batched_tokens``
  (vLLM's ``max_num_scheduled_tokens``, the size of its batch buffers) and ``max_num_seqs`` (the
  running requests vLLM allows), so a decision fits them as it fits the KV. A decision over the
  token limit is trimmed at its tail (a policy that ignores the view's limits), warned about and
  counted (``info_adapter_trimmed_tokens``, ``adapter_trimmed_steps`` in ``summary.json``).
- ``max_num_scheduled_tokens`` (the token budget ``schedule()`` starts from) is set to the sum of
  the tokens the policy scheduled.
- Every request's token count is capped at the policy's choice through
  ``_reserve_prefill_lookahead``, a hook ``schedule()`` calls for each running and waiting request
  right before allocating its KV slots (a no-op without multi-token-prediction drafters). A cap of
  0 makes vLLM skip a running request the policy left out.
- ``waiting`` temporarily holds only the admitted requests, in the policy's order (this also
  removes vLLM's head-of-line stop); the rest are held back and put back afterwards in their
  original order. ``running`` keeps vLLM's admission order: vLLM could only preempt on its own
  (``running[-1]``) if an allocation failed, and the adapter first checks that the decision fits
  the free KV (with vLLM's block arithmetic), raising ``PolicyDecisionError`` otherwise.
- After ``schedule()`` the adapter checks that vLLM scheduled exactly the policy's tokens and
  counts any mismatch in the iteration log (``info_adapter_mismatch``).
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from accelgen.vllm_integration.llvmlite_guard import refuse_dunder_lookups
from accelgen.vllm_integration.version import check_vllm_version

check_vllm_version()
# Engines started later in this process (a second one, or after the JIT decision) need it.
refuse_dunder_lookups()

# vLLM imports follow the version check on purpose: on another version they may not even exist.
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.request_queue import (  # noqa: E402
    SchedulingPolicy,
    create_request_queue,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from accelgen.core.iteration import BatchShape, Pivot  # noqa: E402
from accelgen.core.kvcache import KVQueries  # noqa: E402
from accelgen.core.policy import Decision, Policy, SchedulerView  # noqa: E402
from accelgen.core.request import Request, Status, length_cap_reason, served_output_len  # noqa: E402
from accelgen.costmodel.linear import OnlineLinearCostModel  # noqa: E402
from accelgen.policies.vllm_priority import slo_priority  # noqa: E402
from accelgen.results import IterationLog, requests_frame  # noqa: E402
from accelgen.vllm_integration import shutdown_summary  # noqa: E402
from accelgen.vllm_integration.adapter_config import (  # noqa: E402
    AUTO_REQ_ID_BASE,
    AdapterConfig,
    SLOError,
    build_cost_model,
    build_pivot,
    make_engine_policy,
    parse_request_slo,
    resolve_config,
    shutdown_grace,
)
from accelgen.vllm_integration.logsink import (  # noqa: E402
    ABORTED_REASON,
    IN_FLIGHT_REASON,
    SHUTDOWN_REASON,
    LogDelta,
    LogSink,
)

# A child of vLLM's logger, so messages show up in vLLM's log stream with its formatting.
logger = logging.getLogger("vllm.accelgen")

_mirror_of = operator.attrgetter("accelgen_mirror")
# vLLM's FCFS queue is a deque whose iter/len/bool are Python-level overrides that only call the
# deque's own; the adapter, which reads the queues every step, calls the deque's directly (the
# adapter refuses the priority queue, so its queues are always FCFS ones).
_queue_iter: Callable[[Any], Iterator[VRequest]] = deque.__iter__
_queue_len: Callable[[Any], int] = deque.__len__

_NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


class PolicyDecisionError(RuntimeError):
    """A policy's decision cannot be applied to vLLM (a policy bug or an unsupported action)."""


class VLLMKVView(KVQueries):
    """``KVView`` over vLLM's block pool; the arithmetic is ``KVQueries``, as in the simulator."""

    __slots__ = ("_pool", "block_size", "num_free_swap_blocks", "num_total_blocks",
                 "watermark_blocks")

    def __init__(self, scheduler: Scheduler) -> None:
        mgr = scheduler.kv_cache_manager
        self._pool = mgr.block_pool
        self.block_size = scheduler.block_size
        # vLLM keeps block 0 as a permanently reserved "null block" (block_pool.py).
        self.num_total_blocks = self._pool.num_gpu_blocks - 1
        self.watermark_blocks = mgr.watermark_blocks
        self.num_free_swap_blocks = 0  # recompute preemption only

    @property
    def num_free_blocks(self) -> int:  # type: ignore[override]
        return self._pool.get_num_free_blocks()


@dataclass(slots=True)
class _Step:
    """One iteration between ``schedule()`` and ``update_from_output()``."""

    start: float  # policy clock (s)
    t0: float  # perf_counter at schedule() entry
    t_sched_end: float
    shape: BatchShape
    batch_size: int
    decision_time: float
    policy_time: float
    vllm_time: float
    num_preempted: int
    info: MutableMapping[str, float] = field(default_factory=dict)
    decision: Decision | None = None
    # The adapter's (token budget, mismatch, trimmed tokens), added to ``info`` when the step is
    # logged (after the forward pass: logging is no part of the scheduling time).
    adapter: tuple[int, int, int] | None = None
    # Async scheduling: the policy's cost model's latency of this step (s), which dates the
    # tokens it has in flight for the policy (``AccelGenScheduler._step_scheduled``).
    predicted: float = 0.0


@dataclass(slots=True)
class ForgottenRecords:
    """Counts of what a scheduler forgot once its log had written it: ``statuses`` and
    ``reasons`` as ``shutdown_summary`` counts them (the status the log writes; why unfinished)."""

    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    iterations: int = 0
    refused: int = 0  # entries of ``invalid``


class InstrumentedScheduler(AsyncScheduler):
    """Stock vLLM V1 scheduling plus the recording of the accelgen replay: per-request mirrors
    with token timestamps, per-iteration composition and scheduler wall time, per-request SLOs
    from ``SamplingParams.extra_args`` (bad values finish that request with an error), and,
    with ``log_dir`` configured, those records kept on disk while it serves (``logsink``).

    Every entry point vLLM calls that changes the records holds ``log_lock`` (a re-entrant
    lock, uncontended unless the log writer is collecting), so the log writer reads consistent
    records.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accelgen_config: AdapterConfig = resolve_config(self.vllm_config.additional_config)
        cfg = self.accelgen_config
        self.time_origin: float = cfg.time_origin if cfg.time_origin is not None else time.time()
        self.kv_view = VLLMKVView(self)
        # vLLM request id -> mirror / vLLM request, for requests not finished yet.
        self.tracked: dict[str, Request] = {}
        self._vreqs: dict[str, VRequest] = {}
        self._vid_of: dict[int, str] = {}  # mirror req_id -> vLLM request id
        self._used_ids: set[int] = set()
        self._auto_ids = itertools.count(AUTO_REQ_ID_BASE)
        self.max_tokens: dict[int, int] = {}  # req_id -> the request's max_tokens
        self.vllm_request_ids: dict[int, str] = {}
        self.done: list[Request] = []  # ended mirrors (finished, rejected, aborted), in order
        self.unfinished_reason: dict[int, str] = {}  # req_id -> why it ended unfinished
        self.invalid: dict[str, str] = {}  # vLLM request id -> why it was refused
        self._pending_outputs: list[VRequest] = []
        self.log = IterationLog()
        self._timing: list[tuple[float, float, float, float]] = []
        self.idle_steps = 0
        self.mismatch_steps = 0
        # Steps whose decision exceeded the engine's token limit and was trimmed (the plugin's
        # policies plan within it; 0 unless a policy ignores SchedulerView's limits).
        self.trimmed_steps = 0
        # Steps scheduled while an earlier one was still in flight (0 in sync mode): the proof
        # that the engine core really overlapped scheduling with execution.
        self.overlapped_steps = 0
        # Async scheduling (vLLM's default on GPU): ``schedule()`` runs while the previous step
        # still executes, and that step's outputs reach ``update_from_output()`` after it.
        self.accelgen_async = bool(self.scheduler_config.async_scheduling)
        # Steps scheduled whose outputs have not come back, oldest first (at most one in sync
        # mode, two with async scheduling): (vLLM's output, its record; None for an idle step).
        self._in_flight: deque[tuple[SchedulerOutput, _Step | None]] = deque()
        # perf_counter when the previous step's outputs came back / its update ended: with async
        # scheduling a step executes from the first (not from its own schedule()), and the
        # iterations of the log tile the time between them.
        self._prev_exec_end = 0.0
        self._prev_step_end = 0.0
        self._kv_blocks = scheduler_blocks_of(self)
        self.log_lock = threading.RLock()
        self._logged = (0, 0)  # (ended requests, iterations) handed to the log sink
        # What a server's scheduler forgot once its log wrote it (``keep_logged_records``).
        self.forgotten = ForgottenRecords()
        self._log_dirty = True  # (the first flush writes the files even if nothing was served)
        # Its writer thread starts with the first request (a scheduler whose construction fails
        # leaves no thread behind).
        self.log_sink: LogSink | None = None
        if cfg.log_dir is not None:
            self.log_sink = LogSink(cfg.log_dir, self, self.log_lock, cfg.log_flush_interval_s)
        # time.monotonic() when the engine-core process got SIGTERM/SIGINT (its drain began);
        # ``shutdown_grace_s`` later the requests still held end unfinished (``schedule``).
        self.shutdown_since: float | None = None
        self.shutdown_grace_s = shutdown_grace(cfg, getattr(self.vllm_config, "shutdown_timeout",
                                                            0.0) or 0.0)
        self._ending_at_shutdown = False
        watch_shutdown_signals(self)

    # -- clock ---------------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds on the policy's clock (epoch time minus ``time_origin``)."""
        return time.time() - self.time_origin

    def set_time_origin(self, origin: float) -> None:
        """Re-base the clock (before any request is added), e.g. to a replay's start."""
        if self.tracked or self.done:
            raise RuntimeError("set_time_origin must be called before requests are added")
        self.time_origin = origin

    def reset_records(self, origin: float | None = None) -> None:
        """Forget finished requests and the logs (e.g. after a warm-up) and optionally re-base
        the clock; only valid while no request is in flight."""
        with self.log_lock:
            self._reset_records(origin)

    def _reset_records(self, origin: float | None) -> None:
        if self.tracked:
            raise RuntimeError("reset_records needs an idle scheduler (requests in flight)")
        self.done.clear()
        self.unfinished_reason.clear()
        self.invalid.clear()
        self._used_ids.clear()
        self._auto_ids = itertools.count(AUTO_REQ_ID_BASE)
        self.max_tokens.clear()
        self.vllm_request_ids.clear()
        self.log = IterationLog()
        self._timing.clear()
        self.idle_steps = 0
        self.mismatch_steps = 0
        self.trimmed_steps = 0
        self.overlapped_steps = 0
        # A step still in flight belongs to the time before the reset: not logged.
        self._in_flight = deque((out, None) for out, _ in self._in_flight)
        if origin is not None:
            self.time_origin = origin
        self._logged = (0, 0)
        self.forgotten = ForgottenRecords()
        self._log_dirty = True
        if self.log_sink is not None:
            self.log_sink.reset()

    # -- requests in and out -------------------------------------------------------------------
    def add_request(self, request: VRequest) -> None:
        with self.log_lock:
            self._add_request(request)
            self._log_dirty = True
        if self.log_sink is not None:
            self.log_sink.start()

    def _add_request(self, request: VRequest) -> None:
        is_new = request.request_id not in self.requests
        if is_new and self.policy == SchedulingPolicy.PRIORITY:
            self._set_slo_priority(request)
        super().add_request(request)
        if not is_new:
            return  # a streaming-input continuation of a tracked request
        extra = request.sampling_params.extra_args if request.sampling_params else None
        try:
            slo = parse_request_slo(extra, self.accelgen_config.slo)
            req_id = self._assign_id(slo.req_id)
        except SLOError as exc:
            self._refuse(request, f"accelgen: request {request.request_id} refused: {exc}")
            return
        now = self.now()
        m = Request(req_id=req_id, arrival=request.arrival_time - self.time_origin,
                    prompt_len=request.num_prompt_tokens, source=slo.source,
                    ttft_slo=slo.ttft_slo, tbt_slo=slo.tbt_slo, jct_slo=slo.jct_slo,
                    online=slo.online, predicted_output_len=slo.predicted_output_len,
                    queued_since=now)
        vid = request.request_id
        # The mirror also rides on the vLLM request so that building the policy's view is one
        # attribute read per queued request (see AccelGenScheduler.schedule).
        request.accelgen_mirror = m  # type: ignore[attr-defined]
        self.tracked[vid] = m
        self._vreqs[vid] = request
        self._vid_of[req_id] = vid
        self.vllm_request_ids[req_id] = vid
        self.max_tokens[req_id] = int(request.max_tokens)
        self._on_arrival(m, now)

    def _set_slo_priority(self, request: VRequest) -> None:
        """vLLM's priority mode with SLO classes: a request its client gave no priority (0) gets
        the priority of its SLO class (``policies.vllm_priority.slo_priority``: tight TBT
        first, offline last), as the simulator's ``vllm-priority`` orders it; one whose SLO does
        not parse keeps 0 (it is refused right after)."""
        if request.priority != 0:
            return
        extra = request.sampling_params.extra_args if request.sampling_params else None
        try:
            slo = parse_request_slo(extra, self.accelgen_config.slo)
        except SLOError:
            return
        request.priority = slo_priority(slo.online, slo.tbt_slo)

    def _assign_id(self, wanted: int | None) -> int:
        if wanted is not None:
            if wanted in self._used_ids:
                raise SLOError([("req_id", f"req_id={wanted} is already used by another "
                                           "request")])
            self._used_ids.add(wanted)
            return wanted
        while (i := next(self._auto_ids)) in self._used_ids:
            pass
        self._used_ids.add(i)
        return i

    def _refuse(self, request: VRequest, message: str) -> None:
        """Finish a request with an error output instead of serving it; others are unaffected."""
        logger.error("%s", message)
        self.invalid[request.request_id] = message
        request.stop_reason = message
        self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
        self._pending_outputs.append(request)

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[VRequest]:
        with self.log_lock:
            finished = super().finish_requests(request_ids, finished_status)
            if finished:
                now = self.now()
                for v in finished:
                    if v.request_id in self.tracked:
                        self._finish_mirror(v, now)
                self._log_dirty = True
                if not self.tracked and self.log_sink is not None:
                    self.log_sink.poke()
        return finished

    def has_finished_requests(self) -> bool:
        # Refused/rejected requests still owe their client a final output.
        return bool(self._pending_outputs) or super().has_finished_requests()

    def _finish_mirror(self, v: VRequest, now: float) -> None:
        m = self.tracked.pop(v.request_id)
        del self._vreqs[v.request_id]
        del self._vid_of[m.req_id]
        if v.status in _NORMAL_FINISH:
            # vLLM's LENGTH_CAPPED is both "max_tokens reached" and "max_model_len reached";
            # only the second one cuts the output short.
            if (v.status == RequestStatus.FINISHED_LENGTH_CAPPED
                    and v.num_output_tokens < v.max_tokens):
                m.status = Status.CUT
                m.reject_reason = length_cap_reason(m.prompt_len, v.max_tokens,
                                                    v.num_output_tokens, self.max_model_len)
            else:
                m.status = Status.FINISHED
        elif v.status == RequestStatus.FINISHED_ABORTED:
            # Not a scheduling outcome: recorded as unfinished (see requests_frame).
            m.status = Status.REJECTED
            self.unfinished_reason[m.req_id] = (SHUTDOWN_REASON if self._ending_at_shutdown
                                                else ABORTED_REASON)
        else:
            m.status = Status.REJECTED
            m.reject_reason = (str(v.stop_reason) if isinstance(v.stop_reason, str)
                               else f"vLLM finished it as {v.status.name}")
        m.finish_time = now
        m.num_blocks = 0
        self.done.append(m)
        self._on_finish(m, now)

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        with self.log_lock:
            if self.shutdown_since is not None and self.requests:
                self._end_after_grace()
            return self._schedule(throttle_prefills)

    def _end_after_grace(self) -> None:
        """Once ``shutdown_grace_s`` has passed since SIGTERM, end every request vLLM still
        holds as aborted (their clients get a final output, finish reason ``abort``); the log
        says ``SHUTDOWN_REASON``. The engine then has no work left and stops, writing the logs,
        before vLLM's --shutdown-timeout would kill it."""
        assert self.shutdown_since is not None
        waited = time.monotonic() - self.shutdown_since
        if waited < self.shutdown_grace_s:
            return
        self._ending_at_shutdown = True
        try:
            ended = self.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        finally:
            self._ending_at_shutdown = False
        self._pending_outputs.extend(ended)
        logger.warning("accelgen: %d requests still in flight %.1f s after SIGTERM (the "
                       "shutdown grace period) end unfinished", len(ended), waited)

    def _schedule(self, throttle_prefills: bool) -> SchedulerOutput:
        start = self.now()
        t0 = time.perf_counter()
        out = super().schedule(throttle_prefills)
        t1 = time.perf_counter()
        self._record_schedule(out, start=start, t0=t0, t1=t1, policy_time=0.0,
                              vllm_time=t1 - t0, info={}, decision=None, adapter=None)
        return out

    def _record_schedule(self, out: SchedulerOutput, *, start: float, t0: float, t1: float,
                         policy_time: float, vllm_time: float, info: MutableMapping[str, float],
                         decision: Decision | None, adapter: tuple[int, int, int] | None
                         ) -> None:
        """Update mirrors for what vLLM scheduled and keep the iteration for the log."""
        tracked = self.tracked
        now = start
        preempted = out.preempted_req_ids or ()
        for vid in preempted:
            m = tracked.get(vid)
            if m is not None and m.status == Status.RUNNING:  # preempted by vLLM itself
                m.status = Status.WAITING
                m.num_computed_tokens = 0
                m.num_blocks = 0
                m.num_preemptions += 1
                m.queued_since = now
        shape = BatchShape()
        for vid, n in out.num_scheduled_tokens.items():
            m = tracked.get(vid)
            if m is None:
                continue
            ctx = m.num_computed_tokens
            if n == 1 and m.num_output_tokens > 0 and ctx == m.num_tokens - 1:
                shape.add_decode(ctx)
            else:
                shape.add_prefill(n, ctx)
            if m.status == Status.WAITING:
                m.status = Status.RUNNING
                if math.isnan(m.first_scheduled_time):
                    m.first_scheduled_time = now
        if self.accelgen_async:
            self._advance_mirrors(out)
        if self._in_flight:
            self.overlapped_steps += 1
        n_sched = len(out.num_scheduled_tokens)
        if n_sched == 0:
            self.idle_steps += 1
            self._in_flight.append((out, None))
            self._idle_decision(decision)
            return
        step = _Step(start=start, t0=t0, t_sched_end=t1, shape=shape, batch_size=n_sched,
                     decision_time=t1 - t0, policy_time=policy_time, vllm_time=vllm_time,
                     num_preempted=len(preempted), info=info, decision=decision, adapter=adapter)
        self._in_flight.append((out, step))
        if self.accelgen_async:
            self._step_scheduled(step, out)

    def _advance_mirrors(self, out: SchedulerOutput) -> None:
        """Async scheduling: the mirrors of the requests ``out`` scheduled take vLLM's state
        after ``schedule()`` at once (the step's tokens computed, the token it samples counted
        as an output placeholder, its KV blocks allocated), because the next ``schedule()``
        comes before this step's outputs. Tokens are time-stamped when they come back."""
        tracked, vreqs, blocks_of = self.tracked, self._vreqs, self._kv_blocks
        for vid in out.num_scheduled_tokens:
            m = tracked.get(vid)
            if m is None:
                continue
            v = vreqs[vid]
            m.num_computed_tokens = v.num_computed_tokens
            m.num_output_tokens = v.num_output_tokens + v.num_output_placeholders
            m.num_blocks = blocks_of(vid)

    def _step_scheduled(self, step: _Step, out: SchedulerOutput) -> None:
        """Hook (async scheduling): ``step`` was scheduled and its mirrors advanced."""

    def _idle_decision(self, decision: Decision | None) -> None:
        """Hook: the step scheduled nothing."""

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> dict[int, EngineCoreOutputs]:
        t_exec_end = time.perf_counter()
        with self.log_lock:
            outputs = self._update_from_output(scheduler_output, model_runner_output, t_exec_end)
            self._log_dirty = True
            if not self.tracked and self.log_sink is not None:
                self.log_sink.poke()
        return outputs

    def _update_from_output(self, scheduler_output: SchedulerOutput,
                            model_runner_output: ModelRunnerOutput,
                            t_exec_end: float) -> dict[int, EngineCoreOutputs]:
        # Collect the vLLM requests first: vLLM forgets finished ones inside the call.
        scheduled = [(vid, self._vreqs.get(vid)) for vid in scheduler_output.num_scheduled_tokens]
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = self.now()
        tracked, blocks_of = self.tracked, self._kv_blocks
        for vid, v in scheduled:
            m = tracked.get(vid)
            if m is None or v is None:
                continue
            # Tokens that came back (token_times) against vLLM's count; with async scheduling
            # the mirror's num_output_tokens also counts the tokens still in flight.
            real = v.num_output_tokens
            k = real - len(m.token_times)
            placeholders = v.num_output_placeholders
            if k > 0:
                if not m.token_times:
                    m.first_token_time = now
                m.token_times.extend([now] * k)
                if not placeholders:  # (else: the time of the token in flight, see _advance)
                    m.last_token_time = now
            m.num_output_tokens = real + placeholders
            if v.is_finished():
                self._finish_mirror(v, now)
            else:
                m.num_computed_tokens = v.num_computed_tokens
                m.num_blocks = blocks_of(vid)
        if self._pending_outputs:
            self._emit_pending(outputs)
        step = self._pop_step(scheduler_output)
        if step is not None:
            # With async scheduling the step was scheduled while the previous one executed: it
            # executes from when that one's outputs came back, and its iteration begins when
            # the previous iteration ended (in sync mode both are its own schedule()).
            begin = max(step.t0, self._prev_step_end)
            end = time.perf_counter()
            latency = end - begin
            exec_time = t_exec_end - max(step.t_sched_end, self._prev_exec_end)
            self._prev_exec_end, self._prev_step_end = t_exec_end, end
            pool = self.kv_view
            used_blocks = pool.num_total_blocks - pool.num_free_blocks
            used_tokens = sum(v.num_computed_tokens for v in self.running)
            if step.adapter is not None:
                info = step.info  # (the policy's fresh mapping for this decision)
                info["adapter_budget"] = float(step.adapter[0])
                info["adapter_mismatch"] = float(step.adapter[1])
                info["adapter_trimmed_tokens"] = float(step.adapter[2])
            self.log.append(step.start + (begin - step.t0), latency, step.shape,
                            step.batch_size, used_blocks,
                            pool.num_total_blocks, used_tokens, step.decision_time,
                            step.num_preempted, len(self.waiting) + len(self.kv_holding_waiting),
                            len(self.running), 0, 0.0, step.info)
            self._timing.append((step.policy_time, step.vllm_time, exec_time, latency))
            self._on_step_end(step, latency, exec_time)
        return outputs

    def _pop_step(self, out: SchedulerOutput) -> _Step | None:
        """The record of the step whose outputs came back (vLLM returns steps in order)."""
        q = self._in_flight
        while q:
            o, step = q.popleft()
            if o is out:
                return step
        return None

    def _emit_pending(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        for v in self._pending_outputs:
            eco = outputs.get(v.client_index)
            if eco is None:
                eco = outputs[v.client_index] = EngineCoreOutputs()
            eco.outputs.append(EngineCoreOutput(
                request_id=v.request_id, new_token_ids=[], finish_reason=v.get_finished_reason(),
                stop_reason=v.stop_reason, events=v.take_events(), trace_headers=v.trace_headers))
        self._pending_outputs.clear()

    # -- hooks for the policy-driven subclass --------------------------------------------------
    def _on_arrival(self, req: Request, now: float) -> None:
        pass

    def _on_finish(self, req: Request, now: float) -> None:
        pass

    def _on_step_end(self, step: _Step, latency: float, exec_time: float) -> None:
        pass

    # -- results -------------------------------------------------------------------------------
    def all_requests(self) -> list[Request]:
        """Every request seen (finished, rejected, or still in flight), by req_id; with
        ``log_dir`` and without ``keep_logged_records``, those its log has not written yet."""
        return sorted([*self.done, *self.tracked.values()], key=lambda r: r.req_id)

    def requests_frame(self, requests: Iterable[Request] | None = None) -> pd.DataFrame:
        """``requests.parquet`` rows of ``requests`` (default: every request seen, by req_id).

        The target output length is the request's ``max_tokens``, stopped at max_model_len (its
        served length). Requests vLLM aborted (the client went away, the server shut down) and
        requests still in flight are ``unfinished`` with the reason in ``reject_reason``.
        """
        reqs = self.all_requests() if requests is None else list(requests)
        # A dict, not an array indexed by req_id: served requests without a client id get ids
        # from AUTO_REQ_ID_BASE on.
        asked = [self.max_tokens.get(r.req_id, r.num_output_tokens) for r in reqs]
        served = served_output_len(np.array([r.prompt_len for r in reqs], dtype=np.int64),
                                   np.array(asked, dtype=np.int64), self.max_model_len)
        df = requests_frame(reqs, {r.req_id: int(n) for r, n in zip(reqs, served, strict=True)})
        if len(df):
            reasons = [self.unfinished_reason.get(r.req_id, "" if r.is_done else IN_FLIGHT_REASON)
                       for r in reqs]
            unfinished = [bool(why) for why in reasons]
            df.loc[unfinished, "status"] = "unfinished"
            df.loc[unfinished, "reject_reason"] = [why for why in reasons if why]
        return df

    def iterations_frame(self, start: int = 0) -> pd.DataFrame:
        """``iterations.parquet`` rows of the iterations logged from index ``start`` on."""
        # Under the lock: building the frame moves rows within the log, which the log sink's
        # thread may be reading at the same time.
        with self.log_lock:
            return self.log.to_frame(start)

    def timing_frame(self, start: int = 0) -> pd.DataFrame:
        """Wall times per logged iteration (s): ``decision_time`` (the whole ``schedule()``
        call), ``policy_time``, ``vllm_schedule_time`` (vLLM's own ``schedule()``),
        ``exec_time`` (model execution until ``update_from_output``), ``step_time``."""
        with self.log_lock:
            t = np.asarray(self._timing[start:], dtype=np.float64).reshape(-1, 4)
            decision = np.asarray(self.log.decision_time[start:], dtype=np.float64)
        return pd.DataFrame({
            "decision_time": decision,
            "policy_time": t[:, 0], "vllm_schedule_time": t[:, 1], "exec_time": t[:, 2],
            "step_time": t[:, 3]})

    @property
    def num_iterations(self) -> int:
        """Iterations logged since the start (or ``reset_records``), forgotten ones too."""
        return self.forgotten.iterations + len(self.log)

    def log_delta(self) -> LogDelta | None:
        """Records since the previous call, for ``LogSink`` (which holds ``log_lock``). Unless
        ``keep_logged_records``, the scheduler then forgets them (``_forget``)."""
        if not self._log_dirty:
            return None
        self._log_dirty = False
        n_done, n_its = self._logged
        self._logged = (len(self.done), len(self.log))
        delta = LogDelta(ended_requests=self.requests_frame(self.done[n_done:]),
                         in_flight=self.requests_frame(
                             sorted(self.tracked.values(), key=lambda r: r.req_id)),
                         iterations=self.iterations_frame(n_its),
                         timing=self.timing_frame(n_its))
        if not self.accelgen_config.keep_logged_records:
            self._forget()
        return delta

    def _forget(self) -> None:
        """Drop the records just handed to the log (every ended request, every iteration),
        counting them in ``forgotten``: what a server keeps follows the flush interval, not the
        run's length. (``_used_ids`` stays: a client's req_id is unique over the whole run.)"""
        f = self.forgotten
        unfinished = self.unfinished_reason
        for r in self.done:
            why = unfinished.pop(r.req_id, None)
            if why:
                f.statuses["unfinished"] += 1
                f.reasons[why] += 1
            else:
                f.statuses[r.status.name.lower()] += 1
            self.max_tokens.pop(r.req_id, None)
            self.vllm_request_ids.pop(r.req_id, None)
        f.requests += len(self.done)
        f.refused += len(self.invalid)
        f.iterations += len(self.log)
        self.done.clear()
        self.invalid.clear()
        self.log = IterationLog()
        self._timing.clear()
        self._logged = (0, 0)

    def shutdown(self) -> None:
        # vLLM's EngineCore.shutdown (v1/engine/core.py) calls this after the model executor's
        # shutdown, in the engine-core process's exit path (run_engine_core's `finally`).
        if self.log_sink is not None:
            try:
                drained = shutdown_summary.summary(self)
                logger.info("accelgen: at shutdown %s", drained)
                self.log_sink.close()
                # After the final write: the summary's presence says the logs are complete.
                shutdown_summary.write_summary(drained, self.log_sink.out_dir)
            except Exception:  # never let logging break vLLM's shutdown
                logger.exception("accelgen: could not write scheduler logs to %s",
                                 self.log_sink.out_dir)
        super().shutdown()


SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def watch_shutdown_signals(scheduler: InstrumentedScheduler) -> bool:
    """In vLLM's engine-core process, where a served scheduler lives, note the time SIGTERM or
    SIGINT arrives in ``scheduler.shutdown_since`` and pass the signal on to vLLM's handler
    (which starts the engine's drain). Anywhere else (an engine in the caller's own process)
    the signal handlers are left alone; returns whether they were wrapped."""
    import multiprocessing

    if (threading.current_thread() is not threading.main_thread()
            or not multiprocessing.current_process().name.startswith("EngineCore")):
        return False
    wrapped = False
    for sig in SHUTDOWN_SIGNALS:
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Callable[..., Any] = previous) -> None:
            if scheduler.shutdown_since is None:
                scheduler.shutdown_since = time.monotonic()
            previous(signum, frame)

        signal.signal(sig, handler)
        wrapped = True
    return wrapped


def engine_limits_line(largest_budget: int | None, token_limit: int, max_num_seqs: int) -> str:
    """The startup line saying how the engine's limits bound the policy's plan."""
    if largest_budget is None:
        how = "bounds the policy's batches (it has no token budget of its own)"
    elif largest_budget > token_limit:
        how = (f"caps the policy's token budget (its own largest: {largest_budget}); the policy "
               "plans within it")
    else:
        how = f"holds the policy's largest token budget ({largest_budget})"
    return (f"engine limits max_num_batched_tokens={token_limit} {how}; max_num_seqs="
            f"{max_num_seqs} bounds its admissions")


def scheduler_blocks_of(scheduler: Scheduler) -> Any:
    """``request id -> KV blocks held`` for the scheduler's first KV-cache group.

    Models with one attention type (the ones the artifact serves) have a single group; hybrid
    models would need one count per group, which the policy interface does not have.
    """
    req_to_blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks

    def blocks_of(request_id: str) -> int:
        # .get: req_to_blocks is a defaultdict and indexing would insert an empty entry.
        blocks = req_to_blocks.get(request_id)
        return len(blocks) if blocks is not None else 0

    return blocks_of


class AccelGenScheduler(InstrumentedScheduler):
    """vLLM V1 scheduler driven by an accelgen policy (default: AccelGen itself)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.accelgen_config
        self._check_engine_config()
        # Not `self.policy`: vLLM's Scheduler uses that name for its FCFS/priority queue mode.
        self.accelgen_policy: Policy = make_engine_policy(cfg.policy)
        self._measures_steps()
        self.cost = build_cost_model(cfg.cost)
        self.pivot = build_pivot(cfg, self.cost, block_size=self.block_size,
                                 max_model_len=self.max_model_len)
        # type-ignore: KVView declares num_free_blocks as a plain (settable) attribute; here it
        # is a read-only property over vLLM's block pool, which is all a policy may do with it.
        # The engine's limits: the token limit as it stands before the adapter sets a step's
        # budget (schedule() puts it back after each step); the running-request limit is set
        # per step (``_seats``).
        self.token_limit = int(self.max_num_scheduled_tokens)
        self.view = SchedulerView(now=0.0, waiting=[], running=[], swapped=[],
                                  kv=self.kv_view,  # type: ignore[arg-type]
                                  cost=self.cost, pivot=self.pivot,
                                  max_model_len=self.max_model_len,
                                  max_num_batched_tokens=self.token_limit,
                                  max_num_seqs=int(self.max_num_active_reqs))
        self._caps: dict[str, int] | None = None
        self._view_stale = True  # view.waiting/running to be rebuilt before the next decision
        # The temporary waiting queues of a step (see schedule); replaced after any step that
        # left requests in them.
        self._admit_queues = (create_request_queue(self.policy), create_request_queue(self.policy))
        self._trim_warned = 0
        self._mismatch_warned = 0
        # Async scheduling (docs/vllm.md, "Async scheduling"): the policy's clock time at which
        # the steps in flight are predicted to end (the step it decides starts then), and the
        # requests whose last token is in flight (the policy was told they finished).
        self._busy_until = 0.0
        self._leaving: set[int] = set()
        # Admission's KV rule belongs to the policy (vLLM's default reserves the whole prompt at
        # admission, which would veto a chunk the policy sized to the free KV).
        self.scheduler_reserve_full_isl = False
        logger.info("accelgen: policy %s %s, S_pf=%d, T_pf=%.4fs, cost model %s, KV %d blocks "
                    "of %d", cfg.policy.name, self.accelgen_policy.params.model_dump(),
                    self.pivot.s_pf, self.pivot.t_pf, self.cost.name,
                    self.kv_view.num_total_blocks, self.block_size)
        logger.info("accelgen: %s", engine_limits_line(
            self.accelgen_policy.largest_budget(self.pivot), self.token_limit,
            int(self.max_num_active_reqs)))

    def _measures_steps(self) -> None:
        """With async scheduling the policy is told a step's predicted latency when it is
        scheduled: a closed loop then takes the measured one from ``_on_step_end``."""
        if self.accelgen_async and hasattr(self.accelgen_policy, "observe_step"):
            self.accelgen_policy.measured_by_backend = True  # type: ignore[attr-defined]

    def _check_engine_config(self) -> None:
        sc = self.scheduler_config
        problems = []
        if self.policy == SchedulingPolicy.PRIORITY:
            problems.append("scheduling policy 'priority' (use fcfs: the accelgen policy orders "
                            "the queue itself)")
        if not sc.enable_chunked_prefill:
            problems.append("enable_chunked_prefill=False (vLLM would refuse the policy's chunks;"
                            " a policy that does not chunk simply never cuts a prompt)")
        if sc.long_prefill_token_threshold:
            problems.append(f"long_prefill_token_threshold={sc.long_prefill_token_threshold} "
                            "(vLLM would cut the policy's chunks; set 0)")
        if self.num_spec_tokens or self.num_lookahead_tokens:
            problems.append("speculative decoding (not modelled by the policies)")
        if problems:
            raise ValueError("AccelGenScheduler cannot run with: " + "; ".join(problems))
        if self.cache_config.enable_prefix_caching:
            logger.warning("accelgen: prefix caching is on; cache hits make vLLM compute fewer "
                           "tokens than the policy planned (the policy still caps each request)")

    def _reset_records(self, origin: float | None) -> None:
        super()._reset_records(origin)
        # A fresh policy object: no state (running means, carry-overs) from before the reset.
        cfg = self.accelgen_config
        self.accelgen_policy = make_engine_policy(cfg.policy)
        self._measures_steps()
        self._view_stale = True
        self._busy_until = 0.0
        self._leaving.clear()

    # -- hooks ---------------------------------------------------------------------------------
    def _on_arrival(self, req: Request, now: float) -> None:
        self._view_stale = True
        self.accelgen_policy.on_arrival(req, now)

    def _on_finish(self, req: Request, now: float) -> None:
        self._view_stale = True
        if self._leaving and req.req_id in self._leaving:
            self._leaving.discard(req.req_id)  # (the policy was told when its last token left)
            return
        self.accelgen_policy.on_finish(req, now)

    def _on_step_end(self, step: _Step, latency: float, exec_time: float) -> None:
        cost = self.cost
        if isinstance(cost, OnlineLinearCostModel) and cost.observe(step.shape.forward_size,
                                                                    exec_time):
            # A new Pivot object (not a mutation): policies key their latency caches on it.
            self.pivot = self.view.pivot = Pivot(s_pf=self.pivot.s_pf,
                                                 t_pf=cost.forward_time(self.pivot.s_pf))
        if self.accelgen_async:
            # The policy took this step in when it was scheduled (_step_scheduled); its end is
            # now known: the step still in flight, if any, started now.
            self._busy_until = self.now() + sum(s.predicted for _, s in self._in_flight
                                                if s is not None)
            # A closed loop (AccelGen's) learns from the measured step here, not from the
            # prediction it was told when the step was scheduled.
            observe = getattr(self.accelgen_policy, "observe_step", None)
            if observe is not None and step.decision is not None:
                observe(step.predicted, exec_time)
        elif step.decision is not None:
            self.accelgen_policy.on_step_end(self.view, step.decision, latency)

    def _step_scheduled(self, step: _Step, out: SchedulerOutput) -> None:
        # Async scheduling: the policy takes the step in now, as vLLM's own state does (its
        # mirrors advanced by _advance_mirrors), with the step ending when the cost model says:
        # the token it samples for a request is dated then, the next decision's clock starts
        # then, and a request whose last token it is leaves the policy's view now (vLLM itself
        # will not schedule it again: it knows max_tokens and max_model_len).
        view = self.view
        predicted = self.cost.iteration_time(step.shape)
        step.predicted = predicted
        end = view.now + predicted
        self._busy_until = end
        tracked, vreqs = self.tracked, self._vreqs
        leaving = []
        for vid in out.num_scheduled_tokens:
            m = tracked.get(vid)
            if m is None:
                continue
            v = vreqs[vid]
            if v.is_prefill_chunk:
                continue  # (no token sampled)
            m.last_token_time = end
            if self._last_token_in_flight(v):
                leaving.append(m)
        if step.decision is not None:
            self.accelgen_policy.on_step_end(view, step.decision, predicted)
        for m in leaving:
            self._leaving.add(m.req_id)
            self._view_stale = True
            self.accelgen_policy.on_finish(m, end)

    def _last_token_in_flight(self, v: VRequest) -> bool:
        """The tokens in flight include the request's last, by ``max_tokens`` or
        ``max_model_len``: vLLM will not schedule it again (``Scheduler.schedule`` skips it once
        only its last step is in flight). A stop token cannot be known ahead: such a request may
        run one step more, whose token vLLM discards, as for stock vLLM."""
        ph = v.num_output_placeholders
        return ph > 0 and (v.num_output_tokens + ph >= v.max_tokens
                           or v.num_tokens + ph >= self.max_model_len)

    def _reserve_prefill_lookahead(self, request: VRequest, num_computed_tokens: int,
                                   num_new_tokens: int) -> int:
        # Called once per candidate request per step: skip the base call when it is a no-op
        # (no multi-token-prediction drafter).
        n = (super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
             if self.num_prefill_lookahead else num_new_tokens)
        caps = self._caps
        if caps is None:
            return n
        cap = caps.get(request.request_id, 0)
        return n if n < cap else cap

    # -- the decision --------------------------------------------------------------------------
    def _schedule(self, throttle_prefills: bool) -> SchedulerOutput:
        if self._pause_state == PauseState.PAUSED_ALL:
            # vLLM schedules nothing while paused; asking the policy would only make it plan
            # (and account for) a step that does not happen.
            return super()._schedule(throttle_prefills)
        start = self.now()
        t0 = time.perf_counter()
        view = self.view
        # Seats vLLM still has for admissions, as the policy counts its running requests (those
        # whose last token is in flight left its view but still hold a seat).
        view.max_num_seqs = (self.max_num_active_reqs - len(self._leaving)
                             - self.num_waiting_for_streaming_input)
        # With async scheduling the step decided now starts when the one in flight ends (the
        # clock never runs back, whatever the predictions).
        view.now = max(start, self._busy_until, view.now) if self.accelgen_async else start
        # The view's queues change only with arrivals, finishes, admissions and preemptions,
        # which mark it stale; the counts are a second check.
        if (self._view_stale or len(view.running) != len(self.running) - len(self._leaving)
                or len(view.waiting) != (_queue_len(self.waiting)
                                         + _queue_len(self.kv_holding_waiting))):
            self._refresh_view()
        tp = time.perf_counter()
        decision = self.accelgen_policy.schedule(view)
        policy_time = time.perf_counter() - tp

        if decision.swap_out or decision.swap_in or decision.reserve:
            raise PolicyDecisionError(
                f"policy {self.accelgen_policy.name!r} asked for KV swapping or reservation, "
                "which the vLLM backend does not support (recompute preemption only)")
        for m, why in decision.rejected:
            self._reject(m, why)
        for m in decision.preempted:
            v = self._vreq_of(m, "preempt")
            if v.status != RequestStatus.RUNNING:
                raise PolicyDecisionError(f"policy {self.accelgen_policy.name!r} preempted request "
                                          f"{m.req_id}, which is {v.status.name}, not running")
            in_flight = v.num_output_placeholders  # (async: tokens still to come back)
            self.running.remove(v)
            self._preempt_request(v, time.monotonic())
            # Mirror the preemption now: the feasibility check below reads the freed blocks.
            m.status, m.num_computed_tokens, m.num_blocks = Status.WAITING, 0, 0
            # vLLM still appends the tokens of a step in flight when they come back.
            m.num_output_tokens = v.num_output_tokens + in_flight
            m.num_preemptions += 1
            m.queued_since = start
        caps, wait_order, budget, trimmed = self._caps_from(decision)

        saved_budget = self.max_num_scheduled_tokens
        saved_waiting, saved_kv_waiting = self.waiting, self.kv_holding_waiting
        try:
            # vLLM reads the queues through these attributes, so swapping in queues holding only
            # the admitted requests is cheaper than rebuilding the long queues (O(admitted)).
            # The same two (emptied) queues every step: most steps admit nobody.
            self.waiting, self.kv_holding_waiting = self._admit_queues
            for v in wait_order:
                q = self.kv_holding_waiting if self._holds_kv_blocks(v) else self.waiting
                q.add_request(v)
            self.max_num_scheduled_tokens = budget
            self._caps = caps
            t_v = time.perf_counter()
            out = super(InstrumentedScheduler, self).schedule(throttle_prefills)
            vllm_time = time.perf_counter() - t_v
        finally:
            self._caps = None
            self.max_num_scheduled_tokens = saved_budget
            if wait_order or _queue_len(self.waiting) or _queue_len(self.kv_holding_waiting):
                self._restore_queues(saved_waiting, saved_kv_waiting, wait_order)
            else:  # nothing admitted, nothing preempted by vLLM itself: the usual step
                self.waiting, self.kv_holding_waiting = saved_waiting, saved_kv_waiting
        if wait_order or decision.preempted or out.preempted_req_ids:
            self._view_stale = True
        mismatch = 0
        got = out.num_scheduled_tokens
        if got != caps:
            mismatch = 1
            self._report_mismatch(caps, got)
        t1 = time.perf_counter()
        self._record_schedule(out, start=start, t0=t0, t1=t1, policy_time=policy_time,
                              vllm_time=vllm_time, info=decision.info, decision=decision,
                              adapter=(budget, mismatch, trimmed))
        return out

    def _refresh_view(self) -> None:
        """The view's waiting and running mirrors, in vLLM's queue order."""
        view, tracked = self.view, self.tracked
        try:
            # C-level map over the queues: this runs over every waiting request.
            view.waiting = list(map(_mirror_of, _queue_iter(self.waiting)))
            if _queue_len(self.kv_holding_waiting):
                view.waiting[:0] = map(_mirror_of, _queue_iter(self.kv_holding_waiting))
            view.running = list(map(_mirror_of, self.running))
            if self._leaving:
                leaving = self._leaving
                view.running = [m for m in view.running if m.req_id not in leaving]
        except AttributeError:  # a request added behind add_request's back: skip it
            view.waiting = [m for v in itertools.chain(self.kv_holding_waiting, self.waiting)
                            if (m := tracked.get(v.request_id)) is not None]
            view.running = [m for v in self.running
                            if (m := tracked.get(v.request_id)) is not None
                            and m.req_id not in self._leaving]
        self._view_stale = False

    def _bad_schedule(self, m: Request, n: int, vid: str | None, caps: dict[str, int]
                      ) -> NoReturn:
        if vid is None:
            self._vreq_of(m, "schedule")  # raises with the message
        raise PolicyDecisionError(
            f"policy {self.accelgen_policy.name!r} scheduled {n} tokens for request {m.req_id} "
            f"({m.num_new_tokens} pending{', twice' if vid in caps else ''})")

    def _vreq_of(self, m: Request, action: str) -> VRequest:
        vid = self._vid_of.get(m.req_id)
        if vid is None:
            raise PolicyDecisionError(f"policy {self.accelgen_policy.name!r} tried to {action} "
                                      f"request {m.req_id}, which the engine is not serving")
        return self._vreqs[vid]

    def _caps_from(self, decision: Decision) -> tuple[dict[str, int], list[VRequest], int, int]:
        """(tokens per vLLM request id, the admitted requests in the decision's order, the
        total tokens, the tokens trimmed to fit ``max_num_batched_tokens``)."""
        caps: dict[str, int] = {}
        wait_order: list[VRequest] = []
        vid_of, vreqs = self._vid_of, self._vreqs
        bs = self.block_size
        running = RequestStatus.RUNNING
        need = 0
        total = 0
        # Runs for every scheduled request every step: plain arithmetic, no helper calls
        # (blocks as in VLLMKVView.blocks_needed, pending tokens as Request.num_new_tokens).
        for m, n in decision.scheduled:
            vid = vid_of.get(m.req_id)
            pending = m.prompt_len + m.num_output_tokens - m.num_computed_tokens
            if vid is None or n <= 0 or n > pending or vid in caps:
                self._bad_schedule(m, n, vid, caps)
            caps[vid] = n
            total += n
            grow = -(-(m.num_computed_tokens + n) // bs) - m.num_blocks
            if grow > 0:
                need += grow
            v = vreqs[vid]
            if v.status != running:
                wait_order.append(v)
        free = self.kv_view.num_free_blocks
        if need > free:
            # The interface contract: a decision must fit the KV after its preemptions; an
            # executor reports a violation instead of repairing it.
            raise PolicyDecisionError(
                f"policy {self.accelgen_policy.name!r} scheduled tokens needing {need} KV blocks "
                f"with {free} free after its preemptions")
        trimmed = 0
        excess = total - self.token_limit
        if excess > 0:
            # An error path: the limit is in the policy's view and its plan should fit it (a
            # policy that ignores it, or one that runs a prompt longer than the limit whole).
            # The engine's buffers hold no more, so the decision's tail is cut, and counted.
            trimmed = excess
            self.trimmed_steps += 1
            if self._trim_warned < 5:
                self._trim_warned += 1
                logger.warning("accelgen: policy %r scheduled %d tokens > the engine's "
                               "max_num_batched_tokens=%d, which its view carries; trimming the "
                               "decision's tail (counted: adapter_trimmed_steps)",
                               self.accelgen_policy.name, total, self.token_limit)
            for m, _ in reversed(decision.scheduled):
                vid = self._vid_of[m.req_id]
                cut = min(excess, caps[vid])
                caps[vid] -= cut
                excess -= cut
                if caps[vid] == 0:
                    del caps[vid]
                    v = self._vreqs[vid]
                    if v in wait_order:
                        wait_order.remove(v)
                if excess == 0:
                    break
            total -= trimmed
        return caps, wait_order, total, trimmed

    def _restore_queues(self, waiting: Any, kv_waiting: Any, selected: list[VRequest]) -> None:
        """Put the original queues back after a step that admitted requests or in which vLLM
        preempted some itself (the temporary queues are not empty)."""
        tmp_waiting, tmp_kv = self.waiting, self.kv_holding_waiting
        self.waiting, self.kv_holding_waiting = waiting, kv_waiting
        # vLLM may still hold the temporary queues; the next step needs fresh empty ones.
        self._admit_queues = (create_request_queue(self.policy),
                              create_request_queue(self.policy))
        chosen = set(selected)
        # Admitted requests leave the queue; the others keep their original place. One pass
        # per queue, by identity (a set): removing them one at a time compares every request
        # ahead of each through vLLM Request's Python-level rich comparison, which cost about
        # 50 us per admission with a few hundred requests waiting.
        admitted = {v for v in selected if v.status == RequestStatus.RUNNING}
        if admitted:
            for q in (kv_waiting, waiting):
                if _queue_len(q):
                    kept = [v for v in _queue_iter(q) if v not in admitted]
                    if len(kept) != _queue_len(q):
                        q.clear()
                        q.extend(kept)
        for tmp, orig in ((tmp_waiting, waiting), (tmp_kv, kv_waiting)):
            # Requests vLLM itself preempted during the call sit in front, as vLLM puts them.
            front = [v for v in tmp if v not in chosen]
            if front:
                orig.extendleft(reversed(front))

    def _reject(self, m: Request, why: str) -> None:
        v = self._vreq_of(m, "reject")
        if v.status == RequestStatus.RUNNING:
            raise PolicyDecisionError(
                f"policy {self.accelgen_policy.name!r} rejected request {m.req_id}, which is "
                "running (only waiting requests can be rejected)")
        v.stop_reason = f"accelgen: rejected by policy {self.accelgen_policy.name}: {why}"
        self.finish_requests(v.request_id, RequestStatus.FINISHED_IGNORED)
        self._pending_outputs.append(v)

    def _report_mismatch(self, caps: dict[str, int], got: dict[str, int]) -> None:
        self.mismatch_steps += 1
        if self._mismatch_warned < 5:
            self._mismatch_warned += 1
            diff = {vid: (n, got.get(vid, 0)) for vid, n in caps.items() if got.get(vid) != n}
            extra = sorted(set(got) - set(caps))
            # vLLM's state of those requests (after this schedule()), to tell why.
            state = {vid: (v.status.name, v.num_computed_tokens, v.num_tokens,
                           v.num_output_placeholders, v.max_tokens)
                     for vid in diff if (v := self.requests.get(vid)) is not None}
            logger.warning("accelgen: vLLM did not schedule the policy's tokens exactly "
                           "(request: (planned, scheduled)) %s%s; vLLM's (status, computed, "
                           "tokens, placeholders, max_tokens): %s", diff,
                           f"; unplanned {extra}" if extra else "", state)
