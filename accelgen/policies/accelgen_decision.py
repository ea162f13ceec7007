"""AccelGen's decision (SPEC 4, paper sections 4.2-4.4, Algorithms 1-2): the one implementation,
compiled with numba, run by the simulator and by the vLLM plugin alike.

``decide(d)`` forms one iteration's batch in the arrays ``d`` (``accelgen_workspace``):
``_columns`` (per candidate), ``_plan`` (slack, urgency, SLO_min, ``token_budget``), ``_form``
(step 1 with preemption, Algorithm 1; step 2, slack groups and Euclidean selection, Algorithm 2;
the deadlock breaker; ERA in ``_add``), ``_diagnostics``. Variants are flags in its parameters:
the ablations, the budget rule, ERA and its scope, the Oracle's exact KV plan.

A linear cost model (``CostModel.linear_terms``) and the analytic one (``roofline_terms``) are
evaluated here (``linear_time``, ``roofline_time``: the functions the models themselves run). For
any other, ``decide`` returns the budget whose full-batch latency it needs (the batch in ``ask``);
``Workspace.run`` calls it again with that latency in ``d.times`` (a pure function of its inputs,
it repeats the same steps up to there). Builds: ``accelgen_compiled``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from accelgen.costmodel.analytic import roofline_time
from accelgen.costmodel.linear import linear_time
from accelgen.policies.accelgen_table import LOST_OFFSET, UNCOUNTED
from accelgen.policies.accelgen_workspace import DORMANT_BLOCK

_jit = njit(cache=True, error_model="numpy", _nrt=False)
_linear_time = _jit(linear_time)
_roofline_time = _jit(roofline_time)

NO_LIMIT = 1 << 62  # a block count no request reaches
HIDDEN = NO_LIMIT + 1  # (Oracle) the need of an over-admitted dormant entry: never searched for


# -- slack (SPEC 4.1) --------------------------------------------------------------------------
@_jit
def n_chunks(tokens: int, is_decode: bool, chunk_mean: float) -> float:
    """N_ck: iterations the next output still needs: 1 for a decode, else the tokens in chunks
    of the running mean chunk length L_c."""
    return 1.0 if is_decode else np.ceil(tokens / chunk_mean)


@_jit
def slack(to_deadline: float, chunks: float, t_max: float) -> float:
    """s = deadline - now - T_e with T_e = N_ck x T_max: how long a request can still wait."""
    return to_deadline - chunks * t_max


# -- KV arithmetic -----------------------------------------------------------------------------
@_jit
def _blocks_to_add(d: Any, s: int, c: int) -> int:
    """Blocks request ``s`` must add to hold KV for ``c`` more tokens."""
    r, bs = d.requests[s], d.state[0].params.block_size
    return max((r.computed + c + bs - 1) // bs - r.blocks, 0)


@_jit
def _next_blocks(d: Any, s: int) -> int:
    """Blocks ``s``'s next token needs. This and the two below are kept per candidate for the
    decision: a request's state does not change while its batch forms."""
    c = d.cand[s]
    if c.next_blocks < 0:
        c.next_blocks = _blocks_to_add(d, s, 1)
    return c.next_blocks


@_jit
def _owed(d: Any, s: int) -> int:
    """Blocks promised to running ``s``: its remaining prompt or next token, plus growth."""
    c = d.cand[s]
    if c.owed < 0:
        c.owed = _blocks_to_add(d, s, c.rem + d.state[0].params.growth)
    return c.owed


