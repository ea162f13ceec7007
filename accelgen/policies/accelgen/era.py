"""Exclusive Request Allocation (ERA, SPEC 4.2): at most one long prompt in prefill at a time; every
ERA rule of the decision is here (``docs/accelgen.md``, *Dynamic chunking, KV promises and ERA*)."""

from __future__ import annotations

import numpy as np

from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def holder(req: np.ndarray, par: st.Params, owner: int) -> int:
    """The previous decision's holder ``owner`` if it still holds ERA as a pass begins."""
    if not par.era or owner == st.NO_SLOT:
        return st.NO_SLOT
    r = req[owner]
    prefill_done = r.n_out > 0 and r.prompt + r.n_out - r.computed == 1
    if not r.running or (prefill_done and not par.era_whole_request):
        return st.NO_SLOT
    return owner


@jit
def is_long(par: st.Params, total: int, is_decode: bool) -> bool:
    return not is_decode and total >= par.long_threshold


@jit
def admits(owner: int, s: int, long: bool) -> bool:
    """ERA lets ``s`` join while ``owner`` holds it: nobody does, ``s`` is not long, or the holder."""
    return owner == st.NO_SLOT or not long or s == owner


@jit
def available(c: st.Candidate, s: int, led: st.Ledger) -> bool:
    return c.available and admits(led.era_owner, s, c.is_long)


@jit
def allows_long(led: st.Ledger) -> bool:
    return led.era_owner == st.NO_SLOT


@jit
def take(c: st.Candidate, s: int, par: st.Params, led: st.Ledger) -> None:
    """If ``s`` is long and nobody holds ERA, it does now."""
    if par.era and c.is_long and led.era_owner == st.NO_SLOT:
        led.era_owner = s


@jit
def holds(led: st.Ledger, s: int) -> bool:
    return led.era_owner == s
