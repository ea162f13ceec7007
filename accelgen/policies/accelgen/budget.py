"""T_max, SLO_min and the token budget (SPEC 4.2, paper section 4.3): the plan a batch is formed on,
and the latency of the batch formed (the exact plan: ``chunk_cap``). The linear, analytic and
calibrated cost models are evaluated here with their own functions; for any other the decision asks
(``Workspace.run``). Every predicted latency is scaled by ``Params.time_scale`` (the closed loop's
correction; exactly 1 in the open loop; its margin shrinks the decodes' TBT SLOs, ``rank.columns``,
less while a prompt's TTFT is at risk, ``rank.borrow``)."""

from __future__ import annotations

import math

from accelgen.costmodel.analytic import roofline_time
from accelgen.costmodel.calibrated import calibrated_time
from accelgen.costmodel.linear import linear_time
from accelgen.policies.accelgen import dormant, rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit

compiled_linear_time = jit(linear_time)
compiled_roofline_time = jit(roofline_time)
compiled_calibrated_time = jit(calibrated_time)
BATCH_FIT_ROUNDS = 4  # T_max's composition changes little between rounds: 1-2 suffice


@jit
def forward_time(par: st.Params, cost: st.Cost, budget: int) -> float:
    if par.cost_linear:
        return compiled_linear_time(par, budget, 0, budget * (0 + (budget + 1) / 2)) * par.time_scale
    return cost.times[budget].forward * par.time_scale


@jit
def model_time(par: st.Params, cost: st.Cost, prefill_tokens: int, prefill_seqs: int, prefill_attn: float,
               decode_seqs: int, decode_ctx: int) -> float:
    """The cost model's latency of a batch of these aggregates (``BatchShape``), unscaled; NaN for a
    model the decision does not evaluate itself."""
    if par.cost_linear:
        return compiled_linear_time(par, prefill_tokens + decode_seqs, decode_ctx, prefill_attn)
    if par.cost_roofline:
        return compiled_roofline_time(cost.roofline, prefill_tokens, prefill_seqs, prefill_attn,
                                      decode_seqs, decode_ctx)
    if par.cost_calibrated:
        return compiled_calibrated_time(cost.calibrated, prefill_tokens, prefill_seqs, prefill_attn,
                                        decode_seqs, decode_ctx)
    return math.nan


@jit
def formed_time(par: st.Params, led: st.Ledger, cost: st.Cost) -> float:
    """The cost model's latency of the batch formed so far, unscaled (NaN: asked models)."""
    return model_time(par, cost, led.pf_tokens, led.pf_seqs, led.pf_attn, led.dec_seqs, led.dec_ctx)


@jit
def _with_chunk(par: st.Params, led: st.Ledger, cost: st.Cost, ctx: int, tokens: int) -> float:
    return model_time(par, cost, led.pf_tokens + tokens, led.pf_seqs + 1,
                      led.pf_attn + tokens * (ctx + (tokens + 1) / 2), led.dec_seqs,
                      led.dec_ctx) * par.time_scale


@jit
def chunk_cap(par: st.Params, led: st.Ledger, cost: st.Cost, ctx: int, tokens: int) -> int:
    """The exact plan (budget rule ``batch``; the rules ``paper`` and ``model`` plan tokens alone): the
    largest chunk of at most ``tokens`` (prior context ``ctx``) whose batch, the one formed so far plus
    it, the cost model prices within ``t_limit`` (0: none). Latency grows with the chunk, so a
    bisection; one evaluation when it fits whole (the usual case)."""
    lim = led.t_limit
    if tokens < 1 or lim == math.inf or not par.budget_batch:
        return tokens
    if not _with_chunk(par, led, cost, ctx, tokens) > lim:  # (NaN, an asked model: unchecked)
        return tokens
    lo, hi = 0, tokens  # fits at lo (0: nothing added), not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _with_chunk(par, led, cost, ctx, mid) > lim:
            hi = mid
        else:
            lo = mid
    return lo


@jit
def decodes_fit(par: st.Params, led: st.Ledger, cost: st.Cost, n: int, ctx: int) -> bool:
    """The exact plan: ``n`` more decodes reading ``ctx`` context tokens keep the batch within
    ``t_limit``."""
    lim = led.t_limit
    if n < 1 or lim == math.inf or not par.budget_batch:
        return True
    t = model_time(par, cost, led.pf_tokens, led.pf_seqs, led.pf_attn, led.dec_seqs + n,
                   led.dec_ctx + ctx) * par.time_scale
    return not t > lim


