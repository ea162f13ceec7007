"""The arrays the compiled ``decide`` works in, kept between decisions so that a decision allocates
nothing (``docs/accelgen.md``, *How it runs*), and the loop that asks the cost model what ``decide``
cannot compute itself. Nothing here imports numba."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.base import CostModel
from accelgen.policies.accelgen.state import (
    BUDGET_TIME,
    CANDIDATE,
    DECODE_RUN,
    DORMANT_BLOCK,
    DORMANT_MINIMA,
    INFO_INDEX,
    LISTS,
    LOOP_STATE,
    STATE,
    DecisionArrays,
)

if TYPE_CHECKING:
    from accelgen.core.policy import DecodeSteps, SchedulerView
    from accelgen.costmodel.linear import LinearTerms
    from accelgen.policies.accelgen.closed_loop import ClosedLoop
    from accelgen.policies.accelgen.policy import AccelGenParams
    from accelgen.policies.accelgen.table import RequestTable


class DecodeRunStop(NamedTuple):
    """Where a decode run's decisions stopped (``Workspace.decode_run``): the step after the
    last decided the same, ``stop`` (RUN_ALL, RUN_DECIDED, RUN_ASKS, RUN_OBSERVES), the budget
    the decision waits on (RUN_ASKS), the token budget and ERA holder (a slot) of the last step
    decided the same."""

    end: int
    stop: int
    need: int
    budget: int
    era_owner: int


_PLANNED_AT = INFO_INDEX["t_planned"]
# The closed loop's parameters (``Workspace.set_scales``), in its order.
SCALES = ("time_scale", "tbt_shrink", "err_median", "err_sd", "err_z", "risk")


def _records(dtype: np.dtype, n: int) -> np.recarray:
    return np.zeros(n, dtype=dtype).view(np.recarray)


def largest_budget(p: AccelGenParams, s_pf: int, limit: int | None = None) -> int:
    """The token budget's upper clamp (the ``cap``): S_pf x ``budget_cap``, at most the engine's
    ``max_num_batched_tokens`` (``limit``) where one is set."""
    cap = max(1, int(s_pf * p.budget_cap))
    return cap if limit is None or cap <= limit else limit


class Workspace:
    """One policy's decision arrays, sized for its table. The policy reads the outcome, the ask and the
    diagnostics through plain array views of the state record (a record's attribute access from Python
    costs a microsecond or two), the batch through rows of the lists."""

    def __init__(self, table: RequestTable) -> None:
        state = np.zeros(1, STATE)
        self._step, self._ask = state["step"], state["ask"]
        self._outcome = self._part(state, "outcome", np.int64)
        self._oracle = self._part(state, "oracle", np.int64)
        self.info_values = self._part(state, "info", np.float64)
        # (the closed loop's parameters, set every iteration under noise: one plain view of
        # the six, which lie side by side in the record)
        self._scales = self._params(state, SCALES)
        times = _records(BUDGET_TIME, 1)
        self._full_batch = times.view(np.ndarray)["full_batch"]
        self._run_ctl = _records(DECODE_RUN, 1)  # (``decode_run``'s batch and where it stopped)
        self._run_fields = self._run_ctl.view(np.ndarray)
        # (the closed loop's state while a decode run takes in its steps; its window's scratch)
        self._loop = _records(LOOP_STATE, 1)
        self._loop_fields = self._loop.view(np.ndarray)
        self._scratch = np.zeros(1)
        self.arrays = DecisionArrays(table.rows, _records(CANDIDATE, 0), np.zeros((len(LISTS), 0), np.int64),
                                     state.view(np.recarray), times, table.active, table.dormant_queue,
                                     _records(DORMANT_MINIMA, 0), table.gone, np.zeros(1, np.int64))
        self.follow(table)  # (sizes the per-request arrays)
        self.configured: tuple[object, ...] = ()  # (cost model, pivot, KV, token limit) of ``configure``
        self.cap = 0
        self.exact_kv = False
        self._terms: LinearTerms | None = None
        # ``prices_batches``, kept beside the parameters it is read from: the closed loop asks it
        # at every decode step, and a field read through the record array costs microseconds.
        self._prices_batches = False
        # ``Params.time_scale``, ``tbt_shrink``, ``err_median``, ``err_sd``, ``err_z``, ``risk``
        self.scales: tuple[float, ...] = (1.0, 1.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def time_scale(self) -> float:
        return self.scales[0]

    @property
    def tbt_shrink(self) -> float:
        return self.scales[1]

    def set_scales(self, time_scale: float, tbt_shrink: float, err_median: float = 0.0,
                   err_sd: float = 0.0, err_z: float = 0.0, risk: float = 0.0) -> None:
        """From the next decision on, every latency the decision predicts x ``time_scale``, every
        online decode planned within its TBT SLO x ``tbt_shrink``; the closed loop's fit of the log
        errors (median, spread, a deadline's quantile) and its risk (``rank.borrow``)."""
        scales = (time_scale, tbt_shrink, err_median, err_sd, err_z, risk)
        if scales != self.scales:
            self.scales = scales
            self._scales[:] = scales

    @staticmethod
    def _params(state: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        """A float64 view of consecutive float64 fields ``names`` of ``state``'s parameters."""
        params, offset = STATE.fields["params"][:2]  # type: ignore[index]
        at = [offset + params.fields[name][1] for name in names]  # type: ignore[index]
        if at != list(range(at[0], at[0] + 8 * len(names), 8)) or any(
                params.fields[name][0] != np.float64 for name in names):  # type: ignore[index]
            raise TypeError(f"{names}: not consecutive float64 fields of the parameters")
        return state.view(np.uint8)[at[0]:at[0] + 8 * len(names)].view(np.float64)

    @staticmethod
    def _part(state: np.ndarray, name: str, dtype: type) -> np.ndarray:
        sub, offset = STATE.fields[name][:2]  # type: ignore[index]
        return state.view(np.uint8)[offset:offset + sub.itemsize].view(dtype)

    def configure(self, p: AccelGenParams, view: SchedulerView, exact_kv: bool) -> bool:
        """The fixed inputs, set again only for a new cost model, pivot, KV or engine token limit (returns
        whether it did):
        parameters, KV geometry, the budget's clamps, and what the cost model offers compiled code (linear
        terms, followed at every call; roofline or calibrated constants; else forward times of the budgets
        0..cap + 1, the rest asked)."""
        cost, pivot, kv, limit = view.cost, view.pivot, view.kv, view.max_num_batched_tokens
        key = self.configured
        if key and key[0] is cost and key[1] is pivot and key[2] is kv and key[3] == limit:
            self.use_cost(cost)
            return False
        self.configured = (cost, pivot, kv, limit)
        # (the engine's batch limit is the cap's upper clamp: a budget never exceeds it)
        self.cap = cap = largest_budget(p, pivot.s_pf, limit)
        par = self.arrays.state[0].params
        par.order, par.chunk, par.batch = p.order, p.chunk, p.batch
        par.gamma, par.spill_groups = p.gamma, p.spill_groups
        par.budget_model, par.budget_batch = p.budget_rule == "model", p.budget_rule == "batch"
        par.min_budget, par.cap = min(max(1, p.min_budget or kv.block_size), cap), cap
        par.s_pf, par.t_pf = pivot.s_pf, pivot.t_pf
        par.era, par.era_whole_request = p.era, p.era_scope == "request"
        par.long_threshold = p.long_prompt_threshold
        par.late_is_urgent, par.lost_last = p.late_is_urgent, p.lost_last
        par.growth = kv.block_size if p.kv_growth_reserve is None else p.kv_growth_reserve
        par.block_size, par.total_blocks = kv.block_size, kv.num_total_blocks
        par.exact_kv = self.exact_kv = exact_kv
        self._terms = None
        self.use_cost(cost)
        roofline = cost.roofline_terms()
        par.cost_roofline = roofline is not None
        if roofline is not None:
            self.arrays.state.view(np.ndarray)["roofline"][0] = tuple(roofline)
        calibrated = cost.calibrated_consts()
        par.cost_calibrated = calibrated is not None
        if calibrated is not None:
            self.arrays.state.view(np.ndarray)["calibrated"][0] = tuple(calibrated)
        (par.time_scale, par.tbt_shrink, par.err_median, par.err_sd, par.err_z,
         par.risk) = self.scales
        times = _records(BUDGET_TIME, cap + 2)
        self._full_batch = times.view(np.ndarray)["full_batch"]
        self._full_batch[:] = math.nan
        if not par.cost_linear:
            times.forward = [cost.forward_time(b) for b in range(cap + 2)]
        self._note_pricing(par)
        self.arrays = self.arrays._replace(times=times, finals=np.zeros(kv.num_total_blocks + 3, np.int64))
        return True

    @property
    def prices_batches(self) -> bool:
        """Whether the decision evaluates the cost model itself (linear, roofline or calibrated
        constants), so it prices every batch it forms (``info.t_planned``)."""
        return self._prices_batches

    def _note_pricing(self, par: Any) -> None:
        """``prices_batches`` from the parameters' cost fields, after one of them was set."""
        self._prices_batches = bool(par.cost_linear or par.cost_roofline or par.cost_calibrated)

    def use_cost(self, cost: CostModel) -> None:
        """Follow the cost model's linear terms (an online model's refit replaces them)."""
        terms = cost.linear_terms()
        if terms is self._terms:
            return
        self._terms = terms
        par = self.arrays.state[0].params
        par.cost_linear = terms is not None
        if terms is not None:
            par.base_s, par.per_token_s, par.per_ctx_s, par.per_attn_s = terms
        self._note_pricing(par)

    def follow(self, table: RequestTable) -> None:
        """Use the table's current arrays (reallocated when it grows), the per-request ones as large."""
        n = table.capacity
        if n > len(self.arrays.cand):
            lists = np.zeros((len(LISTS), n), np.int64)
            self.arrays = self.arrays._replace(cand=_records(CANDIDATE, n), lists=lists,
                                               minima=_records(DORMANT_MINIMA, 2 * n // DORMANT_BLOCK + 1))
            self.slots, self.tokens, self.preempted, self.cuts = (lists[LISTS.index(name)] for name in
                                                                  ("slots", "tokens", "preempted", "cuts"))
        self.arrays = self.arrays._replace(requests=table.rows, active=table.active,
                                           dormant=table.dormant_queue, gone=table.gone)

    def run(self, decide: Any, cost: CostModel, step: tuple[Any, ...]) -> list[int]:
        """Run ``decide`` on ``step`` (``Step``'s fields, in order) to completion (``complete``).
        Returns the ``Outcome``'s fields, in order."""
        if self.exact_kv:
            self._oracle.fill(0)  # the Oracle's counters accumulate over its passes
        self._step[0] = step
        return self.complete(decide, cost, decide(self.arrays))

    def complete(self, decide: Any, cost: CostModel, need: int) -> list[int]:
        """A decision that returned ``need``, to completion: while it returns a token budget,
        give it the full batch's latency there (``ask``) and run it again. Returns the
        ``Outcome``'s fields, in order."""
        arrays = self.arrays
        asked = []
        while need >= 0:
            self._full_batch[need] = cost.iteration_time(BatchShape(*self._ask[0].item()))
            asked.append(need)
            need = decide(arrays)
        if asked:
            self._full_batch[asked] = math.nan
        return self.outcome()

    def outcome(self) -> list[int]:
        """The last decision's ``Outcome`` fields, in order."""
        return self._outcome.tolist()  # type: ignore[no-any-return]

    def decode_run(self, kernel: Any, step: tuple[Any, ...], run: DecodeSteps,
                   steps: tuple[int, int], exact_only: bool, infos: np.ndarray,
                   observing: ClosedLoop | None = None) -> DecodeRunStop:
        """Run ``kernel`` (``decode_run.decode_run``) on steps ``steps`` (first, last) of
        ``run``, the first of them with the inputs ``step`` (``exact_only``: the closed loop at
        rest; ``observing``: the closed loop, which takes in each step before the next one's
        decision, its state and the plan's scales then as the run left them), the diagnostics of
        the steps decided the same into their rows of ``infos``: the step after them and where
        it stopped."""
        ctl = self._run_ctl
        # (``DecodeRun``'s fields in order, one assignment: a record's attribute costs a
        # microsecond or two from Python)
        self._run_fields[0] = (len(run.blocks), run.block_size, *steps, exact_only,
                               observing is not None, _PLANNED_AT, 0, 0, 0, 0)
        self._step[0] = step
        errors = scratch = self._scratch
        if observing is not None:
            errors = observing.errors
            if len(scratch) != len(errors):
                scratch = self._scratch = np.zeros(len(errors))
            self._loop_fields[0] = observing.state()
        end = kernel(self.arrays, run.clock, run.latencies, run.free_blocks, run.blocks,
                     run.first_need, ctl, self.info_values, infos, self._loop, errors, scratch)
        if observing is not None:
            observing.set_state(self._loop_fields[0].item())
            self.scales = tuple(self._scales.tolist())  # (as the kernel set them)
        return DecodeRunStop(end, *self._run_fields[0].item()[-4:])
