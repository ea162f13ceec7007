"""T_max, SLO_min and the token budget (SPEC 4.2, paper section 4.3): the plan a batch is formed
on. The linear and the analytic cost model are evaluated here (``linear_time``,
``roofline_time``: the functions the models themselves run); for any other, the decision asks
(``Cost.ask``, ``Workspace.run``)."""

from __future__ import annotations

import math

from accelgen.costmodel.analytic import roofline_time
from accelgen.costmodel.linear import linear_time
from accelgen.policies.accelgen import dormant, rank
from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.state import (
    NO_ASK,
    Budget,
    Candidates,
    Cost,
    Dormant,
    Ledger,
    Params,
    Step,
)

compiled_linear_time = jit(linear_time)
compiled_roofline_time = jit(roofline_time)
BATCH_FIT_ROUNDS = 4  # T_max's composition changes little between rounds: 1-2 suffice


@jit
def forward_time(par: Params, cost: Cost, budget: int) -> float:
    """The cost model's ``forward_time(budget)`` (a prefill-only iteration)."""
    if par.cost_linear:
        return compiled_linear_time(par, budget, 0, budget * (0 + (budget + 1) / 2))
    return cost.times[budget].forward


@jit
def t_max_at(par: Params, led: Ledger, cost: Cost, budget: int) -> float:
    """T_max, the paper's "maximum batch execution time", at ``budget`` tokens: every running
    decode with its context plus a chunk filling the budget at the longest running prompt's
    context (decision 10), at least ``forward_time(budget)``. NaN: ask the cost model."""
    n = min(led.n_decodes, budget)
    ctx = led.decode_ctx if n == led.n_decodes else led.decode_ctx * n // max(led.n_decodes, 1)
    prefill = budget - n if budget > n else 0
    attn = prefill * (led.prefill_ctx + (prefill + 1) / 2) if prefill > 0 else 0.0
    if par.cost_linear:
        full = compiled_linear_time(par, prefill + n, ctx, attn)
    elif par.cost_roofline:
        full = compiled_roofline_time(cost.roofline, prefill, 1 if prefill > 0 else 0, attn, n, ctx)
    else:
        full = cost.times[budget].full_batch
        if math.isnan(full):
            ask = cost.ask
            ask.prefill_tokens, ask.prefill_seqs, ask.prefill_attn = prefill, prefill > 0, attn
            ask.decode_seqs, ask.decode_ctx = n, ctx
            return math.nan
    fwd = forward_time(par, cost, budget)
    return fwd if fwd > full else full


@jit
def largest_fitting(par: Params, cost: Cost, t: float, limit: int) -> int:
    """Budget rule ``model``: the largest forward size S <= ``limit`` with ``forward_time(S) <=
    t`` (0 if none), by bisection (the same answer as ``costmodel.pivot.budget_for_time``)."""
    if forward_time(par, cost, 1) > t:
        return 0
    if forward_time(par, cost, limit) <= t:
        return limit
    lo, hi = 1, limit  # forward_time(lo) <= t < forward_time(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if forward_time(par, cost, mid) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@jit
def token_budget(par: Params, led: Ledger, cost: Cost, slo: float) -> Budget:
    """The token budget S_b for the tightest per-iteration SLO: ``batch``: the largest budget
    whose T_max fits SLO_min (``_fit_batch``); ``paper``: S_pf x SLO_min / T_pf; ``model``: the
    largest forward size whose latency fits SLO_min; clamped to [min_budget, cap]. The one place
    the rule lives."""
    if not math.isfinite(slo):  # nothing constrains it
        return Budget(par.cap, False, slo > 0, NO_ASK)
    raw = 0
    if slo > 0:
        if par.budget_model or par.budget_batch:  # one past the cap: "at least the cap"
            raw = largest_fitting(par, cost, slo, par.cap + 1)
        else:
            x = par.s_pf * slo / par.t_pf
            raw = int(x) if x < 4e18 else 4 * 10 ** 18
    if raw < par.min_budget:
        return Budget(par.min_budget, True, False, NO_ASK)
    tokens, high = (par.cap, True) if raw > par.cap else (raw, False)
    if par.budget_batch:
        fitted = _fit_batch(par, led, cost, slo, tokens)
        if fitted.ask != NO_ASK or fitted.tokens < tokens:
            return fitted
    return Budget(tokens, False, high, NO_ASK)


