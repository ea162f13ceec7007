"""One request's KV in blocks: what it must add, what it is promised, what its admission needs
(``docs/accelgen.md``, *KV promises*). Needs are kept per candidate: a request's state does not
change while its batch forms."""

from __future__ import annotations

from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.state import UNKNOWN, Candidate, Ledger, Params, RequestRow


@jit
def blocks_to_add(r: RequestRow, block_size: int, tokens: int) -> int:
    """Blocks ``r`` must add to hold KV for ``tokens`` more tokens."""
    return max((r.computed + tokens + block_size - 1) // block_size - r.blocks, 0)


@jit
def next_blocks(r: RequestRow, c: Candidate, block_size: int) -> int:
    if c.next_blocks == UNKNOWN:
        c.next_blocks = blocks_to_add(r, block_size, 1)
    return c.next_blocks


@jit
def owed(r: RequestRow, c: Candidate, par: Params) -> int:
    """Blocks promised to running ``r``: its remaining prompt or next token, plus growth."""
    if c.owed == UNKNOWN:
        c.owed = blocks_to_add(r, par.block_size, c.rem + par.growth)
    return c.owed


@jit
def owed_after(r: RequestRow, c: Candidate, par: Params, tokens: int) -> int:
    """Blocks owed to ``r`` once it ran ``tokens`` (the rest, or its next token, + growth)."""
    bs, done = par.block_size, r.computed + tokens
    held = max(r.blocks, (done + bs - 1) // bs)
    pending = (c.rem - tokens if tokens < c.rem else 1) + par.growth
    return max(0, (done + pending + bs - 1) // bs - held)


@jit
def admission_blocks(r: RequestRow, par: Params, rem: int) -> int:
    """Blocks a prompt holding no KV needs to start: all of it (``rem`` tokens), its first token
    and the growth reserve, the reserve capped at the KV's size (a request that fits alone can
    always start)."""
    return max(blocks_to_add(r, par.block_size, rem + 1),
               min(blocks_to_add(r, par.block_size, rem + 1 + par.growth), par.total_blocks))


@jit
def admission_need(r: RequestRow, c: Candidate, par: Params) -> int:
    if c.admission_blocks == UNKNOWN:
        c.admission_blocks = admission_blocks(r, par, c.rem)
    return c.admission_blocks


@jit
def unpromised(led: Ledger) -> int:
    """Free blocks owed to no running request."""
    return led.kv_free - led.reserved


@jit
def prompt_room(r: RequestRow, c: Candidate, par: Params, led: Ledger) -> int:
    """Tokens running prompt ``r`` may add: its last block's room and the free blocks owed to
    nobody else."""
    spare = min(led.kv_free, unpromised(led) + owed(r, c, par))
    return max(0, r.blocks * par.block_size - r.computed) + max(0, spare) * par.block_size


@jit
def final_blocks(r: RequestRow, block_size: int) -> int:
    """(Oracle) Blocks ``r`` holds at its last forward pass: prompt + true output - 1 tokens."""
    return (r.prompt + r.true_out - 1 + block_size - 1) // block_size


@jit
def excluded(r: RequestRow, c: Candidate, par: Params, led: Ledger) -> bool:
    """(Oracle, exact KV plan) A waiting request whose final KV does not fit in the free KV not
    promised to the running requests' final KV, or over-admitted in an earlier pass."""
    return par.exact_kv and (final_blocks(r, par.block_size) > led.oracle_admissible or c.over)
