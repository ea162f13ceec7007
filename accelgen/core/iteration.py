"""What one iteration's latency depends on, shared by the cost models and the policies.

:class:`BatchShape`: the aggregates of one iteration's batch a cost model prices.
:class:`Pivot`: the forward size S_pf past which an iteration's latency grows with its tokens
(it turns compute bound), and that iteration's latency T_pf; the cost model finds it
(``accelgen.costmodel.pivot``), the policies budget around it.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(slots=True)
class Pivot:
    """Pivot forward size S_pf and its iteration latency T_pf (seconds)."""

    s_pf: int
    t_pf: float
