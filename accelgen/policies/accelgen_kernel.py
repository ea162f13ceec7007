"""AccelGen's decision compiled with numba: the same decisions as ``DecisionState`` /
``BatchFormer`` (``accelgen.py``, ``accelgen_select.py``) for the full algorithm.

Why: inside vLLM a step's scheduling is vLLM's own ``schedule()`` (some 40-80 us with a dozen
requests) plus the policy; interpreted, the policy alone costs one to three times that (about a
hundred numpy calls, or a few thousand bytecodes over Python lists), whatever the queue length
(``docs/vllm.md``, *Scheduler time*). Here the per-request quantities, the urgency, both batching
steps and the diagnostics run as loops over the ``RequestTable`` arrays in a few compiled calls.

Scope: slack order, dynamic chunking and Euclidean batching all on (the ablations and the
clairvoyant Oracle keep the vectorised classes) and the paper's budget rule (the ``model`` rule
inverts an arbitrary cost model, which compiled code cannot call). The cost model is only asked
for T_max, between the compiled calls: ``shape_constants`` -> T_max at the last budget ->
``urgency`` -> budget -> (T_max at the new budget -> ``urgency``) -> ``form``.

How the code maps: functions here are named after the methods they restate (``_force`` is
``BatchFormer.force``, ``_select`` is ``DecisionState._select``); the batch ledger's scalars live in
an int64 array ``L`` and the per-candidate columns in row-stacked arrays ``I`` (ints), ``B``
(flags) and ``F`` (floats). Two things differ in form, not in result: the Euclidean distances are
compared squared, as exact integers (the vectorised loop does the same), and "no more admissions"
(``math.inf``) is a large integer.

``tests/test_accelgen_kernel.py`` forms every decision of simulations with both implementations and
compares them (batch, preemptions, ERA owner, cut chunks, budget, T_max, SLO_min, diagnostics).
With ``NUMBA_DISABLE_JIT=1`` these functions run as plain Python (slowly), e.g. under a debugger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from accelgen.policies.accelgen import max_batch_time, plan_budget
from accelgen.policies.accelgen_state import ROW


def _refuse_dunder_lookups() -> None:
    """Make llvmlite's library object (``llvmlite.binding.ffi.lib``, loaded with numba) answer
    ``__dict__`` and other dunder names with AttributeError instead of wrapping them as C
    functions.

    Why: vLLM 0.32's CPU worker, when it starts, scans every loaded module's globals and reads
    ``vars(value).get(...)`` of each value that ``hasattr(value, "__dict__")``
    (``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``). That object claims a
    ``__dict__`` (a C-function wrapper), so any engine started in a process that has already
    run this kernel failed with ``AttributeError: '_lib_fn_wrapper' object has no attribute
    'get'``. llvmlite looks up only C symbol names there, never dunders."""
    from llvmlite.binding import ffi

    cls = type(ffi.lib)
    lookup = cls.__getattr__
    if getattr(lookup, "accelgen_guard", False):
        return

    def __getattr__(self: object, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    __getattr__.accelgen_guard = True  # type: ignore[attr-defined]
    cls.__getattr__ = __getattr__  # type: ignore[method-assign]


_refuse_dunder_lookups()

if TYPE_CHECKING:
    from accelgen.policies.accelgen import AccelGenParams, AccelGenPolicy
    from accelgen.policies.accelgen_budget import TokenBudget
    from accelgen.policies.accelgen_state import RequestTable
    from accelgen.policies.base import SchedulerView

# Ledger (L)
_FREE, _AC, _RES, _ADM, _BUDGET, _ERA, _NS, _NP, _NC, _VH, _NV, _LOW, _NGROUPS = range(13)
_LEDGER = 13
# Integer columns (I)
_REM, _COMP, _BLK, _NEED1, _DELTA, _NFREE, _NADM, _TOT = range(8)
_ICOLS = 8
# Flag columns (B)
_DEC, _RUN, _LONG, _AVAIL, _MEMBER, _URGENT, _COUNTED, _ELIG, _LOST, _ONDEC = range(10)
_BCOLS = 10
# Float columns (F)
_KEY, _VK, _SLACK, _SLO, _TD, _NCK = range(6)
_FCOLS = 6

# Constants (K): block size, growth reserve, total blocks, ERA on, gamma-free ints
_BS, _GROWTH, _TOTAL, _ERA_ON, _SPILL, _LATE_URGENT, _LOST_LAST, _MIN_BUDGET, _CAP = range(9)
_KCONST = 9

# Rows of the RequestTable blocks (ints, floats, flags).
_T_PROMPT, _T_NOUT, _T_COMP, _T_BLK = ROW["prompt"], ROW["n_out"], ROW["computed"], ROW["blocks"]
_T_ARRIVAL, _T_TBT, _T_DEADLINE = ROW["arrival"], ROW["tbt"], ROW["deadline"]
_T_RUN, _T_ONLINE, _T_LOST = ROW["running"], ROW["online"], ROW["lost"]

_NO_ADMISSION_CAP = 1 << 60  # "math.inf" admissions: only ever decremented a few times
_LOST_OFFSET = 1e9  # as accelgen._LOST_OFFSET
_NEVER = -(1 << 62)  # as accelgen_select._NEVER

# Diagnostics, in DecisionState._info's order.
INFO_KEYS = ("token_budget", "slo_min", "t_max", "budget_clamped_low", "budget_clamped_high",
             "n_candidates", "n_urgent", "n_late", "n_lost", "n_preempted", "n_scheduled",
             "n_decode", "n_prefill", "n_decode_skipped", "max_chunk", "n_cut_chunks", "n_groups",
             "era_active", "progress_fallback", "chunk_mean", "kv_free_blocks")


# -- per-request columns ---------------------------------------------------------------------
@njit(cache=True)
def shape_constants(ti: np.ndarray, tb: np.ndarray, n: int) -> tuple[int, int, int]:
    """(n_dec, dec_ctx, prefill_ctx) of ``DecisionState``: running decodes, their total context,
    and the longest context of a running prompt."""
    prompt, n_out, computed, running = ti[_T_PROMPT], ti[_T_NOUT], ti[_T_COMP], tb[_T_RUN]
    n_dec = 0
    dec_ctx = 0
    prefill_ctx = 0
    for i in range(n):
        if running[i]:
            rem = prompt[i] + n_out[i] - computed[i]
            if n_out[i] > 0 and rem == 1:
                n_dec += 1
                dec_ctx += computed[i]
            elif computed[i] > prefill_ctx:
                prefill_ctx = computed[i]
    return n_dec, dec_ctx, prefill_ctx


@njit(cache=True)
def _columns(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
             chunk_mean: float, long_threshold: int, era_owner: int, lost_last: bool
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``DecisionState.__init__``'s columns."""
    prompt, n_out, computed, blocks = ti[_T_PROMPT], ti[_T_NOUT], ti[_T_COMP], ti[_T_BLK]
    running, online, lost = tb[_T_RUN], tb[_T_ONLINE], tb[_T_LOST]
    deadline, tbt = tf[_T_DEADLINE], tf[_T_TBT]
    imat = np.empty((_ICOLS, n), dtype=np.int64)
    bmat = np.zeros((_BCOLS, n), dtype=np.bool_)
    fmat = np.empty((_FCOLS, n), dtype=np.float64)
    for i in range(n):
        tot = prompt[i] + n_out[i]
        rem = tot - computed[i]
        dec = n_out[i] > 0 and rem == 1
        imat[_REM, i] = rem
        imat[_TOT, i] = tot
        imat[_COMP, i] = computed[i]
        imat[_BLK, i] = blocks[i]
        bmat[_DEC, i] = dec
        bmat[_RUN, i] = running[i]
        nck = 1.0 if dec else np.ceil(rem / chunk_mean)
        td = deadline[i] - now
        fmat[_NCK, i] = nck
        fmat[_TD, i] = td
        ondec = dec and online[i]
        bmat[_ONDEC, i] = ondec
        fmat[_SLO, i] = tbt[i] if ondec else td / nck
        long_ = (not dec) and tot >= long_threshold
        bmat[_LONG, i] = long_
        bmat[_ELIG, i] = era_owner < 0 or not long_ or i == era_owner
        if lost_last:
            bmat[_LOST, i] = online[i] and (lost[i] or td < 0.0)
    return imat, bmat, fmat


