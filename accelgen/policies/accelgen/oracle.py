"""The Oracle: CLAIRVOYANT AccelGen (an upper reference, not a deployable scheduler).

It reads what no real scheduler can know: every request's true output length and the arrival
times of the whole trace (``clairvoyant = True``: the simulator fills ``view.true_output_len`` and
``view.next_arrivals``; vLLM grants neither, so the Oracle refuses to run there). Two parts, as in
the paper (the authors searched schedules with the Vidur simulator):

1. ``OraclePolicy``: AccelGen's one decision (``decide``) with exact inputs:
   - exact KV planning (``kv_plan: exact``): a request is admitted only if its *final* KV
     (prompt + true output - 1 tokens) fits in the free KV not promised to the final KV of the
     running requests, so running requests always grow to completion and none is preempted;
   - exact JCT estimates: the offline JCT plan uses the true output length as S_g.
2. The search over AccelGen's parameters for the best goodput on the real trace (so it knows
   every arrival): ``accelgen.experiments.oracle_search``, an experiment above the simulator it drives.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from accelgen.core.policy import Decision, PolicyParams, SchedulerView
from accelgen.core.request import Request
from accelgen.policies.accelgen.policy import AccelGenParams, AccelGenPolicy
from accelgen.policies.accelgen.state import INFO_INDEX, ORACLE_INFO_KEYS


class OracleParams(AccelGenParams):
    kv_plan: Literal["exact", "none"] = "exact"  # none: AccelGen's own KV rule (may preempt)
    exact_lengths: bool = True  # offline JCT plan with the true output length as S_g


class OraclePolicy(AccelGenPolicy):
    """CLAIRVOYANT: AccelGen's decision with the true output lengths as inputs (see the module
    docstring): in the table (``true_out``, and as S_g with ``exact_lengths``) and, with
    ``kv_plan: exact``, the decision's exact KV plan (``exact_kv``)."""

    name = "oracle"
    Params = OracleParams
    params: OracleParams
    clairvoyant = True

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._true: dict[int, int] | None = None
        self._ws.info_values[len(INFO_INDEX)] = 1.0  # clairvoyant (the decision leaves it be)

    def on_arrival(self, req: Request, now: float) -> None:
        super().on_arrival(req, now)
        if self._true is not None:
            self._patch([self._table.slot_of[req.req_id]])

    def _patch(self, slots: Iterable[int]) -> None:
        """Store the true output lengths in the table (and, with ``exact_lengths``, where
        AccelGen keeps its predicted one, S_g, so its offline JCT plan becomes exact)."""
        t, true = self._table, self._true
        assert true is not None
        for s in slots:
            t.true_out[s] = true[t.objs[s].req_id]
            if self.params.exact_lengths:
                t.pred_out[s] = t.true_out[s]

    def _exact_kv(self) -> bool:
        return self.params.kv_plan == "exact"

    def schedule(self, view: SchedulerView) -> Decision:
        if view.true_output_len is None:
            raise RuntimeError("the Oracle is clairvoyant: it needs a backend that grants "
                               "view.true_output_len (the simulator does; vLLM does not)")
        if self._true is None:
            self._true = view.true_output_len
            self._patch(range(self._table.n))
        return super().schedule(view)

    def _sync(self, view: SchedulerView) -> None:
        super()._sync(view)
        self._patch(range(self._table.n))  # (rebuilt from the request objects: the true lengths again)

    def _victims(self, n: int) -> list[Request]:
        if self._exact:
            # never: the exact plan has no victims; a violation is a bug, not a choice
            raise AssertionError("Oracle preempted under an exact KV plan")
        return super()._victims(n)

    def _info_index(self) -> dict[str, int]:
        """AccelGen's diagnostics and the Oracle's own: ``clairvoyant``, ``oracle_reforms``,
        ``oracle_excluded`` and, with the exact plan, ``oracle_admissible``."""
        keys = ORACLE_INFO_KEYS if self._exact_kv() else ORACLE_INFO_KEYS[:-1]
        return {**INFO_INDEX, **{key: len(INFO_INDEX) + i for i, key in enumerate(keys)}}
