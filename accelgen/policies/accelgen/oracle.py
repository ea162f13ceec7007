"""The Oracle: CLAIRVOYANT AccelGen, an upper reference, not a deployable scheduler. It reads every
request's true output length (the simulator grants ``view.true_output_len``; vLLM does not, so it
refuses to run there): AccelGen's one decision with exact KV planning (``kv_plan: exact``: a request
is admitted only if its final KV fits beside the running requests' final KV, so none is ever
preempted) and exact JCT estimates (the true output length as S_g). The search over AccelGen's
parameters on the real trace is ``accelgen.experiments.oracle_search``."""

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
    """CLAIRVOYANT: AccelGen's decision with the true output lengths as inputs (the module
    docstring)."""

    name = "oracle"
    Params = OracleParams
    params: OracleParams
    clairvoyant = True

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._true: dict[int, int] | None = None
        self._exact = self.params.kv_plan == "exact"
        # AccelGen's diagnostics and the Oracle's own (``oracle_admissible`` with the exact plan)
        keys = ORACLE_INFO_KEYS if self._exact else ORACLE_INFO_KEYS[:-1]
        self._info_names = {**INFO_INDEX, **{key: len(INFO_INDEX) + i for i, key in enumerate(keys)}}
        self._ws.info_values[len(INFO_INDEX)] = 1.0  # clairvoyant (the decision leaves it be)

    def on_arrival(self, req: Request, now: float) -> None:
        super().on_arrival(req, now)
        if self._true is not None:
            self._patch([self._table.slot_of[req.req_id]])

    def _patch(self, slots: Iterable[int]) -> None:
        """The true output lengths into the table (and with ``exact_lengths`` as S_g, the predicted one)."""
        t, true = self._table, self._true
        assert true is not None
        for s in slots:
            t.true_out[s] = true[t.objs[s].req_id]
            if self.params.exact_lengths:
                t.pred_out[s] = t.true_out[s]

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
