"""The policy interface: a small view of the serving state in, one iteration's decision out.

The same interface is served by the simulator and by the vLLM V1 scheduler adapter, so every
policy runs unchanged in both (a policy imports neither).

Contract (vLLM V1 vocabulary):
- ``view.waiting``: requests not holding KV (new, or preempted for recompute), in queue order
  (FIFO of arrival; a preempted request is put back at the front, as vLLM does).
- ``view.running``: admitted requests holding KV blocks, in admission order. A running request
  that is not scheduled in an iteration simply keeps its blocks.
- The decision lists ``preempted`` running requests (their blocks are freed first, recompute) and
  then ``scheduled`` (request, num_tokens) pairs. Scheduling a waiting request admits it. The
  blocks needed for ``num_computed_tokens + num_tokens`` must fit after the preemptions; the
  executor raises otherwise (a policy bug, never silently fixed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from accelgen.core.iteration import Pivot

if TYPE_CHECKING:
    from accelgen.core.request import Request
    from accelgen.costmodel.base import CostModel


class KVView(Protocol):
    block_size: int
    num_total_blocks: int
    num_free_blocks: int
    watermark_blocks: int
    num_free_swap_blocks: int

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int: ...
    def free_tokens_for(self, req: Request) -> int: ...
    def can_admit(self, num_blocks: int) -> bool: ...


@dataclass(slots=True)
class SchedulerView:
    now: float
    waiting: list[Request]
    running: list[Request]
    swapped: list[Request]
    kv: KVView
    cost: CostModel
    pivot: Pivot
    max_model_len: int
    # Clairvoyant hooks, present only when the backend grants them (the Oracle).
    true_output_len: dict[int, int] | None = None
    next_arrivals: list[Request] | None = None
    # The engine's limits (None: none binds, as in the simulator): the most tokens one iteration
    # may schedule (vLLM's ``max_num_batched_tokens``, the size of its batch buffers) and the
    # most requests that may run (``max_num_seqs``, counting ``running`` and the admissions of
    # the decision). A decision stays within them; the executor does not repair one that does
    # not (``engine_token_budget``, ``engine_seats``).
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None


def engine_token_budget(view: SchedulerView, budget: int) -> int:
    """``budget`` clamped to the engine's ``max_num_batched_tokens``, where one is set."""
    limit = view.max_num_batched_tokens
    return budget if limit is None or budget <= limit else limit


def engine_seats(view: SchedulerView, max_num_seqs: int) -> int:
    """A policy's ``max_num_seqs`` clamped to the engine's, where one is set."""
    limit = view.max_num_seqs
    return max_num_seqs if limit is None or max_num_seqs <= limit else limit