@jit
def _fit_batch(par: Params, led: Ledger, cost: Cost, slo: float, tokens: int) -> Budget:
    """Budget rule ``batch``: shrink ``tokens`` until T_max, the latency of the batch being formed
    (running decodes with their contexts, the chunk at its context, the fixed cost), fits SLO_min.
    Each round takes the largest S with ``forward_time(S) <= SLO_min - (T_max - forward_time)``
    at the current size: the extra time shrinks with the chunk, so a round never overshoots."""
    for _ in range(BATCH_FIT_ROUNDS):
        if tokens <= par.min_budget:
            return Budget(par.min_budget, True, False, NO_ASK)
        t = t_max_at(par, led, cost, tokens)
        if math.isnan(t):
            return Budget(tokens, False, False, tokens)
        if t <= slo:
            return Budget(tokens, False, False, NO_ASK)
        extra = t - forward_time(par, cost, tokens)
        tokens = min(largest_fitting(par, cost, slo - extra, tokens - 1), tokens - 1)
    return Budget(max(tokens, par.min_budget), tokens <= par.min_budget, False, NO_ASK)


@jit
def slo_min(cs: Candidates, dq: Dormant, par: Params, led: Ledger, t_max: float) -> float:
    """Rank every active candidate at ``t_max``; returns SLO_min: the tightest per-iteration SLO
    among the urgent requests and the head slack group (inf if none). Dormant requests are lost
    prompts: never urgent nor counted; the first eligible one's key may head the queue."""
    best, k1, any_rest = math.inf, math.inf, False
    for i in cs.active:
        c = cs.cand[i]
        rank.rank(cs.req[i], c, par, t_max)
        if c.urgent:
            if c.counted and c.slo_iter < best:
                best = c.slo_iter
        elif c.eligible:
            if not any_rest or c.key < k1:
                k1 = c.key
            any_rest = True
    if dq.hi > dq.lo and (not any_rest or k1 > dq.queue[dq.lo].key):
        q = dormant.first_eligible(dq, par, led)
        if q < dq.hi and (not any_rest or dq.queue[q].key < k1):
            k1, any_rest = dq.queue[q].key, True
    if any_rest:
        for i in cs.active:
            c = cs.cand[i]
            if (c.eligible and not c.urgent and c.key <= k1 + par.gamma and c.counted
                    and c.slo_iter < best):
                best = c.slo_iter
    return best


@jit
def plan(cs: Candidates, dq: Dormant, step: Step, par: Params, led: Ledger, cost: Cost) -> int:
    """SLO_min, token budget and T_max into the ledger: urgency at the last budget's T_max, its
    budget, and when the new budget's T_max is longer, urgency again at it (a larger budget means
    longer iterations). Returns NO_ASK, or a budget whose latency the cost model must give first."""
    t_max = t_max_at(par, led, cost, step.prev_budget)
    if math.isnan(t_max):
        return step.prev_budget
    slo = slo_min(cs, dq, par, led, t_max)
    b = token_budget(par, led, cost, slo)
    if b.ask == NO_ASK and b.tokens != step.prev_budget:
        t_new = t_max_at(par, led, cost, b.tokens)
        if math.isnan(t_new):
            return b.tokens
        if t_new > t_max:
            slo = min(slo, slo_min(cs, dq, par, led, t_new))
            b = token_budget(par, led, cost, slo)
            t_max = t_new
    if b.ask != NO_ASK:
        return b.ask
    led.t_max, led.slo_min, led.clamped_low, led.clamped_high = t_max, slo, b.low, b.high
    led.budget = b.tokens
    return NO_ASK
