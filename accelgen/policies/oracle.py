"""The Oracle: CLAIRVOYANT AccelGen (an upper reference, not a deployable scheduler).

It reads what no real scheduler can know: every request's true output length and the arrival
times of the whole trace (``clairvoyant = True`` makes the simulator fill
``view.true_output_len`` and ``view.next_arrivals``; the vLLM backend grants neither, so the Oracle
refuses to run there). Two parts, as in the paper ("knows the remaining time for job completion,
the arrival times and output lengths of all requests, and schedules the chunking and batching to
maximize the goodput"; the authors searched schedules with the Vidur simulator):

1. ``OraclePolicy``: AccelGen's decision (slack order, dynamic chunking, multi-resource batching,
   ERA) with exact knowledge:
   - exact KV planning (``kv_plan: exact``): a request is admitted only if its *final* KV
     (prompt + true output - 1 tokens, the last sampled token is never fed back) fits in the free
     KV not already promised to the final KV of every running request. Running requests can
     therefore always grow to completion: no preemption is ever needed, and none is made;
   - exact JCT estimates: the offline JCT plan uses the true output length as S_g instead of the
     dataset mean.
2. The search over AccelGen's parameters that keeps the schedule with the best goodput, run on
   the real trace (so it knows every arrival): the simulator's ``oracle_search`` module (the
   ``oracle`` command, and ``simulate --policy oracle``), next to the simulator it drives; a
   policy never imports the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from accelgen.policies.accelgen import AccelGenParams, AccelGenPolicy, DecisionState
from accelgen.policies.accelgen_select import BatchFormer
from accelgen.policies.accelgen_state import RequestTable
from accelgen.policies.base import Decision, PolicyParams, SchedulerView
from accelgen.request import Request


class OracleParams(AccelGenParams):
    kv_plan: Literal["exact", "none"] = "exact"  # none: AccelGen's own KV rule (may preempt)
    exact_lengths: bool = True  # offline JCT plan with the true output length as S_g


class _OracleState(DecisionState):
    """AccelGen's per-decision state with fresh requests that cannot finish without preemption
    made ineligible, and (exact plan) no preemption victims."""

    def __init__(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable, bud: Any,
                 chunk_mean: float, admit: np.ndarray | None) -> None:
        super().__init__(policy, view, t, bud, chunk_mean)
        self.exact = admit is not None
        if admit is not None:
            self.eligible &= admit
            self._plan_budget()  # slack groups and urgency over the eligible set only

    def _victim_key(self) -> np.ndarray:
        if not self.exact:
            return super()._victim_key()
        # BatchFormer.free_kv stops at the first victim whose key is <= the requester's floor:
        # -inf everywhere means nobody is ever preempted.
        return np.full(self.n, -np.inf)


class OraclePolicy(AccelGenPolicy):
    """CLAIRVOYANT: AccelGen with the true output lengths (see the module docstring)."""

    name = "oracle"
    Params = OracleParams
    params: OracleParams
    clairvoyant = True

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._true: dict[int, int] | None = None

    # -- clairvoyant bookkeeping ---------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> None:
        super().on_arrival(req, now)
        if self._true is not None:
            self._patch([self._table.slot_of[req.req_id]])

    def _patch(self, slots: Sequence[int]) -> None:
        """With ``exact_lengths``, store the true output length where AccelGen keeps its
        predicted one (S_g), so its offline JCT plan becomes exact."""
        if not self.params.exact_lengths:
            return
        t, true = self._table, self._true
        assert true is not None
        for s in slots:
            t.pred_out[s] = true[t.objs[s].req_id]

    def _grant(self, view: SchedulerView) -> None:
        if view.true_output_len is None:
            raise RuntimeError("the Oracle is clairvoyant: it needs a backend that grants "
                               "view.true_output_len (the simulator does; vLLM does not)")
        if self._true is None:
            self._true = view.true_output_len
            self._patch(range(self._table.n))

    # -- decision ------------------------------------------------------------------------------
    def schedule(self, view: SchedulerView) -> Decision:
        self._grant(view)
        t = self._table
        stale = len(view.waiting) + len(view.running) != t.n
        self._sync(view)
        if stale:  # the table was rebuilt from the request objects: re-apply the true lengths
            self._patch(range(t.n))
        bud = self._token_budget(view)
        n = t.n
        if n == 0:
            return super().schedule(view)
        p = self.params
        lc = self._chunk_mean
        assert lc is not None
        if t.num_unplanned:
            # Offline plans read pred_out: with exact_lengths it holds the true length.
            t.plan_offline(lc, bud.time(self._prev_budget), p.preempt_prob * p.preempt_max_s)
        if p.kv_plan == "none":
            st = _OracleState(self, view, t, bud, lc, None)
            former = st.form()
            d = self._decision(st, former)
            d.info.update(clairvoyant=1.0, oracle_reforms=0.0, oracle_excluded=0.0)
            return d
        return self._schedule_exact(view, bud, lc)

    def _schedule_exact(self, view: SchedulerView, bud: Any, lc: float) -> Decision:
        t = self._table
        n = t.n
        bs = view.kv.block_size
        running = t.running[:n]
        final = self._final_blocks(bs)
        # Free blocks not promised to the growth of running requests up to their last token.
        promised = int(np.maximum(final[running] - t.blocks[:n][running], 0).sum())
        admissible = view.kv.num_free_blocks - promised
        admit = running | (final <= admissible)
        excluded = int(n - admit.sum())
        reforms = 0
        while True:
            st = _OracleState(self, view, t, bud, lc, admit)
            former = st.form()
            over = self._over_admitted(former, final, admissible)
            if not over:
                break
            # Several admissions together exceed the plan: drop the offenders and form again.
            admit[over] = False
            excluded += len(over)
            reforms += 1
        if former.preempted:  # never: victims are disabled; a violation is a bug, not a choice
            raise AssertionError("Oracle preempted under an exact KV plan")
        d = self._decision(st, former)
        d.info.update(clairvoyant=1.0, oracle_reforms=float(reforms),
                      oracle_excluded=float(excluded), oracle_admissible=float(admissible))
        return d

    def _final_blocks(self, block_size: int) -> np.ndarray:
        """Blocks each live request holds at its last forward pass: KV for prompt + true output
        - 1 tokens (the last sampled token is never fed back)."""
        t, n, true = self._table, self._table.n, self._true
        assert true is not None
        out = np.fromiter((true[r.req_id] for r in t.objs[:n]), dtype=np.int64, count=n)
        return -(-(t.prompt[:n] + out - 1) // block_size)

    @staticmethod
    def _over_admitted(former: BatchFormer, final: np.ndarray, admissible: int) -> list[int]:
        """Fresh admissions (in batch order) whose final KV no longer fits after the earlier ones."""
        left = admissible
        over = []
        for s in former.slots:
            if former.running[s]:
                continue
            if final[s] > left:
                over.append(s)
            else:
                left -= int(final[s])
        return over
