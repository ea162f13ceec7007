"""Deadlines, slack, urgency and queue order (SPEC 4.1, paper section 4.2), sorting slots by a
column, and the table's compiled per-step refresh (``read_rows``, ``decode_rows``,
``set_deadlines``)."""

from __future__ import annotations

import math

import numpy as np

from accelgen.policies.accelgen import era
from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit, jit_inline


@jit
def set_deadline(r: st.RequestRow) -> None:
    """Deadline of the next output: arrival + TTFT, or the previous token + TBT; offline requests follow
    their cumulative JCT plan (``RequestTable.plan_offline``)."""
    if r.online:
        r.deadline = r.arrival + r.ttft if r.n_out == 0 else r.last_tok + r.tbt
    else:
        r.deadline = r.off_first + r.n_out * r.off_step


@jit
def set_deadlines(rows: np.ndarray, slots: np.ndarray) -> int:
    for s in slots:
        set_deadline(rows[s])
    return 0


@jit
def read_rows(rows: np.ndarray, values: np.ndarray, lost_rule: bool, watch: np.ndarray) -> int:
    """Write the rows read from the request objects (slot, output tokens, computed tokens, blocks,
    running, last token time) and the deadlines; with ``lost_rule`` a late token loses an online
    request's SLO for good. Returns how many of them (in ``watch``) wait or are dormant."""
    k = 0
    for v in values:
        s = int(v[0])
        if _read_row(rows[s], int(v[1]), int(v[2]), int(v[3]), v[4] != 0.0, v[5], lost_rule):
            watch[k] = s
            k += 1
    return k


@jit
def decode_rows(rows: np.ndarray, slots: np.ndarray, n: int, now: float, watch: np.ndarray) -> int:
    """``read_rows`` after decode steps alone: rows ``slots[:n]`` emitted one more token at ``now``."""
    k = 0
    for s in slots[:n]:
        r = rows[s]
        if decode_row(r, r.blocks, now):
            watch[k] = s
            k += 1
    return k


@jit
def decode_row(r: st.RequestRow, blocks: int, now: float) -> bool:
    """``r`` emitted one more token at ``now`` in a decode step and holds ``blocks``; whether it
    waits or is dormant (``read_rows``)."""
    return _read_row(r, r.n_out + 1, r.computed + 1, blocks, r.running, now, True)


@jit
def _read_row(r: st.RequestRow, n_out: int, computed: int, blocks: int, running: bool,
              last_tok: float, lost_rule: bool) -> bool:
    emitted, due = n_out > r.n_out, r.deadline
    r.n_out, r.computed, r.blocks = n_out, computed, blocks
    r.running, r.last_tok = running, last_tok
    set_deadline(r)
    if lost_rule and r.online and emitted and r.last_tok > due:
        r.lost = True
    return not r.running or r.dormant


@jit
def n_chunks(tokens: int, is_decode: bool, chunk_mean: float) -> float:
    """N_ck: 1 for a decode, else the tokens in chunks of the mean chunk length L_c."""
    return 1.0 if is_decode else np.ceil(tokens / chunk_mean)


@jit
def slack(to_deadline: float, chunks: float, t_max: float) -> float:
    """s = deadline - now - T_e, with T_e = N_ck x T_max."""
    return to_deadline - chunks * t_max


@jit
def prompt_stretch(par: st.Params, chunks: float) -> float:
    """The closed loop's margin on a prompt's time left, 1 + its error quantile over ``chunks``
    iterations (at least 1): the log error of their sum spreads as one iteration's / sqrt(N)."""
    stretch = math.exp(par.err_median + par.err_z * par.err_sd / math.sqrt(chunks))
    return stretch if stretch > 1.0 else 1.0


@jit
def upper_quantile(p: float) -> float:
    """z with P(Z > z) = p for a standard normal Z (0 < p <= 0.5), by bisection."""
    lo, hi = 0.0, 40.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p:
            lo = mid
        else:
            hi = mid
    return hi


@jit
def borrow(cs: st.Candidates, par: st.Params, t_max: float) -> bool:
    """The closed loop lends a prompt at risk of its TTFT some of its co-running decodes' margin.
    Under the margin a prompt gets the chunks the shrunk TBT SLOs leave, and may miss for sure what
    it would make at the plain ones. An online prompt waiting for its first token, not lost, with
    slack under ``t_max`` (it must run now, or it is late by the plan's estimate) is at risk; the n
    online decodes not lost then run, for the N iterations its plan spans (``n_chunks``; the
    largest N of those at risk), at the margin where each overruns with probability
    ``risk / (N x n)`` per iteration: a near-sure miss traded for at most one request's share of
    the attainment target, ``risk`` = 1 - target, in expectation. Returns whether it lent (the
    decodes' columns changed)."""
    n_prompt, n_dec = 0.0, 0
    for i in cs.active:
        r, c = cs.req[i], cs.cand[i]
        if c.online_decode:
            n_dec += not r.lost
        elif (r.online and r.n_out == 0 and c.slack < t_max and c.to_deadline > 0.0
              and not c.lost and c.n_chunks > n_prompt):
            n_prompt = c.n_chunks
    if n_prompt == 0.0 or n_dec == 0:
        return False
    margin = math.expm1(par.err_median + upper_quantile(par.risk / (n_prompt * n_dec)) * par.err_sd)
    shrink = 1.0 / (1.0 + margin) if margin > 0.0 else 1.0
    if not shrink > par.tbt_shrink:
        return False
    for i in cs.active:
        r, c = cs.req[i], cs.cand[i]
        if c.online_decode and not r.lost:
            c.slo_iter = r.tbt * shrink
            c.to_deadline += r.tbt * (shrink - par.tbt_shrink)
    return True