@njit(cache=True)
def _urgency(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, arrival: np.ndarray, n: int,
             t_max: float, gamma: float, late_urgent: bool, lost_last: bool) -> float:
    """``DecisionState._urgency``: slack, urgency, counted and key at ``t_max`` (into the
    columns); returns SLO_min of the urgent requests and the head group."""
    best = math.inf
    k1 = math.inf
    any_rest = False
    for i in range(n):
        slack = fmat[_TD, i] - fmat[_NCK, i] * t_max
        fmat[_SLACK, i] = slack
        dec = bmat[_DEC, i]
        counted = bmat[_ONDEC, i] or slack >= 0.0
        bmat[_COUNTED, i] = counted
        urgent = bmat[_ELIG, i] and slack < t_max and (late_urgent or slack >= 0.0 or dec)
        bmat[_URGENT, i] = urgent
        key = arrival[i] + _LOST_OFFSET if lost_last and bmat[_LOST, i] and not dec else slack
        fmat[_KEY, i] = key
        if urgent:
            if counted and fmat[_SLO, i] < best:
                best = fmat[_SLO, i]
        elif bmat[_ELIG, i]:
            if not any_rest or key < k1:
                k1 = key
            any_rest = True
    if any_rest:
        lim = k1 + gamma
        for i in range(n):
            if (bmat[_ELIG, i] and not bmat[_URGENT, i] and fmat[_KEY, i] <= lim
                    and bmat[_COUNTED, i] and fmat[_SLO, i] < best):
                best = fmat[_SLO, i]
    return best


@njit(cache=True)
def urgency(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
            chunk_mean: float, long_threshold: int, era_owner: int, t_max: float, gamma: float,
            late_urgent: bool, lost_last: bool) -> float:
    """SLO_min at ``t_max`` (``DecisionState._urgency``'s return value)."""
    imat, bmat, fmat = _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner,
                                lost_last)
    return _urgency(imat, bmat, fmat, tf[_T_ARRIVAL], n, t_max, gamma, late_urgent, lost_last)


