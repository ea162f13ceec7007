"""AccelGen's mirror of the live requests: one record per request, read by the compiled decision.

Reading attributes from ~1,256 Python objects per decision would cost hundreds of microseconds,
so the table keeps what the decision reads in a numpy record array (``REQUEST``; ``table.prompt``
etc. are views of one field), updated only where the state can change: ``add`` on arrival,
``refresh`` of the requests a step scheduled or preempted (re-read from the objects: the table
follows what the executor really did), ``remove`` on finish or rejection. Live requests occupy
rows ``0..n-1`` (a removal moves the last row into the hole), so a row number (a *slot*) is valid
within one decision only; across hooks requests are found by ``req_id``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from accelgen.request import Request, Status

REQUEST = np.dtype([
    ("req_id", np.int64),
    ("prompt", np.int64),  # prompt tokens
    ("n_out", np.int64),  # output tokens emitted
    ("computed", np.int64),  # tokens whose KV is computed
    ("blocks", np.int64),  # KV blocks held
    ("pred_out", np.int64),  # S_g: predicted output length (offline JCT plan)
    ("true_out", np.int64),  # true output length (clairvoyant policies only; else 0)
    ("arrival", np.float64),
    ("ttft", np.float64),
    ("tbt", np.float64),
    ("jct", np.float64),
    ("last_tok", np.float64),  # time of the last output token
    ("deadline", np.float64),  # deadline of the next output token
    ("off_first", np.float64),  # offline: planned time of the first token (NaN until planned)
    ("off_step", np.float64),  # offline: planned time per later token (allowance T_r + T_max)
    ("running", np.bool_),  # holds KV (vLLM's running queue)
    ("online", np.bool_),  # TTFT/TBT SLOs (else a JCT SLO)
    ("lost", np.bool_),  # online and a token already missed its deadline (request SLO lost)
], align=True)


class RequestTable:
    """Rows of ``REQUEST`` indexed by slot; ``objs[slot]`` is the request itself."""

    rows: np.recarray
    if TYPE_CHECKING:  # self.prompt etc.: a view of one field of ``rows`` each (``_alloc``)
        def __getattr__(self, field: str) -> np.ndarray: ...

    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.capacity = 0
        self.objs: list[Request] = []
        self.slot_of: dict[int, int] = {}
        self.num_unplanned = 0  # offline requests whose JCT plan is still to be made
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        rows = np.zeros(capacity, dtype=REQUEST).view(np.recarray)
        if self.capacity:
            rows[: self.n] = self.rows[: self.n]
        self.rows = rows
        for name in REQUEST.names or ():
            setattr(self, name, rows[name])
        self.capacity = capacity

    # -- membership ----------------------------------------------------------------------------
    def add(self, r: Request) -> int:
        if r.req_id in self.slot_of:
            return self.slot_of[r.req_id]
        if self.n == self.capacity:
            self._alloc(2 * self.capacity)
        s = self.n
        self.n += 1
        self.objs.append(r)
        self.slot_of[r.req_id] = s
        self.req_id[s] = r.req_id
        self.prompt[s] = r.prompt_len
        self.pred_out[s] = r.predicted_output_len
        self.true_out[s] = 0
        self.arrival[s] = r.arrival
        self.ttft[s] = r.ttft_slo
        self.tbt[s] = r.tbt_slo
        self.jct[s] = r.jct_slo
        self.online[s] = r.online
        self.lost[s] = False
        self.off_first[s] = math.nan
        self.off_step[s] = math.nan
        if not r.online:
            self.num_unplanned += 1
        self._read(np.array([s]), [r])
        return s

    def remove(self, req_id: int) -> None:
        s = self.slot_of.pop(req_id, None)
        if s is None:
            return
        if not self.online[s] and math.isnan(self.off_first[s]):
            self.num_unplanned -= 1
        last = self.n - 1
        if s != last:  # move the last live request into the hole
            self.rows[s] = self.rows[last]
            moved = self.objs[last]
            self.objs[s] = moved
            self.slot_of[moved.req_id] = s
        self.objs.pop()
        self.n = last

    def rebuild(self, reqs: list[Request]) -> None:
        """Start over from the given live requests (used when hooks were missed)."""
        keep = {r.req_id for r in reqs}
        for rid in [rid for rid in self.slot_of if rid not in keep]:
            self.remove(rid)
        slots = np.array([self.add(r) for r in reqs], dtype=np.int64)  # (the known ones: their slot)
        self._read(slots, reqs)

    # -- dynamic fields ------------------------------------------------------------------------
    def _read(self, slots: np.ndarray, reqs: list[Request]) -> None:
        """Re-read the dynamic fields of ``reqs`` (in ``slots``) from the objects."""
        self.n_out[slots] = [r.num_output_tokens for r in reqs]
        self.computed[slots] = [r.num_computed_tokens for r in reqs]
        self.blocks[slots] = [r.num_blocks for r in reqs]
        self.running[slots] = [r.status == Status.RUNNING for r in reqs]
        self.last_tok[slots] = [r.last_token_time for r in reqs]
        self._set_deadline(slots)

    def refresh(self, reqs: list[Request]) -> None:
        """Re-read the dynamic fields of ``reqs`` (those a step changed) in one vectorised pass."""
        live = [r for r in reqs if r.req_id in self.slot_of]
        if not live:
            return
        slots = np.fromiter((self.slot_of[r.req_id] for r in live), dtype=np.int64, count=len(live))
        old_out, old_deadline = self.n_out[slots], self.deadline[slots]  # copies (fancy index)
        self._read(slots, live)
        # A token emitted after its deadline loses the request's request-level SLO for good.
        self.lost[slots] |= (self.online[slots] & (self.n_out[slots] > old_out)
                             & (self.last_tok[slots] > old_deadline))

    def _set_deadline(self, slots: np.ndarray) -> None:
        """Deadline of the next output (SPEC 4.1): the first token by arrival + TTFT SLO, a later
        token (also after a preemption) by the previous token + TBT SLO; offline requests follow
        their cumulative JCT plan, which carries over- and under-use to later iterations."""
        n_out = self.n_out[slots]
        online = np.where(n_out == 0, self.arrival[slots] + self.ttft[slots],
                          self.last_tok[slots] + self.tbt[slots])
        offline = self.off_first[slots] + n_out * self.off_step[slots]
        self.deadline[slots] = np.where(self.online[slots], online, offline)

    def plan_offline(self, chunk_len: float, t_max: float, preempt_term: float) -> None:
        """Make the JCT plan of offline requests that have none yet (paper section 4.3).

        T_e = N_ck T_max + S_g (T_max + P_max P) and the per-iteration waiting allowance
        T_r = (SLO_JCT - T_e) / (N_ck + S_g). The k-th iteration is due at
        arrival + k (T_r + T_max) (+ P_max P for generation steps): a cumulative plan, so running
        d later (earlier) than allowed shrinks (grows) the next allowance by d, as in the paper.
        """
        n = self.n
        todo = np.flatnonzero(~self.online[:n] & np.isnan(self.off_first[:n]))
        nck = np.ceil(self.prompt[todo] / chunk_len)
        s_g = np.maximum(self.pred_out[todo], 1)
        t_e = nck * t_max + s_g * (t_max + preempt_term)
        t_r = (self.jct[todo] - t_e) / (nck + s_g)
        self.off_first[todo] = self.arrival[todo] + nck * (t_r + t_max)
        self.off_step[todo] = t_r + t_max + preempt_term
        self._set_deadline(todo)
        self.num_unplanned = 0

    def mismatches(self) -> list[str]:
        """Fields that disagree with the request objects (a debugging aid for tests)."""
        bad = []
        for s in range(self.n):
            r = self.objs[s]
            want = (r.num_output_tokens, r.num_computed_tokens, r.num_blocks, r.status == Status.RUNNING)
            got = (int(self.n_out[s]), int(self.computed[s]), int(self.blocks[s]), bool(self.running[s]))
            if want != got or self.slot_of.get(r.req_id) != s:
                bad.append(f"req {r.req_id}: table {got} vs request {want}")
        return bad