@jit_inline
def columns(cs: st.Candidates, s: int, par: st.Params, led: st.Ledger) -> None:
    """The columns of candidate ``s`` that hold for the whole pass."""
    r, c = cs.req[s], cs.cand[s]
    c.total = r.prompt + r.n_out
    c.rem = c.total - r.computed
    c.is_decode = r.n_out > 0 and c.rem == 1
    c.n_chunks = n_chunks(c.rem, c.is_decode, cs.chunk_mean)
    c.to_deadline = r.deadline - cs.now
    c.online_decode = c.is_decode and r.online
    c.slo_iter = r.tbt if c.online_decode else c.to_deadline / c.n_chunks
    c.is_long = era.is_long(par, c.total, c.is_decode)
    c.eligible = era.admits(led.era_owner_start, s, c.is_long)
    c.lost = par.order and par.lost_last and r.online and (r.lost or c.to_deadline < 0.0)
    if par.tbt_shrink != 1.0 or par.err_sd > 0.0:  # (the closed loop's margin, after ``lost``)
        _with_margin(r, c, par)
    c.available = c.member = c.urgent = c.counted = False
    c.next_blocks = c.owed = c.admission_blocks = st.UNKNOWN
    c.stamp = led.pass_id


@jit
def _with_margin(r: st.RequestRow, c: st.Candidate, par: st.Params) -> None:
    """``columns`` under the closed loop's margin: a decode's iteration planned within its TBT SLO
    shrunk by the margin, its next token too, so its slack and urgency (a request already lost has
    no attainment left for the margin to keep); a prompt's time left divided by its stretch."""
    if c.online_decode:
        shrink = 1.0 if r.lost else par.tbt_shrink
        c.slo_iter = r.tbt * shrink
        c.to_deadline -= r.tbt * (1.0 - shrink)
    elif par.err_sd > 0.0 and r.online and c.to_deadline > 0.0:
        c.to_deadline /= prompt_stretch(par, c.n_chunks)
        c.slo_iter = c.to_deadline / c.n_chunks


@jit
def rank(r: st.RequestRow, c: st.Candidate, par: st.Params, t_max: float) -> None:
    """Slack, counted, urgency and queue key of a candidate at ``t_max``."""
    c.slack = slack(c.to_deadline, c.n_chunks, t_max)
    # A late prompt cannot be rescued by a smaller batch (its remaining time grows with its
    # remaining tokens), so only on-track requests and online decodes lower SLO_min.
    c.counted = c.online_decode or c.slack >= 0.0
    if par.order:
        # A request past its deadline is not urgent (running it now saves no deadline), except
        # a running decode: its TBT chain restarts at its next token.
        c.urgent = (c.eligible and c.slack < t_max
                    and (par.late_is_urgent or c.slack >= 0.0 or c.is_decode))
        # Lost prompts after every on-track candidate, first come first served among them.
        c.key = r.arrival + st.LOST_OFFSET if c.lost and not c.is_decode else c.slack
    else:
        c.urgent = False
        c.key = r.arrival


@jit
def before(a: float, b: float) -> bool:
    """``a`` strictly before ``b`` in numpy's sort order (NaN last)."""
    return a < b or (b != b and a == a)


@jit
def _merge_sort(keys: np.ndarray, vals: np.ndarray, m: int, key_tmp: np.ndarray,
                val_tmp: np.ndarray) -> None:
    """Stable sort of ``vals[:m]`` by ``keys[:m]`` (numpy's ``kind="stable"`` order), in place, the
    keys moved along (every comparison reads keys in a row, not through the slots; they end in
    ``keys`` or ``key_tmp``), the ``_tmp`` arrays the buffers: insertion-sorted runs of 16, then
    bottom-up merges; two neighbouring runs already in order are copied, not merged (a queue
    mostly in order costs a pass per width)."""
    for lo in range(0, m, 16):
        for i in range(lo + 1, min(lo + 16, m)):
            k, v, j = keys[i], vals[i], i - 1
            while j >= lo and before(k, keys[j]):
                keys[j + 1], vals[j + 1] = keys[j], vals[j]
                j -= 1
            keys[j + 1], vals[j + 1] = k, v
    sk, sv, dk, dv, width, in_tmp = keys, vals, key_tmp, val_tmp, 16, False
    while width < m:
        for lo in range(0, m, 2 * width):
            mid, hi = min(lo + width, m), min(lo + 2 * width, m)
            if mid == hi or not before(sk[mid], sk[mid - 1]):  # (in order: the left run first)
                for o in range(lo, hi):
                    dk[o], dv[o] = sk[o], sv[o]
                continue
            i, j = lo, mid
            for o in range(lo, hi):  # the left run's element first on ties
                if j < hi and (i == mid or before(sk[j], sk[i])):
                    dk[o], dv[o] = sk[j], sv[j]
                    j += 1
                else:
                    dk[o], dv[o] = sk[i], sv[i]
                    i += 1
        sk, sv, dk, dv, width, in_tmp = dk, dv, sk, sv, width * 2, not in_tmp
    for i in range(m if in_tmp else 0):
        vals[i] = val_tmp[i]


@jit
def sort_slots(cs: st.Candidates, idx: np.ndarray, m: int, keys: np.ndarray, descending: bool) -> None:
    """Sort the slots ``idx[:m]`` stably by a candidate column (``descending``: negated, NaN still
    last), the keys gathered first and sorted along with the slots."""
    gathered, key_tmp = cs.sort_keys.view(np.float64), cs.sort_key_tmp.view(np.float64)
    for p in range(m):
        gathered[p] = -keys[idx[p]] if descending else keys[idx[p]]
    _merge_sort(gathered, idx, m, key_tmp, cs.sort_slot_tmp)
