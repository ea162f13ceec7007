"""Preemption (paper Algorithm 1, lines 2-4; ``docs/accelgen.md``, *Preemption*): a request joins
with the largest piece the budget allows, preempting (for recompute) running requests outside the
batch with a larger victim key for its KV (``force``)."""

from __future__ import annotations

import math

from accelgen.policies.accelgen import batch, kv, rank
from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.state import (
    FOR_ADMISSION,
    FOR_CHUNK,
    FOR_DECODE,
    LOST_OFFSET,
    UNKNOWN,
    Batch,
    Candidate,
    Candidates,
    Ledger,
    Params,
    RequestRow,
)


@jit
def victim_key(r: RequestRow, c: Candidate, par: Params, chunk_mean: float, t_max: float) -> float:
    """Victims go largest key first: the newest under FCFS (/Order); lost requests first, the
    oldest first (decision 11: it holds the most KV); else by slack once preempted, when it must
    recompute everything it holds (without this, a victim is at once more urgent than the request
    it made room for, and the two swap places every iteration)."""
    if not par.order:
        return r.arrival
    if c.lost:
        return LOST_OFFSET - r.arrival
    return rank.slack(c.to_deadline, rank.n_chunks(c.total, False, chunk_mean), t_max)


@jit
def victim_min_key(c: Candidate, running: bool, par: Params, led: Ledger) -> float:
    """Victims of a request must have a larger key than this: a running request's own (evicting it
    would cost less); for a prompt being admitted, outside its slack group (gamma) and not urgent
    once preempted (T_max): else one SLO miss is traded for another plus a recompute."""
    if running:
        return c.victim_key
    floor = led.t_max if par.order else -math.inf
    return max(c.key + par.gamma, floor)


@jit
def _preempt(cs: Candidates, v: int, par: Params, led: Ledger, b: Batch) -> None:
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
def room(cs: Candidates, kind: int, s: int, par: Params, led: Ledger) -> int:
    """Room for ``s``: blocks owed to nobody (an admission's whole prompt), free blocks (a
    decode's next one), tokens (a running prompt's chunk)."""
    if kind == FOR_ADMISSION:
        return kv.unpromised(led)
    return led.kv_free if kind == FOR_DECODE else kv.prompt_room(cs.req[s], cs.cand[s], par, led)


@jit
def _victims(cs: Candidates, par: Params, led: Ledger, b: Batch) -> None:
    """The running requests by victim key into ``b.victims``, when first needed (most decisions
    preempt nobody); none under the Oracle's exact plan."""
    led.n_victims = 0
    if par.exact_kv:
        return
    for i in cs.active:
        if cs.req[i].running:
            b.victims[led.n_victims] = i
            led.n_victims += 1
    rank.sort_slots(cs, b.victims, led.n_victims, cs.cand.victim_key, True)


@jit
def force(cs: Candidates, s: int, min_key: float, oversize: bool, par: Params, led: Ledger,
          b: Batch) -> bool:
    """Add ``s`` with the largest chunk the budget allows, preempting the running requests with
    the largest victim key above ``min_key`` until its KV fits. ``oversize``: the /Chunk
    starvation guard (a prompt longer than the budget runs whole). Returns whether it joined."""
    r, c = cs.req[s], cs.cand[s]
    tokens = 1 if c.is_decode else (c.rem if oversize or not par.chunk else min(c.rem, led.budget_left))
    if tokens < 1 or (not c.is_decode and not par.chunk and not oversize and c.rem > led.budget_left):
        return False
    if not r.running:  # admission: the whole remaining prompt must fit
        if led.admissions < 1:
            return False
        kind, need = FOR_ADMISSION, kv.admission_need(r, c, par)
    elif c.is_decode:
        kind, need = FOR_DECODE, kv.next_blocks(r, c, par.block_size)
    else:
        kind, need = FOR_CHUNK, tokens
    if room(cs, kind, s, par, led) < need:
        if led.n_victims == UNKNOWN:
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
        if kind != FOR_CHUNK or not par.chunk or fits < 1:
            return False
        tokens = fits  # dynamic chunking: cut where the free KV ends
    batch.add(cs, s, tokens, par, led, b)
    return True
