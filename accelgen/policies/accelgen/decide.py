"""AccelGen's decision (SPEC 4, paper sections 4.2-4.4, Algorithms 1-2): the one implementation,
compiled, run by the simulator and by the vLLM plugin alike (``docs/accelgen.md``, *One decision*
and *How it runs*)."""

from __future__ import annotations

import math

import numpy as np

from accelgen.policies.accelgen import batch, budget, dormant, era, exact_kv, kv, preempt, rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def decide(a: st.DecisionArrays) -> int:
    """One decision on the inputs in ``state.step``, in passes over the candidates (the Oracle's exact
    plan may re-form the batch). Returns NO_ASK when it is complete (batch in the lists, ``outcome``,
    ``info``), or a token budget whose full-batch latency the cost model must give first
    (``Workspace.run`` then runs it again: a pure function of its inputs, it repeats the same steps)."""
    rec, x = a.state[0], a.lists
    step, par, led = rec.step, rec.params, rec.ledger
    cost = st.Cost(a.times, rec.roofline, rec.ask, rec.calibrated)
    # The slot lists by name: the rows of ``a.lists``, in ``state.LISTS``' order.
    b = st.Batch(x[0], x[1], x[2], x[3], x[4], x[5], x[6])
    dq = st.Dormant(a.dormant, a.minima, a.gone, a.finals, step.dormant_lo,
                    step.dormant_lo + step.n_dormant, x[18])
    q = st.Queue(x[7], x[8], x[9], x[10], x[11], dq)
    pools = st.Pools(x[12], x[13], x[14].view(np.float64), x[15], x[16], x[17])
    ora = st.Oracle(rec.oracle, x[19], x[20])
    cs = st.Candidates(a.requests, a.cand, a.active[:step.n_active], step.now, step.chunk_mean,
                       x[21], x[22], x[23])
    while True:
        _start_pass(cs, dq, step, par, led, ora)
        ask = budget.plan(cs, dq, step, par, led, cost)
        if ask != st.NO_ASK:
            return ask
        if step.plan_only:
            for e in dq.queue[dq.lo:dq.hi]:  # (explain: every column)
                dormant.wake(cs, dq, e.slot, par, led)
            return st.NO_ASK
        ask = _form(cs, q, par, led, b, cost, pools)
        if ask != st.NO_ASK:
            return ask
        if not (par.exact_kv and exact_kv.over_admitted(cs, dq, par, led, b, ora)):
            if par.exact_kv:
                exact_kv.unhide(cs, dq, par, ora)
            _diagnostics(cs, step, par, led, b, cost, ora, rec.info)
            _finish(led, b, rec.outcome)
            return st.NO_ASK


@jit
def _start_pass(cs: st.Candidates, dq: st.Dormant, step: st.Step, par: st.Params, led: st.Ledger,
                ora: st.Oracle) -> None:
    """A pass begins: ERA's holder, the dormant queue's changes, the active candidates' columns, the
    running batch's shape (for T_max), the Oracle's exact plan."""
    led.era_owner = led.era_owner_start = era.holder(cs.req, par, step.era_owner)
    led.pass_id += 1
    led.n_touched = 0
    led.dormant_head = dq.lo
    led.oversize = st.NO_SLOT
    led.n_decodes = led.decode_ctx = led.prefill_ctx = 0
    led.kv_free, led.admissions = step.free_blocks, step.admissions_left
    if step.reindex or step.dirty_lo < step.dirty_hi or step.n_gone:
        dormant.index(dq, cs.req, par, step)
    if par.exact_kv:
        led.oracle_admissible = exact_kv.admissible(cs, step, par)
        ora.counts.excluded = ora.counts.n_over + dormant.count_over(dq, led.oracle_admissible)
    for i in cs.active:
        r, c = cs.req[i], cs.cand[i]
        rank.columns(cs, i, par, led)
        if r.running:  # what a full batch reads besides its new tokens (T_max)
            if c.is_decode:
                led.n_decodes += 1
                led.decode_ctx += r.computed
            elif r.computed > led.prefill_ctx:
                led.prefill_ctx = r.computed
        elif kv.excluded(r, c, par, led):
            c.eligible = False  # (counted unless only over-admitted)
            ora.counts.excluded += kv.final_blocks(r, par.block_size) > led.oracle_admissible


