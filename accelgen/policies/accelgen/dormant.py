"""The dormant queue of lost prompts and its per-block minima (``docs/accelgen.md``, *A long
queue*)."""

from __future__ import annotations

import numpy as np

from accelgen.policies.accelgen import era, kv, rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def index(dq: st.Dormant, req: np.ndarray, par: st.Params, step: st.Step) -> None:
    """Take in the queue's changes (every entry with ``reindex``): new entries' admission need, final KV
    and length class, their blocks' minima stale, and (Oracle) the count of final KV."""
    full = step.reindex
    if full:
        dq.finals[:] = 0
        a, b = dq.lo, dq.hi
    else:
        a, b = max(step.dirty_lo, dq.lo), min(step.dirty_hi, dq.hi)
        for k in range(step.n_gone if par.exact_kv else 0):
            count_final(dq, dq.gone[k], -1)
    # Only the changed blocks: a block outside them holds the same entries (or fewer, at the
    # queue's ends: its minima are then lower bounds, which only means looking inside it).
    for blk in range(a // st.DORMANT_BLOCK, (b - 1) // st.DORMANT_BLOCK + 1 if a < b else 0):
        for q in range(max(blk * st.DORMANT_BLOCK, dq.lo), min((blk + 1) * st.DORMANT_BLOCK, dq.hi)):
            e = dq.queue[q]
            if full or e.final == st.UNCOUNTED:
                r = req[e.slot]
                e.need = need(r, par)
                e.final = kv.final_blocks(r, par.block_size) if par.exact_kv else 0
                e.long = era.is_long(par, r.prompt + r.n_out, False)
                if par.exact_kv:
                    count_final(dq, e.final, 1)
        dq.minima[blk].final_max = st.STALE
    step.reindex = False
    step.dirty_lo = step.dirty_hi = step.n_gone = 0


@jit
def need(r: st.RequestRow, par: st.Params) -> int:
    """Blocks a dormant request needs to start (all its pending tokens and the growth reserve)."""
    return kv.admission_blocks(r, par, r.prompt + r.n_out - r.computed)


@jit
def _block_minima(queue: np.ndarray, mb: st.DormantMinima, start: int, end: int, final_max: int) -> None:
    """The minima ``mb`` of the entries ``queue[start:end]`` (one block) with at most ``final_max``
    final blocks: the smallest admission need of all and of those not long (kept until the block
    changes or another ``final_max`` is asked)."""
    mb.final_max, mb.need, mb.need_short = final_max, st.HIDDEN, st.HIDDEN
    for e in queue[start:end]:
        if e.final <= final_max:
            mb.need = min(mb.need, e.need)
            if not e.long:
                mb.need_short = min(mb.need_short, e.need)


@jit
def count_final(dq: st.Dormant, final: int, delta: int) -> None:
    """(Oracle) Add ``delta`` entries holding ``final`` blocks at the end (a Fenwick tree over final KV,
    clipped to the cache's size plus one)."""
    tree = dq.finals
    i = min(max(final, 0), tree.size - 2) + 1
    while i < tree.size:
        tree[i] += delta
        i += i & -i


@jit
def count_over(dq: st.Dormant, admissible: int) -> int:
    """(Oracle) Dormant requests whose final KV exceeds ``admissible`` blocks."""
    n = dq.hi - dq.lo
    if n == 0 or admissible < 0:
        return n
    tree, at_most = dq.finals, 0
    i = min(admissible, tree.size - 2) + 1
    while i > 0:
        at_most += tree[i]
        i -= i & -i
    return n - at_most


@jit
def next_entry(dq: st.Dormant, q: int, need_max: int, final_max: int, allow_long: bool) -> int:
    """The first position from ``q`` on (``dq.hi`` if none) whose request needs at most ``need_max``
    blocks, ends with at most ``final_max`` and is not long unless ``allow_long``: necessary conditions
    of joining, tested on a block's minima before its entries."""
    queue, minima, hi = dq.queue, dq.minima, dq.hi  # (the loop passes arrays, not ``dq``: it is hot)
    while q < hi:
        if q % st.DORMANT_BLOCK == 0:
            mb = minima[q // st.DORMANT_BLOCK]
            if mb.final_max != final_max:
                _block_minima(queue, mb, max(q, dq.lo), min(q + st.DORMANT_BLOCK, hi), final_max)
            if (mb.need if allow_long else mb.need_short) > need_max:
                q += st.DORMANT_BLOCK
                continue
        e = queue[q]
        if e.need <= need_max and e.final <= final_max and (allow_long or not e.long):
            return q
        q += 1
    return hi


@jit
def final_max(par: st.Params, led: st.Ledger) -> int:
    return led.oracle_admissible if par.exact_kv else st.NO_LIMIT


@jit
def queue_end(dq: st.Dormant, led: st.Ledger) -> int:
    """The end of the dormant entries in step 2's queue: none once an oversized prompt runs."""
    return dq.hi if led.oversize == st.NO_SLOT else dq.lo


@jit
def first_eligible(dq: st.Dormant, par: st.Params, led: st.Ledger) -> int:
    return next_entry(dq, dq.lo, st.NO_LIMIT, final_max(par, led), era.allows_long(led))


@jit
def before_entry(cs: st.Candidates, s: int, dq: st.Dormant, q: int) -> bool:
    """Active ``s`` comes before dormant entry ``q`` in queue order (key, then slot)."""
    a, b = cs.cand[s].key, dq.queue[q].key
    return rank.before(a, b) or (a == b and s < dq.queue[q].slot)


@jit
def wake(cs: st.Candidates, dq: st.Dormant, s: int, par: st.Params, led: st.Ledger) -> None:
    """The columns of dormant ``s`` for this pass, once (at the plan's T_max)."""
    r, c = cs.req[s], cs.cand[s]
    if c.stamp == led.pass_id:
        return
    rank.columns(cs, s, par, led)
    if kv.excluded(r, c, par, led):
        c.eligible = False
    rank.rank(r, c, par, led.t_max)
    set_available(c, led)
    dq.touched[led.n_touched] = s
    led.n_touched += 1


@jit
def set_available(c: st.Candidate, led: st.Ledger) -> None:
    """Eligible, and not shut out by an oversized head prompt (/Chunk); ERA aside."""
    c.available = c.eligible and (led.oversize == st.NO_SLOT or c.is_decode)


@jit
def position(dq: st.Dormant, key: float, s: int) -> int:
    """Position of dormant ``s`` (queue key ``key``), by bisection."""
    lo, hi = dq.lo, dq.hi
    while lo < hi:
        mid = (lo + hi) // 2
        e = dq.queue[mid]
        if e.key < key or (e.key == key and e.slot < s):
            lo = mid + 1
        else:
            hi = mid
    if lo < dq.hi and dq.queue[lo].slot == s:
        return lo
    for q in range(dq.lo, dq.hi):  # (never: keys are exact)
        if dq.queue[q].slot == s:
            return q
    return st.NO_SLOT
