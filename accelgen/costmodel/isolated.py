"""Latencies of one request alone on a deployment: the references of SLOs that hold at zero load.

SPEC section 11 (``workload.slo.ttft_reference: isolated``): a request's TTFT reference is its own
prefill run alone, cut into chunks of S_pf tokens (each chunk attends to the chunks before it),
plus one T_pf for the iteration it may arrive during; its TBT floor is one decode iteration with
batch 1 at its longest context.
"""

from __future__ import annotations

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.base import CostModel


class ChunkedPrefill:
    """Isolated prefill latency of a prompt cut into ``chunk``-token pieces, one per iteration.

    p = q x chunk + r costs the first q full chunks (prefix sums, cached) plus a last piece of r
    tokens after q x chunk tokens of context.
    """

    __slots__ = ("_cost", "_prefix", "chunk")

    def __init__(self, cost: CostModel, chunk: int) -> None:
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        self._cost, self.chunk = cost, chunk
        self._prefix = [0.0]  # _prefix[k]: time of the first k full chunks

    def _piece(self, n_new: int, n_ctx: int) -> float:
        shape = BatchShape()
        shape.add_prefill(n_new, n_ctx)
        return self._cost.iteration_time(shape)

    def __call__(self, prompt_len: int) -> float:
        if prompt_len <= 0:
            return 0.0
        q, r = divmod(prompt_len, self.chunk)
        prefix = self._prefix
        while len(prefix) <= q:
            k = len(prefix) - 1
            prefix.append(prefix[-1] + self._piece(self.chunk, k * self.chunk))
        return prefix[q] + (self._piece(r, q * self.chunk) if r else 0.0)


def isolated_decode_time(cost: CostModel, context: int) -> float:
    """One decode iteration of a single request reading ``context`` KV tokens (batch 1)."""
    shape = BatchShape()
    shape.add_decode(max(context, 0))
    return cost.iteration_time(shape)
