"""Preemption for KV (paper Algorithm 1, lines 2-4; ``docs/accelgen.md``, *Preemption*)."""

from __future__ import annotations

import math

from accelgen.policies.accelgen import batch, budget, kv, rank
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def victim_key(r: st.RequestRow, c: st.Candidate, par: st.Params, chunk_mean: float, t_max: float) -> float:
    """Victims go largest key first: the newest under /Order; lost requests first, oldest first
    (decision 11: it holds the most KV); else by slack once preempted, when it must recompute all it
    holds (else a victim is at once more urgent than the request it made room for, and they swap)."""
    if not par.order:
        return r.arrival
    if c.lost:
        return st.LOST_OFFSET - r.arrival
    return rank.slack(c.to_deadline, rank.n_chunks(c.total, False, chunk_mean), t_max)


@jit
def victim_min_key(c: st.Candidate, running: bool, par: st.Params, led: st.Ledger) -> float:
    """Victims of a request must have a larger key than this: a running request's own; for an admission,
    outside its slack group and not urgent once preempted (else one SLO miss is traded for another)."""
    if running:
        return c.victim_key
    floor = led.t_max if par.order else -math.inf
    return max(c.key + par.gamma, floor)


@jit
def _preempt(cs: st.Candidates, v: int, par: st.Params, led: st.Ledger, b: st.Batch) -> None:
    r, c = cs.req[v], cs.cand[v]
    b.preempted[led.n_preempted] = v
    led.n_preempted += 1
    # As vLLM V1: nothing else is admitted in a step that preempted, so blocks freed for an
    # urgent request are not handed straight to a new prompt.
    led.admissions = min(led.admissions, 0)
    led.kv_free += r.blocks
    led.reserved -= kv.owed(r, c, par)
    c.available = False


@jit
def room(cs: st.Candidates, kind: int, s: int, par: st.Params, led: st.Ledger) -> int:
    """Room for ``s``: unpromised blocks (an admission), free blocks (a decode), tokens (a chunk)."""
    if kind == st.FOR_ADMISSION:
        return kv.unpromised(led)
    return led.kv_free if kind == st.FOR_DECODE else kv.prompt_room(cs.req[s], cs.cand[s], par, led)


@jit
def _victims(cs: st.Candidates, par: st.Params, led: st.Ledger, b: st.Batch) -> None:
    """The running requests by victim key into ``b.victims``, when first needed; none under the exact
    plan."""
    led.n_victims = 0
    if par.exact_kv:
        return
    for i in cs.active:
        if cs.req[i].running:
            b.victims[led.n_victims] = i
            led.n_victims += 1
    rank.sort_slots(cs, b.victims, led.n_victims, cs.cand.victim_key, True)


@jit
def force(cs: st.Candidates, s: int, min_key: float, oversize: bool, par: st.Params, led: st.Ledger,
          b: st.Batch, cost: st.Cost) -> bool:
    """Add ``s`` with the largest chunk the budget and the batch's latency limit allow (the exact plan;
    a decode, here an urgent one, is within T_max), preempting running requests with the largest victim
    key above ``min_key`` until its KV fits (``oversize``: a /Chunk prompt longer than the budget, run
    whole). Returns whether it joined."""
    r, c = cs.req[s], cs.cand[s]
    tokens = 1 if c.is_decode else (c.rem if oversize or not par.chunk else min(c.rem, led.budget_left))
    if tokens < 1 or (not c.is_decode and not par.chunk and not oversize and c.rem > led.budget_left):
        return False
    if not (c.is_decode or oversize):
        capped = budget.chunk_cap(par, led, cost, r.computed, tokens)
        if capped < 1 or (not par.chunk and capped < tokens):
            return False
        tokens = capped
    if not r.running:  # admission: the whole remaining prompt must fit
        if led.admissions < 1:
            return False
        kind, need = st.FOR_ADMISSION, kv.admission_need(r, c, par)
    elif c.is_decode:
        kind, need = st.FOR_DECODE, kv.next_blocks(r, c, par.block_size)
    else:
        kind, need = st.FOR_CHUNK, tokens
    if room(cs, kind, s, par, led) < need:
        if led.n_victims == st.UNKNOWN:
            _victims(cs, par, led, b)
        while room(cs, kind, s, par, led) < need and led.victim_head < led.n_victims:
            v = b.victims[led.victim_head]
            if cs.cand[v].victim_key <= min_key:
                break
            led.victim_head += 1
            if v != s and not cs.cand[v].member:
                _preempt(cs, v, par, led, b)
    fits = room(cs, kind, s, par, led)
    if need > fits:
        if kind != st.FOR_CHUNK or not par.chunk or fits < 1:
            return False
        tokens = fits  # dynamic chunking: cut where the free KV ends
    batch.add(cs, s, tokens, par, led, b)
    return True
