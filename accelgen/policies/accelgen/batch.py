"""The batch under construction (``add``, ``fit``) and step 2, SelectRequests (paper Algorithm 2,
SPEC 4.3): slack groups, the Euclidean selection within a group, /Batch's in-order filling."""

from __future__ import annotations

import math

import numpy as np

from accelgen.policies.accelgen import budget, dormant, era, kv, rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def add(cs: st.Candidates, s: int, tokens: int, par: st.Params, led: st.Ledger, b: st.Batch) -> None:
    r, c = cs.req[s], cs.cand[s]
    if r.running:
        led.reserved -= kv.owed(r, c, par)
    else:
        led.admissions -= 1
    led.reserved += kv.owed_after(r, c, par, tokens)
    led.kv_free -= kv.blocks_to_add(r, par.block_size, tokens)
    led.budget_left -= tokens
    if c.is_decode:  # the batch as the cost model prices it (the simulator's ``_form_batch``)
        led.dec_seqs += 1
        led.dec_ctx += r.computed
    else:
        led.pf_tokens += tokens
        led.pf_seqs += 1
        led.pf_attn += tokens * (r.computed + (tokens + 1) / 2)
    b.slots[led.n_sched], b.tokens[led.n_sched] = s, tokens
    led.n_sched += 1
    c.member, c.available = True, False
    if not c.is_decode and tokens < c.rem:
        b.cuts[led.n_cut] = tokens
        led.n_cut += 1
    era.take(c, s, par, led)


@jit
def fit(cs: st.Candidates, s: int, par: st.Params, led: st.Ledger) -> int:
    """Tokens ``s`` can run now without preempting anyone (0: none). A fresh prompt's KV room is its
    whole prompt; under /Chunk a prompt runs only whole."""
    r, c = cs.req[s], cs.cand[s]
    if c.is_decode:
        return 1 if kv.next_blocks(r, c, par.block_size) <= led.kv_free else 0
    if r.running:
        room = kv.prompt_room(r, c, par, led)
    elif led.admissions >= 1 and kv.admission_need(r, c, par) <= kv.unpromised(led):
        room = c.rem
    else:
        return 0
    if par.chunk:
        return min(c.rem, led.budget_left, room)
    return c.rem if c.rem <= led.budget_left and c.rem <= room else 0


@jit
def _feasible(cs: st.Candidates, s: int, par: st.Params, led: st.Ledger) -> bool:
    """``s`` could still join with its smallest piece of work (a whole prompt under /Chunk)."""
    r, c = cs.req[s], cs.cand[s]
    if not r.running or c.is_decode:
        return fit(cs, s, par, led) >= 1  # (step 2 runs while budget is left)
    spare = min(led.kv_free, kv.unpromised(led) + kv.owed(r, c, par))  # free, owed to nobody else
    if par.chunk:  # its next token's block
        return kv.next_blocks(r, c, par.block_size) <= spare
    return kv.blocks_to_add(r, par.block_size, c.rem) <= spare and c.rem <= led.budget_left


@jit
def next_group(cs: st.Candidates, q: st.Queue, par: st.Params, led: st.Ledger) -> int:
    """The next slack group into ``q.group`` (returns its size): the feasible available candidates
    within gamma of the smallest key, in key order, from step 2's queue merged with the dormant queue
    (where only requests with an admission and their blocks could start)."""
    dq, n, limit = q.dormant, 0, 0.0
    j, p, end = led.order_head, led.dormant_head, dormant.queue_end(q.dormant, led)
    need_max = kv.unpromised(led) if led.admissions >= 1 else -1  # (-1: none may start)
    most_final, allow_long = dormant.final_max(par, led), era.allows_long(led)
    while True:
        if p < end:
            p = dormant.next_entry(dq, p, need_max, most_final, allow_long)
        if j < led.n_order and (p >= end or dormant.before_entry(cs, q.order[j], dq, p)):
            s, active, head = q.order[j], True, j == led.order_head
            j += 1
        elif p < end:
            s, active, head = dq.queue[p].slot, False, p == led.dormant_head
            p += 1
            dormant.wake(cs, dq, s, par, led)
        else:
            break
        c = cs.cand[s]
        if not era.available(c, s, led):
            if head and active:  # gone for this decision: later groups start after it
                led.order_head += 1
            elif head:
                led.dormant_head += 1
            continue
        if not _feasible(cs, s, par, led):
            continue
        if n == 0:
            limit = c.key + par.gamma
        elif c.key > limit:
            break
        q.group[n] = s
        n += 1
    return n


