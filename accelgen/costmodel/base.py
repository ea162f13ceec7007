"""Cost-model interface: the latency of one iteration from its composition."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from accelgen.core.iteration import BatchShape

if TYPE_CHECKING:
    import numpy as np

    from accelgen.costmodel.analytic import RooflineTerms
    from accelgen.costmodel.calibrated import CalibratedConsts
    from accelgen.costmodel.linear import LinearTerms


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

    def calibrated_consts(self) -> CalibratedConsts | None:
        """The constants when ``iteration_time`` is exactly ``calibrated.calibrated_time`` of them (the
        calibrated model says so; no other model does): compiled code evaluates it too."""
        return None

    def decode_times(self, decode_seqs: int, decode_ctx: np.ndarray) -> np.ndarray | None:
        """``iteration_time`` of decode-only batches of ``decode_seqs`` sequences reading
        ``decode_ctx[j]`` context tokens, for every ``j`` at once: the same values to the last
        bit as asking ``iteration_time`` for them in turn (a noisy model: its next draws, kept
        until ``took_decode_run`` says how many ran), or None where the model has no such
        shortcut. The simulator's runs of decode
        iterations (``Simulator._decode_run``) use it."""
        return None

    def min_token_iteration_time(self) -> float:
        """A lower bound (s) on every iteration that emits a token (one with a decode, or a
        prefill chunk), for as long as the model lives; 0.0 where the model gives none (the
        default; a noisy or refitted model). An Oracle candidate's goodput bound prices the work
        still to do with it (``experiments.goodput_bound``)."""
        return 0.0

    def took_decode_run(self, iterations: int) -> None:  # noqa: B027 - optional hook
        """After ``decode_times``: its first ``iterations`` ran (a noisy model's draws move on by
        them; a deterministic one has nothing to do)."""

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
