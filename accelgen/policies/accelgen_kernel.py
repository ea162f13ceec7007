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

Per decision nothing is allocated and nothing reference-counted: the columns, slot lists, sort
buffer, ledger and outputs live in a ``Workspace`` kept between decisions, the functions are
compiled with ``_nrt=False`` (every array is the caller's), and ``CompiledDecision`` calls the
compiled entry point with the arguments that stay the same cached. Why: in vLLM each step runs
after a forward pass has evicted the caches, where every allocation, reference count and
dispatcher lookup costs cache misses (``docs/vllm.md``, *Scheduler time*).

``tests/test_accelgen_kernel.py`` forms every decision of simulations with both implementations and
compares them (batch, preemptions, ERA owner, cut chunks, budget, T_max, SLO_min, diagnostics).
With ``NUMBA_DISABLE_JIT=1`` these functions run as plain Python (slowly), e.g. under a debugger.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit, typeof, types

from accelgen.policies.accelgen import INFO_INDEX, INFO_KEYS, max_batch_time, plan_budget
from accelgen.policies.accelgen_state import ROW
from accelgen.policies.base import InfoRow


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
_FREE, _AC, _RES, _ADM, _BUDGET, _ERA, _NS, _NP, _NC, _VH, _NV, _LOW, _NGROUPS, _N = range(14)
_LEDGER = 14
# Integer columns (I)
_REM, _COMP, _BLK, _NEED1, _DELTA, _NFREE, _NADM, _TOT = range(8)
_ICOLS = 8
# Flag columns (B)
_DEC, _RUN, _LONG, _AVAIL, _MEMBER, _URGENT, _COUNTED, _ELIG, _LOST, _ONDEC = range(10)
_BCOLS = 10
# Float columns (F); the last two are scratch (Euclidean pool keys, negated victim keys)
_KEY, _VK, _SLACK, _SLO, _TD, _NCK, _FKEY, _NEGVK = range(8)
_FCOLS = 8
# Scratch rows (S): the decision's outputs (batch slots and tokens, preempted slots, cut
# chunks), then slot lists and a sort buffer
(_S_SLOT, _S_TOK, _S_PRE, _S_CUT, _S_VICT, _S_URG, _S_ORD, _S_GRP, _S_DECS, _S_PROMPTS, _S_FIT,
 _S_SHORT, _S_FSLOT, _S_PART, _S_DECB, _S_DECA, _S_FREM, _S_CAND, _S_TMP) = range(19)
_SROWS = 19

# Constants (K): block size, growth reserve, total blocks, ERA on, gamma-free ints
_BS, _GROWTH, _TOTAL, _ERA_ON, _SPILL, _LATE_URGENT, _LOST_LAST, _MIN_BUDGET, _CAP = range(9)
_KCONST = 9

# Rows of the RequestTable blocks (ints, floats, flags).
_T_PROMPT, _T_NOUT, _T_COMP, _T_BLK = ROW["prompt"], ROW["n_out"], ROW["computed"], ROW["blocks"]
_T_ARRIVAL, _T_TBT, _T_DEADLINE = ROW["arrival"], ROW["tbt"], ROW["deadline"]
_T_RUN, _T_ONLINE, _T_LOST = ROW["running"], ROW["online"], ROW["lost"]

_HEADER = 5  # packed outputs: batch size, preemptions, cut chunks, token budget, ERA owner's slot
_NO_ADMISSION_CAP = 1 << 60  # "math.inf" admissions: only ever decremented a few times
_LOST_OFFSET = 1e9  # as accelgen._LOST_OFFSET
_NEVER = -(1 << 62)  # as accelgen_select._NEVER



# -- per-request columns ---------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
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


@njit(cache=True, error_model="numpy", _nrt=False)
def _columns(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
             chunk_mean: float, long_threshold: int, era_owner: int, lost_last: bool,
             imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray) -> None:
    """``DecisionState.__init__``'s columns, into the workspace's first ``n`` columns (every
    flag row is written: the workspace keeps the previous decision's values)."""
    prompt, n_out, computed, blocks = ti[_T_PROMPT], ti[_T_NOUT], ti[_T_COMP], ti[_T_BLK]
    running, online, lost = tb[_T_RUN], tb[_T_ONLINE], tb[_T_LOST]
    deadline, tbt = tf[_T_DEADLINE], tf[_T_TBT]
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
        bmat[_LOST, i] = lost_last and online[i] and (lost[i] or td < 0.0)
        bmat[_MEMBER, i] = False
        bmat[_AVAIL, i] = False
        bmat[_URGENT, i] = False
        bmat[_COUNTED, i] = False


@njit(cache=True, error_model="numpy", _nrt=False)
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


@njit(cache=True, error_model="numpy", _nrt=False)
def urgency(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
            chunk_mean: float, long_threshold: int, era_owner: int, t_max: float, gamma: float,
            late_urgent: bool, lost_last: bool, imat: np.ndarray, bmat: np.ndarray,
            fmat: np.ndarray) -> float:
    """SLO_min at ``t_max`` (``DecisionState._urgency``'s return value); the columns go to the
    workspace arrays ``imat``, ``bmat``, ``fmat``."""
    _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner, lost_last, imat, bmat,
             fmat)
    return _urgency(imat, bmat, fmat, tf[_T_ARRIVAL], n, t_max, gamma, late_urgent, lost_last)