@jit
def select(cs: st.Candidates, q: st.Queue, par: st.Params, led: st.Ledger, b: st.Batch, cost: st.Cost,
           pools: st.Pools) -> int:
    """Step 2 on the head slack group, then on the next ones while budget is left (decision 6). Returns
    NO_ASK, or a budget whose latency the cost model must give first."""
    while led.budget_left > 0:
        n = next_group(cs, q, par, led)
        if n == 0:
            return st.NO_ASK
        led.n_groups += 1
        # Members of a later group may have a tighter per-iteration SLO: the batch's budget
        # follows the tightest one that joins. A group whose budget the batch formed so far
        # already fills cannot join: the batch stops here, planned for the SLOs it holds.
        m = math.inf
        for s in q.group[:n]:
            c = cs.cand[s]
            if c.counted and c.slo_iter < m:
                m = c.slo_iter
        if m < led.slo_min:
            lower = budget.token_budget(par, led, cost, m)
            if lower.ask != st.NO_ASK:
                return lower.ask
            if lower.tokens < led.budget:
                left = led.budget_left - (led.budget - lower.tokens)
                if left <= 0:
                    return st.NO_ASK
                led.budget_left, led.budget, led.clamped_low = left, lower.tokens, lower.low
            if not lower.low:  # the exact plan: within the tighter SLO, or the group waits
                if par.budget_batch and budget.formed_time(par, led, cost) * par.time_scale > m:
                    return st.NO_ASK
                led.t_limit = m
            led.slo_min = m
        before = led.n_sched
        if par.batch:
            select_euclidean(cs, q.group, n, par, led, b, cost, pools)
        else:
            _fill_in_order(cs, q.group, n, par, led, b, cost)
        if not par.spill_groups or led.n_sched == before:
            return st.NO_ASK
    return st.NO_ASK


@jit
def _split(cs: st.Candidates, group: np.ndarray, n: int, par: st.Params,
           pools: st.Pools) -> tuple[int, int, int, int]:
    """The group's pools (fresh prompts sorted by remaining length); returns their sizes."""
    n_fresh = n_partial = n_block = n_free = 0
    for s in group[:n]:
        r, c = cs.req[s], cs.cand[s]
        if not r.running:
            pools.fresh[n_fresh] = s
            n_fresh += 1
        elif not c.is_decode:
            pools.partial[n_partial] = s
            n_partial += 1
        elif kv.next_blocks(r, c, par.block_size) > 0:
            pools.dec_block[n_block] = s
            n_block += 1
        else:
            pools.dec_free[n_free] = s
            n_free += 1
    rank.sort_slots(cs, pools.fresh, n_fresh, cs.cand.rem, False)
    for j in range(n_fresh):
        c = cs.cand[pools.fresh[j]]
        pools.fresh_rem[j], pools.fresh_key[j] = c.rem, c.key
    return n_fresh, n_partial, n_block, n_free


