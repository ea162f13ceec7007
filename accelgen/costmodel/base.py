"""Cost-model interface: the latency of one iteration from its composition."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelgen.costmodel.analytic import RooflineTerms
    from accelgen.costmodel.linear import LinearTerms


@dataclass(slots=True)
class BatchShape:
    """Aggregates of one iteration's batch, accumulated in O(1) per scheduled request.

    ``prefill_attn`` is the number of query-key pairs of the prefill chunks:
    sum over chunks of n_new * (n_ctx + (n_new + 1) / 2), where n_ctx is the chunk's prior context.
    ``decode_ctx`` is the total context (KV tokens read) of the decode requests.
    """

    prefill_tokens: int = 0
    prefill_seqs: int = 0
    prefill_attn: float = 0.0
    decode_seqs: int = 0
    decode_ctx: int = 0

    @property
    def forward_size(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    def add_prefill(self, n_new: int, n_ctx: int) -> None:
        self.prefill_tokens += n_new
        self.prefill_seqs += 1
        self.prefill_attn += n_new * (n_ctx + (n_new + 1) / 2)

    def add_decode(self, n_ctx: int) -> None:
        self.decode_seqs += 1
        self.decode_ctx += n_ctx


class CostModel(ABC):
    """Predicts iteration latency (seconds)."""

    name: str = "cost-model"

    @abstractmethod
    def iteration_time(self, shape: BatchShape) -> float:
        """Latency of one iteration with the given batch composition."""

    def linear_terms(self) -> LinearTerms | None:
        """The coefficients when ``iteration_time`` is exactly ``linear.linear_time`` of them (the
        linear model says so; no other model does). Compiled code (AccelGen's decision) then
        evaluates latencies itself; otherwise it asks ``iteration_time`` between its steps."""
        return None

    def roofline_terms(self) -> RooflineTerms | None:
        """The constants when ``iteration_time`` is exactly ``analytic.roofline_time`` of them (the
        analytic model says so; no other model does): compiled code evaluates it too."""
        return None

    def forward_time(self, forward_size: int) -> float:
        """Latency of a prefill-only iteration of ``forward_size`` tokens with no prior context.

        Used for the pivot forward size, T_max at a token budget, and isolated prefill latency.
        """
        shape = BatchShape()
        if forward_size > 0:
            shape.add_prefill(forward_size, 0)
        return self.iteration_time(shape)

    def prefill_time(self, prompt_len: int) -> float:
        """Isolated (single-request, unchunked) prefill latency."""
        return self.forward_time(prompt_len)
