"""Per-request serving state shared by the simulator, the policies and the vLLM adapter.

Vocabulary follows vLLM V1: a request has ``num_tokens`` (prompt plus generated so far) of which
``num_computed_tokens`` have KV computed; scheduling ``n`` tokens advances ``num_computed_tokens``
by ``n`` and, when it reaches ``num_tokens``, one new token is sampled. Prefill, chunked prefill,
decode and recompute after preemption all fall out of that rule.

The true output length is deliberately *not* a field here: only the simulator's bookkeeping (and
the clairvoyant Oracle, through an explicit hook) may know it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class Status(IntEnum):
    WAITING = 0  # never started, or preempted (recompute)
    RUNNING = 1  # admitted, holds KV blocks
    SWAPPED = 2  # KV lives in host memory (FastServe)
    FINISHED = 3  # emitted its whole output
    REJECTED = 4  # never served, or given up on (``reject_reason`` says why)
    CUT = 5  # served, but its output was cut short (at max_model_len; ``reject_reason`` says so)
    UNFINISHED = 6  # not done when the simulation stopped (``sim.horizon_s``; the reason says so)


@dataclass(slots=True, eq=False)
class Request:
    req_id: int
    arrival: float
    prompt_len: int
    source: str = "unknown"
    # SLOs (seconds). Online requests use ttft/tbt; offline ones use jct. jct_slo is always set
    # (derived as ttft + tbt * (n_out - 1) for online ones) so JCT attainment can be reported.
    ttft_slo: float = math.inf
    tbt_slo: float = math.inf
    jct_slo: float = math.inf
    online: bool = True
    # S_g: a *predicted* output length (e.g. its dataset's mean), never the true one.
    predicted_output_len: int = 256

    # --- dynamic state -------------------------------------------------------------------------
    status: Status = Status.WAITING
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_blocks: int = 0  # KV blocks held on the device
    num_swapped_blocks: int = 0  # KV blocks held in host memory
    num_preemptions: int = 0
    queued_since: float = 0.0  # when it (re-)entered the waiting queue
    first_scheduled_time: float = math.nan
    first_token_time: float = math.nan
    last_token_time: float = math.nan
    finish_time: float = math.nan
    reject_reason: str = ""
    # Every emitted token's time (s), 8 bytes each: a paper-size run emits ~17 M tokens.
    token_times: array[float] = field(default_factory=lambda: array("d"))
    # Free slot for a policy's per-request bookkeeping (slack, queue level, carry-over, ...).
    policy_state: Any = None

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    @property
    def num_new_tokens(self) -> int:
        """Tokens that still need a forward pass before the next token can be sampled."""
        return self.prompt_len + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """True when the next forward pass is a single decode step of an already-started output."""
        return self.num_output_tokens > 0 and self.num_new_tokens == 1

    @property
    def has_first_token(self) -> bool:
        return self.num_output_tokens > 0

    @property
    def is_done(self) -> bool:
        return self.status >= Status.FINISHED


def served_output_len(prompt_len: np.ndarray, output_len: np.ndarray,
                      max_model_len: int) -> np.ndarray:
    """Tokens each request emits: its output, stopped where prompt + output reaches
    ``max_model_len``, as a real engine's length limit stops a sequence (vLLM:
    ``num_tokens >= max_model_len``). One rule for the simulator and the replay runner."""
    prompt = np.asarray(prompt_len, dtype=np.int64)
    return np.minimum(np.asarray(output_len, dtype=np.int64),
                      np.maximum(max_model_len - prompt, 0))


def length_cap_reason(prompt_len: int, output_len: int, served: int, max_model_len: int) -> str:
    """The recorded reason of a request whose output stopped at ``max_model_len``."""
    return (f"length_cap: output cut at {served} of {output_len} tokens (prompt {prompt_len} + "
            f"output reached max_model_len {max_model_len})")