# -- budget ----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
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
@njit(cache=True, error_model="numpy", _nrt=False)
def _need_blocks(imat: np.ndarray, s: int, c: int, bs: int) -> int:
    need = -(-(imat[_COMP, s] + c) // bs) - imat[_BLK, s]
    return need if need > 0 else 0


@njit(cache=True, error_model="numpy", _nrt=False)
def _owed(imat: np.ndarray, k: np.ndarray, s: int) -> int:
    return _need_blocks(imat, s, imat[_REM, s] + k[_GROWTH], k[_BS])


@njit(cache=True, error_model="numpy", _nrt=False)
def _owed_after(imat: np.ndarray, k: np.ndarray, s: int, c: int) -> int:
    bs = k[_BS]
    rem = imat[_REM, s]
    done = imat[_COMP, s] + c
    held = max(imat[_BLK, s], -(-done // bs))
    nxt = (rem - c if c < rem else 1) + k[_GROWTH]
    return max(0, -(-(done + nxt) // bs) - held)


@njit(cache=True, error_model="numpy", _nrt=False)
def _admission_need(imat: np.ndarray, k: np.ndarray, s: int) -> int:
    rem = imat[_REM, s]
    bs = k[_BS]
    return max(_need_blocks(imat, s, rem + 1, bs),
               min(_need_blocks(imat, s, rem + 1 + k[_GROWTH], bs), k[_TOTAL]))


@njit(cache=True, error_model="numpy", _nrt=False)
def _prompt_room(imat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> int:
    bs = k[_BS]
    room_last = max(0, imat[_BLK, s] * bs - imat[_COMP, s])
    spare = min(led[_FREE], led[_FREE] - led[_RES] + _owed(imat, k, s))
    return room_last + max(0, spare) * bs


# -- ledger ----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
def _add(imat: np.ndarray, bmat: np.ndarray, k: np.ndarray, led: np.ndarray, sc: np.ndarray,
         s: int, c: int) -> None:
    need = _need_blocks(imat, s, c, k[_BS])
    if bmat[_RUN, s]:
        led[_RES] -= _owed(imat, k, s)
    else:
        led[_ADM] -= 1
    led[_RES] += _owed_after(imat, k, s, c)
    led[_FREE] -= need
    led[_AC] -= c
    j = led[_NS]
    sc[_S_SLOT, j] = s
    sc[_S_TOK, j] = c
    led[_NS] = j + 1
    bmat[_MEMBER, s] = True
    bmat[_AVAIL, s] = False
    if not bmat[_DEC, s] and c < imat[_REM, s]:
        sc[_S_CUT, led[_NC]] = c
        led[_NC] += 1
    if k[_ERA_ON] and bmat[_LONG, s] and led[_ERA] < 0:
        led[_ERA] = s
        for i in range(led[_N]):  # ERA: no other long prompt starts while the owner is in prefill
            if bmat[_LONG, i]:
                bmat[_AVAIL, i] = False


@njit(cache=True, error_model="numpy", _nrt=False)
def _add_decodes(imat: np.ndarray, bmat: np.ndarray, led: np.ndarray, sc: np.ndarray,
                 u: np.ndarray, lo: int, hi: int) -> None:
    for j in range(lo, hi):
        s = u[j]
        led[_FREE] -= imat[_NEED1, s]
        led[_RES] += imat[_DELTA, s]
        bmat[_MEMBER, s] = True
        bmat[_AVAIL, s] = False
        m = led[_NS]
        sc[_S_SLOT, m] = s
        sc[_S_TOK, m] = 1
        led[_NS] = m + 1
    if hi > lo:
        led[_AC] -= hi - lo


@njit(cache=True, error_model="numpy", _nrt=False)
def _slice_end(length: int, stop: int) -> int:
    """End of Python's ``x[:stop]`` on a sequence of ``length``."""
    if stop < 0:
        stop += length
        return stop if stop > 0 else 0
    return stop if stop < length else length


# -- preemption ------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
def _preempt(imat: np.ndarray, bmat: np.ndarray, k: np.ndarray, led: np.ndarray,
             sc: np.ndarray, v: int) -> None:
    sc[_S_PRE, led[_NP]] = v
    led[_NP] += 1
    if led[_ADM] > 0:
        led[_ADM] = 0
    led[_FREE] += imat[_BLK, v]
    led[_RES] -= _owed(imat, k, v)
    bmat[_AVAIL, v] = False


@njit(cache=True, error_model="numpy", _nrt=False)
def _enough(imat: np.ndarray, k: np.ndarray, led: np.ndarray, mode: int, x: int, s: int) -> bool:
    if mode == 0:  # an admission: its whole prompt within the KV owed to nobody
        return x <= led[_FREE] - led[_RES]
    if mode == 1:  # a decode: a free block
        return x <= led[_FREE]
    return x <= _prompt_room(imat, k, led, s)  # a running prompt's chunk


@njit(cache=True, error_model="numpy", _nrt=False)
def _free_kv(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
             led: np.ndarray, sc: np.ndarray, victims: np.ndarray, mode: int, x: int,
             requester: int, min_key: float) -> None:
    while not _enough(imat, k, led, mode, x, requester) and led[_VH] < led[_NV]:
        v = victims[led[_VH]]
        if fmat[_VK, v] <= min_key:
            return
        led[_VH] += 1
        if v != requester and not bmat[_MEMBER, v]:
            _preempt(imat, bmat, k, led, sc, v)


@njit(cache=True, error_model="numpy", _nrt=False)
def _force(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
           led: np.ndarray, sc: np.ndarray, victims: np.ndarray, s: int,
           min_key: float) -> bool:
    rem = imat[_REM, s]
    c = 1 if bmat[_DEC, s] else min(rem, led[_AC])
    if c < 1:
        return False
    if not bmat[_RUN, s]:
        if led[_ADM] < 1:
            return False
        whole = _admission_need(imat, k, s)
        _free_kv(imat, bmat, fmat, k, led, sc, victims, 0, whole, s, min_key)
        if whole > led[_FREE] - led[_RES]:
            return False
    elif bmat[_DEC, s]:
        need = _need_blocks(imat, s, 1, k[_BS])
        _free_kv(imat, bmat, fmat, k, led, sc, victims, 1, need, s, min_key)
        if need > led[_FREE]:
            return False
    else:
        _free_kv(imat, bmat, fmat, k, led, sc, victims, 2, c, s, min_key)
        room = _prompt_room(imat, k, led, s)
        if c > room:
            if room < 1:
                return False
            c = room
    _add(imat, bmat, k, led, sc, s, c)
    return True


@njit(cache=True, error_model="numpy", _nrt=False)
def _victim_min_key(bmat: np.ndarray, fmat: np.ndarray, s: int, gamma: float,
                    t_max: float) -> float:
    if bmat[_RUN, s]:
        return fmat[_VK, s]
    return max(fmat[_KEY, s] + gamma, t_max)


@njit(cache=True, error_model="numpy", _nrt=False)
def _era_blocked(bmat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> bool:
    return bool(k[_ERA_ON]) and bmat[_LONG, s] and led[_ERA] >= 0 and led[_ERA] != s


@njit(cache=True, error_model="numpy", _nrt=False)
def _before(a: float, b: float) -> bool:
    """Strictly before in numpy's sort order (NaN last)."""
    return a < b or (b != b and a == a)


@njit(cache=True, error_model="numpy", _nrt=False)
def _sort_slots(idx: np.ndarray, m: int, keys: np.ndarray, tmp: np.ndarray) -> None:
    """Sort ``idx[:m]`` by ``keys[idx]``, stably (numpy's ``kind="mergesort"`` order), in place
    with ``tmp`` as the merge buffer: no allocation per decision."""
    run = 16
    for lo in range(0, m, run):  # insertion sort of short runs
        hi = min(lo + run, m)
        for i in range(lo + 1, hi):
            x = idx[i]
            kx = keys[x]
            j = i - 1
            while j >= lo and _before(kx, keys[idx[j]]):
                idx[j + 1] = idx[j]
                j -= 1
            idx[j + 1] = x
    src, dst = idx, tmp
    in_tmp = False
    width = run
    while width < m:  # bottom-up merges, taking the left run's element on ties
        for lo in range(0, m, 2 * width):
            mid = min(lo + width, m)
            hi = min(lo + 2 * width, m)
            i, j, o = lo, mid, lo
            while i < mid and j < hi:
                if _before(keys[src[j]], keys[src[i]]):
                    dst[o] = src[j]
                    j += 1
                else:
                    dst[o] = src[i]
                    i += 1
                o += 1
            while i < mid:
                dst[o] = src[i]
                i += 1
                o += 1
            while j < hi:
                dst[o] = src[j]
                j += 1
                o += 1
        src, dst = dst, src
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for i in range(m):
            idx[i] = tmp[i]


# -- step 1: urgent requests -----------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
def _add_urgent(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
                led: np.ndarray, sc: np.ndarray, victims: np.ndarray, urgent: np.ndarray,
                nu: int, gamma: float, t_max: float) -> None:
    decs, prompts = sc[_S_DECS], sc[_S_PROMPTS]
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
    fit, short = sc[_S_FIT], sc[_S_SHORT]
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
    _add_decodes(imat, bmat, led, sc, fit, 0, nf)
    for j in range(ns):
        if led[_AC] <= 0:
            return
        s = short[j]
        _force(imat, bmat, fmat, k, led, sc, victims, s,
               _victim_min_key(bmat, fmat, s, gamma, t_max))
    for j in range(npr):
        if led[_AC] <= 0:
            return
        s = prompts[j]
        if bmat[_AVAIL, s] and not _era_blocked(bmat, k, led, s):
            _force(imat, bmat, fmat, k, led, sc, victims, s,
                   _victim_min_key(bmat, fmat, s, gamma, t_max))


# -- step 2: SelectRequests ------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
def _bisect_right(a: np.ndarray, x: int, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, error_model="numpy", _nrt=False)
def _bisect_left(a: np.ndarray, x: int, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, error_model="numpy", _nrt=False)
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


@njit(cache=True, error_model="numpy", _nrt=False)
def _prompt_chunk(imat: np.ndarray, k: np.ndarray, led: np.ndarray, s: int) -> int:
    return min(imat[_REM, s], led[_AC], _prompt_room(imat, k, led, s))


@njit(cache=True, error_model="numpy", _nrt=False)
def _add_alone(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
               led: np.ndarray, sc: np.ndarray, s: int) -> None:
    if bmat[_DEC, s]:
        _add(imat, bmat, k, led, sc, s, 1)
    elif bmat[_RUN, s]:
        c = _prompt_chunk(imat, k, led, s)
        if c >= 1:
            _add(imat, bmat, k, led, sc, s, c)
    else:
        f_rem, f_key = sc[_S_FREM], fmat[_FKEY]
        f_rem[0] = imat[_REM, s]
        f_key[0] = fmat[_KEY, s]
        j, c = _best_fresh(k, led, f_rem, f_key, 1)
        if j >= 0:
            _add(imat, bmat, k, led, sc, s, c)


@njit(cache=True, error_model="numpy", _nrt=False)
def _select_euclidean(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
                      led: np.ndarray, sc: np.ndarray, group: np.ndarray, gn: int) -> None:
    """Algorithm 2 on one slack group (``BatchFormer.select_euclidean`` / ``_euclid_loop``)."""
    if gn == 1:
        _add_alone(imat, bmat, fmat, k, led, sc, group[0])
        return
    bs = k[_BS]
    # Pools: prompts holding no KV by remaining length (stable), running prompts, decodes
    # needing a block, decodes needing none (each in key order, as the group is).
    f_slot, partial, dec_b, dec_a = sc[_S_FSLOT], sc[_S_PART], sc[_S_DECB], sc[_S_DECA]
    fl = 0
    pn = 0
    nb = 0
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
    _sort_slots(f_slot, fl, imat[_REM], sc[_S_TMP])
    f_rem, f_key = sc[_S_FREM], fmat[_FKEY]
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
            _add(imat, bmat, k, led, sc, s, best_c)
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
            _add(imat, bmat, k, led, sc, s, best_c)
        elif prompt_fits:  # a decode beat a prompt chunk needing no new block
            if best_kind == 2:
                s = dec_b[hb]
                hb += 1
            else:
                s = dec_a[ha]
                ha += 1
            _add(imat, bmat, k, led, sc, s, 1)
        else:
            # No prompt fits any more: (1, b) decodes while blocks are free, then (1, 0).
            k_b = _slice_end(nb - hb, min(led[_AC], led[_FREE]))
            _add_decodes(imat, bmat, led, sc, dec_b, hb, hb + k_b)
            k_a = _slice_end(na - ha, led[_AC])
            _add_decodes(imat, bmat, led, sc, dec_a, ha, ha + k_a)
            return


@njit(cache=True, error_model="numpy", _nrt=False)
def _feasible(imat: np.ndarray, bmat: np.ndarray, led: np.ndarray, s: int) -> bool:
    if imat[_NFREE, s] > led[_FREE] or imat[_NADM, s] > led[_FREE] - led[_RES]:
        return False
    return led[_ADM] >= 1 or bmat[_RUN, s]


@njit(cache=True, error_model="numpy", _nrt=False)
def _select(imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, k: np.ndarray,
            led: np.ndarray, sc: np.ndarray, order: np.ndarray, group: np.ndarray,
            gamma: float, slo_min: float, s_pf: int, t_pf: float) -> float:
    """``DecisionState._select``; returns SLO_min as lowered by the groups that joined."""
    n = led[_N]
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
        _select_euclidean(imat, bmat, fmat, k, led, sc, group, gn)
        if not k[_SPILL] or led[_NS] == before:
            return slo_min
    return slo_min


# -- one decision ----------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", _nrt=False)
def form(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float, chunk_mean: float,
         long_threshold: int, era_owner: int, t_max: float, gamma: float, slo_min: float,
         budget: int, clamped_low: bool, clamped_high: bool, k: np.ndarray, free_blocks: int,
         admissions_left: int, s_pf: int, t_pf: float, imat: np.ndarray, bmat: np.ndarray,
         fmat: np.ndarray, sc: np.ndarray, led: np.ndarray, info: np.ndarray,
         packed: np.ndarray) -> int:
    """``DecisionState.form`` at ``t_max`` with token budget ``budget``, in the workspace.

    Writes ``packed`` (the three lengths, then slots, tokens, preempted slots and cut chunks;
    returns its used length) and ``info`` (the diagnostics in ``INFO_KEYS`` order followed by
    the ERA owner's slot)."""
    _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner, bool(k[_LOST_LAST]),
             imat, bmat, fmat)
    _urgency(imat, bmat, fmat, tf[_T_ARRIVAL], n, t_max, gamma, bool(k[_LATE_URGENT]),
             bool(k[_LOST_LAST]))
    return _form(tf[_T_ARRIVAL], n, chunk_mean, era_owner, t_max, gamma, slo_min, budget,
                 clamped_low, clamped_high, k, free_blocks, admissions_left, s_pf, t_pf, imat,
                 bmat, fmat, sc, led, info, packed)


@njit(cache=True, error_model="numpy", _nrt=False)
def _form(arrival: np.ndarray, n: int, chunk_mean: float, era_owner: int, t_max: float,
          gamma: float, slo_min: float, budget: int, clamped_low: bool, clamped_high: bool,
          k: np.ndarray, free_blocks: int, admissions_left: int, s_pf: int, t_pf: float,
          imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, sc: np.ndarray, led: np.ndarray,
          info: np.ndarray, packed: np.ndarray) -> int:
    """``form`` after the columns and the urgency at ``t_max`` are in the workspace."""
    lost_last = bool(k[_LOST_LAST])
    bs = k[_BS]
    g = k[_GROWTH]
    total = k[_TOTAL]
    reserved = 0
    n_run = 0
    n_urg = 0
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
            sc[_S_VICT, n_run] = i
            n_run += 1
        else:
            imat[_NFREE, i] = _NEVER
            imat[_NADM, i] = fresh_need
        avail = bmat[_ELIG, i]
        bmat[_AVAIL, i] = avail
        if avail and bmat[_URGENT, i]:
            sc[_S_URG, n_urg] = i
            n_urg += 1
        # Victim key: the slack once preempted (recomputing everything it holds); lost requests
        # first, the oldest first.
        if lost_last and bmat[_LOST, i]:
            fmat[_VK, i] = _LOST_OFFSET - arrival[i]
        else:
            fmat[_VK, i] = fmat[_TD, i] - np.ceil(imat[_TOT, i] / chunk_mean) * t_max
        fmat[_NEGVK, i] = -fmat[_VK, i]
        sc[_S_ORD, i] = i
    led[:] = 0
    led[_N] = n
    led[_FREE] = free_blocks
    led[_AC] = budget
    led[_BUDGET] = budget
    led[_RES] = reserved
    led[_ADM] = admissions_left
    led[_ERA] = era_owner
    led[_LOW] = 1 if clamped_low else 0
    tmp = sc[_S_TMP]
    # Victims: running requests, largest victim key first.
    victims = sc[_S_VICT]
    _sort_slots(victims, n_run, fmat[_NEGVK], tmp)
    led[_NV] = n_run
    # Step 1: urgent requests in ascending slack.
    urgent = sc[_S_URG]
    _sort_slots(urgent, n_urg, fmat[_SLACK], tmp)
    nu = n_urg
    _add_urgent(imat, bmat, fmat, k, led, sc, victims, urgent, nu, gamma, t_max)
    # Step 2.
    order = sc[_S_ORD]
    _sort_slots(order, n, fmat[_KEY], tmp)
    group = sc[_S_GRP]
    slo_min = _select(imat, bmat, fmat, k, led, sc, order, group, gamma, slo_min, s_pf, t_pf)
    fallback = led[_NS] == 0
    if fallback:
        # Nothing fits: the first running request in key order (else the first waiting one),
        # preempting the largest-key running requests for it.
        cand = sc[_S_CAND]
        nc = 0
        for want_running in (True, False):
            first = nc
            for i in range(n):
                if bmat[_AVAIL, i] and bmat[_RUN, i] == want_running:
                    cand[nc] = i
                    nc += 1
            _sort_slots(cand[first:], nc - first, fmat[_KEY], tmp)
        for j in range(nc):
            if _force(imat, bmat, fmat, k, led, sc, victims, cand[j], -math.inf):
                slo_min = _select(imat, bmat, fmat, k, led, sc, order, group, gamma, slo_min,
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
        if bmat[_DEC, sc[_S_SLOT, j]]:
            dec_sched += 1
        elif sc[_S_TOK, j] > max_chunk:
            max_chunk = sc[_S_TOK, j]
    n_sched = led[_NS]
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
    n_pre, n_cut = led[_NP], led[_NC]
    packed[0] = n_sched
    packed[1] = n_pre
    packed[2] = n_cut
    packed[3] = led[_BUDGET]
    packed[4] = led[_ERA]
    p = _HEADER
    for j in range(n_sched):
        packed[p + j] = sc[_S_SLOT, j]
        packed[p + n_sched + j] = sc[_S_TOK, j]
    p += 2 * n_sched
    for j in range(n_pre):
        packed[p + j] = sc[_S_PRE, j]
    p += n_pre
    for j in range(n_cut):
        packed[p + j] = sc[_S_CUT, j]
    return p + n_cut


@njit(cache=True, error_model="numpy", _nrt=False)
def _linear_time(base: float, per_token: float, per_ctx: float, n_tokens: int,
                 decode_ctx: int) -> float:
    """``LinearCostModel.iteration_time`` (the same arithmetic, in the same order)."""
    if n_tokens <= 0:
        return 0.0
    return base + per_token * n_tokens + per_ctx * decode_ctx


@njit(cache=True, error_model="numpy", _nrt=False)
def _linear_t_max(budget: int, n_dec: int, dec_ctx: int, base: float, per_token: float,
                  per_ctx: float) -> float:
    """``accelgen.max_batch_time`` under a linear cost model (which reads no prefill context)."""
    nd = min(n_dec, budget)
    ctx = dec_ctx if nd == n_dec else dec_ctx * nd // max(n_dec, 1)
    n_tokens = (budget - nd if budget > nd else 0) + nd
    it = _linear_time(base, per_token, per_ctx, n_tokens, ctx)
    ft = _linear_time(base, per_token, per_ctx, budget, 0)
    return ft if ft > it else it


@njit(cache=True, error_model="numpy", _nrt=False)
def decide_linear(ti: np.ndarray, tf: np.ndarray, tb: np.ndarray, n: int, now: float,
                  chunk_mean: float, era_owner: int, prev_budget: int, free_blocks: int,
                  admissions_left: int, long_threshold: int, gamma: float, base: float,
                  per_token: float, per_ctx: float, k: np.ndarray, s_pf: int, t_pf: float,
                  imat: np.ndarray, bmat: np.ndarray, fmat: np.ndarray, sc: np.ndarray,
                  led: np.ndarray, info: np.ndarray, packed: np.ndarray) -> int:
    """The whole decision in one call when the cost model is ``LinearCostModel`` (the vLLM
    plugin's): T_max is then computed here (``accelgen.plan_budget``, compiled), then ``form``
    (whose outputs it returns the same way). The arguments from ``long_threshold`` on stay the
    same from one decision to the next (``CompiledDecision`` passes them as one tuple)."""
    late_urgent = bool(k[_LATE_URGENT])
    lost_last = bool(k[_LOST_LAST])
    n_dec, dec_ctx, _ = shape_constants(ti, tb, n)
    t_prev = _linear_t_max(prev_budget, n_dec, dec_ctx, base, per_token, per_ctx)
    _columns(ti, tf, tb, n, now, chunk_mean, long_threshold, era_owner, lost_last, imat, bmat,
             fmat)
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
    # (the last urgency pass above was at t_max: the columns are ready for _form)
    return _form(arrival, n, chunk_mean, era_owner, t_max, gamma, slo_min, tokens, low, high, k,
                 free_blocks, admissions_left, s_pf, t_pf, imat, bmat, fmat, sc, led, info,
                 packed)


# -- the Python side -------------------------------------------------------------------------
class Workspace:
    """The compiled decision's working arrays, kept from one decision to the next (grown by
    doubling): a decision allocates nothing. Why: inside vLLM every step runs after a forward
    pass has evicted the caches, and each allocation, array object and freed buffer then costs
    a few cache misses (``scripts/bench_cold_call.py``)."""

    __slots__ = ("bmat", "capacity", "fmat", "imat", "info", "led", "packed", "sc")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        width = 2 * capacity + 1  # (room even if a policy bug added a slot twice)
        self.imat = np.zeros((_ICOLS, capacity), dtype=np.int64)
        self.bmat = np.zeros((_BCOLS, capacity), dtype=np.bool_)
        self.fmat = np.zeros((_FCOLS, width), dtype=np.float64)
        self.sc = np.zeros((_SROWS, width), dtype=np.int64)
        self.led = np.zeros(_LEDGER, dtype=np.int64)
        self.info = np.zeros(len(INFO_KEYS), dtype=np.float64)
        self.packed = np.zeros(_HEADER + 4 * width, dtype=np.int64)


@dataclass(slots=True)
class KernelResult:
    """One compiled decision, parsed (for tests and debugging; ``AccelGenPolicy`` reads the two
    lists directly): slots index the ``RequestTable``, as a ``BatchFormer``'s; ``slo_min`` is
    NaN when nothing constrained the budget."""

    slots: list[int]
    tokens: list[int]
    preempted: list[int]
    cut_chunks: list[int]
    era_owner: int
    budget: int
    t_max: float
    slo_min: float
    info: InfoRow
    ints: list[int]  # the raw outputs of CompiledDecision.run
    vals: np.ndarray

    @classmethod
    def parse(cls, ints: list[int], vals: np.ndarray) -> KernelResult:
        ns, npre = ints[0], ints[1]
        j = _HEADER + 2 * ns
        return cls(ints[_HEADER:_HEADER + ns], ints[_HEADER + ns:j], ints[j:j + npre],
                   ints[j + npre:], ints[4], ints[3], float(vals[2]), float(vals[1]),
                   InfoRow(INFO_INDEX, vals), ints,
                   vals)


class CompiledDecision:
    """One policy's compiled decisions: the workspace, and the arguments that stay the same
    between decisions, rebuilt when the params, token budget, pivot, cost model or KV object
    change (a refit of the vLLM adapter's online cost model comes with a new pivot object)."""

    __slots__ = ("_key", "_linear", "_steady", "ws")

    def __init__(self) -> None:
        self.ws: Workspace | None = None
        self._key: tuple[object, ...] = ()
        self._steady: tuple[object, ...] = ()
        self._linear: Callable[..., int] | None = None  # decide_linear's compiled entry point

    def _setup(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable,
               bud: TokenBudget) -> Workspace:
        p, kv, cost = policy.params, view.kv, view.cost
        ws = self.ws
        if ws is None or ws.capacity < t.n:
            ws = self.ws = Workspace(max(t.n, t.capacity))
        self._key = (bud, view.pivot, cost, p, kv)
        k = _constants(p, kv.block_size, kv.num_total_blocks, bud)
        lin = cost.linear_coefficients()
        base, per_token, per_ctx = lin if lin is not None else (0.0, 0.0, 0.0)
        self._steady = (int(p.long_prompt_threshold), float(p.gamma), float(base),
                        float(per_token), float(per_ctx), k, int(bud.pivot.s_pf),
                        float(bud.pivot.t_pf), ws.imat, ws.bmat, ws.fmat, ws.sc, ws.led, ws.info,
                        ws.packed)
        self._linear = None
        if lin is not None:
            self._linear = _entry_point(decide_linear, (t.ints, t.floats, t.flags),
                                        _LINEAR_STEP_TYPES, self._steady)
        return ws

    def run(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable,
            bud: TokenBudget, chunk_mean: float) -> tuple[list[int], np.ndarray]:
        """``DecisionState(policy, view, t, bud, chunk_mean).form()`` compiled (see the module
        docstring for the order of the calls). Returns ``ints``: the numbers of scheduled,
        preempted and cut requests, the token budget and the ERA owner's slot (-1: none), then
        the batch's slots, its tokens, the preempted slots and the cut chunks; and ``vals``: the
        diagnostics in ``INFO_KEYS`` order (a new array)."""
        n = t.n
        p = policy.params
        kv = view.kv
        key, ws = self._key, self.ws
        # (identity checks: the same objects every step is the usual case)
        if (ws is None or ws.capacity < n or not key or key[0] is not bud
                or key[1] is not view.pivot or key[2] is not view.cost or key[3] is not p
                or key[4] is not kv):
            ws = self._setup(policy, view, t, bud)
        owner = -1
        if policy._era_owner is not None and p.era:
            owner = t.slot_of.get(policy._era_owner, -1)
        adm = (_NO_ADMISSION_CAP if p.max_num_seqs is None
               else p.max_num_seqs - int(np.count_nonzero(t.running[:n])))
        linear = self._linear
        if linear is not None:
            m = linear(t.ints, t.floats, t.flags, n, view.now, chunk_mean, owner,
                       policy._prev_budget, kv.num_free_blocks, adm, *self._steady)
        else:
            m = self._generic(policy, view, t, bud, chunk_mean, owner, adm, ws)
        # (the diagnostics as one array copy: a list would be 21 float objects per step)
        return ws.packed[:m].tolist(), ws.info.copy()

    def _generic(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable,
                 bud: TokenBudget, chunk_mean: float, owner: int, adm: int,
                 ws: Workspace) -> int:
        """Any cost model: T_max from the cost model between compiled calls."""
        p, cost, now, n = policy.params, view.cost, view.now, t.n
        ti, tf, tb = t.ints, t.floats, t.flags
        thr, gamma = p.long_prompt_threshold, p.gamma
        imat, bmat, fmat = ws.imat, ws.bmat, ws.fmat
        n_dec, dec_ctx, prefill_ctx = shape_constants(ti, tb, n)
        slo_min, b, t_max = plan_budget(
            bud, policy._prev_budget,
            lambda budget: max_batch_time(cost, bud, budget, n_dec, dec_ctx, prefill_ctx),
            lambda t_max: urgency(ti, tf, tb, n, now, chunk_mean, thr, owner, t_max, gamma,
                                  p.late_is_urgent, p.lost_last, imat, bmat, fmat))
        return form(ti, tf, tb, n, now, chunk_mean, thr, owner, t_max, gamma, slo_min, b.tokens,
                    b.clamped_low, b.clamped_high, self._steady[5], view.kv.num_free_blocks, adm,
                    bud.pivot.s_pf, bud.pivot.t_pf, imat, bmat, fmat, ws.sc, ws.led, ws.info,
                    ws.packed)


# decide_linear's per-step scalars: n, now, chunk_mean, era_owner, prev_budget, free_blocks,
# admissions_left (declared: a first call's values, e.g. an int ``now``, must not fix the types).
_LINEAR_STEP_TYPES = (types.int64, types.float64, types.float64, types.int64, types.int64,
                      types.int64, types.int64)


def _entry_point(dispatcher: Any, tables: tuple[np.ndarray, ...], step_types: tuple[Any, ...],
                 steady: tuple[object, ...]) -> Callable[..., int]:
    """The compiled code behind ``dispatcher`` for arguments ``(*tables, <step scalars>,
    *steady)``, to be called directly.

    Why: with 25 arguments, the dispatcher's per-call type resolution cost more than the
    decision itself once a forward pass had evicted the caches (``scripts/bench_cold_call.py``:
    about 18 us against 10 through the entry point). The caller keeps the argument types: the
    same arrays (the table's blocks keep their dtype and layout when they grow) and scalars that
    the entry point converts to the declared ``step_types``."""
    if not hasattr(dispatcher, "overloads"):  # NUMBA_DISABLE_JIT=1: a plain Python function
        return dispatcher  # type: ignore[no-any-return]
    sig = (*map(typeof, tables), *step_types, *map(typeof, steady))
    if sig not in dispatcher.overloads:
        dispatcher.compile(sig)
    return dispatcher.overloads[sig].entry_point  # type: ignore[no-any-return]


def decide(policy: AccelGenPolicy, view: SchedulerView, t: RequestTable, bud: TokenBudget,
           chunk_mean: float) -> KernelResult:
    """The policy's next decision, parsed (``policy._compiled`` forms it)."""
    return KernelResult.parse(*policy.compiled_decision().run(policy, view, t, bud, chunk_mean))


def _constants(p: AccelGenParams, block_size: int, total_blocks: int, bud: TokenBudget
               ) -> np.ndarray:
    """The ``K`` array (read-only for the kernel); ``CompiledDecision`` keeps it until the
    params, KV or budget objects change."""
    growth = block_size if p.kv_growth_reserve is None else p.kv_growth_reserve
    return np.array((block_size, growth, total_blocks, p.era, p.spill_groups, p.late_is_urgent,
                     p.lost_last, bud.min_budget, bud.cap), dtype=np.int64)