@jit
def t_max_at(par: st.Params, led: st.Ledger, cost: st.Cost, budget: int) -> float:
    """T_max, the paper's "maximum batch execution time", at ``budget``: the running decodes with their
    contexts and a chunk filling the budget at the longest running prompt's context (decision 10), at
    least ``forward_time(budget)``. NaN: ask the cost model."""
    n = min(led.n_decodes, budget)
    ctx = led.decode_ctx if n == led.n_decodes else led.decode_ctx * n // max(led.n_decodes, 1)
    prefill = budget - n if budget > n else 0
    attn = prefill * (led.prefill_ctx + (prefill + 1) / 2) if prefill > 0 else 0.0
    if par.cost_linear or par.cost_roofline or par.cost_calibrated:
        full = model_time(par, cost, prefill, 1 if prefill > 0 else 0, attn, n, ctx) * par.time_scale
    else:
        full = cost.times[budget].full_batch
        if math.isnan(full):
            ask = cost.ask
            ask.prefill_tokens, ask.prefill_seqs, ask.prefill_attn = prefill, prefill > 0, attn
            ask.decode_seqs, ask.decode_ctx = n, ctx
            return math.nan
        full *= par.time_scale
    fwd = forward_time(par, cost, budget)
    return fwd if fwd > full else full


@jit
def largest_fitting(par: st.Params, cost: st.Cost, t: float, limit: int) -> int:
    """The largest S <= ``limit`` with ``forward_time(S) <= t`` (0 if none), by bisection (as
    ``costmodel.pivot.budget_for_time``)."""
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
def token_budget(par: st.Params, led: st.Ledger, cost: st.Cost, slo: float) -> st.Budget:
    """S_b for the tightest per-iteration SLO, by the budget rule, clamped to [min_budget, cap]: the one
    place the rule lives."""
    if not math.isfinite(slo):  # nothing constrains it
        return st.Budget(par.cap, False, slo > 0, st.NO_ASK)
    raw = 0
    if slo > 0:
        if par.budget_model or par.budget_batch:  # one past the cap: "at least the cap"
            raw = largest_fitting(par, cost, slo, par.cap + 1)
        else:
            x = par.s_pf * slo / par.t_pf
            raw = int(x) if x < 4e18 else 4 * 10 ** 18
    if raw < par.min_budget:
        return st.Budget(par.min_budget, True, False, st.NO_ASK)
    tokens, high = (par.cap, True) if raw > par.cap else (raw, False)
    if par.budget_batch:
        fitted = _fit_batch(par, led, cost, slo, tokens)
        if fitted.ask != st.NO_ASK or fitted.tokens < tokens:
            return fitted
    return st.Budget(tokens, False, high, st.NO_ASK)


@jit
def _fit_batch(par: st.Params, led: st.Ledger, cost: st.Cost, slo: float, tokens: int) -> st.Budget:
    """Rule ``batch``: shrink ``tokens`` until T_max fits SLO_min, each round to the largest S with
    ``forward_time(S) <= SLO_min - (T_max - forward_time)``; the extra time shrinks with the chunk, so a
    round never overshoots."""
    for _ in range(BATCH_FIT_ROUNDS):
        if tokens <= par.min_budget:
            return st.Budget(par.min_budget, True, False, st.NO_ASK)
        t = t_max_at(par, led, cost, tokens)
        if math.isnan(t):
            return st.Budget(tokens, False, False, tokens)
        if t <= slo:
            return st.Budget(tokens, False, False, st.NO_ASK)
        extra = t - forward_time(par, cost, tokens)
        tokens = min(largest_fitting(par, cost, slo - extra, tokens - 1), tokens - 1)
    return st.Budget(max(tokens, par.min_budget), tokens <= par.min_budget, False, st.NO_ASK)


@jit
def slo_min(cs: st.Candidates, dq: st.Dormant, par: st.Params, led: st.Ledger, t_max: float) -> float:
    """Rank every active candidate at ``t_max``; SLO_min: the tightest per-iteration SLO of the urgent
    requests and the head slack group (inf: none). Dormant requests are never urgent nor counted; the
    first eligible one's key may head the queue."""
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
def plan(cs: st.Candidates, dq: st.Dormant, step: st.Step, par: st.Params, led: st.Ledger,
         cost: st.Cost) -> int:
    """SLO_min, token budget and T_max into the ledger: urgency at the last budget's T_max, and again at
    the new budget's if longer. Returns NO_ASK, or a budget whose latency the cost model must give."""
    t_max = t_max_at(par, led, cost, step.prev_budget)
    if math.isnan(t_max):
        return step.prev_budget
    slo = slo_min(cs, dq, par, led, t_max)
    if par.err_sd > 0.0 and rank.borrow(cs, par, t_max):  # (the closed loop under noise)
        slo = slo_min(cs, dq, par, led, t_max)
    b = token_budget(par, led, cost, slo)
    if b.ask == st.NO_ASK and b.tokens != step.prev_budget:
        t_new = t_max_at(par, led, cost, b.tokens)
        if math.isnan(t_new):
            return b.tokens
        if t_new > t_max:
            slo = min(slo, slo_min(cs, dq, par, led, t_new))
            b = token_budget(par, led, cost, slo)
            t_max = t_new
    if b.ask != st.NO_ASK:
        return b.ask
    led.t_max, led.slo_min, led.clamped_low, led.clamped_high = t_max, slo, b.low, b.high
    led.budget = b.tokens
    return st.NO_ASK