@jit
def _form(cs: st.Candidates, q: st.Queue, par: st.Params, led: st.Ledger, b: st.Batch, cost: st.Cost,
          pools: st.Pools) -> int:
    """Step 1, step 2 and the deadlock breaker on the plan in the ledger. Returns NO_ASK or a budget to
    ask."""
    led.budget_left, led.reserved = led.budget, 0
    led.n_sched = led.n_preempted = led.n_cut = 0
    led.n_groups = led.victim_head = led.order_head = 0
    led.n_victims = st.UNKNOWN
    led.fallback = False
    led.pf_tokens = led.pf_seqs = led.dec_seqs = led.dec_ctx = 0
    led.pf_attn = 0.0
    # The exact plan: the batch's latency within SLO_min, unless no batch can be (clamped low)
    led.t_limit = led.slo_min if not led.clamped_low else math.inf
    led.oversize = oversize = _oversize_head(cs, q.dormant, par, led)
    for s in q.dormant.touched[:led.n_touched]:  # (a dormant head prompt: with the above)
        dormant.set_available(cs.cand[s], led)
    n = 0
    for i in cs.active:
        r, c = cs.req[i], cs.cand[i]
        dormant.set_available(c, led)
        if era.available(c, i, led) and c.urgent:
            q.urgent[n] = i
            n += 1
        if r.running:
            led.reserved += kv.owed(r, c, par)
            c.victim_key = preempt.victim_key(r, c, par, cs.chunk_mean, led.t_max)
    rank.sort_slots(cs, q.urgent, n, cs.cand.slack, False)
    led.n_urgent = n
    _add_urgent(cs, q, par, led, b, cost)
    if oversize != st.NO_SLOT:  # preempting for it only helps if it can still make its deadline
        c = cs.cand[oversize]
        floor = preempt.victim_min_key(c, cs.req[oversize].running, par, led) if c.urgent else math.inf
        preempt.force(cs, oversize, floor, True, par, led, b, cost)
    led.n_order = 0
    for i in cs.active:  # step 2's queue: what step 1 left, by key (and the dormant)
        if era.available(cs.cand[i], i, led):
            q.order[led.n_order] = i
            led.n_order += 1
    rank.sort_slots(cs, q.order, led.n_order, cs.cand.key, False)
    ask = batch.select(cs, q, par, led, b, cost, pools)
    if ask == st.NO_ASK and led.n_sched == 0:
        led.fallback = True
        led.t_limit = math.inf  # (progress first: the deadlock breaker plans no latency)
        ask = _ensure_progress(cs, q, par, led, b, cost, pools)
    return ask


@jit
def _add_urgent(cs: st.Candidates, q: st.Queue, par: st.Params, led: st.Ledger, b: st.Batch,
                cost: st.Cost) -> None:
    """Step 1 (Algorithm 1): the urgent requests in ascending slack, decodes first (beyond the budget
    the largest-slack ones are left out), then prompts, a chunk cut where the budget ends (a prompt's
    demand is elastic: cutting it is the smallest way to remove a deficit), preempting larger slacks for
    KV. Decodes whose next token fits now join at once; the others (``short``) preempt for theirs."""
    limit, free, seen, with_block, n_short = led.budget_left, led.kv_free, 0, 0, 0
    for s in q.urgent[:led.n_urgent]:
        r, c = cs.req[s], cs.cand[s]
        if not (era.available(c, s, led) and c.is_decode):
            continue
        if seen == limit:
            break
        seen += 1
        needs_block = kv.next_blocks(r, c, par.block_size) > 0
        if not needs_block or with_block < free:
            batch.add(cs, s, 1, par, led, b)
        else:
            q.short[n_short] = s
            n_short += 1
        with_block += needs_block
    for s in q.short[:n_short]:
        if led.budget_left <= 0:
            return
        if not cs.cand[s].available:  # preempted for an earlier short decode's block
            continue
        floor = preempt.victim_min_key(cs.cand[s], cs.req[s].running, par, led)
        preempt.force(cs, s, floor, False, par, led, b, cost)
    for s in q.urgent[:led.n_urgent]:
        c = cs.cand[s]
        if c.is_decode:
            continue
        if led.budget_left <= 0:
            return
        if era.available(c, s, led):
            floor = preempt.victim_min_key(c, cs.req[s].running, par, led)
            preempt.force(cs, s, floor, False, par, led, b, cost)


@jit
def _oversize_head(cs: st.Candidates, dq: st.Dormant, par: st.Params, led: st.Ledger) -> int:
    """/Chunk: a prompt longer than the budget could never run within it; the first one in queue order
    runs whole as the batch's only prompt, so it cannot starve. Returns its slot, or NO_SLOT."""
    if par.chunk:
        return st.NO_SLOT
    h, best = st.NO_SLOT, math.inf
    for i in cs.active:
        c = cs.cand[i]
        if not c.eligible or c.is_decode:
            continue
        if c.key != c.key:  # numpy's argmin: the first NaN
            return i if c.rem > led.budget else st.NO_SLOT
        if h == st.NO_SLOT or c.key < best:
            h, best = i, c.key
    if dq.hi > dq.lo:  # (equal keys: the smaller slot first)
        p = dormant.first_eligible(dq, par, led)
        if p < dq.hi:
            e = dq.queue[p]
            if h == st.NO_SLOT or e.key < best or (e.key == best and e.slot < h):
                h = e.slot
                dormant.wake(cs, dq, h, par, led)
    return h if h != st.NO_SLOT and cs.cand[h].rem > led.budget else st.NO_SLOT