@_jit
def _owed_after(d: Any, s: int, c: int) -> int:
    """Blocks owed to ``s`` after it ran ``c`` tokens (the rest, or its next token, + growth)."""
    r, bs, rem = d.requests[s], d.state[0].params.block_size, d.cand[s].rem
    done = r.computed + c
    held = max(r.blocks, (done + bs - 1) // bs)
    nxt = (rem - c if c < rem else 1) + d.state[0].params.growth
    return max(0, (done + nxt + bs - 1) // bs - held)


@_jit
def _admission_blocks(d: Any, s: int, rem: int) -> int:
    """Blocks a prompt holding no KV needs to start: all of it (``rem`` tokens), its first token
    and the growth reserve, the reserve capped at the KV's size (a request that fits alone can
    always start)."""
    par = d.state[0].params
    return max(_blocks_to_add(d, s, rem + 1),
               min(_blocks_to_add(d, s, rem + 1 + par.growth), par.total_blocks))


@_jit
def _admission_need(d: Any, s: int) -> int:
    """``_admission_blocks`` of candidate ``s``, kept for the decision."""
    c = d.cand[s]
    if c.admission_blocks < 0:
        c.admission_blocks = _admission_blocks(d, s, c.rem)
    return c.admission_blocks


@_jit
def _admissible(d: Any) -> int:
    """Free blocks owed to no running request."""
    return d.state[0].ledger.kv_free - d.state[0].ledger.reserved


@_jit
def _prompt_room(d: Any, s: int) -> int:
    """Tokens running prompt ``s`` may add: its last block's room plus the free blocks owed to
    nobody else."""
    r, bs = d.requests[s], d.state[0].params.block_size
    spare = min(d.state[0].ledger.kv_free, _admissible(d) + _owed(d, s))
    return max(0, r.blocks * bs - r.computed) + max(0, spare) * bs


@_jit
def _final_blocks(d: Any, s: int) -> int:
    """(Oracle) Blocks ``s`` holds at its last forward pass: prompt + true output - 1 tokens."""
    r, bs = d.requests[s], d.state[0].params.block_size
    return (r.prompt + r.true_out - 1 + bs - 1) // bs


# -- 1. per-candidate columns ------------------------------------------------------------------
@_jit
def _candidate(d: Any, i: int) -> None:
    """The columns of candidate ``i`` that hold for the whole decision."""
    st, par, led = d.state[0].step, d.state[0].params, d.state[0].ledger
    r, c, owner = d.requests[i], d.cand[i], led.era_owner_start
    c.total = r.prompt + r.n_out
    c.rem = c.total - r.computed
    c.is_decode = r.n_out > 0 and c.rem == 1
    c.n_chunks = n_chunks(c.rem, c.is_decode, st.chunk_mean)
    c.to_deadline = r.deadline - st.now
    c.online_decode = c.is_decode and r.online
    c.slo_iter = r.tbt if c.online_decode else c.to_deadline / c.n_chunks
    c.is_long = not c.is_decode and c.total >= par.long_threshold
    c.eligible = owner < 0 or not c.is_long or i == owner
    c.lost = par.order and par.lost_last and r.online and (r.lost or c.to_deadline < 0.0)
    c.available = c.member = c.urgent = c.counted = False
    c.next_blocks = c.owed = c.admission_blocks = -1  # not yet needed
    c.stamp = led.pass_id


@_jit
def _columns(d: Any) -> None:
    st, par, led, out = d.state[0].step, d.state[0].params, d.state[0].ledger, d.state[0].outcome
    # ERA: the owner keeps it until its prefill completes (scope prefill) or it finishes (scope
    # request); a preempted owner holds no KV and releases it too.
    owner = st.era_owner if par.era else -1
    if owner >= 0:
        r = d.requests[owner]
        prefill_done = r.n_out > 0 and r.prompt + r.n_out - r.computed == 1
        if not r.running or (prefill_done and not par.era_whole_request):
            owner = -1
    out.era_owner = led.era_owner_start = owner
    led.pass_id += 1
    led.n_touched = 0
    led.dormant_head = st.dormant_lo
    led.oversize = -1
    led.n_decodes = led.decode_ctx = led.prefill_ctx = 0
    if st.reindex or st.dirty_lo < st.dirty_hi or st.n_gone:
        _index_dormant(d)
    for k in range(st.n_active):
        i = d.active[k]
        _candidate(d, i)
        r = d.requests[i]
        if r.running:  # what a full batch reads besides its new tokens (T_max)
            if d.cand[i].is_decode:
                led.n_decodes += 1
                led.decode_ctx += r.computed
            elif r.computed > led.prefill_ctx:
                led.prefill_ctx = r.computed
    if par.exact_kv:
        _oracle_admission(d)


@_jit
def _oracle_admission(d: Any) -> None:
    """(Oracle, exact KV plan) Only requests whose final KV fits in the free KV not promised to the
    running requests' final KV are eligible (no preemption is ever needed); nor the over-admitted."""
    st, out = d.state[0].step, d.state[0].outcome
    promised = 0
    for k in range(st.n_active):
        i = d.active[k]
        if d.requests[i].running:
            promised += max(_final_blocks(d, i) - d.requests[i].blocks, 0)
    out.oracle_admissible = st.free_blocks - promised
    out.oracle_excluded = out.oracle_n_over + _dormant_over(d, out.oracle_admissible)
    for k in range(st.n_active):
        i = d.active[k]
        if d.requests[i].running:
            continue
        if _final_blocks(d, i) > out.oracle_admissible:
            d.cand[i].eligible = False
            out.oracle_excluded += 1
        elif _over_listed(d, i):  # (a dormant one: hidden, ``_hide``, and ``_wake``)
            d.cand[i].eligible = False


@_jit
def _over_listed(d: Any, s: int) -> bool:
    """(Oracle) Whether ``s`` is one of this decision's over-admitted requests."""
    return d.cand[s].over


# -- 1b. the dormant queue -----------------------------------------------------------------------
@_jit
def _index_dormant(d: Any) -> None:
    """Take in the dormant queue's changes: for its new entries, the admission need, final KV and
    length class; the minima of each block of DORMANT_BLOCK positions that changed
    (``_dormant_next`` skips whole blocks); for the Oracle, the count of their final KV, without
    the entries that left (``dormant_finals``). With ``reindex``, every entry again. (Entries keep
    what was derived for them: a dormant request's columns do not change while it waits.)"""
    st, par = d.state[0].step, d.state[0].params
    lo, hi = st.dormant_lo, st.dormant_lo + st.n_dormant
    full = st.reindex
    if full:
        d.dormant_finals[:] = 0
        a, b = lo, hi
    else:
        a, b = max(st.dirty_lo, lo), min(st.dirty_hi, hi)
        for k in range(st.n_gone if par.exact_kv else 0):
            _count_final(d, d.dormant_gone[k], -1)
    # Only the changed blocks: a block outside them holds the same entries (or fewer, at the
    # queue's ends: its minima are then lower bounds, which only means looking inside it).
    for blk in range(a // DORMANT_BLOCK, (b - 1) // DORMANT_BLOCK + 1 if a < b else 0):
        for q in range(max(blk * DORMANT_BLOCK, lo), min((blk + 1) * DORMANT_BLOCK, hi)):
            e = d.dormant[q]
            if full or e.final == UNCOUNTED:
                r = d.requests[e.slot]
                e.need = _dormant_need(d, e.slot)
                e.final = _final_blocks(d, e.slot) if par.exact_kv else 0
                e.long = r.prompt + r.n_out >= par.long_threshold
                if par.exact_kv:
                    _count_final(d, e.final, 1)
        _block_changed(d, blk)
    st.reindex = False
    st.dirty_lo = st.dirty_hi = st.n_gone = 0


@_jit
def _dormant_need(d: Any, s: int) -> int:
    """Blocks dormant ``s`` needs to start (all its pending tokens and the growth reserve)."""
    r = d.requests[s]
    return _admission_blocks(d, s, r.prompt + r.n_out - r.computed)


@_jit
def _block_changed(d: Any, blk: int) -> None:
    """Block ``blk`` of the dormant queue changed: its minima are computed again when needed."""
    d.dormant_minima[blk].final_max = -1


@_jit
def _block_minima(d: Any, blk: int, final_max: int) -> Any:
    """The minima of block ``blk`` of the dormant queue over its entries holding at most
    ``final_max`` blocks at the end (kept until the block changes or another ``final_max``)."""
    mb = d.dormant_minima[blk]
    if mb.final_max == final_max:
        return mb
    lo, hi = d.state[0].step.dormant_lo, _dormant_end(d)
    mb.final_max, mb.need, mb.need_short = final_max, HIDDEN, HIDDEN
    for q in range(max(blk * DORMANT_BLOCK, lo), min((blk + 1) * DORMANT_BLOCK, hi)):
        e = d.dormant[q]
        if e.final <= final_max:
            mb.need = min(mb.need, e.need)
            if not e.long:
                mb.need_short = min(mb.need_short, e.need)
    return mb


@_jit
def _count_final(d: Any, final: int, delta: int) -> None:
    """(Oracle) Add ``delta`` dormant requests holding ``final`` blocks at the end (a Fenwick
    tree over final KV, clipped to the cache's size plus one)."""
    tree = d.dormant_finals
    i = min(max(final, 0), tree.size - 2) + 1
    while i < tree.size:
        tree[i] += delta
        i += i & -i


@_jit
def _dormant_over(d: Any, admissible: int) -> int:
    """(Oracle) Dormant requests whose final KV exceeds ``admissible`` blocks."""
    n = d.state[0].step.n_dormant
    if n == 0 or admissible < 0:
        return n
    tree, at_most = d.dormant_finals, 0
    i = min(admissible, tree.size - 2) + 1
    while i > 0:
        at_most += tree[i]
        i -= i & -i
    return n - at_most


@_jit
def _dormant_end(d: Any) -> int:
    """The position after the dormant queue's last entry."""
    return d.state[0].step.dormant_lo + d.state[0].step.n_dormant


@_jit
def _dormant_next(d: Any, q: int, need_max: int, final_max: int, allow_long: bool) -> int:
    """The first position from ``q`` on whose request needs at most ``need_max`` blocks to start,
    holds at most ``final_max`` at the end, and is not long unless ``allow_long``
    (``_dormant_end`` if none): necessary conditions of being available and feasible, tested on
    a block's minima before its entries."""
    m = _dormant_end(d)
    while q < m:
        if q % DORMANT_BLOCK == 0:
            mb = _block_minima(d, q // DORMANT_BLOCK, final_max)
            if (mb.need if allow_long else mb.need_short) > need_max:
                q += DORMANT_BLOCK
                continue
        e = d.dormant[q]
        if e.need <= need_max and e.final <= final_max and (allow_long or not e.long):
            return q
        q += 1
    return m


@_jit
def _dormant_final_max(d: Any) -> int:
    """Final KV a dormant request may hold to be eligible (the Oracle's exact plan)."""
    return d.state[0].outcome.oracle_admissible if d.state[0].params.exact_kv else NO_LIMIT


@_jit
def _dormant_allow_long(d: Any) -> bool:
    """Whether a long dormant prompt may still join (ERA)."""
    return not (d.state[0].params.era and d.state[0].outcome.era_owner >= 0)


@_jit
def _wake(d: Any, s: int) -> None:
    """The columns of dormant ``s`` for this pass, once (at the plan's T_max): what ``_columns``,
    ``_urgency`` and ``_form`` give an active candidate."""
    led, par, c = d.state[0].ledger, d.state[0].params, d.cand[s]
    if c.stamp == led.pass_id:
        return
    _candidate(d, s)
    if par.exact_kv and (_final_blocks(d, s) > d.state[0].outcome.oracle_admissible
                         or _over_listed(d, s)):
        c.eligible = False
    _rank(d, s, led.t_max)
    _set_available(d, s)
    d.lists[led.n_touched].touched = s
    led.n_touched += 1


@_jit
def _set_available(d: Any, s: int) -> None:
    """Whether ``s`` may join (``_form``): eligible, not shut out by an oversized head prompt
    (/Chunk) or by a long prompt that took ERA in this decision."""
    c, led, par = d.cand[s], d.state[0].ledger, d.state[0].params
    c.available = (c.eligible and (led.oversize < 0 or c.is_decode)
                   and not (par.era and c.is_long and d.state[0].outcome.era_owner >= 0
                            and d.state[0].outcome.era_owner != s))


@_jit
def _first_eligible_dormant(d: Any) -> int:
    """Position of the first eligible dormant request (``_dormant_end`` if none): within the
    Oracle's final KV, not over-admitted (those are hidden, ``_hide``)."""
    return _dormant_next(d, d.state[0].step.dormant_lo, NO_LIMIT, _dormant_final_max(d),
                         _dormant_allow_long(d))


# -- 2. urgency and the token budget -----------------------------------------------------------
@_jit
def _rank(d: Any, i: int, t_max: float) -> None:
    """Slack, counted, urgency and queue key of candidate ``i`` at ``t_max``."""
    par, c = d.state[0].params, d.cand[i]
    c.slack = slack(c.to_deadline, c.n_chunks, t_max)
    # A late prompt cannot be rescued by a smaller batch (its remaining time grows with its
    # remaining tokens), so only on-track requests and online decodes lower SLO_min.
    c.counted = c.online_decode or c.slack >= 0.0
    if par.order:
        # A request past its deadline is not urgent (running it now saves no deadline),
        # except a running decode: its TBT chain restarts at its next token.
        c.urgent = (c.eligible and c.slack < t_max
                    and (par.late_is_urgent or c.slack >= 0.0 or c.is_decode))
        # Lost prompts after every on-track candidate, first come first served among them.
        lost_prompt = c.lost and not c.is_decode
        c.key = d.requests[i].arrival + LOST_OFFSET if lost_prompt else c.slack
    else:
        c.urgent = False
        c.key = d.requests[i].arrival


@_jit
def _urgency(d: Any, t_max: float) -> float:
    """Slack, urgency, counted and key of every active candidate at ``t_max``. Returns SLO_min:
    the tightest per-iteration SLO among the urgent requests and the head slack group (or inf).
    Dormant requests are late, lost prompts: never urgent nor counted; the first eligible one's
    key may head the queue."""
    st, par = d.state[0].step, d.state[0].params
    best, k1, any_rest = math.inf, math.inf, False
    for k in range(st.n_active):
        i = d.active[k]
        _rank(d, i, t_max)
        c = d.cand[i]
        if c.urgent:
            if c.counted and c.slo_iter < best:
                best = c.slo_iter
        elif c.eligible:
            if not any_rest or c.key < k1:
                k1 = c.key
            any_rest = True
    if st.n_dormant > 0 and (not any_rest or k1 > d.dormant[st.dormant_lo].key):
        q = _first_eligible_dormant(d)
        if q < _dormant_end(d) and (not any_rest or d.dormant[q].key < k1):
            k1, any_rest = d.dormant[q].key, True
    for k in range(st.n_active if any_rest else 0):
        c = d.cand[d.active[k]]
        if (c.eligible and not c.urgent and c.key <= k1 + par.gamma and c.counted
                and c.slo_iter < best):
            best = c.slo_iter
    return best


@_jit
def _forward_time(d: Any, budget: int) -> float:
    """The cost model's ``forward_time(budget)`` (a prefill-only iteration)."""
    par = d.state[0].params
    if par.cost_linear:
        return _linear_time(par, budget, 0, budget * (0 + (budget + 1) / 2))
    return d.times[budget].forward


@_jit
def _t_max(d: Any, budget: int) -> float:
    """T_max, the paper's "maximum batch execution time" at ``budget`` tokens: every running decode
    with its context plus a chunk filling the budget at the longest running prompt's context
    (decision 10), at least ``forward_time(budget)``. NaN: ask the cost model (batch in ``ask``)."""
    par, led = d.state[0].params, d.state[0].ledger
    n = min(led.n_decodes, budget)
    ctx = led.decode_ctx if n == led.n_decodes else led.decode_ctx * n // max(led.n_decodes, 1)
    prefill = budget - n if budget > n else 0
    attn = prefill * (led.prefill_ctx + (prefill + 1) / 2) if prefill > 0 else 0.0
    if par.cost_linear:
        full = _linear_time(par, prefill + n, ctx, attn)
    elif par.cost_roofline:
        full = _roofline_time(d.state[0].roofline, prefill, 1 if prefill > 0 else 0, attn, n, ctx)
    else:
        full = d.times[budget].full_batch
        if math.isnan(full):
            ask = d.state[0].ask  # (a BatchShape)
            ask.prefill_tokens, ask.prefill_seqs, ask.prefill_attn = prefill, prefill > 0, attn
            ask.decode_seqs, ask.decode_ctx = n, ctx
            return math.nan
    fwd = _forward_time(d, budget)
    return fwd if fwd > full else full


@_jit
def _largest_fitting(d: Any, t: float, limit: int) -> int:
    """Budget rule ``model``: the largest forward size S <= ``limit`` with ``forward_time(S) <=
    t`` (0 if none), by bisection (forward times do not decrease with S; the same answer as
    ``costmodel.pivot.budget_for_time``)."""
    if _forward_time(d, 1) > t:
        return 0
    if _forward_time(d, limit) <= t:
        return limit
    lo, hi = 1, limit  # forward_time(lo) <= t < forward_time(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _forward_time(d, mid) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@_jit
def token_budget(d: Any, slo: float) -> tuple[int, bool, bool]:
    """The token budget S_b for the tightest per-iteration SLO (SPEC 4.2), with whether it was
    clamped low and high: ``batch``: the largest budget whose T_max (the batch being formed)
    fits SLO_min (``_fit_batch``); ``paper``: S_pf x SLO_min / T_pf; ``model``: the largest
    forward size whose latency fits SLO_min; clamped to [min_budget, cap]. The one place the
    rule lives. A negative budget -1 - S: the cost model must first give T_max at S."""
    par = d.state[0].params
    if not math.isfinite(slo):  # nothing constrains it
        return par.cap, False, slo > 0
    raw = 0
    if slo > 0:
        if par.budget_model or par.budget_batch:  # one past the cap: "at least the cap"
            raw = _largest_fitting(d, slo, par.cap + 1)
        else:
            x = par.s_pf * slo / par.t_pf
            raw = int(x) if x < 4e18 else 4 * 10 ** 18
    if raw < par.min_budget:
        return par.min_budget, True, False
    tokens, high = (par.cap, True) if raw > par.cap else (raw, False)
    if par.budget_batch:
        fitted, at_min = _fit_batch(d, slo, tokens)
        if fitted < tokens:  # (or an ask: negative)
            return fitted, at_min, False
    return tokens, False, high


BATCH_FIT_ROUNDS = 4  # T_max's composition changes little between rounds: 1-2 suffice


@_jit
def _fit_batch(d: Any, slo: float, tokens: int) -> tuple[int, bool]:
    """Budget rule ``batch``: shrink ``tokens`` until T_max, the latency of the batch being
    formed (running decodes with their contexts, the prompt chunk at its context, the fixed
    cost), fits SLO_min, not only a prefill-only forward of that size. Each round takes the
    largest S with ``forward_time(S) <= SLO_min - (T_max - forward_time)`` at the current size:
    the composition's extra time shrinks with the chunk, so a round never overshoots. Returns
    the budget (or -1 - the budget whose T_max the cost model must give first) and whether it
    is the minimum."""
    par = d.state[0].params
    for _ in range(BATCH_FIT_ROUNDS):
        if tokens <= par.min_budget:
            return par.min_budget, True
        t = _t_max(d, tokens)
        if math.isnan(t):
            return -1 - tokens, False
        if t <= slo:
            return tokens, False
        extra = t - _forward_time(d, tokens)
        tokens = min(_largest_fitting(d, slo - extra, tokens - 1), tokens - 1)
    return max(tokens, par.min_budget), tokens <= par.min_budget


@_jit
def _plan(d: Any) -> int:
    """SLO_min, token budget and T_max (into the ledger): urgency at the last budget's T_max, its
    budget, and when the new budget's T_max is longer, urgency again at it (a larger budget means
    longer iterations). Returns -1, or a budget whose latency the cost model must give first."""
    st, led, out = d.state[0].step, d.state[0].ledger, d.state[0].outcome
    t_max = _t_max(d, st.prev_budget)
    if math.isnan(t_max):
        return st.prev_budget
    slo_min = _urgency(d, t_max)
    tokens, low, high = token_budget(d, slo_min)
    if 0 <= tokens != st.prev_budget:
        t_new = _t_max(d, tokens)
        if math.isnan(t_new):
            return tokens
        if t_new > t_max:
            slo_min = min(slo_min, _urgency(d, t_new))
            tokens, low, high = token_budget(d, slo_min)
            t_max = t_new
    if tokens < 0:
        return -1 - tokens
    led.t_max, led.slo_min, led.clamped_low, led.clamped_high = t_max, slo_min, low, high
    out.budget = tokens
    return -1


# -- sorting -----------------------------------------------------------------------------------
@_jit
def _before(a: Any, b: Any) -> bool:
    """``a`` strictly before ``b`` in numpy's sort order (NaN last)."""
    return a < b or (b != b and a == a)


@_jit
def _merge_sort(idx: Any, m: int, keys: Any, tmp: Any) -> None:
    """Sort ``idx[:m]`` by ``keys[idx]``, stably (numpy's ``kind="stable"`` order), in place with
    ``tmp`` as the merge buffer: insertion-sorted runs of 16, then bottom-up merges."""
    for lo in range(0, m, 16):
        for i in range(lo + 1, min(lo + 16, m)):
            x, j = idx[i], i - 1
            while j >= lo and _before(keys[x], keys[idx[j]]):
                idx[j + 1] = idx[j]
                j -= 1
            idx[j + 1] = x
    src, dst, width, in_tmp = idx, tmp, 16, False
    while width < m:
        for lo in range(0, m, 2 * width):
            mid, hi = min(lo + width, m), min(lo + 2 * width, m)
            i, j = lo, mid
            for o in range(lo, hi):  # the left run's element first on ties
                if j < hi and (i == mid or _before(keys[src[j]], keys[src[i]])):
                    dst[o] = src[j]
                    j += 1
                else:
                    dst[o] = src[i]
                    i += 1
        src, dst, width, in_tmp = dst, src, width * 2, not in_tmp
    for i in range(m if in_tmp else 0):
        idx[i] = tmp[i]


@_jit
def _sort_slots(d: Any, idx: Any, m: int, keys: Any, descending: bool) -> None:
    """Sort the slots ``idx[:m]`` by ``keys[slot]`` (a candidate column; ``descending``: negated,
    NaN still last), stably, with the keys gathered into ``d.scratch`` first: sorting contiguous
    numbers is about twice as fast as reaching into the candidates' records."""
    n = d.scratch.size // 3
    sorted_keys, order, tmp = d.scratch[:n].view(np.float64), d.scratch[n:2 * n], d.scratch[2 * n:]
    for p in range(m):
        sorted_keys[p], order[p] = -keys[idx[p]] if descending else keys[idx[p]], p
    _merge_sort(order, m, sorted_keys, tmp)
    for p in range(m):
        tmp[p] = idx[order[p]]
    for p in range(m):
        idx[p] = tmp[p]


# -- the batch ledger --------------------------------------------------------------------------
@_jit
def _add(d: Any, s: int, c: int) -> None:
    """``s`` joins the batch with ``c`` tokens."""
    led, out, cs = d.state[0].ledger, d.state[0].outcome, d.cand[s]
    if d.requests[s].running:
        led.reserved -= _owed(d, s)
    else:
        led.admissions -= 1
    led.reserved += _owed_after(d, s, c)
    led.kv_free -= _blocks_to_add(d, s, c)
    led.budget_left -= c
    d.lists[out.n_sched].slots, d.lists[out.n_sched].tokens = s, c
    out.n_sched += 1
    cs.member, cs.available = True, False
    if not cs.is_decode and c < cs.rem:
        d.lists[out.n_cut].cut_chunks = c
        out.n_cut += 1
    if d.state[0].params.era and cs.is_long and out.era_owner < 0:
        out.era_owner = s  # ERA: no other long prompt starts while this one is in prefill
        for k in range(d.state[0].step.n_active):  # (dormant ones: ``_set_available``)
            if d.cand[d.active[k]].is_long:
                d.cand[d.active[k]].available = False
        for k in range(led.n_touched):
            if d.cand[d.lists[k].touched].is_long:
                d.cand[d.lists[k].touched].available = False


# -- preemption --------------------------------------------------------------------------------
@_jit
def _preempt(d: Any, v: int) -> None:
    led, out = d.state[0].ledger, d.state[0].outcome
    d.lists[out.n_preempted].preempted = v
    out.n_preempted += 1
    # As vLLM V1: nothing else is admitted in a step that preempted, so blocks freed for an
    # urgent request are not handed straight to a new prompt.
    led.admissions = min(led.admissions, 0)
    led.kv_free += d.requests[v].blocks
    led.reserved -= _owed(d, v)
    d.cand[v].available = False


_FOR_ADMISSION, _FOR_DECODE, _FOR_CHUNK = 0, 1, 2  # what ``_free_kv`` makes room for


@_jit
def _room(d: Any, kind: int, s: int) -> int:
    """Room for ``s``: blocks owed to nobody (an admission's whole prompt), free blocks (a
    decode's next one), tokens (a running prompt's chunk)."""
    if kind == _FOR_ADMISSION:
        return _admissible(d)
    return d.state[0].ledger.kv_free if kind == _FOR_DECODE else _prompt_room(d, s)


@_jit
def _free_kv(d: Any, kind: int, need: int, s: int, min_key: float) -> None:
    """Preempt (recompute) the running requests with the largest slack until ``s`` has room for
    ``need`` (Algorithm 1, lines 2-4), only those whose slack once preempted exceeds ``min_key``.
    Victims are sorted when first needed (most decisions preempt nobody); the exact plan has none."""
    led, lists = d.state[0].ledger, d.lists
    if _room(d, kind, s) >= need:
        return
    if led.n_victims < 0:
        led.n_victims = 0
        for k in range(0 if d.state[0].params.exact_kv else d.state[0].step.n_active):
            i = d.active[k]
            if d.requests[i].running:
                lists[led.n_victims].victims = i
                led.n_victims += 1
        _sort_slots(d, lists.victims, led.n_victims, d.cand.victim_key, True)
    while _room(d, kind, s) < need and led.victim_head < led.n_victims:
        v = lists[led.victim_head].victims
        if d.cand[v].victim_key <= min_key:
            return
        led.victim_head += 1
        if v != s and not d.cand[v].member:
            _preempt(d, v)


@_jit
def _victim_min_key(d: Any, s: int) -> float:
    """Victims must have a larger key than this: for a running request, its own slack once
    preempted (evicting it would cost less); for a prompt being admitted, outside its slack
    group (gamma) and not urgent once preempted (T_max)."""
    if d.requests[s].running:
        return d.cand[s].victim_key
    floor = d.state[0].ledger.t_max if d.state[0].params.order else -math.inf
    return max(d.cand[s].key + d.state[0].params.gamma, floor)


@_jit
def _force(d: Any, s: int, min_key: float, oversize: bool) -> bool:
    """Add ``s`` with the largest chunk the budget allows, preempting running requests whose slack
    once preempted exceeds ``min_key`` for its KV. ``oversize``: the /Chunk starvation guard."""
    led, c, chunk = d.state[0].ledger, d.cand[s], d.state[0].params.chunk
    tokens = 1 if c.is_decode else (c.rem if oversize or not chunk else min(c.rem, led.budget_left))
    if tokens < 1 or (not c.is_decode and not chunk and not oversize and c.rem > led.budget_left):
        return False
    if not d.requests[s].running:  # admission: the whole remaining prompt must fit
        if led.admissions < 1:
            return False
        kind, need = _FOR_ADMISSION, _admission_need(d, s)
    elif c.is_decode:
        kind, need = _FOR_DECODE, _next_blocks(d, s)
    else:
        kind, need = _FOR_CHUNK, tokens
    _free_kv(d, kind, need, s, min_key)
    room = _room(d, kind, s)
    if need > room:
        if kind != _FOR_CHUNK or not chunk or room < 1:
            return False
        tokens = room  # dynamic chunking: cut where the free KV ends
    _add(d, s, tokens)
    return True


# -- 3a. step 1: urgent requests (Algorithm 1) -------------------------------------------------
@_jit
def _add_urgent(d: Any) -> None:
    """All urgent requests join, in ascending slack: decodes first (one token each; beyond the
    budget the largest-slack ones are left out), then prompts, each chunk cut where the budget ends
    (a prompt's demand is elastic under dynamic chunking, so cutting it is the smallest way to
    remove a budget deficit). When KV runs out, running requests with a larger slack are preempted."""
    led, lists = d.state[0].ledger, d.lists
    # Decodes whose next token fits now (no new block, or one while blocks are free) join at
    # once; the others (``short``) preempt for theirs.
    limit, free, seen, with_block, n_short = led.budget_left, led.kv_free, 0, 0, 0
    for j in range(led.n_urgent):
        s = lists[j].urgent
        if not (d.cand[s].available and d.cand[s].is_decode):
            continue
        if seen == limit:
            break
        seen += 1
        needs_block = _next_blocks(d, s) > 0
        if not needs_block or with_block < free:
            _add(d, s, 1)
        else:
            lists[n_short].short = s
            n_short += 1
        with_block += needs_block
    for j in range(n_short):
        if led.budget_left <= 0:
            return
        s = lists[j].short
        if d.cand[s].available:  # (not preempted for an earlier one's block meanwhile)
            _force(d, s, _victim_min_key(d, s), False)
    for j in range(led.n_urgent):
        s = lists[j].urgent
        if d.cand[s].is_decode:
            continue
        if led.budget_left <= 0:
            return
        if d.cand[s].available:
            _force(d, s, _victim_min_key(d, s), False)


@_jit
def _oversize_head(d: Any) -> int:
    """/Chunk: a prompt longer than the budget could never run whole within it. When it is the
    first prompt in queue order it runs whole as the only prompt of the batch (decodes still
    join), so it cannot starve. Returns its slot, or -1."""
    st, chunk = d.state[0].step, d.state[0].params.chunk
    h, best, nan = -1, math.inf, False
    for k in range(0 if chunk else st.n_active):
        i = d.active[k]
        c = d.cand[i]
        if not c.eligible or c.is_decode:
            continue
        if c.key != c.key:  # numpy's argmin: the first NaN
            h, nan = i, True
            break
        if h < 0 or c.key < best:
            h, best = i, c.key
    if not chunk and not nan and st.n_dormant > 0:  # (equal keys: the smaller slot first)
        q = _first_eligible_dormant(d)
        if q < _dormant_end(d):
            e = d.dormant[q]
            if h < 0 or e.key < best or (e.key == best and e.slot < h):
                h = e.slot
                _wake(d, h)
    return h if h >= 0 and d.cand[h].rem > d.state[0].outcome.budget else -1


# -- 3b. step 2: SelectRequests (Algorithm 2) --------------------------------------------------
@_jit
def _fit(d: Any, s: int) -> int:
    """Tokens ``s`` can run now without preempting anyone (0: none): a decode's one if its block
    is free; a prompt's chunk within the budget and its KV room (a fresh prompt's room is its
    whole prompt, if it may be admitted), under /Chunk only its whole rest."""
    led, c = d.state[0].ledger, d.cand[s]
    if c.is_decode:
        return 1 if _next_blocks(d, s) <= led.kv_free else 0
    if d.requests[s].running:
        room = _prompt_room(d, s)
    elif led.admissions >= 1 and _admission_need(d, s) <= _admissible(d):
        room = c.rem
    else:
        return 0
    if d.state[0].params.chunk:
        return min(c.rem, led.budget_left, room)
    return c.rem if c.rem <= led.budget_left and c.rem <= room else 0


@_jit
def _feasible(d: Any, s: int) -> bool:
    """``s`` could still join with its smallest piece of work (a whole prompt under /Chunk)."""
    led, c, chunk = d.state[0].ledger, d.cand[s], d.state[0].params.chunk
    if not d.requests[s].running or c.is_decode:
        return _fit(d, s) >= 1  # (step 2 runs while budget is left)
    spare = min(led.kv_free, _admissible(d) + _owed(d, s))  # free and owed to nobody else
    if chunk:  # its next token's block
        return _next_blocks(d, s) <= spare
    return _blocks_to_add(d, s, c.rem) <= spare and c.rem <= led.budget_left


@_jit
def _next_group(d: Any) -> int:
    """The next slack group into ``lists.group``: the feasible available candidates whose key is
    within gamma of the smallest, in key order. Returns its size (0: none)."""
    led, lists, gn, limit = d.state[0].ledger, d.lists, 0, 0.0
    # The queue: step 2's active candidates merged with the dormant queue, where only requests
    # that could start now are looked at (a waiting request needs an admission and its blocks).
    j, q, m = led.order_head, led.dormant_head, _dormant_in_queue(d)
    need_max = _admissible(d) if led.admissions >= 1 else -1
    final_max, allow_long = _dormant_final_max(d), _dormant_allow_long(d)
    while True:
        if q < m:
            q = _dormant_next(d, q, need_max, final_max, allow_long)
        if j < led.n_order and (q >= m or _before_dormant(d, lists[j].order, q)):
            s, active, head = lists[j].order, True, j == led.order_head
            j += 1
        elif q < m:
            s, active, head = d.dormant[q].slot, False, q == led.dormant_head
            q += 1
            _wake(d, s)
        else:
            break
        c = d.cand[s]
        if not c.available:
            if head and active:  # gone for this decision: later groups start after it
                led.order_head += 1
            elif head:
                led.dormant_head += 1
            continue
        if not _feasible(d, s):
            continue
        if gn == 0:
            limit = c.key + d.state[0].params.gamma
        elif c.key > limit:
            break
        lists[gn].group = s
        gn += 1
    return gn


@_jit
def _dormant_in_queue(d: Any) -> int:
    """The end of the dormant entries in the queue of this step (from ``dormant_lo``): none once
    an oversized prompt runs (/Chunk)."""
    return _dormant_end(d) if d.state[0].ledger.oversize < 0 else d.state[0].step.dormant_lo


@_jit
def _before_dormant(d: Any, s: int, q: int) -> bool:
    """Active candidate ``s`` comes before dormant entry ``q`` in queue order (key, then slot)."""
    a, b = d.cand[s].key, d.dormant[q].key
    return _before(a, b) or (a == b and s < d.dormant[q].slot)


@_jit
def _select(d: Any) -> int:
    """Step 2: SelectRequests on the head slack group, then on the following groups while budget
    and KV are left (forward size = S_b while work is available; decision 6). Returns -1, or a
    budget whose latency the cost model must give first (a group lowered SLO_min)."""
    led, out, par = d.state[0].ledger, d.state[0].outcome, d.state[0].params
    while led.budget_left > 0:
        gn = _next_group(d)
        if gn == 0:
            return -1
        led.n_groups += 1
        # Members of a later group may have a tighter per-iteration SLO: the batch's budget
        # follows the tightest one that joins. A group whose budget the batch formed so far
        # already fills cannot join: the batch stops here, planned for the SLOs it holds.
        m = math.inf
        for j in range(gn):
            c = d.cand[d.lists[j].group]
            if c.counted and c.slo_iter < m:
                m = c.slo_iter
        if m < led.slo_min:
            tokens, low, _ = token_budget(d, m)
            if tokens < 0:
                return -1 - tokens
            if tokens < out.budget:
                left = led.budget_left - (out.budget - tokens)
                if left <= 0:
                    return -1
                led.budget_left, out.budget, led.clamped_low = left, tokens, low
            led.slo_min = m
        before = out.n_sched
        if par.batch:
            _select_euclidean(d, gn)
        else:
            _fill_in_order(d, gn)
        if not par.spill_groups or out.n_sched == before:
            return -1
    return -1


@_jit
def _best_fresh(d: Any, fl: int) -> tuple[int, int]:
    """The closest of the first ``fl`` prompts holding no KV (sorted by remaining length), as
    (index, chunk), index -1 if none: one at least A_c long that may be admitted, cut to A_c
    (the smallest key among them); else the longest that fits whole (smaller key on ties)."""
    led, par = d.state[0].ledger, d.state[0].params
    if fl == 0 or led.admissions < 1:
        return -1, 0
    rem, key, a_c = d.lists.fresh_rem[:fl], d.lists.fresh_key, led.budget_left
    # rem[:hi] may be admitted (whole prompt, first token and growth reserve fit)
    free, bs = _admissible(d), par.block_size
    limit = free * bs - 1 - par.growth if free < par.total_blocks else par.total_blocks * bs - 1
    hi = np.searchsorted(rem, limit, side="right")
    if hi == 0:
        return -1, 0
    if par.chunk and rem[hi - 1] >= a_c:
        j = np.searchsorted(rem[:hi], a_c)
        for i in range(j + 1, hi):
            if key[i] < key[j]:
                j = i
        return j, a_c
    j = np.searchsorted(rem[:hi], a_c, side="right") - 1
    for i in range(j - 1, -1, -1):  # equal demand: the smaller key
        if rem[i] != rem[j]:
            break
        if key[i] < key[j]:
            j = i
    return (j, rem[j]) if j >= 0 else (-1, 0)


@_jit
def _distance(a_c: int, a_m: int, tokens: int, kv_tokens: int) -> int:
    """Squared Euclidean distance of a demand (D_c, D_m) from (A_c, A_m): exact integers, the
    same order as the distance's, and no rounding to tell apart (or tie) two candidates."""
    return (a_c - tokens) * (a_c - tokens) + (a_m - kv_tokens) * (a_m - kv_tokens)


@_jit
def _select_euclidean(d: Any, gn: int) -> None:
    """Algorithm 2 on one slack group (in key order): repeatedly add the candidate whose
    (D_c, D_m) is closest to (A_c, A_m) (remaining budget, free KV tokens) among those that fit;
    ties go to the smaller key.

    Fast by the structure of the rule rather than by rescanning every candidate per pick: a
    decode demands (1, 0) or (1, b); every other feasible item is at least as close to
    (A_c, A_m) as (1, 0), and every item with D_m >= b at least as close as (1, b); so decodes
    are picked only once no prompt fits (except against a prompt chunk needing no new block,
    compared explicitly), then in bulk. A prompt holding no KV demands (c, ceil(c/b) b): both
    coordinates grow with c, so among prompts that fit whole the longest is closest (a
    bisection), and one at least A_c long, cut to A_c, closer still. The few running prompts are
    compared one by one."""
    led, out, lists, bs = d.state[0].ledger, d.state[0].outcome, d.lists, d.state[0].params.block_size
    fl = pn = nb = na = 0  # pool sizes: fresh prompts, running prompts, decodes (block / none)
    for j in range(gn):
        s = lists[j].group
        if not d.requests[s].running:
            lists[fl].fresh = s
            fl += 1
        elif not d.cand[s].is_decode:
            lists[pn].partial = s
            pn += 1
        elif _next_blocks(d, s) > 0:
            lists[nb].dec_block = s
            nb += 1
        else:
            lists[na].dec_free = s
            na += 1
    _sort_slots(d, lists.fresh, fl, d.cand.rem, False)
    for j in range(fl):
        lists[j].fresh_rem, lists[j].fresh_key = d.cand[lists[j].fresh].rem, d.cand[lists[j].fresh].key
    hb = ha = 0  # decodes taken from the head of each pool
    while led.budget_left > 0:
        a_c, a_m = led.budget_left, led.kv_free * bs
        best_kind, best_j, best_c, best_d, best_k = -1, 0, 0, 0, math.inf
        j, tokens = _best_fresh(d, fl)
        if j >= 0:
            best_kind, best_j, best_c, best_k = 0, j, tokens, lists[j].fresh_key
            best_d = _distance(a_c, a_m, tokens, (tokens + bs - 1) // bs * bs)
        for pi in range(pn):
            s = lists[pi].partial
            tokens = _fit(d, s)
            if tokens < 1:
                continue
            dist, key = _distance(a_c, a_m, tokens, _blocks_to_add(d, s, tokens) * bs), d.cand[s].key
            if best_kind < 0 or dist < best_d or (dist == best_d and key < best_k):
                best_kind, best_j, best_c, best_d, best_k = 1, pi, tokens, dist, key
        prompt_fits = best_kind >= 0
        use_block = nb > hb and led.kv_free >= 1  # decodes: (1, b) while a block is free
        if use_block or na > ha:
            dist = _distance(a_c, a_m, 1, bs if use_block else 0)
            key = d.cand[lists[hb].dec_block].key if use_block else d.cand[lists[ha].dec_free].key
            if best_kind < 0 or dist < best_d or (dist == best_d and key < best_k):
                best_kind = 2 if use_block else 3
        if best_kind < 0:
            return
        if best_kind == 0:
            s = lists[best_j].fresh
            _add(d, s, best_c)
            long_out = out.era_owner == s  # other long prompts leave too
            w = 0 if long_out else best_j
            for i in range(w, fl):
                if i != best_j and not (long_out and d.cand[lists[i].fresh].is_long):
                    lists[w].fresh, lists[w].fresh_rem = lists[i].fresh, lists[i].fresh_rem
                    lists[w].fresh_key = lists[i].fresh_key
                    w += 1
            fl = w
        elif best_kind == 1:
            s = lists[best_j].partial
            for i in range(best_j, pn - 1):
                lists[i].partial = lists[i + 1].partial
            pn -= 1
            _add(d, s, best_c)
        elif prompt_fits:  # a decode beat a prompt chunk needing no new block
            if best_kind == 2:
                _add(d, lists[hb].dec_block, 1)
                hb += 1
            else:
                _add(d, lists[ha].dec_free, 1)
                ha += 1
        else:  # no prompt fits: (1, b) decodes while blocks are free, then (1, 0), by key
            for i in range(hb, hb + max(min(nb - hb, led.budget_left, led.kv_free), 0)):
                _add(d, lists[i].dec_block, 1)
            for i in range(ha, ha + max(min(na - ha, led.budget_left), 0)):
                _add(d, lists[i].dec_free, 1)
            return


@_jit
def _fill_in_order(d: Any, gn: int) -> None:
    """/Batch: take the group's candidates in key order, skipping those that do not fit; a
    prompt is cut where the budget or the free KV ends."""
    led = d.state[0].ledger
    for j in range(gn):
        if led.budget_left <= 0:
            return
        s = d.lists[j].group
        tokens = _fit(d, s) if d.cand[s].available else 0
        if tokens >= 1:
            _add(d, s, tokens)


@_jit
def _ensure_progress(d: Any) -> int:
    """Nothing fits (KV full, every candidate needs a block; decision 7): run the first running
    request in key order, preempting the largest-key ones for its KV (the first waiting one only
    when nothing runs), so that the victims, which must then fit whole, cannot swap places with it."""
    lists, st, led, m, n_running = d.lists, d.state[0].step, d.state[0].ledger, 0, 0
    for running in (True, False):
        first = m
        for k in range(st.n_active):
            i = d.active[k]
            if d.cand[i].available and d.requests[i].running == running:
                lists[m].fallback = i
                m += 1
        _sort_slots(d, lists.fallback[first:], m - first, d.cand.key, False)
        if running:
            n_running = m
    oversize = not d.state[0].params.chunk
    for j in range(n_running):
        if _force(d, lists[j].fallback, -math.inf, oversize):
            return _select(d)  # the preemption may have made room for more
    # The waiting ones, active and dormant in queue order. Without an admission left none can
    # start (``_force`` then returns at once, changing nothing).
    j, q, md = n_running, d.state[0].step.dormant_lo, _dormant_in_queue(d)
    while led.admissions >= 1:
        if j < m and (q >= md or _before_dormant(d, lists[j].fallback, q)):
            s = lists[j].fallback
            j += 1
        elif q < md:
            s = d.dormant[q].slot
            q += 1
            _wake(d, s)
            if not d.cand[s].available:
                continue
        else:
            break
        if _force(d, s, -math.inf, oversize):
            return _select(d)
    return -1


@_jit
def _form(d: Any) -> int:
    """Step 1, step 2 and the deadlock breaker, on the plan in the ledger. Returns -1, or a
    budget whose latency the cost model must give first."""
    g, lists = d.state[0], d.lists
    st, par, led, out = g.step, g.params, g.ledger, g.outcome
    led.budget_left, led.kv_free, led.admissions = out.budget, st.free_blocks, st.admissions_left
    led.reserved = out.n_sched = out.n_preempted = out.n_cut = 0
    led.n_groups = led.victim_head = led.order_head = 0
    led.n_victims = -1
    led.fallback = False
    led.oversize = oversize = _oversize_head(d)
    for k in range(led.n_touched):  # (a dormant head prompt: its availability with the above)
        _set_available(d, lists[k].touched)
    nu = 0
    for k in range(st.n_active):
        i = d.active[k]
        c, r = d.cand[i], d.requests[i]
        _set_available(d, i)
        if c.available and c.urgent:
            lists[nu].urgent = i
            nu += 1
        if r.running:
            led.reserved += _owed(d, i)
            if not par.order:  # FCFS: the newest is preempted first
                c.victim_key = r.arrival
            elif c.lost:  # lost requests first, the oldest first (decision 11)
                c.victim_key = LOST_OFFSET - r.arrival
            else:  # its slack once preempted: it must recompute everything it holds
                c.victim_key = slack(c.to_deadline, n_chunks(c.total, False, st.chunk_mean),
                                     led.t_max)
    _sort_slots(d, lists.urgent, nu, d.cand.slack, False)
    led.n_urgent = nu
    _add_urgent(d)
    if oversize >= 0:  # preempting for it only helps if it can still make its deadline
        min_key = _victim_min_key(d, oversize) if d.cand[oversize].urgent else math.inf
        _force(d, oversize, min_key, True)
    led.n_order = 0
    for k in range(st.n_active):  # step 2's queue: what step 1 left, by key (and the dormant)
        i = d.active[k]
        if d.cand[i].available:
            lists[led.n_order].order = i
            led.n_order += 1
    _sort_slots(d, lists.order, led.n_order, d.cand.key, False)
    need = _select(d)
    if need < 0 and out.n_sched == 0:
        led.fallback = True
        need = _ensure_progress(d)
    return need


@_jit
def _over_admitted(d: Any) -> bool:
    """(Oracle) Fresh admissions, in batch order, whose final KV no longer fits after the earlier
    ones: noted for the next pass, which excludes them. False if there are none."""
    out = d.state[0].outcome
    left, before = out.oracle_admissible, out.oracle_n_over
    for j in range(out.n_sched):
        s = d.lists[j].slots
        if d.requests[s].running:
            continue
        if _final_blocks(d, s) > left:
            over = d.lists[out.oracle_n_over]
            over.over, over.over_at = s, _hide(d, s)
            d.cand[s].over = True
            out.oracle_n_over += 1
        else:
            left -= _final_blocks(d, s)
    out.oracle_reforms += out.oracle_n_over > before
    return out.oracle_n_over > before


@_jit
def _hide(d: Any, s: int) -> int:
    """(Oracle) Over-admitted ``s``, if dormant, out of the dormant queue's searches for the rest
    of the decision (``_dormant_next`` passes over it, its block too if nothing else there may
    start): under overload a decision re-forms hundreds of times, and every pass would otherwise
    look at every request excluded so far. Returns its position (-1: active)."""
    if not d.requests[s].dormant:
        return -1
    q = _dormant_position(d, s)
    d.dormant[q].need = HIDDEN
    _block_changed(d, q // DORMANT_BLOCK)
    return q


@_jit
def _unhide(d: Any) -> None:
    """(Oracle) When a decision ends: its over-admitted requests eligible again (the next starts
    from none), the hidden entries' needs and their blocks' minima back."""
    out = d.state[0].outcome
    for k in range(out.oracle_n_over):
        d.cand[d.lists[k].over].over = False
        q = d.lists[k].over_at
        if q >= 0:
            d.dormant[q].need = _dormant_need(d, d.dormant[q].slot)
            _block_changed(d, q // DORMANT_BLOCK)


@_jit
def _dormant_position(d: Any, s: int) -> int:
    """Position of dormant ``s`` in the dormant queue (by key, then slot)."""
    key = d.requests[s].arrival + LOST_OFFSET
    lo, hi = d.state[0].step.dormant_lo, _dormant_end(d)
    while lo < hi:
        mid = (lo + hi) // 2
        e = d.dormant[mid]
        if e.key < key or (e.key == key and e.slot < s):
            lo = mid + 1
        else:
            hi = mid
    if lo < _dormant_end(d) and d.dormant[lo].slot == s:
        return lo
    for q in range(d.state[0].step.dormant_lo, _dormant_end(d)):  # (never: keys are exact)
        if d.dormant[q].slot == s:
            return q
    return -1


# -- 4. diagnostics ----------------------------------------------------------------------------
@_jit
def _diagnostics(d: Any) -> None:
    st, led, out, info = d.state[0].step, d.state[0].ledger, d.state[0].outcome, d.state[0].info
    n_late = n_lost = st.n_dormant  # (late and lost, all of them)
    n_dec = max_chunk = 0
    for k in range(st.n_active):
        n_late += d.cand[d.active[k]].slack < 0.0
        n_lost += d.cand[d.active[k]].lost
    for j in range(out.n_sched):
        if d.cand[d.lists[j].slots].is_decode:
            n_dec += 1
        else:
            max_chunk = max(max_chunk, d.lists[j].tokens)
    info.token_budget, info.t_max = out.budget, led.t_max
    info.slo_min = led.slo_min if math.isfinite(led.slo_min) else math.nan
    info.budget_clamped_low, info.budget_clamped_high = led.clamped_low, led.clamped_high
    info.n_candidates, info.n_urgent, info.n_late, info.n_lost = st.n, led.n_urgent, n_late, n_lost
    info.n_preempted, info.n_scheduled = out.n_preempted, out.n_sched
    info.n_decode, info.n_prefill = n_dec, out.n_sched - n_dec
    info.n_decode_skipped = led.n_decodes - n_dec
    info.max_chunk, info.n_cut_chunks, info.n_groups = max_chunk, out.n_cut, led.n_groups
    info.era_active, info.progress_fallback = out.era_owner >= 0, led.fallback
    info.chunk_mean, info.kv_free_blocks = st.chunk_mean, led.kv_free
    info.oracle_reforms, info.oracle_excluded = out.oracle_reforms, out.oracle_excluded
    info.oracle_admissible = out.oracle_admissible


# -- the decision ------------------------------------------------------------------------------
@_jit
def decide(d: Any) -> int:
    """One decision on the inputs in ``d.state[0].step`` (``Step``). Returns -1 when it is
    complete (the batch in ``d.lists`` and the ``outcome``, diagnostics in ``info``), or a token
    budget whose full-batch latency the cost model must give first."""
    while True:
        _columns(d)
        need = _plan(d)
        if need >= 0:
            return need
        if d.state[0].step.plan_only:
            for q in range(d.state[0].step.dormant_lo, _dormant_end(d)):  # (explain: every column)
                _wake(d, d.dormant[q].slot)
            return need
        need = _form(d)
        if need >= 0:
            return need
        if not (d.state[0].params.exact_kv and _over_admitted(d)):
            if d.state[0].params.exact_kv:
                _unhide(d)
            _diagnostics(d)
            _compare_batch(d)
            return -1


@_jit
def _compare_batch(d: Any) -> None:
    """``outcome.same_batch``: the batch is the previous decision's and nothing else happens
    (no preemption); then this batch is kept as the one the next decision compares with."""
    out, led, lists = d.state[0].outcome, d.state[0].ledger, d.lists
    n = out.n_sched
    same = n == led.last_n_sched and out.n_preempted == 0
    for j in range(n):
        e = lists[j]
        if e.last_slots != e.slots or e.last_tokens != e.tokens:
            same = False
        e.last_slots, e.last_tokens = e.slots, e.tokens
    out.same_batch, led.last_n_sched = same, n


# -- the table's dynamic columns (``RequestTable``: compiled too, it runs every step) ------------
@_jit
def _set_deadline(r: Any) -> None:
    """Deadline of the next output (SPEC 4.1): the first token by arrival + TTFT SLO, a later
    token (also after a preemption) by the previous token + TBT SLO; offline requests follow
    their cumulative JCT plan, which carries over- and under-use to later iterations."""
    if r.online:
        r.deadline = r.arrival + r.ttft if r.n_out == 0 else r.last_tok + r.tbt
    else:
        r.deadline = r.off_first + r.n_out * r.off_step


@_jit
def set_deadlines(rows: Any, slots: Any) -> int:
    """``_set_deadline`` of the rows ``slots``."""
    for s in slots:
        _set_deadline(rows[s])
    return 0


@_jit
def read_rows(rows: Any, values: Any, lost_rule: bool, watch: Any) -> int:
    """Write the dynamic fields read from the request objects (``values``: a row per request,
    ``accelgen_table._dynamic``) into their rows, and their deadlines. ``lost_rule``: a token
    emitted after its deadline loses an online request's request-level SLO for good. Returns how
    many of them (in ``watch``) wait or are dormant."""
    k = 0
    for j in range(values.shape[0]):
        v = values[j]
        s = int(v[0])
        if _read_row(rows[s], int(v[1]), int(v[2]), int(v[3]), v[4] != 0.0, v[5], lost_rule):
            watch[k] = s
            k += 1
    return k


@_jit
def decode_rows(rows: Any, slots: Any, n: int, now: float, watch: Any) -> int:
    """``read_rows`` (with the lost rule) after an iteration of decode steps alone that changed
    nothing else: each of the rows ``slots[:n]`` computed one more token and emitted it at
    ``now``, still running (its blocks already written: ``RequestTable.advance_decodes``)."""
    k = 0
    for j in range(n):
        s = slots[j]
        r = rows[s]
        if _read_row(r, r.n_out + 1, r.computed + 1, r.blocks, r.running, now, True):
            watch[k] = s
            k += 1
    return k


@_jit
def _read_row(r: Any, n_out: int, computed: int, blocks: int, running: bool, last_tok: float,
              lost_rule: bool) -> bool:
    """One row's dynamic fields and deadline; returns whether it waits or is dormant."""
    emitted, due = n_out > r.n_out, r.deadline
    r.n_out, r.computed, r.blocks = n_out, computed, blocks
    r.running, r.last_tok = running, last_tok
    _set_deadline(r)
    if lost_rule and r.online and emitted and r.last_tok > due:
        r.lost = True
    return not r.running or r.dormant