class InfoRow(MutableMapping[str, float]):
    """A decision's diagnostics as a row: names shared by every decision of one kind (``index``:
    name -> position), values in a list or a 1-D float array (what compiled code fills);
    entries set under other names (the vLLM adapter's) go to a small dict.

    Why not a dict: inside vLLM a step is scheduled right after a forward pass has evicted the
    caches, and building a twenty-key dict there took longer than the compiled AccelGen decision
    itself; the log needs the dict only when it is written (``as_dict``)."""

    __slots__ = ("_extra", "_index", "_values")

    def __init__(self, index: dict[str, int], values: Any) -> None:
        self._index = index
        self._values = values
        self._extra: dict[str, float] | None = None

    def __getitem__(self, key: str) -> float:
        i = self._index.get(key)
        if i is not None:
            return float(self._values[i])
        if self._extra is not None:
            return self._extra[key]
        raise KeyError(key)

    def __setitem__(self, key: str, value: float) -> None:
        i = self._index.get(key)
        if i is not None:
            self._values[i] = value
        elif self._extra is None:
            self._extra = {key: value}
        else:
            self._extra[key] = value

    def __delitem__(self, key: str) -> None:
        if self._extra is None or key not in self._extra:
            raise KeyError(f"{key!r}: only entries added after the decision can be removed")
        del self._extra[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._index
        if self._extra is not None:
            yield from self._extra

    def __len__(self) -> int:
        return len(self._index) + (len(self._extra) if self._extra is not None else 0)

    def as_dict(self) -> dict[str, float]:
        values = self._values
        d = dict(zip(self._index, values if isinstance(values, list) else values.tolist(),
                     strict=False))
        if self._extra is not None:
            d.update(self._extra)
        return d


@dataclass(slots=True)
class Decision:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[Request] = field(default_factory=list)  # running -> host memory
    swap_in: list[Request] = field(default_factory=list)  # host memory -> running (not scheduled yet)
    # (request, tokens): hold KV blocks for that many tokens up front, before ``scheduled`` is
    # allocated (Orca's max-length reservation). Applied after preemptions and swaps.
    reserve: list[tuple[Request, int]] = field(default_factory=list)
    # Waiting requests the policy gives up on for good (e.g. a prompt that can never fit its KV
    # rule), with the reason recorded; never used to shed load.
    rejected: list[tuple[Request, str]] = field(default_factory=list)
    # Diagnostics copied into the iteration log (token_budget, slo_min, n_urgent, ...); a new
    # mapping per decision (the vLLM adapter adds its own entries to it): a dict, or an InfoRow.
    info: MutableMapping[str, float] = field(default_factory=dict)
    # When the policy deliberately schedules nothing, the earliest time it wants to be asked again.
    wake_at: float | None = None

    @staticmethod
    def of_batch(scheduled: list[tuple[Request, int]], preempted: list[Request],
                 info_index: dict[str, int], info_values: Any) -> Decision:
        """``Decision(scheduled=..., preempted=..., info=InfoRow(info_index, info_values))``,
        built without the generated ``__init__``s. Why: in vLLM a step is scheduled right after a
        forward pass has evicted the caches, and there the two keyword-parsing ``__init__``s with
        their default factories took longer than the compiled decision they wrap
        (``tests/test_accelgen_decision.py`` checks that every field is set)."""
        d = _new(Decision)
        d.scheduled = scheduled
        d.preempted = preempted
        d.swap_out = []
        d.swap_in = []
        d.reserve = []
        d.rejected = []
        info = _new(InfoRow)
        info._index = info_index
        info._values = info_values
        info._extra = None
        d.info = info
        d.wake_at = None
        return d


_new = object.__new__


@dataclass(frozen=True, slots=True)
class DecodeSteps:
    """A run of decode steps of a decision's batch the backend will take while the decision
    stays the same (``Policy.decide_decode_run``): per step, its start (``clock``), its latency
    and the free KV blocks before the step's new blocks are given; per request of the batch, in
    its order, the blocks it holds at the run's start and the run's first step that gives it
    one more (``first_need``; then every ``block_size`` steps)."""

    clock: Any  # float64 array, a step each
    latencies: Any  # float64 array, a step each
    free_blocks: Any  # int64 array, a step each
    blocks: Any  # int64 array, a request each
    first_need: Any  # int64 array, a request each
    block_size: int


@dataclass(slots=True)
class DecodeRunDecisions:
    """What ``Policy.decide_decode_run`` decided: the first ``len(info_values)`` steps'
    decisions are the decision itself, their diagnostics the rows of ``info_values`` under the
    names ``info_index`` (as ``InfoRow``s; the decision's ``info`` is the last's);
    ``following`` the next step's decision where it was made (None: that step is not asked
    yet)."""

    info_index: dict[str, int]
    info_values: Any  # float64 array, a row per step
    following: Decision | None


class PolicyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Policy(ABC):
    """Base class of all scheduling policies."""

    name: ClassVar[str] = "policy"
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    # Whether the backend should pass clairvoyant information (true output lengths, arrivals).
    clairvoyant: ClassVar[bool] = False

    def __init__(self, params: PolicyParams | None = None, **overrides: Any) -> None:
        base = params.model_dump() if params is not None else {}
        base.update(overrides)
        self.params = self.Params(**base)

    @abstractmethod
    def schedule(self, view: SchedulerView) -> Decision:
        """Decide the next iteration."""

    def largest_budget(self, pivot: Pivot) -> int | None:
        """The most tokens one of this policy's decisions can schedule with ``pivot`` and no
        engine limit, where it has such a bound (None: it has none, e.g. whole prompts). A
        backend sizes the engine's ``max_num_batched_tokens`` from it when the user did not."""
        return None

    def on_arrival(self, req: Request, now: float) -> None:  # noqa: B027 - optional hook
        """A new request entered the waiting queue."""

    def repeats(self, view: SchedulerView, decision: Decision) -> bool:
        """Whether ``decision``, just run, is again this policy's decision at every following
        iteration for as long as nothing changes but the decode progress of its batch: no
        arrival, no request finishing, no request of the batch needing a new KV block, and
        ``on_step_end`` changing nothing the decision reads. The simulator asks only after an
        iteration of decode steps alone (one token for every request of the batch) that did
        nothing else (no rejection, preemption, swap or reservation), checks those events
        itself, and then runs the same decision again without calling ``schedule`` until one of
        them happens; the results are the ones asking every time gives. Default: False (ask at
        every iteration)."""
        return False

    def after_decodes_while_blocks_fit(self) -> bool:
        """Whether this policy's ``schedule_after_decodes`` returns ``decision`` itself, with
        nothing else done (no state change, ``info`` as it is), exactly when the KV blocks that
        its decode steps need for their next token fit in the free ones
        (``accelgen.policies.common.decode_blocks_fit``). The simulator then checks the blocks
        itself and calls ``schedule_after_decodes`` only when they do not fit. Asked once, when
        a simulation starts. Default: False."""
        return False

    def after_decodes_reads_blocks_only(self, decision: Decision) -> bool:
        """Whether the next ``schedule_after_decodes(view, decision, ...)``, should it return
        ``decision`` itself, reads of the batch's requests only their KV blocks
        (``num_blocks``) and of the view only ``now``, the free blocks and what no decode step
        changes. The simulator may then ask it at every iteration of a run of decode steps and
        take in the requests' new tokens and times once, after the run
        (``Simulator._asking_decode_run``). Asked before every such call. Default: False."""
        return False

    def decides_decode_run(self, decision: Decision) -> bool:
        """Whether ``decide_decode_run`` would decide a run of ``decision``'s decode steps now
        (asked before the backend lays out the run; it may still decline). Default: False."""
        return False

    def decide_decode_run(self, view: SchedulerView, decision: Decision, latency: float,
                          run: DecodeSteps) -> DecodeRunDecisions | None:
        """``schedule_after_decodes`` asked before each step of ``run`` in one call, where
        ``decides_decode_run(decision)`` has just held and ``view.now`` is the run's first
        step (``latency``: the step's before it, as the first call would pass it; each later
        call's is the run's step before): for as long as the decision stays ``decision``
        itself, then the step where it does not (``DecodeRunDecisions``); the same results as
        the calls one by one. None where the policy does not decide this run (the backend asks
        it step by step; the policy has taken in nothing). Default: None."""
        return None

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        """``on_step_end`` and then ``schedule`` in one call, which a policy may make cheaper.
        A backend calls it only after an iteration that ran ``decision`` as decode steps alone
        (one token for every request of its batch; a request may have been given a KV block
        for it) and changed nothing else: no arrival, no request ending, no rejection,
        preemption, swap or reservation; ``view.now`` is already the new decision's time (the
        iteration's end). Return
        ``decision`` itself, its ``info`` replaced, exactly when the new decision schedules the
        same batch and nothing else; the backend then runs it again as it is. The results must
        be the ones of the two calls. (The simulator calls it only for a policy that overrides
        it.)"""
        self.on_step_end(view, decision, latency)
        return self.schedule(view)

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:  # noqa: B027
        """The iteration decided by ``decision`` finished after ``latency`` seconds."""

    def on_finish(self, req: Request, now: float) -> None:  # noqa: B027
        """A request finished or was rejected."""

    def live_requests(self) -> int | None:
        """How many requests the policy's own state holds (None: it keeps none of its own). A
        backend reads it after a drain (``vllm_integration.shutdown_summary``), where it must
        be 0: a request the policy was never told had ended would stay in its state."""
        return None
