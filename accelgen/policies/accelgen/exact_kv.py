"""The Oracle's exact KV plan (``kv_plan: exact``): a waiting request is eligible only if its
final KV fits in the free KV not promised to the running requests' final KV, so nothing is ever
preempted; when admissions together exceed the plan, the offenders are excluded and the decision
runs again (``decide``). The over-admitted dormant requests are hidden from the queue's searches
for the rest of the decision: under overload a decision re-forms hundreds of times."""

from __future__ import annotations

from accelgen.policies.accelgen import dormant, kv
from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.state import (
    DORMANT_BLOCK,
    HIDDEN,
    LOST_OFFSET,
    NO_SLOT,
    STALE,
    Batch,
    Candidates,
    Dormant,
    Ledger,
    Oracle,
    Params,
    Step,
)


@jit
def admissible(cs: Candidates, step: Step, par: Params) -> int:
    """Free blocks not promised to the running requests' final KV."""
    promised = 0
    for i in cs.active:
        r = cs.req[i]
        if r.running:
            promised += max(kv.final_blocks(r, par.block_size) - r.blocks, 0)
    return step.free_blocks - promised


@jit
def over_admitted(cs: Candidates, dq: Dormant, par: Params, led: Ledger, b: Batch, ora: Oracle) -> bool:
    """Fresh admissions, in batch order, whose final KV no longer fits after the earlier ones:
    noted (and hidden) for the next pass, which excludes them. False if there are none."""
    left, n_before = led.oracle_admissible, ora.counts.n_over
    for s in b.slots[:led.n_sched]:
        r = cs.req[s]
        if r.running:
            continue
        final = kv.final_blocks(r, par.block_size)
        if final > left:
            ora.over[ora.counts.n_over], ora.over_at[ora.counts.n_over] = s, _hide(cs, dq, s)
            cs.cand[s].over = True
            ora.counts.n_over += 1
        else:
            left -= final
    ora.counts.reforms += ora.counts.n_over > n_before
    return ora.counts.n_over > n_before


@jit
def _hide(cs: Candidates, dq: Dormant, s: int) -> int:
    """Over-admitted ``s``, if dormant, out of the dormant queue's searches (its need beyond any
    limit). Returns its position (NO_SLOT: active)."""
    r = cs.req[s]
    if not r.dormant:
        return NO_SLOT
    q = dormant.position(dq, r.arrival + LOST_OFFSET, s)
    dq.queue[q].need = HIDDEN
    dq.minima[q // DORMANT_BLOCK].final_max = STALE
    return q


@jit
def unhide(cs: Candidates, dq: Dormant, par: Params, ora: Oracle) -> None:
    """When a decision ends: its over-admitted requests eligible again (the next starts from
    none), the hidden entries' needs and their blocks' minima back."""
    for k in range(ora.counts.n_over):
        cs.cand[ora.over[k]].over = False
        q = ora.over_at[k]
        if q != NO_SLOT:
            e = dq.queue[q]
            e.need = dormant.need(cs.req[e.slot], par)
            dq.minima[q // DORMANT_BLOCK].final_max = STALE
