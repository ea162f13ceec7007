"""AccelGen: SLO-guaranteed dynamic chunking, slack ordering and multi-resource batching
(SPEC section 4, paper sections 4.2-4.4, Algorithms 1-2). ``docs/accelgen.md`` describes the
algorithm as implemented and every decision taken where the paper and the spec are silent.

One decision, in order:

1. Slack of every unfinished request (waiting: new or preempted; running: decode or partially
   prefilled): s = deadline of its next output - now - N_ck x T_max (``RequestTable`` keeps the
   deadlines). Urgent: 0 <= s < T_max, i.e. it must run now and still can make it; a running
   decode with s < 0 is urgent too (its next TBT deadline counts from the token it emits).
2. Token budget S_b from SLO_min, the tightest per-iteration SLO among the urgent requests and the
   head slack group (``accelgen_budget``). T_max is the predicted latency of a full batch at the
   budget; when the new budget is larger than the previous one, urgency is re-evaluated at the
   larger T_max.
3. Step 1: urgent requests join in slack order, prompt chunks cut where the budget ends;
   larger-slack running requests are preempted when KV runs out (Algorithm 1).
4. Step 2: SelectRequests on the head group (slack within s_1 + gamma), then the next groups while
   budget is left (Algorithm 2; ``accelgen_select``). ERA keeps one long prompt in prefill.

Ablations: ``order=False`` orders by arrival (FCFS) with no urgency; ``chunk=False`` schedules a
prompt whole or not at all; ``batch=False`` fills in queue order instead of by Euclidean fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from accelgen.costmodel.base import BatchShape, CostModel
from accelgen.policies.accelgen_budget import Budget, BudgetRule, TokenBudget
from accelgen.policies.accelgen_select import BatchFormer
from accelgen.policies.accelgen_state import RequestTable
from accelgen.policies.base import Decision, Policy, PolicyParams, SchedulerView
from accelgen.request import Request

if TYPE_CHECKING:
    from accelgen.policies.accelgen_kernel import CompiledDecision

# Base of a lost request's key (seconds): above every on-track request's slack.
_LOST_OFFSET = 1e9


def max_batch_time(cost: CostModel, bud: TokenBudget, budget: int, n_dec: int, dec_ctx: int,
                   prefill_ctx: int) -> float:
    """T_max, the paper's "maximum batch execution time" at ``budget`` tokens: every running
    decode (``n_dec`` of them, ``dec_ctx`` tokens of context in all) plus a prompt chunk filling
    the rest of the budget at the longest running prompt's context (``prefill_ctx``). A
    prefill-only latency (``forward_time``) leaves out the KV reads, and a decode let skip by a
    slack computed with it can miss its TBT by that much (seen on the quick configuration at
    moderate load)."""
    shape = BatchShape()
    n = min(n_dec, budget)
    if budget > n:
        shape.add_prefill(budget - n, prefill_ctx)
    shape.decode_seqs = n
    shape.decode_ctx = dec_ctx if n == n_dec else dec_ctx * n // max(n_dec, 1)
    return max(cost.iteration_time(shape), bud.time(budget))


def plan_budget(bud: TokenBudget, prev_budget: int, t_max_at: Callable[[int], float],
                urgency_at: Callable[[float], float]) -> tuple[float, Budget, float]:
    """SLO_min, token budget and T_max of a decision: urgency at the last budget's T_max, the
    budget for that SLO_min, and when the new budget's T_max is longer, urgency re-checked at it
    (a larger budget means longer iterations). ``urgency_at(t)`` returns SLO_min at T_max ``t``
    (and leaves the caller's slack state at ``t``)."""
    t_prev = t_max_at(prev_budget)
    slo_min = urgency_at(t_prev)
    b = bud.for_slo(slo_min)
    if b.tokens == prev_budget:
        return slo_min, b, t_prev
    t_new = t_max_at(b.tokens)
    if t_new <= t_prev:
        return slo_min, b, t_prev
    slo_min = min(slo_min, urgency_at(t_new))
    return slo_min, bud.for_slo(slo_min), t_new


class AccelGenParams(PolicyParams):
    # The three methods (ablation switches).
    order: bool = True  # slack ordering + urgency (False: FCFS by arrival, nothing urgent)
    chunk: bool = True  # dynamic chunking (False: a prompt runs whole or not at all)
    batch: bool = True  # Euclidean multi-resource selection (False: in-order filling)
    # Multi-resource batching.
    gamma: NonNegativeFloat = 0.75  # s: head group = slack within s_1 + gamma (paper)
    spill_groups: bool = True  # continue with the next group while budget is left
    # Token budget.
    budget_rule: BudgetRule = "paper"  # paper: S_pf x SLO_min / T_pf; model: invert the cost
    min_budget: PositiveInt | None = None  # tokens; default one KV block
    budget_cap: PositiveFloat = 1.0  # S_b <= S_pf x budget_cap
    # Exclusive Request Allocation.
    era: bool = True
    # prefill (SPEC 4.2): a new long prompt starts when the current one's prefill completes;
    # request: when the current long request completes (the paper's wording, "does not begin
    # until all currently served long-prompt requests are completed").
    era_scope: Literal["prefill", "request"] = "prefill"
    long_prompt_threshold: PositiveInt = 4096  # tokens
    # Slack estimation.
    chunk_mean_weight: float = Field(0.05, gt=0.0, le=1.0)  # weight of a new chunk in L_c
    late_is_urgent: bool = False  # True: late prompts are urgent too (late decodes always are)
    # Requests whose request-level SLO is already lost (an online request with a token past its
    # deadline, or whose next output's deadline has passed) come after every on-track candidate
    # in step 2 (FCFS among them) and are preempted first (oldest first); their decodes keep
    # their urgency. The paper is silent; False gives plain ascending slack, which under overload
    # serves the latest request first and lets it evict on-track ones (docs/accelgen.md,
    # decision 11).
    lost_last: bool = True
    # Offline JCT plan: T_e adds S_g x P_max x P for preemptions (paper; no values given).
    preempt_prob: float = Field(0.0, ge=0.0, le=1.0)  # P
    preempt_max_s: NonNegativeFloat = 0.0  # P_max
    max_num_seqs: PositiveInt | None = None  # running-request cap (None: KV is the only cap)
    # KV promised to each running request beyond its pending tokens (tokens; default one block):
    # admissions leave this much room for decode growth.
    kv_growth_reserve: NonNegativeInt | None = None


class AccelGenPolicy(Policy):
    name = "accelgen"
    Params = AccelGenParams
    params: AccelGenParams

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._table = RequestTable()
        self._budget: TokenBudget | None = None
        self._prev_budget = 0
        self._chunk_mean: float | None = None  # L_c, starts at S_pf
        self._era_owner: int | None = None  # req_id of the long prompt holding ERA
        self._pending_cuts: list[int] = []
        self._compiled: CompiledDecision | None = None
        # Tests switch this on: compare the table with the request objects every decision.
        self.debug_verify = False
        p = self.params
        # The compiled decision (accelgen_kernel) for the full algorithm with the paper's budget
        # rule; False: always the interpreted classes (tests compare the two).
        self.use_kernel = p.order and p.chunk and p.batch and p.budget_rule == "paper"

    # -- hooks ---------------------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> None:
        self._table.add(req)

    def on_finish(self, req: Request, now: float) -> None:
        self._table.remove(req.req_id)
        if self._era_owner == req.req_id:
            self._era_owner = None

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:
        touched = [r for r, _ in decision.scheduled]
        touched.extend(decision.preempted)
        self._table.refresh(touched)
        if self._chunk_mean is not None:
            w = self.params.chunk_mean_weight
            for c in self._pending_cuts:
                self._chunk_mean += w * (c - self._chunk_mean)
        self._pending_cuts = []
        self._update_era_owner()

    def _update_era_owner(self) -> None:
        """ERA ends when the owner's prefill completes (scope ``prefill``) or the request ends
        (``request``); a preempted owner holds no KV and releases it too."""
        if self._era_owner is None:
            return
        t = self._table
        s = t.slot_of.get(self._era_owner)
        prefill_done = s is not None and t.n_out[s] > 0 and t.prompt[s] + t.n_out[s] - t.computed[s] == 1
        if s is None or not t.running[s] or (self.params.era_scope == "prefill" and prefill_done):
            self._era_owner = None

    # -- decision ------------------------------------------------------------------------------
    def _sync(self, view: SchedulerView) -> None:
        """Adopt requests the hooks did not announce (e.g. an adapter that missed a hook)."""
        t = self._table
        if len(view.waiting) + len(view.running) != t.n:
            t.rebuild([*view.waiting, *view.running])
        if self.debug_verify:
            bad = t.mismatches()
            if bad:
                raise AssertionError("AccelGen state out of sync: " + "; ".join(bad[:5]))

    def _token_budget(self, view: SchedulerView) -> TokenBudget:
        b = self._budget
        # (identity first: the same cost model and pivot objects every step is the usual case)
        if b is None or (not (b.cost is view.cost and b.pivot is view.pivot)
                         and not b.matches(view.cost, view.pivot)):
            p = self.params
            first = b is None
            b = self._budget = TokenBudget(view.cost, view.pivot, p.budget_rule,
                                           p.min_budget or view.kv.block_size, p.budget_cap)
            # A refitted cost model (the vLLM adapter's online one) keeps the last budget.
            self._prev_budget = b.cap if first else min(self._prev_budget, b.cap)
        if self._chunk_mean is None:
            self._chunk_mean = float(view.pivot.s_pf)
        return b

    def _prepare(self, view: SchedulerView) -> tuple[TokenBudget, float]:
        """Everything a decision reads besides the view: the table in sync with it, the token
        budget rule and L_c, and the JCT plan of offline requests that have none yet."""
        t = self._table
        # (the checks of _sync and _token_budget inline: this runs every step, and in vLLM
        # right after a forward pass, when every call costs cache misses)
        if len(view.waiting) + len(view.running) != t.n or self.debug_verify:
            self._sync(view)
        bud = self._budget
        if bud is None or bud.cost is not view.cost or bud.pivot is not view.pivot:
            bud = self._token_budget(view)
        lc = self._chunk_mean
        assert lc is not None  # set by _token_budget
        if t.num_unplanned:
            p = self.params
            t.plan_offline(lc, bud.time(self._prev_budget), p.preempt_prob * p.preempt_max_s)
        return bud, lc

    def schedule(self, view: SchedulerView) -> Decision:
        bud, lc = self._prepare(view)
        t = self._table
        n = t.n
        if n == 0:
            return Decision(info={"token_budget": float(self._prev_budget), "n_candidates": 0.0})
        if self.use_kernel:
            c = self._compiled or self.compiled_decision()
            return self._kernel_decision(*c.run(self, view, t, bud, lc))
        st = DecisionState(self, view, t, bud, lc)
        former = st.form()
        return self._decision(st, former)

    def compiled_decision(self) -> CompiledDecision:
        """This policy's compiled decisions (``accelgen_kernel``; numba loads on first use)."""
        if self._compiled is None:
            from accelgen.policies.accelgen_kernel import CompiledDecision

            self._compiled = CompiledDecision()
        return self._compiled

    def _kernel_decision(self, ints: list[int], vals: np.ndarray) -> Decision:
        """The decision of a compiled result (``CompiledDecision.run``); keeps its ERA owner,
        cut chunks and budget."""
        ns, npre = ints[0], ints[1]
        j = 5 + 2 * ns
        t = self._table
        objs = t.objs
        if ints[4] >= 0:
            self._era_owner = int(t.req_id[ints[4]])
        self._pending_cuts = ints[j + npre:]
        self._prev_budget = ints[3]
        batch = list(zip(map(objs.__getitem__, ints[5:5 + ns]), ints[5 + ns:j], strict=True))
        return Decision.of_batch(batch, [objs[s] for s in ints[j:j + npre]] if npre else [],
                                 INFO_INDEX, vals)

    def explain(self, view: SchedulerView) -> dict[int, dict[str, float]]:
        """Per request (by id): slack, urgency, per-iteration SLO, N_ck and whether it counts
        toward SLO_min, as the next decision would compute them (plus the iteration's T_max and
        token budget). Read-only; for notebooks, tests and the vLLM adapter's logs."""
        bud, lc = self._prepare(view)
        t = self._table
        if t.n == 0:
            return {}
        st = DecisionState(self, view, t, bud, lc)
        return {int(t.req_id[s]): {
            "slack": float(st.slack[s]), "urgent": float(st.urgent[s]),
            "slo_iter": float(st.slo_iter[s]), "n_chunks": float(st.nck[s]),
            "counted": float(st.counted[s]), "deadline": float(t.deadline[s]),
            "lost": float(st.lost[s]) if st.lost is not None else 0.0,
            "t_max": st.t_max, "token_budget": float(st.budget.tokens)} for s in range(t.n)}

    def _decision(self, st: DecisionState, former: BatchFormer) -> Decision:
        t = self._table
        objs = t.objs
        d = Decision(scheduled=list(zip(map(objs.__getitem__, former.slots), former.tokens,
                                        strict=True)),
                     preempted=list(map(objs.__getitem__, former.preempted)))
        if former.era_owner >= 0:
            self._era_owner = int(t.req_id[former.era_owner])
        self._pending_cuts = former.cut_chunks
        self._prev_budget = former.budget
        d.info = st.info(former)
        return d


# The diagnostics of a decision, in DecisionState._info's order (the compiled decision returns
# them as a list in this order: AccelGenPolicy._kernel_decision wraps it as an InfoRow).
INFO_KEYS = ("token_budget", "slo_min", "t_max", "budget_clamped_low", "budget_clamped_high",
             "n_candidates", "n_urgent", "n_late", "n_lost", "n_preempted", "n_scheduled",
             "n_decode", "n_prefill", "n_decode_skipped", "max_chunk", "n_cut_chunks", "n_groups",
             "era_active", "progress_fallback", "chunk_mean", "kv_free_blocks")
INFO_INDEX = {key: i for i, key in enumerate(INFO_KEYS)}


class DecisionState:
    """Vectorised per-decision quantities (slack, per-iteration SLO, urgency) and the driver of
    the two batching steps. Built fresh for every decision from the policy's ``RequestTable``;
    variants of the policy (the clairvoyant Oracle) subclass it to restrict the eligible set or
    the victims."""

    def __init__(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable,
                 bud: TokenBudget, chunk_mean: float) -> None:
        p = policy.params
        self.p, self.view, self.t, self.bud = p, view, t, bud
        self.chunk_mean = chunk_mean
        n = self.n = t.n
        now = view.now
        prompt, n_out = t.prompt[:n], t.n_out[:n]
        self.rem = prompt + n_out - t.computed[:n]
        self.is_dec = (n_out > 0) & (self.rem == 1)
        # N_ck: remaining chunks at the running mean chunk length (1 for a decode).
        self.nck = np.where(self.is_dec, 1.0, np.ceil(self.rem / chunk_mean))
        self.to_deadline = t.deadline[:n] - now
        online = t.online[:n]
        self.online_dec = self.is_dec & online
        # Per-iteration SLO: TBT for an online decode, else the time left per remaining chunk
        # (N_ck >= 1, so the division is safe).
        self.slo_iter = np.where(self.online_dec, t.tbt[:n], self.to_deadline / self.nck)
        self.is_long = ~self.is_dec & (prompt + n_out >= p.long_prompt_threshold)
        owner = t.slot_of.get(policy._era_owner, -1) if policy._era_owner is not None else -1
        self.era_owner = owner if p.era else -1
        self.eligible = np.ones(n, dtype=bool)
        if self.era_owner >= 0:
            self.eligible &= ~self.is_long
            self.eligible[owner] = True
        self.prev_budget = policy._prev_budget
        # What a full batch would read besides its new tokens: the KV context of every running
        # decode, and the longest context a running prompt's chunk would attend to.
        run = t.running[:n]
        decodes = self.is_dec & run
        # (count_nonzero, nonzero and ndarray methods: this runs every decision, and numpy's
        # Python-level wrappers cost as much as the work on a few hundred elements)
        self.dec_ctx = int(t.computed[:n][decodes].sum())
        self.n_dec = int(np.count_nonzero(decodes))
        partial = run & ~self.is_dec
        self.prefill_ctx = int(t.computed[:n][partial].max()) if np.count_nonzero(partial) else 0
        # Lost requests (see AccelGenParams.lost_last); None when the rule is off.
        self.lost = (online & (t.lost[:n] | (self.to_deadline < 0.0))
                     if p.order and p.lost_last else None)
        self._t_max: dict[int, float] = {}
        self._key_order: np.ndarray | None = None
        self._plan_budget()

    # -- slack, urgency and budget -------------------------------------------------------------
    def _urgency(self, t_max: float) -> float:
        """Slack, urgent set and sort key at ``t_max``; returns SLO_min of the urgent requests
        and the head group (the batch being formed)."""
        p = self.p
        slack = self.to_deadline - self.nck * t_max
        # A late prompt cannot be rescued by a smaller batch (under chunking its remaining time
        # grows with its remaining tokens), so only on-track requests and online decodes, whose
        # TBT governs every later token, lower SLO_min.
        counted = self.online_dec | (slack >= 0.0)
        if p.order:
            urgent = self.eligible & (slack < t_max)
            if not p.late_is_urgent:
                # A request already past its deadline is not urgent (running it now saves no
                # deadline), except a running decode: its TBT chain restarts at its next token.
                urgent &= (slack >= 0.0) | self.is_dec
            # Lost prompts after every on-track candidate, first come first served among them.
            key = slack if self.lost is None else \
                np.where(self.lost & ~self.is_dec, self.t.arrival[: self.n] + _LOST_OFFSET, slack)
        else:
            urgent = np.zeros(self.n, dtype=bool)
            key = self.t.arrival[: self.n]
        self.slack, self.urgent, self.key, self.counted, self.t_max = slack, urgent, key, counted, t_max
        rest = self.eligible & ~urgent
        sel = urgent & counted
        if np.count_nonzero(rest):
            k1 = key[rest].min()
            sel |= rest & (key <= k1 + p.gamma) & counted
        return float(self.slo_iter[sel].min()) if np.count_nonzero(sel) else math.inf

    def max_batch_time(self, budget: int) -> float:
        """T_max at ``budget`` tokens (``max_batch_time``), memoised for the decision."""
        t = self._t_max.get(budget)
        if t is None:
            t = self._t_max[budget] = max_batch_time(self.view.cost, self.bud, budget, self.n_dec,
                                                     self.dec_ctx, self.prefill_ctx)
        return t

    def _plan_budget(self) -> None:
        self.slo_min, self.budget, _ = plan_budget(self.bud, self.prev_budget,
                                                   self.max_batch_time, self._urgency)

    # -- batching ------------------------------------------------------------------------------
    def form(self) -> BatchFormer:
        former = self._new_former()
        self.n_groups = 0
        oversize = self._oversize_head(former)
        if oversize >= 0:
            former.available &= self.is_dec  # the oversize prompt runs without other prompts
        urgent = self._urgent_order(former)
        self.n_urgent = len(urgent)
        former.add_urgent(urgent)
        if oversize >= 0:
            # Preempting for it only helps if it can still make its deadline.
            min_key = former.victim_min_key(oversize) if self.urgent[oversize] else math.inf
            former.force(oversize, min_key=min_key, oversize=True)
        self._select(former)
        self.fallback = not former.slots
        if self.fallback:
            self._ensure_progress(former)
        return former

    def _new_former(self) -> BatchFormer:
        p, t, n = self.p, self.t, self.n
        return BatchFormer(
            t, block_size=self.view.kv.block_size, free_blocks=self.view.kv.num_free_blocks,
            token_budget=self.budget.tokens, rem=self.rem, is_dec=self.is_dec, key=self.key,
            victim_key=self._victim_key, is_long=self.is_long, available=self.eligible.copy(),
            chunk=p.chunk, era=p.era, era_owner=self.era_owner,
            admissions_left=(math.inf if p.max_num_seqs is None
                             else p.max_num_seqs - int(t.running[:n].sum())),
            victim_floor=self.t_max if p.order else -math.inf, victim_margin=p.gamma,
            growth_reserve=(self.view.kv.block_size if p.kv_growth_reserve is None
                            else p.kv_growth_reserve),
            total_blocks=self.view.kv.num_total_blocks)

    def _urgent_order(self, former: BatchFormer) -> np.ndarray:
        """Urgent candidates still available, in ascending slack (ties by slot)."""
        urgent = (self.urgent & former.available).nonzero()[0]
        if urgent.size:
            urgent = urgent[self.slack[urgent].argsort(kind="stable")]
        return urgent

    def _victim_key(self) -> np.ndarray:
        """Slack a running request would have once preempted: it must then recompute its prompt
        and generated tokens (FCFS: its arrival, so the newest is preempted first)."""
        t, n = self.t, self.n
        if not self.p.order:
            return t.arrival[:n]
        recompute = np.ceil((t.prompt[:n] + t.n_out[:n]) / self.chunk_mean)
        key = self.to_deadline - recompute * self.t_max
        # Lost requests are victims before any on-track one, the oldest first: it holds the most
        # KV, so one preemption frees the most (half the preemptions of newest-first or
        # largest-slack-first on the quick configuration, docs/accelgen.md decision 11).
        return key if self.lost is None else \
            np.where(self.lost, _LOST_OFFSET - t.arrival[:n], key)

    def _oversize_head(self, former: BatchFormer) -> int:
        """/Chunk: a prompt longer than the budget could never run whole within it. When it is
        the first prompt in queue order it runs whole as the only prompt of the batch (decodes
        still join), so it cannot starve."""
        if self.p.chunk:
            return -1
        prompts = np.flatnonzero(self.eligible & ~self.is_dec)
        if prompts.size == 0:
            return -1
        h = int(prompts[np.argmin(self.key[prompts])])
        return h if self.rem[h] > former.budget else -1

    def _select(self, former: BatchFormer) -> None:
        """Step 2: SelectRequests on the head slack group, then on the following groups while
        budget and KV are left (forward size = S_b while work is available)."""
        p, bud = self.p, self.bud
        while former.a_c > 0:
            group = self._next_group(former)
            if group is None:
                return
            self.n_groups += 1
            # Members of a later group may have a tighter per-iteration SLO: the batch's budget
            # follows the tightest one that joins.
            m = self._group_slo_min(group)
            if m < self.slo_min:
                self.slo_min = m
                nb = bud.for_slo(m)
                if nb.tokens < former.budget:
                    former.a_c -= former.budget - nb.tokens
                    former.budget = nb.tokens
                    self.budget = Budget(nb.tokens, nb.clamped_low, self.budget.clamped_high)
                    if former.a_c <= 0:
                        return
            before = len(former.slots)
            if p.batch:
                former.select_euclidean(group)
            else:
                former.fill_in_order(group)
            if not p.spill_groups or len(former.slots) == before:
                return

    def _next_group(self, former: BatchFormer) -> np.ndarray | None:
        """The next slack group: the feasible available candidates whose key is within gamma of
        the smallest, in key order (None when no candidate is feasible)."""
        # Candidates in key order once per decision (stable: ties by slot): each group is then
        # a prefix of the feasible ones.
        order = self._key_order
        if order is None:
            order = self._key_order = self.key.argsort(kind="stable")
        cand = former.feasible(order[former.available[order]])
        if cand.size == 0:
            return None
        kc = self.key[cand]
        return cand[: int(np.searchsorted(kc, kc[0] + self.p.gamma, side="right"))]

    def _group_slo_min(self, group: np.ndarray) -> float:
        """The tightest per-iteration SLO among the group's members that count toward SLO_min
        (inf if none)."""
        sel = group[self.counted[group]]
        return float(self.slo_iter[sel].min()) if sel.size else math.inf

    def _ensure_progress(self, former: BatchFormer) -> None:
        """Nothing fits (KV full and every candidate needs a block): run the first running
        request in queue order, preempting the largest-key running requests for its KV; only
        when nothing runs, the first waiting one. Running requests go first so that the victims,
        which must then fit whole to come back, cannot swap places with it."""
        cand = np.flatnonzero(former.available)
        order = np.lexsort((self.key[cand], ~self.t.running[cand]))
        for s in cand[order].tolist():
            if former.force(s, min_key=-math.inf, oversize=not self.p.chunk):
                self._select(former)  # the preemption may have made room for more
                return

    # -- diagnostics ---------------------------------------------------------------------------
    def info(self, former: BatchFormer) -> dict[str, float]:
        dec = self.is_dec[former.slots].tolist() if former.slots else []
        n_lost = int(np.count_nonzero(self.lost)) if self.lost is not None else 0
        return self._info(former, dec, int(np.count_nonzero(self.slack < 0.0)), n_lost)

    def _info(self, former: BatchFormer, dec: list[bool], n_late: int, n_lost: int
              ) -> dict[str, float]:
        chunks = [c for c, d in zip(former.tokens, dec, strict=True) if not d]
        dec_sched = len(dec) - len(chunks)
        return {
            "token_budget": float(former.budget),
            "slo_min": self.slo_min if math.isfinite(self.slo_min) else math.nan,
            "t_max": self.t_max,
            "budget_clamped_low": float(self.budget.clamped_low),
            "budget_clamped_high": float(self.budget.clamped_high),
            "n_candidates": float(self.n),
            "n_urgent": float(self.n_urgent),
            "n_late": float(n_late),
            "n_lost": float(n_lost),
            "n_preempted": float(len(former.preempted)),
            "n_scheduled": float(len(former.slots)),
            "n_decode": float(dec_sched),
            "n_prefill": float(len(chunks)),
            "n_decode_skipped": float(self.n_dec - dec_sched),
            "max_chunk": float(max(chunks, default=0)),
            "n_cut_chunks": float(len(former.cut_chunks)),
            "n_groups": float(self.n_groups),
            "era_active": float(former.era_owner >= 0),
            "progress_fallback": float(self.fallback),
            "chunk_mean": float(self.chunk_mean),
            "kv_free_blocks": float(former.free_blocks),
        }