@jit
def _ensure_progress(cs: st.Candidates, q: st.Queue, par: st.Params, led: st.Ledger, b: st.Batch,
                     cost: st.Cost, pools: st.Pools) -> int:
    """Decision 7, nothing fits (KV full, every candidate needs a block): the first running request in
    key order runs (the first waiting one only when nothing runs), preempting the largest keys, which
    must then fit whole so they cannot swap places with it; then step 2 again with the room made."""
    m = n_running = 0
    for running in (True, False):
        first = m
        for i in cs.active:
            if era.available(cs.cand[i], i, led) and cs.req[i].running == running:
                q.fallback[m] = i
                m += 1
        rank.sort_slots(cs, q.fallback[first:], m - first, cs.cand.key, False)
        if running:
            n_running = m
    for s in q.fallback[:n_running]:
        if preempt.force(cs, s, -math.inf, not par.chunk, par, led, b, cost):
            return batch.select(cs, q, par, led, b, cost, pools)
    # The waiting ones, active and dormant in queue order. Without an admission left none can
    # start (``force`` then returns at once, changing nothing).
    dq, j = q.dormant, n_running
    p, end = dq.lo, dormant.queue_end(dq, led)
    while led.admissions >= 1:
        if j < m and (p >= end or dormant.before_entry(cs, q.fallback[j], dq, p)):
            s = q.fallback[j]
            j += 1
        elif p < end:
            s = dq.queue[p].slot
            p += 1
            dormant.wake(cs, dq, s, par, led)
            if not era.available(cs.cand[s], s, led):
                continue
        else:
            break
        if preempt.force(cs, s, -math.inf, not par.chunk, par, led, b, cost):
            return batch.select(cs, q, par, led, b, cost, pools)
    return st.NO_ASK


@jit
def _diagnostics(cs: st.Candidates, step: st.Step, par: st.Params, led: st.Ledger, b: st.Batch,
                 cost: st.Cost, ora: st.Oracle, info: st.Info) -> None:
    n_late = n_lost = step.n_dormant  # (late and lost, all of them)
    n_dec = max_chunk = 0
    for i in cs.active:
        n_late += cs.cand[i].slack < 0.0
        n_lost += cs.cand[i].lost
    for j in range(led.n_sched):
        if cs.cand[b.slots[j]].is_decode:
            n_dec += 1
        else:
            max_chunk = max(max_chunk, b.tokens[j])
    info.token_budget, info.t_max = led.budget, led.t_max
    info.slo_min = led.slo_min if math.isfinite(led.slo_min) else math.nan
    info.budget_clamped_low, info.budget_clamped_high = led.clamped_low, led.clamped_high
    info.n_candidates, info.n_urgent, info.n_late, info.n_lost = step.n, led.n_urgent, n_late, n_lost
    info.n_preempted, info.n_scheduled = led.n_preempted, led.n_sched
    info.n_decode, info.n_prefill = n_dec, led.n_sched - n_dec
    info.n_decode_skipped = led.n_decodes - n_dec
    info.max_chunk, info.n_cut_chunks, info.n_groups = max_chunk, led.n_cut, led.n_groups
    info.era_active, info.progress_fallback = led.era_owner != st.NO_SLOT, led.fallback
    info.chunk_mean, info.kv_free_blocks = cs.chunk_mean, led.kv_free
    info.oracle_reforms, info.oracle_excluded = ora.counts.reforms, ora.counts.excluded
    info.oracle_admissible = led.oracle_admissible
    info.t_planned = budget.formed_time(par, led, cost)
    info.plan_slo = led.t_limit if led.t_limit != math.inf else math.nan
    info.planned_overrun = info.t_planned * par.time_scale > led.t_limit  # (False for NaN)
    info.time_scale = par.time_scale / par.tbt_shrink  # (the closed loop's correction x (1 + margin))


@jit
def _finish(led: st.Ledger, b: st.Batch, out: st.Outcome) -> None:
    """The outcome; whether the batch is the previous decision's with nothing else (no preemption)."""
    n = led.n_sched
    same = n == led.last_n_sched and led.n_preempted == 0
    for j in range(n):
        if b.last_slots[j] != b.slots[j] or b.last_tokens[j] != b.tokens[j]:
            same = False
        b.last_slots[j], b.last_tokens[j] = b.slots[j], b.tokens[j]
    led.last_n_sched = n
    out.n_sched, out.n_preempted, out.n_cut, out.budget = n, led.n_preempted, led.n_cut, led.budget
    out.era_owner, out.same_batch = led.era_owner, same
