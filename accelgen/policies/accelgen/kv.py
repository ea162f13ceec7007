"""One request's KV in blocks: what it must add, is promised, needs to start (``docs/accelgen.md``,
*KV promises*). Needs are cached per candidate: a request does not change while its batch forms."""

from __future__ import annotations

from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def blocks_to_add(r: st.RequestRow, block_size: int, tokens: int) -> int:
    return max((r.computed + tokens + block_size - 1) // block_size - r.blocks, 0)


@jit
def next_blocks(r: st.RequestRow, c: st.Candidate, block_size: int) -> int:
    if c.next_blocks == st.UNKNOWN:
        c.next_blocks = blocks_to_add(r, block_size, 1)
    return c.next_blocks


@jit
def owed(r: st.RequestRow, c: st.Candidate, par: st.Params) -> int:
    """Blocks promised to running ``r``: its remaining prompt or next token, plus growth."""
    if c.owed == st.UNKNOWN:
        c.owed = blocks_to_add(r, par.block_size, c.rem + par.growth)
    return c.owed


@jit
def owed_after(r: st.RequestRow, c: st.Candidate, par: st.Params, tokens: int) -> int:
    """Blocks owed to ``r`` once it ran ``tokens`` (the rest, or its next token, plus growth)."""
    bs, done = par.block_size, r.computed + tokens
    held = max(r.blocks, (done + bs - 1) // bs)
    pending = (c.rem - tokens if tokens < c.rem else 1) + par.growth
    return max(0, (done + pending + bs - 1) // bs - held)


@jit
def admission_blocks(r: st.RequestRow, par: st.Params, rem: int) -> int:
    """Blocks a prompt holding no KV needs to start: ``rem`` tokens, its first token and the growth
    reserve, the reserve capped at the KV's size (a request that fits alone can always start)."""
    return max(blocks_to_add(r, par.block_size, rem + 1),
               min(blocks_to_add(r, par.block_size, rem + 1 + par.growth), par.total_blocks))


@jit
def admission_need(r: st.RequestRow, c: st.Candidate, par: st.Params) -> int:
    if c.admission_blocks == st.UNKNOWN:
        c.admission_blocks = admission_blocks(r, par, c.rem)
    return c.admission_blocks


@jit
def unpromised(led: st.Ledger) -> int:
    return led.kv_free - led.reserved


@jit
def prompt_room(r: st.RequestRow, c: st.Candidate, par: st.Params, led: st.Ledger) -> int:
    """Tokens running prompt ``r`` may add: its last block's room and free blocks owed to nobody
    else."""
    spare = min(led.kv_free, unpromised(led) + owed(r, c, par))
    return max(0, r.blocks * par.block_size - r.computed) + max(0, spare) * par.block_size


@jit
def final_blocks(r: st.RequestRow, block_size: int) -> int:
    """(Oracle) Blocks ``r`` holds at its last forward pass: prompt + true output - 1 tokens."""
    return (r.prompt + r.true_out - 1 + block_size - 1) // block_size


@jit
def excluded(r: st.RequestRow, c: st.Candidate, par: st.Params, led: st.Ledger) -> bool:
    """(Oracle) A waiting request whose final KV does not fit the admissible KV, or over-admitted."""
    return par.exact_kv and (final_blocks(r, par.block_size) > led.oracle_admissible or c.over)