@jit
def best_fresh(pools: st.Pools, n: int, par: st.Params, led: st.Ledger) -> tuple[int, int]:
    """The closest fresh prompt as (index, chunk), NO_PICK if none: one at least A_c long cut to A_c
    (the smallest key among them), else the longest that fits whole (smaller key on ties)."""
    if n == 0 or led.admissions < 1:
        return st.NO_PICK, 0
    rem, key, a_c = pools.fresh_rem[:n], pools.fresh_key, led.budget_left
    # rem[:hi] may be admitted (whole prompt, first token and growth reserve fit)
    free, bs = kv.unpromised(led), par.block_size
    limit = free * bs - 1 - par.growth if free < par.total_blocks else par.total_blocks * bs - 1
    hi = int(np.searchsorted(rem, limit, side="right"))
    if hi == 0:
        return st.NO_PICK, 0
    if par.chunk and rem[hi - 1] >= a_c:
        j = int(np.searchsorted(rem[:hi], a_c))
        for i in range(j + 1, hi):
            if key[i] < key[j]:
                j = i
        return j, a_c
    j = int(np.searchsorted(rem[:hi], a_c, side="right")) - 1
    for i in range(j - 1, -1, -1):  # equal demand: the smaller key
        if rem[i] != rem[j]:
            break
        if key[i] < key[j]:
            j = i
    return (j, rem[j]) if j >= 0 else (st.NO_PICK, 0)


@jit
def distance(a_c: int, a_m: int, tokens: int, kv_tokens: int) -> int:
    """Squared Euclidean distance of (D_c, D_m) from (A_c, A_m): exact integers, so no rounding can tell
    apart (or tie) two candidates."""
    return (a_c - tokens) * (a_c - tokens) + (a_m - kv_tokens) * (a_m - kv_tokens)


