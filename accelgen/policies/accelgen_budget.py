"""AccelGen's token budget S_b from the tightest per-iteration SLO (SPEC 4.2, paper eq. 1).

Two rules:
- ``paper``: S_b = S_pf x SLO_min / T_pf, the paper's linear formula;
- ``model``: the largest forward size whose predicted prefill-only latency is at most SLO_min
  (the cost model inverted by binary search, ``accelgen.costmodel.pivot.budget_for_time``).

The result is clamped to [min_budget, S_pf x budget_cap]; the clamps are reported so the
iteration log shows when an SLO asked for more (or less) than the GPU can give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from accelgen.costmodel.base import CostModel
from accelgen.costmodel.pivot import budget_for_time
from accelgen.policies.base import Pivot

BudgetRule = Literal["paper", "model"]

_MEMO_LIMIT = 1 << 14  # entries per memo before it is cleared (SLO values repeat per request)


@dataclass(slots=True)
class Budget:
    tokens: int
    clamped_low: bool
    clamped_high: bool


class TokenBudget:
    """Budget rule plus memoised iteration latencies for one cost model and pivot."""

    __slots__ = ("_budget_memo", "_time_memo", "cap", "cost", "min_budget", "pivot", "rule")

    def __init__(self, cost: CostModel, pivot: Pivot, rule: BudgetRule, min_budget: int,
                 budget_cap: float) -> None:
        self.cost = cost
        self.pivot = pivot
        self.rule = rule
        self.cap = max(1, int(pivot.s_pf * budget_cap))
        self.min_budget = min(max(1, min_budget), self.cap)
        self._time_memo: dict[int, float] = {}
        self._budget_memo: dict[float, int] = {}

    def matches(self, cost: CostModel, pivot: Pivot) -> bool:
        return cost is self.cost and pivot.s_pf == self.pivot.s_pf and pivot.t_pf == self.pivot.t_pf

    def time(self, forward_size: int) -> float:
        """Predicted latency of an iteration of ``forward_size`` tokens (T_max at that budget)."""
        t = self._time_memo.get(forward_size)
        if t is None:
            if len(self._time_memo) > _MEMO_LIMIT:
                self._time_memo.clear()
            t = self._time_memo[forward_size] = self.cost.forward_time(forward_size)
        return t

    def _raw(self, slo: float) -> int:
        if self.rule == "paper":
            return int(self.pivot.s_pf * slo / self.pivot.t_pf)
        b = self._budget_memo.get(slo)
        if b is None:
            if len(self._budget_memo) > _MEMO_LIMIT:
                self._budget_memo.clear()
            # One past the cap, so that "at least the cap" is told apart from "exactly the cap".
            b = self._budget_memo[slo] = budget_for_time(self.cost, slo, limit=self.cap + 1)
        return b

    def for_slo(self, slo_min: float) -> Budget:
        """S_b for the tightest per-iteration SLO (``inf`` when nothing constrains it)."""
        if not math.isfinite(slo_min):
            return Budget(self.cap, False, slo_min > 0)
        raw = self._raw(slo_min) if slo_min > 0 else 0
        if raw < self.min_budget:
            return Budget(self.min_budget, True, False)
        if raw > self.cap:
            return Budget(self.cap, False, True)
        return Budget(raw, False, False)
