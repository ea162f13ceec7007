"""The Oracle's exact KV plan (``kv_plan: exact``; ``docs/accelgen.md``, *One decision* and *A long
queue*): nothing is ever preempted; over-admissions re-form the batch."""

from __future__ import annotations

from accelgen.policies.accelgen import dormant, kv
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def admissible(cs: st.Candidates, step: st.Step, par: st.Params) -> int:
    """Free blocks not promised to the running requests' final KV."""
    promised = 0
    for i in cs.active:
        r = cs.req[i]
        if r.running:
            promised += max(kv.final_blocks(r, par.block_size) - r.blocks, 0)
    return step.free_blocks - promised


@jit
def over_admitted(cs: st.Candidates, dq: st.Dormant, par: st.Params, led: st.Ledger, b: st.Batch,
                  ora: st.Oracle) -> bool:
    """Fresh admissions, in batch order, whose final KV no longer fits after the earlier ones, noted
    (and hidden) for the next pass to exclude. False if there are none."""
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
def _hide(cs: st.Candidates, dq: st.Dormant, s: int) -> int:
    """Over-admitted ``s``, if dormant, out of the queue's searches. Returns its position (NO_SLOT:
    active)."""
    r = cs.req[s]
    if not r.dormant:
        return st.NO_SLOT
    q = dormant.position(dq, r.arrival + st.LOST_OFFSET, s)
    dq.queue[q].need = st.HIDDEN
    dq.minima[q // st.DORMANT_BLOCK].final_max = st.STALE
    return q


@jit
def unhide(cs: st.Candidates, dq: st.Dormant, par: st.Params, ora: st.Oracle) -> None:
    """When a decision ends: its over-admitted requests eligible again, hidden entries restored."""
    for k in range(ora.counts.n_over):
        cs.cand[ora.over[k]].over = False
        q = ora.over_at[k]
        if q != st.NO_SLOT:
            e = dq.queue[q]
            e.need = dormant.need(cs.req[e.slot], par)
            dq.minima[q // st.DORMANT_BLOCK].final_max = st.STALE