@jit
def select_euclidean(cs: st.Candidates, group: np.ndarray, n: int, par: st.Params, led: st.Ledger,
                     b: st.Batch, cost: st.Cost, pools: st.Pools) -> None:
    """Algorithm 2 on one slack group: repeatedly add the candidate whose (D_c, D_m) is closest to (A_c,
    A_m) among those that fit, ties to the smaller key. Fast by the rule's structure
    (``docs/accelgen.md``, step 7): decodes, (1, 0) or (1, b), lose to every prompt that fits but a
    chunk needing no new block, so they are compared with those only, else taken in bulk; among fresh
    prompts the longest that fits whole is closest (a bisection); running prompts one by one. The exact
    plan cuts the chosen chunk to what the batch's latency limit leaves (``budget.chunk_cap``), or drops
    a candidate that does not fit at all (a fresh prompt: every fresh prompt, they all start at context
    0)."""
    bs = par.block_size
    n_fresh, n_partial, n_block, n_free = _split(cs, group, n, par, pools)
    took_block = took_free = 0  # decodes taken from the head of each pool
    while led.budget_left > 0:
        a_c, a_m = led.budget_left, led.kv_free * bs
        kind, pick, tokens, dist, key = st.NO_PICK, 0, 0, 0, math.inf
        j, chunk = best_fresh(pools, n_fresh, par, led)
        if j != st.NO_PICK:
            kind, pick, tokens, key = st.PICK_FRESH, j, chunk, pools.fresh_key[j]
            dist = distance(a_c, a_m, chunk, (chunk + bs - 1) // bs * bs)
        for i in range(n_partial):
            s = pools.partial[i]
            t = fit(cs, s, par, led)
            if t < 1:
                continue
            d, k = distance(a_c, a_m, t, kv.blocks_to_add(cs.req[s], bs, t) * bs), cs.cand[s].key
            if kind == st.NO_PICK or d < dist or (d == dist and k < key):
                kind, pick, tokens, dist, key = st.PICK_PROMPT, i, t, d, k
        prompt_fits = kind != st.NO_PICK
        use_block = n_block > took_block and led.kv_free >= 1  # decodes: (1, b) while a block is free
        if use_block or n_free > took_free:
            d = distance(a_c, a_m, 1, bs if use_block else 0)
            k = cs.cand[pools.dec_block[took_block] if use_block else pools.dec_free[took_free]].key
            if kind == st.NO_PICK or d < dist or (d == dist and k < key):
                kind = st.PICK_DECODE_BLOCK if use_block else st.PICK_DECODE_FREE
        if kind == st.NO_PICK:
            return
        if kind == st.PICK_FRESH:
            capped = budget.chunk_cap(par, led, cost, 0, tokens)
            if capped < 1 or (not par.chunk and capped < tokens):
                n_fresh = 0  # (no fresh prompt fits the latency left)
            else:
                n_fresh = _take_fresh(cs, pick, capped, n_fresh, par, led, b, pools)
        elif kind == st.PICK_PROMPT:
            s = pools.partial[pick]
            for i in range(pick, n_partial - 1):
                pools.partial[i] = pools.partial[i + 1]
            n_partial -= 1
            capped = budget.chunk_cap(par, led, cost, cs.req[s].computed, tokens)
            if capped >= 1 and (par.chunk or capped == tokens):
                add(cs, s, capped, par, led, b)
        elif prompt_fits:  # a decode beat a prompt chunk needing no new block
            if kind == st.PICK_DECODE_BLOCK:
                s = pools.dec_block[took_block]
                took_block += 1
            else:
                s = pools.dec_free[took_free]
                took_free += 1
            if budget.decodes_fit(par, led, cost, 1, cs.req[s].computed):
                add(cs, s, 1, par, led, b)
        else:  # no prompt fits: (1, b) decodes while blocks are free, then (1, 0), by key
            _add_decodes(cs, pools.dec_block[took_block:n_block][:max(min(led.budget_left, led.kv_free), 0)],
                         par, led, b, cost)
            _add_decodes(cs, pools.dec_free[took_free:n_free][:max(led.budget_left, 0)], par, led, b, cost)
            return


@jit
def _add_decodes(cs: st.Candidates, slots: np.ndarray, par: st.Params, led: st.Ledger, b: st.Batch,
                 cost: st.Cost) -> None:
    """Decodes in bulk (the budget and KV already counted for them): all at once when the latency limit
    holds them all, else one by one, skipping those that do not fit."""
    ctx = 0
    for s in slots:
        ctx += cs.req[s].computed
    every = budget.decodes_fit(par, led, cost, len(slots), ctx)
    for s in slots:
        if every or budget.decodes_fit(par, led, cost, 1, cs.req[s].computed):
            add(cs, s, 1, par, led, b)


@jit
def _take_fresh(cs: st.Candidates, pick: int, tokens: int, n: int, par: st.Params, led: st.Ledger,
                b: st.Batch, pools: st.Pools) -> int:
    """Fresh prompt ``pick`` joins and leaves the pool; if it took ERA, so do the other long prompts.
    Returns the pool's new size."""
    s = pools.fresh[pick]
    add(cs, s, tokens, par, led, b)
    took_era = era.holds(led, s)
    w = 0 if took_era else pick
    for i in range(w, n):
        f = pools.fresh[i]
        if i != pick and not (took_era and cs.cand[f].is_long):
            pools.fresh[w], pools.fresh_rem[w], pools.fresh_key[w] = f, pools.fresh_rem[i], pools.fresh_key[i]
            w += 1
    return w


@jit
def _fill_in_order(cs: st.Candidates, group: np.ndarray, n: int, par: st.Params, led: st.Ledger,
                   b: st.Batch, cost: st.Cost) -> None:
    """/Batch: the group in key order, skipping what does not fit (budget, KV, the latency limit)."""
    for s in group[:n]:
        if led.budget_left <= 0:
            return
        tokens = fit(cs, s, par, led) if era.available(cs.cand[s], s, led) else 0
        if tokens >= 1:
            tokens = time_fit(cs, s, tokens, par, led, cost)
        if tokens >= 1:
            add(cs, s, tokens, par, led, b)


@jit
def time_fit(cs: st.Candidates, s: int, tokens: int, par: st.Params, led: st.Ledger, cost: st.Cost) -> int:
    """The exact plan: of ``tokens`` for ``s``, what the batch's latency limit leaves (0: none; a prompt
    under /Chunk only whole)."""
    r, c = cs.req[s], cs.cand[s]
    if c.is_decode:
        return tokens if budget.decodes_fit(par, led, cost, 1, r.computed) else 0
    capped = budget.chunk_cap(par, led, cost, r.computed, tokens)
    return capped if par.chunk or capped == tokens else 0
