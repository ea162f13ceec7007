"""AccelGen: SLO-guaranteed dynamic chunking, slack ordering and multi-resource batching (SPEC
section 4, paper sections 4.2-4.4). The policy keeps what lives between decisions (the table of live
requests, L_c, the ERA holder, the last budget); the decision is ``decide.decide``, compiled, the
same in the simulator and in vLLM; every variant is a flag or an input of it
(``docs/accelgen.md``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from accelgen.core.iteration import BatchShape, Pivot
from accelgen.core.policy import (
    Decision,
    DecodeRunDecisions,
    DecodeSteps,
    InfoRow,
    Policy,
    PolicyParams,
    SchedulerView,
)
from accelgen.core.request import Request
from accelgen.policies.accelgen.build import load
from accelgen.policies.accelgen.closed_loop import ClosedLoop
from accelgen.policies.accelgen.state import (
    INFO_INDEX,
    NO_ADMISSION_CAP,
    NO_SLOT,
    OUTCOME,
    RUN_ALL,
    RUN_ASKS,
    RUN_DECIDED,
    RUN_OBSERVES,
)
from accelgen.policies.accelgen.table import RequestTable
from accelgen.policies.accelgen.workspace import Workspace, largest_budget


class AccelGenParams(PolicyParams):
    # Each explained in docs/accelgen.md, *Parameters*.
    order: bool = True  # the three methods (ablation switches): slack ordering + urgency,
    chunk: bool = True  # dynamic chunking,
    batch: bool = True  # Euclidean multi-resource selection
    gamma: NonNegativeFloat = 0.75  # s: head group = slack within s_1 + gamma (paper)
    spill_groups: bool = True  # continue with the next group while budget is left
    budget_rule: Literal["batch", "paper", "model"] = "batch"
    min_budget: PositiveInt | None = None  # tokens; default one KV block
    budget_cap: PositiveFloat = 1.0  # S_b <= S_pf x budget_cap
    era: bool = True
    era_scope: Literal["prefill", "request"] = "prefill"  # SPEC 4.2, or the paper's wording
    long_prompt_threshold: PositiveInt = 4096  # tokens
    chunk_mean_weight: float = Field(0.05, gt=0.0, le=1.0)  # weight of a new chunk in L_c
    late_is_urgent: bool = False  # late prompts urgent too (late decodes always are)
    lost_last: bool = True  # decision 11
    preempt_prob: float = Field(0.0, ge=0.0, le=1.0)  # P and P_max of the offline JCT plan
    preempt_max_s: NonNegativeFloat = 0.0
    # running-request cap (None: KV and the engine's max_num_seqs, where set, are the only caps)
    max_num_seqs: PositiveInt | None = None
    kv_growth_reserve: NonNegativeInt | None = None  # tokens promised for growth; default a block
    # The closed loop (docs/accelgen.md, *Closed loop*; system ``accelgen-closed``): measured
    # iterations correct the cost model and set a margin, the error quantile at the attainment aimed for.
    closed_loop: bool = False
    attainment_target: float = Field(0.9, gt=0.0, lt=1.0)
    correction_weight: float = Field(0.05, gt=0.0, le=1.0)  # a new iteration's weight in the correction
    error_window: PositiveInt = 256  # iterations whose errors set the margin


class AccelGenPolicy(Policy):
    name = "accelgen"
    Params = AccelGenParams
    params: AccelGenParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._table = RequestTable(kernels=load())
        # Lost prompts wait last in arrival order (lost_last) and never turn urgent again: the
        # table keeps the waiting ones apart (dormant), the decision passes them over in blocks.
        p = self.params
        self._table.dormancy = p.order and p.lost_last and not p.late_is_urgent
        self._ws = Workspace(self._table)
        self._prev_budget = 0
        self._chunk_mean = math.nan  # L_c, starts at S_pf (the first pivot)
        self._era_owner: int | None = None  # req_id of the long prompt holding ERA
        self._pending_cuts: list[int] = []
        self._info_names = INFO_INDEX  # (the diagnostics' positions in the workspace's record)
        self._exact = False  # the decision plans KV with the true output lengths (the Oracle)
        # The last decision, while its batch is still the workspace's output: the one
        # ``schedule_after_decodes`` takes in and may hand back again.
        self._last: Decision | None = None
        # Tests set this: a check of the table against the request objects, every decision.
        self.verify: Callable[[RequestTable], list[str]] | None = None
        # The closed loop: the last decision's predicted latency (uncorrected), taken in with the
        # latency its iteration took (``on_step_end``, ``schedule_after_decodes``).
        self.loop = (ClosedLoop(p.attainment_target, p.correction_weight, p.error_window)
                     if p.closed_loop else None)
        self._planned = math.nan
        # The backend reports measured iterations itself (``observe_step``; the vLLM plugin under
        # async scheduling, whose ``on_step_end`` latency is a prediction).
        self.measured_by_backend = False

    # -- hooks ---------------------------------------------------------------------------------
    def largest_budget(self, pivot: Pivot) -> int:
        return largest_budget(self.params, pivot.s_pf)

    def on_arrival(self, req: Request, now: float) -> None:
        self._table.add(req)
        self._last = None

    def on_finish(self, req: Request, now: float) -> None:
        if self.loop is not None and req.online:
            self.loop.finished(req.num_output_tokens)
        self._table.remove(req.req_id)
        self._last = None

    def live_requests(self) -> int:
        return self._table.n

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:
        if self.loop is not None and not self.measured_by_backend:
            self._measured(latency)
        self._table.refresh([r for r, _ in decision.scheduled] + decision.preempted)
        w = self.params.chunk_mean_weight
        for c in self._pending_cuts:
            self._chunk_mean += w * (c - self._chunk_mean)
        self._pending_cuts = []

    def after_decodes_reads_blocks_only(self, decision: Decision) -> bool:
        # (the table takes in a decode step by itself, re-reading the blocks alone; the other
        # paths refresh from the request objects; the closed loop prices the batch from them
        # where the decision does not price it itself)
        return (decision is self._last and not self._pending_cuts and self.verify is None
                and (self.loop is None or self._ws.prices_batches))

    def schedule_after_decodes(self, view: SchedulerView, decision: Decision,
                               latency: float) -> Decision:
        # The step taken in from the table itself (its batch, one token more each), not read
        # back from the request objects; the decision as ``schedule`` makes it; and, when it is
        # the same batch, ``decision`` again rather than a new one.
        if decision is not self._last or self._pending_cuts or self.verify:
            return super().schedule_after_decodes(view, decision, latency)
        if self.loop is not None and not self.measured_by_backend:
            self._measured(latency)
        self._table.advance_decodes(decision.scheduled, self._ws.slots, view.now)
        return self._schedule(view, decision)

    def observe_step(self, predicted: float, measured: float) -> None:
        """The closed loop takes in a step the backend measured: the cost model's latency of its
        batch and what it took (no effect in the open loop)."""
        if self.loop is not None and self.loop.observe(predicted, measured):
            self._ws.set_scales(*self.loop.scales)

    def fix_decode_margin(self, margin: float) -> None:
        """Plan every online decode within its TBT SLO / (1 + ``margin``) from now on, as the
        closed loop does under noise, but fixed and with nothing learnt: what that margin costs
        where no iteration is noisy (``scripts/capacity_probe.py --decode-margin``). Only for a
        policy without the closed loop, which would set its own."""
        if self.loop is not None:
            raise ValueError("fix_decode_margin: the closed loop sets its own margin")
        if not margin >= 0.0:
            raise ValueError(f"fix_decode_margin: margin must be >= 0, got {margin!r}")
        self._ws.set_scales(1.0, 1.0 / (1.0 + margin))

    def _measured(self, latency: float) -> None:
        """The closed loop takes in the iteration of the last decision (it took ``latency``)."""
        loop = self.loop
        assert loop is not None
        if loop.observe(self._planned, latency):
            self._ws.set_scales(*loop.scales)
        self._planned = math.nan

    # -- decision ------------------------------------------------------------------------------
    def schedule(self, view: SchedulerView) -> Decision:
        return self._schedule(view, None)

    def _schedule(self, view: SchedulerView, last: Decision | None) -> Decision:
        out = self._run(view)
        if out is None:
            self._last = None
            self._planned = math.nan
            return Decision(info={"token_budget": float(self._prev_budget), "n_candidates": 0.0})
        return self._decision(out, last, view)

    def explain(self, view: SchedulerView) -> dict[int, dict[str, float]]:
        """Per request (by id): the next decision's own columns after its plan (slack, urgency,
        per-iteration SLO, N_ck, counted, deadline, lost) with T_max and the token budget. Read-only."""
        self._last = None  # (the workspace's output is the plan's now)
        if self._run(view, plan_only=True) is None:
            return {}
        t, arrays, led = self._table, self._ws.arrays, self._ws.arrays.state[0].ledger
        c, t_max, budget = arrays.cand.view(np.ndarray), float(led.t_max), float(led.budget)
        cols = ("slack", "urgent", "slo_iter", "n_chunks", "counted", "lost")
        return {int(t.req_id[s]): {**{k: float(c[k][s]) for k in cols}, "deadline": float(t.deadline[s]),
                                   "t_max": t_max, "token_budget": budget} for s in range(t.n)}

    def _run(self, view: SchedulerView, plan_only: bool = False) -> list[int] | None:
        """One decision (None without requests)."""
        step = self._inputs(view, plan_only)
        if step is None:
            return None
        t = self._table
        out = self._ws.run(load().decide, view.cost, step)
        if t.dirty_hi or t.n_gone or t.reindex:
            t.seen()
        return out

    def _inputs(self, view: SchedulerView, plan_only: bool = False) -> tuple[Any, ...] | None:
        """A decision's inputs (``Step``'s fields, in order; None without requests), after what
        it reads besides the view: the table in sync, the workspace configured for the cost
        model, pivot and KV, L_c, the JCT plans still to make."""
        t, ws, p = self._table, self._ws, self.params
        # (the usual case checked inline: this runs every step, and in vLLM right after a
        # forward pass, when every call costs cache misses)
        if len(view.waiting) + len(view.running) != t.n or self.verify:
            self._sync(view)
        if ws.arrays.requests is not t.rows:  # the table grew (and asks for a reindex itself)
            ws.follow(t)
        if ws.configure(p, view, self._exact):  # a new cost model, pivot or KV
            if math.isnan(self._chunk_mean):  # the first: L_c starts at S_pf, the budget at the cap
                self._chunk_mean, self._prev_budget = float(view.pivot.s_pf), ws.cap
            self._prev_budget = min(self._prev_budget, ws.cap)  # (an online refit keeps it)
            t.reindex = True
        if t.dormancy:
            t.sweep(view.now)
        if t.num_unplanned:
            t.plan_offline(self._chunk_mean, view.cost.forward_time(self._prev_budget),
                           p.preempt_prob * p.preempt_max_s)
        if t.n == 0:
            return None
        owner = self._era_owner
        seats = p.max_num_seqs
        if view.max_num_seqs is not None and (seats is None or view.max_num_seqs < seats):
            seats = view.max_num_seqs  # (the engine's own running-request limit)
        admissions = (NO_ADMISSION_CAP if seats is None else seats - int(t.running[: t.n].sum()))
        return (t.n, view.now, self._chunk_mean,
                t.slot_of.get(owner, NO_SLOT) if owner is not None else NO_SLOT, self._prev_budget,
                view.kv.num_free_blocks, admissions, plan_only, t.n_active, t.n_dormant,
                t.dormant_lo, t.dirty_lo, t.dirty_hi, t.n_gone, t.reindex)

    def decides_decode_run(self, decision: Decision) -> bool:
        # The compiled run (``decode_run.decode_run``) is ``schedule_after_decodes``' path step by
        # step, while nothing but the batch's rows changes between its steps: no waiting
        # request's deadline passes (the table's sweep, run between the run's parts), no row of
        # the batch is dormant (no rows to re-watch), no JCT plan to make, and the closed loop,
        # if any, takes in the steps' latencies as they come (not a backend's own measurements).
        t, loop = self._table, self.loop
        return (self.after_decodes_reads_blocks_only(decision) and not t.num_unplanned
                and (loop is None or not self.measured_by_backend)
                and not (t.dormancy and t.dormant[self._ws.slots[:len(decision.scheduled)]].any()))

    def decide_decode_run(self, view: SchedulerView, decision: Decision, latency: float,
                          run: DecodeSteps) -> DecodeRunDecisions | None:
        # (asked only where ``decides_decode_run`` just said it would take the run)
        t, ws, loop = self._table, self._ws, self.loop
        assert len(run.blocks) == len(decision.scheduled)
        if loop is not None:
            self._measured(latency)  # (the step before the run; it may set the plan's scales)
        # At rest (exact predictions) the loop takes in the run's steps after it, in one call, and
        # the run stops before a step whose prediction was not exact; otherwise the run takes
        # them in as it goes (``loop_step.take_in``).
        at_rest = loop is None or loop.at_rest()
        observing = None if at_rest else loop
        clock = run.clock
        total = len(clock)
        kernels = load()
        infos = np.empty((total, len(ws.info_values)))
        done = 0
        while True:
            # The steps up to the next that finds a waiting request's deadline passed: the
            # table's sweep before that step's decision, here (``_inputs``), as the step's own
            # call would make it (nothing it reads changes with the batch's rows).
            view.now = float(clock[done])
            step = self._inputs(view)
            assert step is not None  # (the batch's requests are live)
            last = total
            sweep_at = t.next_sweep()
            if sweep_at < clock[total - 1]:
                last = max(done + 1, int(np.searchsorted(clock[:total], sweep_at, side="right")))
            stop = ws.decode_run(kernels.decode_run, step, run, (done, last),
                                 loop is not None and at_rest, infos, observing)
            if t.dirty_hi or t.n_gone or t.reindex:
                t.seen()
            if stop.end > done:
                self._prev_budget = stop.budget
                self._era_owner = (int(t.req_id[stop.era_owner]) if stop.era_owner != NO_SLOT
                                   else None)
            done = stop.end
            if stop.stop != RUN_ALL or done == total:
                break
        if done:
            self._planned = float(infos[done - 1, _T_PLANNED])
            decision.info = InfoRow(self._info_names, infos[done - 1])
        if loop is not None and at_rest and done:
            # (the steps taken in before the run's later decisions, and before the next step's
            # where the run decided it)
            loop.observe_exact(done - (stop.stop in (RUN_ALL, RUN_OBSERVES)))
        following = None
        if stop.stop == RUN_DECIDED:
            following = self._decision(ws.outcome(), decision, view)
        elif stop.stop == RUN_ASKS:
            following = self._decision(ws.complete(kernels.decide, view.cost, stop.need),
                                       decision, view)
        return DecodeRunDecisions(self._info_names, infos[:done], following)

    def _sync(self, view: SchedulerView) -> None:
        """Adopt requests the hooks did not announce (e.g. an adapter that missed a hook)."""
        t = self._table
        if len(view.waiting) + len(view.running) != t.n:
            t.rebuild([*view.waiting, *view.running])
        if self.verify:
            bad = self.verify(t)
            if bad:
                raise AssertionError("AccelGen state out of sync: " + "; ".join(bad[:5]))

    def _decision(self, out: list[int], last: Decision | None, view: SchedulerView) -> Decision:
        """The decision in the workspace; keeps its ERA owner, cut chunks and budget. ``last`` (the previous
        decision, its batch run since as decode steps alone) itself if the batch is the same and nothing
        else."""
        t, ws = self._table, self._ws
        ns, npre, n_cut, budget, era_owner, same_batch = out  # (``Outcome``'s fields, in order)
        self._era_owner = int(t.req_id[era_owner]) if era_owner != NO_SLOT else None
        self._pending_cuts = ws.cuts[:n_cut].tolist() if n_cut else []
        self._prev_budget = budget
        # (the diagnostics as one array copy, wrapped as an InfoRow: a dict would be 21 float
        # objects per step, and the log takes its fast path only for an InfoRow of known names)
        info = ws.info_values.copy()
        self._planned = float(info[_T_PLANNED])
        if last is not None and same_batch:
            last.info = InfoRow(self._info_names, info)
            if self._planned != self._planned and self.loop is not None:
                self._planned = _price(view, last.scheduled)
            return last
        objs = t.objs
        batch = list(zip(map(objs.__getitem__, ws.slots[:ns].tolist()), ws.tokens[:ns].tolist(),
                         strict=True))
        if npre and self._exact:  # (a bug, not a choice: the exact plan has no victims)
            raise AssertionError("Oracle preempted under an exact KV plan")
        preempted = [objs[s] for s in ws.preempted[:npre].tolist()] if npre else []
        self._last = decision = Decision.of_batch(batch, preempted, self._info_names, info)
        if self._planned != self._planned and self.loop is not None:  # (NaN: a model it asks)
            self._planned = _price(view, batch)
        return decision


def _price(view: SchedulerView, batch: list[tuple[Request, int]]) -> float:
    """The cost model's latency of ``batch`` (as the simulator forms it), for the closed loop where the
    decision asks the cost model (it prices its batch only for a model it evaluates itself)."""
    shape = BatchShape()
    for r, n in batch:
        out = r.num_output_tokens
        if n == 1 and out > 0 and r.prompt_len + out - r.num_computed_tokens == 1:
            shape.add_decode(r.num_computed_tokens)
        else:
            shape.add_prefill(n, r.num_computed_tokens)
    return view.cost.iteration_time(shape)



_T_PLANNED = INFO_INDEX["t_planned"]
assert OUTCOME.names == ("n_sched", "n_preempted", "n_cut", "budget", "era_owner", "same_batch")