# -- budget ----------------------------------------------------------------------------------
@njit(cache=True)
def _for_slo(slo: float, s_pf: int, t_pf: float, min_budget: int, cap: int
             ) -> tuple[int, bool, bool]:
    """``TokenBudget.for_slo`` with the paper's rule: (tokens, clamped_low, clamped_high)."""
    if not math.isfinite(slo):
        return cap, False, slo > 0
    raw = 0
    if slo > 0:
        x = s_pf * slo / t_pf
        raw = int(x) if x < 4.0e18 else 4 * 10 ** 18
    if raw < min_budget:
        return min_budget, True, False
    if raw > cap:
        return cap, False, True
    return raw, False, False


# -- KV arithmetic (BatchFormer) -------------------------------------------------------------
@njit(cache=True)
def _need_blocks(imat: np.ndarray, s: int, c: int, bs: int) -> int:
    need = -(-(imat[_COMP, s] + c) // bs) - imat[_BLK, s]
    return need if need > 0 else 0


@njit(cache=True)
def _owed(imat: np.ndarray, k: np.ndarray, s: int) -> int:
    return _need_blocks(imat, s, imat[_REM, s] + k[_GROWTH], k[_BS])


@njit(cache=True)
def _owed_after(imat: np.ndarray, k: np.ndarray, s: int, c: int) -> int:
    bs = k[_BS]
    rem = imat[_REM, s]
    done = imat[_COMP, s] + c
    held = max(imat[_BLK, s], -(-done // bs))
    nxt = (rem - c if c < rem else 1) + k[_GROWTH]
    return max(0, -(-(done + nxt) // bs) - held)


@njit(cache=True)
def _admission_need(imat: np.ndarray, k: np.ndarray, s: int) -> int:
    rem = imat[_REM, s]
    bs = k[_BS]
    return max(_need_blocks(imat, s, rem + 1, bs),
               min(_need_blocks(imat, s, rem + 1 + k[_GROWTH], bs), k[_TOTAL]))


@njit(cache=True)
def _prompt_room(imat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> int:
    bs = k[_BS]
    room_last = max(0, imat[_BLK, s] * bs - imat[_COMP, s])
    spare = min(led[_FREE], led[_FREE] - led[_RES] + _owed(imat, k, s))
    return room_last + max(0, spare) * bs


# -- ledger ----------------------------------------------------------------------------------
@njit(cache=True)
def _add(imat: np.ndarray, bmat: np.ndarray, k: np.ndarray, led: np.ndarray, out: np.ndarray,
         s: int, c: int) -> None:
    n = imat.shape[1]
    need = _need_blocks(imat, s, c, k[_BS])
    if bmat[_RUN, s]:
        led[_RES] -= _owed(imat, k, s)
    else:
        led[_ADM] -= 1
    led[_RES] += _owed_after(imat, k, s, c)
    led[_FREE] -= need
    led[_AC] -= c
    j = led[_NS]
    out[0, j] = s
    out[1, j] = c
    led[_NS] = j + 1
    bmat[_MEMBER, s] = True
    bmat[_AVAIL, s] = False
    if not bmat[_DEC, s] and c < imat[_REM, s]:
        out[3, led[_NC]] = c
        led[_NC] += 1
    if k[_ERA_ON] and bmat[_LONG, s] and led[_ERA] < 0:
        led[_ERA] = s
        for i in range(n):  # ERA: no other long prompt starts while the owner is in prefill
            if bmat[_LONG, i]:
                bmat[_AVAIL, i] = False


@njit(cache=True)
def _add_decodes(imat: np.ndarray, bmat: np.ndarray, led: np.ndarray, out: np.ndarray,
                 u: np.ndarray, lo: int, hi: int) -> None:
    for j in range(lo, hi):
        s = u[j]
        led[_FREE] -= imat[_NEED1, s]
        led[_RES] += imat[_DELTA, s]
        bmat[_MEMBER, s] = True
        bmat[_AVAIL, s] = False
        m = led[_NS]
        out[0, m] = s
        out[1, m] = 1
        led[_NS] = m + 1
    if hi > lo:
        led[_AC] -= hi - lo


@njit(cache=True)
def _slice_end(length: int, stop: int) -> int:
    """End of Python's ``x[:stop]`` on a sequence of ``length``."""
    if stop < 0:
        stop += length
        return stop if stop > 0 else 0
    return stop if stop < length else length


# -- preemption ------------------------------------------------------------------------------
@njit(cache=True)
def _preempt(imat: np.ndarray, bmat: np.ndarray, k: np.ndarray, led: np.ndarray,
             out: np.ndarray, v: int) -> None:
    out[2, led[_NP]] = v
    led[_NP] += 1
    if led[_ADM] > 0:
        led[_ADM] = 0
    led[_FREE] += imat[_BLK, v]
    led[_RES] -= _owed(imat, k, v)
    bmat[_AVAIL, v] = False


@njit(cache=True)
def _enough(imat: np.ndarray, k: np.ndarray, led: np.ndarray, mode: int, x: int, s: int) -> bool:
    if mode == 0:  # an admission: its whole prompt within the KV owed to nobody
        return x <= led[_FREE] - led[_RES]
    if mode == 1:  # a decode: a free block
        return x <= led[_FREE]
    return x <= _prompt_room(imat, k, led, s)  # a running prompt's chunk


@njit(cache=True)
def _free_kv(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
             led: np.ndarray, out: np.ndarray, victims: np.ndarray, mode: int, x: int,
             requester: int, min_key: float) -> None:
    while not _enough(imat, k, led, mode, x, requester) and led[_VH] < led[_NV]:
        v = victims[led[_VH]]
        if fmat[_VK, v] <= min_key:
            return
        led[_VH] += 1
        if v != requester and not bmat[_MEMBER, v]:
            _preempt(imat, bmat, k, led, out, v)


@njit(cache=True)
def _force(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
           led: np.ndarray, out: np.ndarray, victims: np.ndarray, s: int,
           min_key: float) -> bool:
    rem = imat[_REM, s]
    c = 1 if bmat[_DEC, s] else min(rem, led[_AC])
    if c < 1:
        return False
    if not bmat[_RUN, s]:
        if led[_ADM] < 1:
            return False
        whole = _admission_need(imat, k, s)
        _free_kv(imat, bmat, fmat, k, led, out, victims, 0, whole, s, min_key)
        if whole > led[_FREE] - led[_RES]:
            return False
    elif bmat[_DEC, s]:
        need = _need_blocks(imat, s, 1, k[_BS])
        _free_kv(imat, bmat, fmat, k, led, out, victims, 1, need, s, min_key)
        if need > led[_FREE]:
            return False
    else:
        _free_kv(imat, bmat, fmat, k, led, out, victims, 2, c, s, min_key)
        room = _prompt_room(imat, k, led, s)
        if c > room:
            if room < 1:
                return False
            c = room
    _add(imat, bmat, k, led, out, s, c)
    return True


@njit(cache=True)
def _victim_min_key(bmat: np.ndarray, fmat: np.ndarray, s: int, gamma: float,
                    t_max: float) -> float:
    if bmat[_RUN, s]:
        return fmat[_VK, s]
    return max(fmat[_KEY, s] + gamma, t_max)


@njit(cache=True)
def _era_blocked(bmat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> bool:
    return bool(k[_ERA_ON]) and bmat[_LONG, s] and led[_ERA] >= 0 and led[_ERA] != s


@njit(cache=True)
def _slots_by(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Slots where ``mask`` holds, in ascending ``values`` (stable: ties by slot)."""
    slots = np.nonzero(mask)[0]
    return slots[np.argsort(values[slots], kind="mergesort")]


# -- step 1: urgent requests -----------------------------------------------------------------
@njit(cache=True)
def _add_urgent(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
                led: np.ndarray, out: np.ndarray, victims: np.ndarray, urgent: np.ndarray,
                gamma: float, t_max: float) -> None:
    nu = urgent.shape[0]
    decs = np.empty(nu, dtype=np.int64)
    prompts = np.empty(nu, dtype=np.int64)
    nd = 0
    npr = 0
    for j in range(nu):
        s = urgent[j]
        if bmat[_AVAIL, s]:
            if bmat[_DEC, s]:
                decs[nd] = s
                nd += 1
            else:
                prompts[npr] = s
                npr += 1
    nd = _slice_end(nd, led[_AC])
    # The urgent decodes (slack order) whose next token fits now: no new block needed, or one
    # while blocks are free; the others need a preemption.
    fit = np.empty(nd, dtype=np.int64)
    short = np.empty(nd, dtype=np.int64)
    n_with = 0
    for j in range(nd):
        if imat[_NEED1, decs[j]] > 0:
            n_with += 1
    n_fit_with = _slice_end(n_with, led[_FREE])
    nf = 0
    ns = 0
    seen = 0
    for j in range(nd):
        s = decs[j]
        if imat[_NEED1, s] > 0:
            ok = seen < n_fit_with
            seen += 1
        else:
            ok = True
        if ok:
            fit[nf] = s
            nf += 1
        else:
            short[ns] = s
            ns += 1
    _add_decodes(imat, bmat, led, out, fit, 0, nf)
    for j in range(ns):
        if led[_AC] <= 0:
            return
        s = short[j]
        _force(imat, bmat, fmat, k, led, out, victims, s,
               _victim_min_key(bmat, fmat, s, gamma, t_max))
    for j in range(npr):
        if led[_AC] <= 0:
            return
        s = prompts[j]
        if bmat[_AVAIL, s] and not _era_blocked(bmat, k, led, s):
            _force(imat, bmat, fmat, k, led, out, victims, s,
                   _victim_min_key(bmat, fmat, s, gamma, t_max))


# -- step 2: SelectRequests ------------------------------------------------------------------
@njit(cache=True)
def _bisect_right(a: np.ndarray, x: int, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def _bisect_left(a: np.ndarray, x: int, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _best_fresh(k: np.ndarray, led: np.ndarray, f_rem: np.ndarray, f_key: np.ndarray,
                fl: int) -> tuple[int, int]:
    """``BatchFormer._best_fresh``: (index, chunk), index -1 if none."""
    if fl == 0 or led[_ADM] < 1:
        return -1, 0
    bs = k[_BS]
    free = led[_FREE] - led[_RES]
    limit = free * bs - 1 - k[_GROWTH] if free < k[_TOTAL] else k[_TOTAL] * bs - 1
    hi = _bisect_right(f_rem, limit, 0, fl)
    if hi == 0:
        return -1, 0
    a_c = led[_AC]
    if f_rem[hi - 1] >= a_c:
        lo = _bisect_left(f_rem, a_c, 0, hi)
        j = lo
        for i in range(lo + 1, hi):
            if f_key[i] < f_key[j]:
                j = i
        return j, a_c
    j = _bisect_right(f_rem, a_c, 0, hi) - 1
    if j < 0:
        return -1, 0
    r = f_rem[j]
    i = j - 1
    while i >= 0 and f_rem[i] == r:
        if f_key[i] < f_key[j]:
            j = i
        i -= 1
    return j, r


@njit(cache=True)
def _prompt_chunk(imat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> int:
    return min(imat[_REM, s], led[_AC], _prompt_room(imat, k, led, s))


@njit(cache=True)
def _add_alone(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
               led: np.ndarray, out: np.ndarray, s: int) -> None:
    if bmat[_DEC, s]:
        _add(imat, bmat, k, led, out, s, 1)
    elif bmat[_RUN, s]:
        c = _prompt_chunk(imat, k, led, s)
        if c >= 1:
            _add(imat, bmat, k, led, out, s, c)
    else:
        f_rem = np.array([imat[_REM, s]], dtype=np.int64)
        f_key = np.array([fmat[_KEY, s]], dtype=np.float64)
        j, c = _best_fresh(k, led, f_rem, f_key, 1)
        if j >= 0:
            _add(imat, bmat, k, led, out, s, c)


@njit(cache=True)
def _select_euclidean(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
                      led: np.ndarray, out: np.ndarray, group: np.ndarray, gn: int) -> None:
    """Algorithm 2 on one slack group (``BatchFormer.select_euclidean`` / ``_euclid_loop``)."""
    if gn == 1:
        _add_alone(imat, bmat, fmat, k, led, out, group[0])
        return
    bs = k[_BS]
    # Pools: prompts holding no KV by remaining length (stable), running prompts, decodes
    # needing a block, decodes needing none (each in key order, as the group is).
    f_slot = np.empty(gn, dtype=np.int64)
    fl = 0
    partial = np.empty(gn, dtype=np.int64)
    pn = 0
    dec_b = np.empty(gn, dtype=np.int64)
    nb = 0
    dec_a = np.empty(gn, dtype=np.int64)
    na = 0
    for j in range(gn):
        s = group[j]
        run = bmat[_RUN, s]
        dec = bmat[_DEC, s]
        if not run:
            f_slot[fl] = s
            fl += 1
        elif not dec:
            partial[pn] = s
            pn += 1
        if dec:
            if imat[_NEED1, s] > 0:
                dec_b[nb] = s
                nb += 1
            else:
                dec_a[na] = s
                na += 1
    if fl > 1:
        order = np.argsort(imat[_REM][f_slot[:fl]], kind="mergesort")
        f_slot[:fl] = f_slot[:fl][order]
    f_rem = np.empty(fl, dtype=np.int64)
    f_key = np.empty(fl, dtype=np.float64)
    for j in range(fl):
        f_rem[j] = imat[_REM, f_slot[j]]
        f_key[j] = fmat[_KEY, f_slot[j]]
    hb = 0
    ha = 0
    while led[_AC] > 0:
        a_c = led[_AC]
        a_m = led[_FREE] * bs
        best_kind = -1
        best_j = 0
        best_c = 0
        best_d = 0
        best_k = math.inf
        j, c = _best_fresh(k, led, f_rem, f_key, fl)
        if j >= 0:
            m = -(-c // bs) * bs
            best_d = (a_c - c) * (a_c - c) + (a_m - m) * (a_m - m)
            best_k = f_key[j]
            best_kind, best_j, best_c = 0, j, c
        for pi in range(pn):
            s = partial[pi]
            c = _prompt_chunk(imat, k, led, s)
            if c < 1:
                continue
            dm = a_m - _need_blocks(imat, s, c, bs) * bs
            d = (a_c - c) * (a_c - c) + dm * dm
            key = fmat[_KEY, s]
            if best_kind < 0 or d < best_d or (d == best_d and key < best_k):
                best_d, best_k = d, key
                best_kind, best_j, best_c = 1, pi, c
        prompt_fits = best_kind >= 0
        # Decodes: (1, b) while a block is free, else (1, 0).
        use_b = nb > hb and led[_FREE] >= 1
        if use_b or na > ha:
            dm = a_m - (bs if use_b else 0)
            d = (a_c - 1) * (a_c - 1) + dm * dm
            key = fmat[_KEY, dec_b[hb]] if use_b else fmat[_KEY, dec_a[ha]]
            if best_kind < 0 or d < best_d or (d == best_d and key < best_k):
                best_kind = 2 if use_b else 3
        if best_kind < 0:
            return
        if best_kind == 0:
            s = f_slot[best_j]
            for i in range(best_j, fl - 1):
                f_slot[i] = f_slot[i + 1]
                f_rem[i] = f_rem[i + 1]
                f_key[i] = f_key[i + 1]
            fl -= 1
            _add(imat, bmat, k, led, out, s, best_c)
            if k[_ERA_ON] and led[_ERA] == s:  # other long prompts leave the group
                w = 0
                for i in range(fl):
                    if not bmat[_LONG, f_slot[i]]:
                        f_slot[w] = f_slot[i]
                        f_rem[w] = f_rem[i]
                        f_key[w] = f_key[i]
                        w += 1
                fl = w
        elif best_kind == 1:
            s = partial[best_j]
            for i in range(best_j, pn - 1):
                partial[i] = partial[i + 1]
            pn -= 1
            _add(imat, bmat, k, led, out, s, best_c)
        elif prompt_fits:  # a decode beat a prompt chunk needing no new block
            if best_kind == 2:
                s = dec_b[hb]
                hb += 1
            else:
                s = dec_a[ha]
                ha += 1
            _add(imat, bmat, k, led, out, s, 1)
        else:
            # No prompt fits any more: (1, b) decodes while blocks are free, then (1, 0).
            k_b = _slice_end(nb - hb, min(led[_AC], led[_FREE]))
            _add_decodes(imat, bmat, led, out, dec_b, hb, hb + k_b)
            k_a = _slice_end(na - ha, led[_AC])
            _add_decodes(imat, bmat, led, out, dec_a, ha, ha + k_a)
            return


@njit(cache=True)
def _feasible(imat: np.ndarray, bmat: np.ndarray, led: np.ndarray, s: int) -> bool:
    if imat[_NFREE, s] > led[_FREE] or imat[_NADM, s] > led[_FREE] - led[_RES]:
        return False
    return led[_ADM] >= 1 or bmat[_RUN, s]


@njit(cache=True)
def _select(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
            led: np.ndarray, out: np.ndarray, order: np.ndarray, group: np.ndarray,
            gamma: float, slo_min: float, s_pf: int, t_pf: float) -> float:
    """``DecisionState._select``; returns SLO_min as lowered by the groups that joined."""
    n = order.shape[0]
    while led[_AC] > 0:
        # The next slack group: the feasible available candidates within gamma of the first.
        gn = 0
        lim = 0.0
        for j in range(n):
            s = order[j]
            if not bmat[_AVAIL, s] or not _feasible(imat, bmat, led, s):
                continue
            if gn == 0:
                lim = fmat[_KEY, s] + gamma
            elif fmat[_KEY, s] > lim:
                break
            group[gn] = s
            gn += 1
        if gn == 0:
            return slo_min
        led[_NGROUPS] += 1
        m = math.inf
        for j in range(gn):
            s = group[j]
            if bmat[_COUNTED, s] and fmat[_SLO, s] < m:
                m = fmat[_SLO, s]
        if m < slo_min:
            slo_min = m
            tokens, low, _ = _for_slo(m, s_pf, t_pf, k[_MIN_BUDGET], k[_CAP])
            if tokens < led[_BUDGET]:
                led[_AC] -= led[_BUDGET] - tokens
                led[_BUDGET] = tokens
                led[_LOW] = 1 if low else 0
                if led[_AC] <= 0:
                    return slo_min
        before = led[_NS]
        _select_euclidean(imat, bmat, fmat, k, led, out, group, gn)
        if not k[_SPILL] or led[_NS] == before:
            return slo_min
    return slo_min


# -- one decision ----------------------------------------------------------------------------
@njit(cache=True)
def form(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float, chunk_mean: float,
         long_threshold: int, era_owner: int, t_max: float, gamma: float, slo_min: float,
         budget: int, clamped_low: bool, clamped_high: bool, k: np.ndarray, free_blocks: int,
         admissions_left: int, s_pf: int, t_pf: float) -> tuple[np.ndarray, np.ndarray]:
    """``DecisionState.form`` at ``t_max`` with token budget ``budget``.

    Returns ``packed`` (the three lengths, then slots, tokens, preempted slots and cut chunks)
    and the diagnostics in ``INFO_KEYS`` order followed by the ERA owner's slot, as floats."""
    late_urgent = bool(k[_LATE_URGENT])
    lost_last = bool(k[_LOST_LAST])
    arrival = tf[_T_ARRIVAL]
    imat, bmat, fmat = _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner,
                                lost_last)
    _urgency(imat, bmat, fmat, arrival, n, t_max, gamma, late_urgent, lost_last)
    bs = k[_BS]
    g = k[_GROWTH]
    total = k[_TOTAL]
    reserved = 0
    # BatchFormer.__init__'s per-candidate block needs.
    for i in range(n):
        comp = imat[_COMP, i]
        blk = imat[_BLK, i]
        rem = imat[_REM, i]
        nxt = (comp + bs) // bs
        need1 = nxt - blk if nxt > blk else 0
        owed_all = max((comp + rem + (g + bs - 1)) // bs - blk, 0)
        fresh_need = max((rem + bs) // bs, min((rem + (g + bs)) // bs, total))
        held = max(blk, nxt)
        imat[_NEED1, i] = need1
        imat[_DELTA, i] = max((comp + (g + bs + 1)) // bs - held, 0) - owed_all
        if bmat[_RUN, i]:
            reserved += owed_all
            imat[_NFREE, i] = need1
            imat[_NADM, i] = _NEVER if bmat[_DEC, i] else need1 - owed_all
        else:
            imat[_NFREE, i] = _NEVER
            imat[_NADM, i] = fresh_need
        bmat[_AVAIL, i] = bmat[_ELIG, i]
        # Victim key: the slack once preempted (recomputing everything it holds); lost requests
        # first, the oldest first.
        if lost_last and bmat[_LOST, i]:
            fmat[_VK, i] = _LOST_OFFSET - arrival[i]
        else:
            fmat[_VK, i] = fmat[_TD, i] - np.ceil(imat[_TOT, i] / chunk_mean) * t_max
    led = np.zeros(_LEDGER, dtype=np.int64)
    led[_FREE] = free_blocks
    led[_AC] = budget
    led[_BUDGET] = budget
    led[_RES] = reserved
    led[_ADM] = admissions_left
    led[_ERA] = era_owner
    led[_LOW] = 1 if clamped_low else 0
    # (2n: room even if a policy bug added a slot twice; numba does not check bounds)
    out = np.empty((4, 2 * n + 1), dtype=np.int64)
    # Victims: running requests, largest victim key first.
    victims = _slots_by(bmat[_RUN], -fmat[_VK])
    led[_NV] = victims.shape[0]
    # Step 1: urgent requests in ascending slack.
    urgent = _slots_by(bmat[_URGENT] & bmat[_AVAIL], fmat[_SLACK])
    nu = urgent.shape[0]
    _add_urgent(imat, bmat, fmat, k, led, out, victims, urgent, gamma, t_max)
    # Step 2.
    order = np.argsort(fmat[_KEY], kind="mergesort")
    group = np.empty(n, dtype=np.int64)
    slo_min = _select(imat, bmat, fmat, k, led, out, order, group, gamma, slo_min, s_pf, t_pf)
    fallback = led[_NS] == 0
    if fallback:
        # Nothing fits: the first running request in key order (else the first waiting one),
        # preempting the largest-key running requests for it.
        avail = bmat[_AVAIL]
        cand = np.concatenate((_slots_by(avail & bmat[_RUN], fmat[_KEY]),
                               _slots_by(avail & ~bmat[_RUN], fmat[_KEY])))
        for j in range(cand.shape[0]):
            if _force(imat, bmat, fmat, k, led, out, victims, cand[j], -math.inf):
                slo_min = _select(imat, bmat, fmat, k, led, out, order, group, gamma, slo_min,
                                  s_pf, t_pf)
                break
    # Diagnostics (DecisionState.info).
    n_late = 0
    n_lost = 0
    n_dec = 0
    for i in range(n):
        if fmat[_SLACK, i] < 0.0:
            n_late += 1
        if lost_last and bmat[_LOST, i]:
            n_lost += 1
        if bmat[_RUN, i] and bmat[_DEC, i]:
            n_dec += 1
    dec_sched = 0
    max_chunk = 0
    for j in range(led[_NS]):
        if bmat[_DEC, out[0, j]]:
            dec_sched += 1
        elif out[1, j] > max_chunk:
            max_chunk = out[1, j]
    n_sched = led[_NS]
    info = np.empty(len(INFO_KEYS) + 1, dtype=np.float64)
    info[0] = led[_BUDGET]
    info[1] = slo_min if math.isfinite(slo_min) else math.nan
    info[2] = t_max
    info[3] = led[_LOW]
    info[4] = 1.0 if clamped_high else 0.0  # (step 2 keeps step 1's)
    info[5] = n
    info[6] = nu
    info[7] = n_late
    info[8] = n_lost
    info[9] = led[_NP]
    info[10] = n_sched
    info[11] = dec_sched
    info[12] = n_sched - dec_sched
    info[13] = n_dec - dec_sched
    info[14] = max_chunk
    info[15] = led[_NC]
    info[16] = led[_NGROUPS]
    info[17] = 1.0 if led[_ERA] >= 0 else 0.0
    info[18] = 1.0 if fallback else 0.0
    info[19] = chunk_mean
    info[20] = led[_FREE]
    info[21] = led[_ERA]  # (trailer: the ERA owner's slot)
    lens = np.array([led[_NS], led[_NP], led[_NC]], dtype=np.int64)
    packed = np.empty(lens[0] * 2 + lens[1] + lens[2] + 3, dtype=np.int64)
    packed[:3] = lens
    p = 3
    packed[p:p + lens[0]] = out[0, :lens[0]]
    p += lens[0]
    packed[p:p + lens[0]] = out[1, :lens[0]]
    p += lens[0]
    packed[p:p + lens[1]] = out[2, :lens[1]]
    p += lens[1]
    packed[p:p + lens[2]] = out[3, :lens[2]]
    return packed, info


@njit(cache=True)
def _linear_time(base: float, per_token: float, per_ctx: float, n_tokens: int,
                 decode_ctx: int) -> float:
    """``LinearCostModel.iteration_time`` (the same arithmetic, in the same order)."""
    if n_tokens <= 0:
        return 0.0
    return base + per_token * n_tokens + per_ctx * decode_ctx


@njit(cache=True)
def _linear_t_max(budget: int, n_dec: int, dec_ctx: int, base: float, per_token: float,
                  per_ctx: float) -> float:
    """``accelgen.max_batch_time`` under a linear cost model (which reads no prefill context)."""
    nd = min(n_dec, budget)
    ctx = dec_ctx if nd == n_dec else dec_ctx * nd // max(n_dec, 1)
    n_tokens = (budget - nd if budget > nd else 0) + nd
    it = _linear_time(base, per_token, per_ctx, n_tokens, ctx)
    ft = _linear_time(base, per_token, per_ctx, budget, 0)
    return ft if ft > it else it


@njit(cache=True)
def decide_linear(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
                  chunk_mean: float, long_threshold: int, era_owner: int, gamma: float,
                  prev_budget: int, base: float, per_token: float, per_ctx: float,
                  k: np.ndarray, free_blocks: int, admissions_left: int, s_pf: int,
                  t_pf: float) -> tuple[np.ndarray, np.ndarray]:
    """The whole decision in one call when the cost model is ``LinearCostModel`` (the vLLM
    plugin's): T_max is then computed here (``accelgen.plan_budget``, compiled), then ``form``."""
    late_urgent = bool(k[_LATE_URGENT])
    lost_last = bool(k[_LOST_LAST])
    n_dec, dec_ctx, _ = shape_constants(ti, tb, n)
    t_prev = _linear_t_max(prev_budget, n_dec, dec_ctx, base, per_token, per_ctx)
    imat, bmat, fmat = _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner,
                                lost_last)
    arrival = tf[_T_ARRIVAL]
    slo_min = _urgency(imat, bmat, fmat, arrival, n, t_prev, gamma, late_urgent, lost_last)
    tokens, low, high = _for_slo(slo_min, s_pf, t_pf, k[_MIN_BUDGET], k[_CAP])
    t_max = t_prev
    if tokens != prev_budget:
        t_new = _linear_t_max(tokens, n_dec, dec_ctx, base, per_token, per_ctx)
        if t_new > t_prev:
            again = _urgency(imat, bmat, fmat, arrival, n, t_new, gamma, late_urgent, lost_last)
            if again < slo_min:
                slo_min = again
            tokens, low, high = _for_slo(slo_min, s_pf, t_pf, k[_MIN_BUDGET], k[_CAP])
            t_max = t_new
    return form(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner, t_max, gamma, slo_min,
                tokens, low, high, k, free_blocks, admissions_left, s_pf, t_pf)


# -- the Python side -------------------------------------------------------------------------
@dataclass(slots=True)
class KernelResult:
    """One compiled decision: slots index the ``RequestTable``, as a ``BatchFormer``'s;
    ``slo_min`` is NaN when nothing constrained the budget."""

    slots: list[int]
    tokens: list[int]
    preempted: list[int]
    cut_chunks: list[int]
    era_owner: int
    budget: int
    t_max: float
    slo_min: float
    info: dict[str, float]


def decide(policy: AccelGenPolicy, view: SchedulerView, t: RequestTable, bud: TokenBudget,
           chunk_mean: float) -> KernelResult:
    """``DecisionState(policy, view, t, bud, chunk_mean).form()`` compiled (see the module
    docstring for the order of the calls)."""
    p = policy.params
    n = t.n
    now = view.now
    ti, tf, tb = t.ints, t.floats, t.flags
    owner = -1
    if p.era and policy._era_owner is not None:
        owner = t.slot_of.get(policy._era_owner, -1)
    thr, gamma, late, lost_last = p.long_prompt_threshold, p.gamma, p.late_is_urgent, p.lost_last
    kv = view.kv
    consts = _constants(p, kv.block_size, kv.num_total_blocks, bud)
    adm = (_NO_ADMISSION_CAP if p.max_num_seqs is None
           else p.max_num_seqs - int(np.count_nonzero(t.running[:n])))
    cost = view.cost
    prev = policy._prev_budget
    s_pf, t_pf = bud.pivot.s_pf, bud.pivot.t_pf
    lin = cost.linear_coefficients()
    if lin is not None:
        packed, info_arr = decide_linear(ti, tf, tb, n, now, chunk_mean, thr, owner, gamma, prev,
                                         lin[0], lin[1], lin[2], consts, kv.num_free_blocks, adm,
                                         s_pf, t_pf)
    else:
        n_dec, dec_ctx, prefill_ctx = shape_constants(ti, tb, n)
        slo_min, b, t_max = plan_budget(
            bud, prev,
            lambda budget: max_batch_time(cost, bud, budget, n_dec, dec_ctx, prefill_ctx),
            lambda t: urgency(ti, tf, tb, n, now, chunk_mean, thr, owner, t, gamma, late,
                              lost_last))
        packed, info_arr = form(ti, tf, tb, n, now, chunk_mean, thr, owner, t_max, gamma,
                                slo_min, b.tokens, b.clamped_low, b.clamped_high, consts,
                                kv.num_free_blocks, adm, s_pf, t_pf)
    ints = packed.tolist()
    ns, npre, ncut = ints[0], ints[1], ints[2]
    j = 3 + 2 * ns
    vals = info_arr.tolist()
    return KernelResult(ints[3:3 + ns], ints[3 + ns:j], ints[j:j + npre],
                        ints[j + npre:j + npre + ncut], int(vals[21]), int(vals[0]), vals[2],
                        vals[1], dict(zip(INFO_KEYS, vals, strict=False)))


_LAST: list[object] = [None, None]  # (key of the last lookup, its array)


def _constants(p: AccelGenParams, block_size: int, total_blocks: int, bud: TokenBudget
               ) -> np.ndarray:
    """The ``K`` array (read-only for the kernel), rebuilt only when the params, KV or budget
    objects change (a policy's stay the same between refits)."""
    key = (p, block_size, total_blocks, bud)
    if _LAST[0] != key:
        growth = block_size if p.kv_growth_reserve is None else p.kv_growth_reserve
        _LAST[0], _LAST[1] = key, np.array(
            (block_size, growth, total_blocks, p.era, p.spill_groups, p.late_is_urgent,
             p.lost_last, bud.min_budget, bud.cap), dtype=np.int64)
    return _LAST[1]  # type: ignore[return-value]
