"""Sarathi-Serve's rule for a static token budget: the largest budget whose iteration, with the
decode batch that runs near the knee, still meets the strictest TBT SLO (SPEC section 12).

Sarathi-Serve (Agrawal et al., OSDI '24, section 4.3) picks the token budget from the tightest
time-between-tokens SLO a deployment must serve: a chunk of that many prefill tokens beside the
running decodes must finish within it. This module computes that budget from the cost model and
the workload's lengths, as a user tuning Sarathi-Serve (or vLLM's ``max_num_batched_tokens``) for
the workload would; nothing here reads files, so a policy never does trace I/O (the pipeline
resolves the budget when it builds the grid and passes ``token_budget`` to the ``tuned`` systems).

The predicted iteration of a candidate budget ``B`` (:func:`predicted_iteration`):

- **prefill**: ``B`` prompt tokens in one chunk, with the attention work (query-key pairs) that
  ``B`` prompt tokens carry on average in this workload when every prompt is cut into chunks of
  ``B`` (a chunk's prior context is the prompt's earlier chunks; :func:`prefill_pairs_per_token`);
- **decodes**: the decode batch near the knee (:func:`knee_decodes`), by Little's law at the
  deployment's capacity estimate (``accelgen capacity``) when every iteration takes the SLO the
  budget is tuned for (the rule's own fixed point: a request decodes for ``output - 1``
  iterations of at most that length): ``rate x E[output - 1] x SLO`` decoding requests (rounded
  to the nearest integer; at most ``max_num_seqs``), each with the time-weighted mean decode
  context ``E[sum over decode steps of (prompt + j)] / E[output - 1]``. (At one iteration per
  T_pf, as the capacity estimate counts, the batch is T_pf / SLO times larger and on the quick
  workload no budget at all would meet the 47 ms class.)

Candidates are the multiples of the KV block size from one block up to ``max_tokens``
(:func:`candidates`), a finer ladder than the powers of two of the envelope (the strongest
static choice the rule can make). The result is the largest candidate whose predicted iteration
is within the SLO; when even one block is not, the smallest candidate, marked ``meets=False``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.base import CostModel


@dataclass(frozen=True, slots=True)
class KneeDecodes:
    """The decode batch the rule assumes near the knee."""

    num_seqs: int
    mean_context: float  # tokens of KV each decode reads


@dataclass(frozen=True, slots=True)
class TunedBudget:
    """A budget by Sarathi-Serve's rule and the numbers behind it (seconds, tokens)."""

    token_budget: int
    tbt_slo: float  # the tightest TBT SLO of the workload's online requests
    decode_seqs: int
    decode_context: float
    predicted_s: float  # the predicted iteration at token_budget
    next_budget: int | None  # the next larger candidate (None: token_budget is the largest)
    next_predicted_s: float | None
    meets: bool  # whether predicted_s <= tbt_slo (False: not even the smallest candidate does)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates(block_size: int, max_tokens: int) -> list[int]:
    """The budgets the rule considers: block_size, 2 x block_size, ... <= max_tokens (at least
    one block)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive (got {block_size})")
    top = max(block_size, max_tokens)
    return list(range(block_size, top + 1, block_size))


def knee_decodes(prompt_len: np.ndarray, output_len: np.ndarray, *, rate: float,
                 t_iteration: float, max_num_seqs: int) -> KneeDecodes:
    """Little's law for the decoding requests at arrival rate ``rate`` when every iteration takes
    ``t_iteration``: a request decodes for ``output - 1`` iterations, so
    ``rate x E[output - 1] x t_iteration`` decode at once (nearest integer, at most
    ``max_num_seqs``); each reads the time-weighted mean context of a decode step."""
    p = np.asarray(prompt_len, dtype=np.float64)
    steps = np.maximum(np.asarray(output_len, dtype=np.float64), 1.0) - 1.0
    if p.size == 0:
        raise ValueError("knee decode batch of an empty workload")
    # sum over decode steps j = 1 .. o - 1 of (p + j) = (o - 1) p + (o - 1) o / 2
    ctx_sum = steps * p + steps * (steps + 1.0) / 2.0
    mean_steps = float(steps.mean())
    mean_ctx = float(ctx_sum.sum() / steps.sum()) if steps.sum() > 0 else 0.0
    n = round(rate * mean_steps * t_iteration)
    return KneeDecodes(num_seqs=max(0, min(n, max_num_seqs)), mean_context=mean_ctx)


def prefill_pairs_per_token(prompt_len: np.ndarray, chunk: int) -> float:
    """Mean attention work (query-key pairs, as :class:`BatchShape` counts them) per prompt token
    when every prompt is prefilled in chunks of ``chunk`` tokens."""
    p = np.asarray(prompt_len, dtype=np.int64)
    p = p[p > 0]
    if p.size == 0:
        return 0.0
    full, rest = np.divmod(p, chunk)
    # full chunks k = 0 .. full - 1 start at k x chunk: sum of chunk x (k chunk + (chunk + 1) / 2)
    pairs = chunk * (chunk * full * (full - 1) / 2.0 + full * (chunk + 1) / 2.0)
    pairs = pairs + rest * (full * chunk + (rest + 1) / 2.0)
    return float(pairs.sum() / p.sum())


def predicted_iteration(cost: CostModel, budget: int, pairs_per_token: float,
                        decodes: KneeDecodes) -> float:
    """The cost model's latency of ``budget`` prompt tokens (one chunk, ``pairs_per_token`` of
    attention work per token) beside the knee's decode batch."""
    shape = BatchShape(prefill_tokens=budget, prefill_seqs=1,
                       prefill_attn=budget * pairs_per_token, decode_seqs=decodes.num_seqs,
                       decode_ctx=round(decodes.num_seqs * decodes.mean_context))
    return cost.iteration_time(shape)


def tuned_token_budget(cost: CostModel, tbt_slo: float, prompt_len: np.ndarray,
                       decodes: KneeDecodes, *, block_size: int,
                       max_tokens: int) -> TunedBudget:
    """The largest candidate budget (:func:`candidates`) whose :func:`predicted_iteration` is at
    most ``tbt_slo``; the smallest candidate with ``meets=False`` when none is."""
    if not tbt_slo > 0:
        raise ValueError(f"tbt_slo must be positive (got {tbt_slo})")
    ladder = candidates(block_size, max_tokens)
    times = [predicted_iteration(cost, b, prefill_pairs_per_token(prompt_len, b), decodes)
             for b in ladder]
    fits = [i for i, t in enumerate(times) if t <= tbt_slo]
    i = fits[-1] if fits else 0
    nxt = i + 1 if i + 1 < len(ladder) else None
    return TunedBudget(
        token_budget=ladder[i], tbt_slo=float(tbt_slo), decode_seqs=decodes.num_seqs,
        decode_context=decodes.mean_context, predicted_s=times[i],
        next_budget=ladder[nxt] if nxt is not None else None,
        next_predicted_s=times[nxt] if nxt is not None else None, meets=bool(fits))
