"""The linear iteration-latency model: a quick fit of an engine's step times.

    T = base + per_token x S_f + per_ctx x decode context + per_attn x prefill attention pairs

(0 for an empty batch; ``BatchShape`` defines the aggregates). The vLLM plugin plans with it by
default (``per_attn = 0``: a fit of the tiny CPU engine's steps), optionally refitted online to
the engine's measured steps; the tests use it as their simple, monotone cost model.

Being linear in the batch aggregates, it is one of the cost models compiled code can evaluate
itself: ``linear_terms()`` hands AccelGen's compiled decision the coefficients, and
``linear_time`` is the formula both sides evaluate (compiled there, interpreted here), so the
two agree to the last bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple, final

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.base import CostModel


class LinearTerms(NamedTuple):
    """Coefficients of the linear model (seconds, per token / per context token / per pair)."""

    base_s: float
    per_token_s: float
    per_ctx_s: float = 0.0
    per_attn_s: float = 0.0


def linear_time(terms: LinearTerms, n_tokens: int, decode_ctx: int, prefill_attn: float) -> float:
    """Latency of an iteration of ``n_tokens`` (forward size) with ``decode_ctx`` context tokens
    read by its decodes and ``prefill_attn`` query-key pairs in its prefill chunks. Plain
    arithmetic, so that numba compiles the same function (``policies.accelgen.budget``)."""
    if n_tokens <= 0:
        return 0.0
    return (terms.base_s + terms.per_token_s * n_tokens + terms.per_ctx_s * decode_ctx
            + terms.per_attn_s * prefill_attn)


class LinearCostModel(CostModel):
    """``linear_time`` with fixed coefficients."""

    name = "linear"

    def __init__(self, base_s: float, per_token_s: float, per_ctx_s: float = 0.0,
                 per_attn_s: float = 0.0) -> None:
        self.terms = LinearTerms(float(base_s), float(per_token_s), float(per_ctx_s),
                                 float(per_attn_s))

    @final
    def iteration_time(self, shape: BatchShape) -> float:
        return linear_time(self.terms, shape.prefill_tokens + shape.decode_seqs, shape.decode_ctx,
                           shape.prefill_attn)

    @final
    def linear_terms(self) -> LinearTerms:
        return self.terms

    def min_token_iteration_time(self) -> float:
        # (an iteration of one token at least; every term adds when none is negative)
        t = self.terms
        return t.base_s + t.per_token_s if min(t) >= 0.0 else 0.0

    @property
    def base_s(self) -> float:
        return self.terms.base_s

    @property
    def per_token_s(self) -> float:
        return self.terms.per_token_s


class OnlineLinearCostModel(LinearCostModel):
    """``LinearCostModel`` (base and per-token terms) refitted to measured (forward size, step
    time) pairs every ``refit_every`` observations, over the last ``window``. A refit replaces
    ``terms`` with a new object, which is how users of the coefficients notice it; the vLLM
    plugin also hands policies a new ``Pivot`` then (``AccelGenScheduler``)."""

    name = "online-linear"

    def __init__(self, base_s: float, per_token_s: float, *, window: int = 256,
                 refit_every: int = 32) -> None:
        super().__init__(base_s, per_token_s)
        self._x: list[float] = []
        self._y: list[float] = []
        self.window, self.refit_every = window, refit_every
        self._since = 0
        self.refits = 0

    def min_token_iteration_time(self) -> float:
        return 0.0  # (a refit may lower the terms)

    def observe(self, forward_size: int, seconds: float) -> bool:
        """Record one measured step; returns True when the coefficients changed."""
        if forward_size <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return False
        self._x.append(float(forward_size))
        self._y.append(seconds)
        if len(self._x) > self.window:
            del self._x[0], self._y[0]
        self._since += 1
        if self._since < self.refit_every:
            return False
        self._since = 0
        n = len(self._x)
        mx, my = sum(self._x) / n, sum(self._y) / n
        sxx = sum((x - mx) ** 2 for x in self._x)
        slope = (sum((x - mx) * (y - my) for x, y in zip(self._x, self._y, strict=True)) / sxx
                 if sxx > 0 else 0.0)
        # A line through noisy steps can tilt negative; latency never falls with more tokens.
        slope = max(slope, 0.0)
        self.terms = self.terms._replace(base_s=max(my - slope * mx, 1e-6), per_token_s=slope)
        self.refits += 1
        return True
