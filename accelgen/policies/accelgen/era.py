"""Exclusive Request Allocation (ERA, SPEC 4.2): at most one long prompt in prefill at a time.

A prompt of at least ``long_prompt_threshold`` tokens (prompt + generated for a recompute) is
long. Its holder keeps ERA until its prefill completes (scope ``prefill``) or the request does
(``request``); a preempted holder releases it. Once a long prompt starts, the other long prompts
leave the candidates of this decision. Every ERA rule of the decision is a function here.
"""

from __future__ import annotations

import numpy as np

from accelgen.policies.accelgen.jit import jit
from accelgen.policies.accelgen.state import NO_SLOT, Candidate, Ledger, Params


@jit
def holder(req: np.ndarray, par: Params, owner: int) -> int:
    """The previous decision's holder ``owner`` if it still holds ERA as a pass begins."""
    if not par.era or owner == NO_SLOT:
        return NO_SLOT
    r = req[owner]
    prefill_done = r.n_out > 0 and r.prompt + r.n_out - r.computed == 1
    if not r.running or (prefill_done and not par.era_whole_request):
        return NO_SLOT
    return owner


@jit
def is_long(par: Params, total: int, is_decode: bool) -> bool:
    return not is_decode and total >= par.long_threshold


@jit
def admits(owner: int, s: int, long: bool) -> bool:
    """ERA lets ``s`` join while ``owner`` holds it: nobody does, ``s`` is not long, or the holder."""
    return owner == NO_SLOT or not long or s == owner


@jit
def available(c: Candidate, s: int, led: Ledger) -> bool:
    """``s`` may still join: available, and not a long prompt while another holds ERA."""
    return c.available and admits(led.era_owner, s, c.is_long)


@jit
def allows_long(led: Ledger) -> bool:
    return led.era_owner == NO_SLOT


@jit
def take(c: Candidate, s: int, par: Params, led: Ledger) -> None:
    """``s`` joins the batch: if it is long and nobody holds ERA, it does now."""
    if par.era and c.is_long and led.era_owner == NO_SLOT:
        led.era_owner = s


@jit
def holds(led: Ledger, s: int) -> bool:
    return led.era_owner == s
