"""Calibrated cost model: the analytic model's structure with every free term fitted to measured
iteration latencies (``accelgen calibrate``; the terms are ``accelgen.core.specs.CalibratedTerms``).

For an iteration of P prefill tokens and D decode sequences (forward size N = P + D) on a
deployment of ``tp`` x ``pp`` GPUs and L layers:

    T = overhead_s + prefill_seq_s x prefill chunks
        + roofline(weights_s / tp, (prefill_token_s x P + decode_token_s x D) / tp)
        + (causal_pair_s x causal pairs + context_pair_s x context pairs
           + context_token_s x decode context) / tp
        + comm_token_s x N x (4 L (tp - 1) / tp + (pp - 1))

- ``roofline(w, c) = w (1 + (c / w)^p)^(1/p)``, p = ``transition_p``: the linear layers stream
  their weights (``weights_s``) until the batch's compute takes longer, with the gradual bend a
  GPU shows (``analytic.py``). With ``weights_s`` = 0 it is the compute term alone: a model
  linear in the batch, which is what a small CPU engine's step looks like.
- Attention: query-key pairs of the prefill chunks, split as in ``analytic.py`` (causal pairs
  estimated as min(pairs, P (P + 1) / 2), exact for one chunk; a causal pair is charged at least
  what a context pair costs, so that no iteration gets cheaper when its pairs move into the
  causal part), and the context tokens the decodes read.
- Communication: two ring all-reduces of the activations per layer under TP (each moves
  2 (tp - 1) / tp of them), (pp - 1) point-to-point transfers under PP; ``comm_token_s`` is the
  time of one token's activations over one such transfer. The terms are stated for the whole
  model on one GPU, so one set of terms predicts every layout of the same model and GPU: TP
  divides the work terms, PP runs all layers in one pass (no micro-batch overlap, as
  ``analytic.py``). Fixed per-iteration costs (launches, all-reduce latency) are all in
  ``overhead_s``, and the engine's work per new sequence (admitting a request, its first
  sampling) in ``prefill_seq_s``; no layout scales those two.

The model is stateless and costs a handful of float operations per call (the simulator's hot
path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import CalibratedTerms
from accelgen.costmodel.base import CostModel

# The fitted terms in the order of ``features`` (``transition_p`` is a shape parameter, not a
# linear coefficient).
TERMS = ("overhead_s", "weights_s", "prefill_token_s", "prefill_seq_s", "decode_token_s",
         "causal_pair_s", "context_pair_s", "context_token_s", "comm_token_s")


def comm_volume(num_layers: int, tp: int, pp: int) -> float:
    """Activation transfers per token and iteration: 2 all-reduces per layer under TP, each
    moving 2 (tp - 1) / tp of a token's activations, plus (pp - 1) pipeline hops."""
    return 4.0 * num_layers * (tp - 1) / tp + (pp - 1)


class CalibratedConsts(NamedTuple):
    """The per-iteration constants of ``CalibratedCostModel`` on its layout (seconds): all
    ``calibrated_time`` needs. ``linear``: the model is ``overhead_s + per_token_s x N + ctx_s x decode
    context`` exactly (no weights floor, one per-token cost, no prefill attention or per-sequence
    term), computed in that form."""

    overhead_s: float
    w_s: float  # weights floor / tp
    p: float
    inv_p: float
    pf_s: float  # per prefill token / tp
    dec_s: float  # per decode sequence / tp
    seq_s: float  # per prefill chunk
    causal_s: float  # per causal query-key pair / tp (at least a context pair's)
    ctx_pair_s: float  # per context query-key pair / tp
    ctx_s: float  # per context token a decode reads / tp
    comm_s: float  # per forward token: activation transfers
    per_token_s: float  # linear form: pf_s + comm_s
    linear: bool


def calibrated_time(k: CalibratedConsts, prefill_tokens: int, prefill_seqs: int, prefill_attn: float,
                    decode_seqs: int, decode_ctx: int) -> float:
    """Latency of an iteration with these ``BatchShape`` aggregates. Plain arithmetic, so that numba
    compiles the same function for AccelGen's decision (``policies.accelgen.budget``), and the two
    agree to the last bit."""
    n = prefill_tokens + decode_seqs
    if n <= 0:
        return 0.0
    if k.linear:
        return k.overhead_s + k.per_token_s * n + k.ctx_s * decode_ctx
    c = k.pf_s * prefill_tokens + k.dec_s * decode_seqs
    w = k.w_s
    t = k.overhead_s + (w * (1.0 + (c / w) ** k.p) ** k.inv_p if w > 0 else c)
    if prefill_tokens > 0:
        causal = prefill_tokens * (prefill_tokens + 1) * 0.5
        if causal > prefill_attn:
            causal = prefill_attn
        t += (k.seq_s * prefill_seqs + k.causal_s * causal
              + k.ctx_pair_s * (prefill_attn - causal))
    return t + k.ctx_s * decode_ctx + k.comm_s * n


@dataclass(frozen=True, slots=True)
class Features:
    """Per-iteration aggregates the model needs, as arrays (one entry per iteration)."""

    prefill_tokens: np.ndarray
    prefill_seqs: np.ndarray
    decode_seqs: np.ndarray
    causal_pairs: np.ndarray
    context_pairs: np.ndarray
    decode_ctx: np.ndarray
    inv_tp: np.ndarray  # 1 / tp of each iteration's layout
    comm: np.ndarray  # forward size x comm_volume of its layout

    @classmethod
    def of(cls, shapes: list[BatchShape], tp: np.ndarray | list[int],
           pp: np.ndarray | list[int], num_layers: int) -> Features:
        p = np.array([s.prefill_tokens for s in shapes], dtype=np.float64)
        attn = np.array([s.prefill_attn for s in shapes], dtype=np.float64)
        causal = np.minimum(attn, p * (p + 1) * 0.5)
        d = np.array([s.decode_seqs for s in shapes], dtype=np.float64)
        tp_a, pp_a = np.asarray(tp, dtype=np.float64), np.asarray(pp, dtype=np.float64)
        vol = 4.0 * num_layers * (tp_a - 1) / tp_a + (pp_a - 1)
        seqs = np.array([s.prefill_seqs for s in shapes], dtype=np.float64)
        return cls(p, seqs, d, causal, attn - causal,
                   np.array([s.decode_ctx for s in shapes], dtype=np.float64), 1.0 / tp_a,
                   (p + d) * vol)

    def __len__(self) -> int:
        return len(self.prefill_tokens)

    def take(self, idx: np.ndarray) -> Features:
        return Features(*(getattr(self, f)[idx] for f in self.__slots__))  # type: ignore[attr-defined]

    def predict(self, coef: np.ndarray, p: float) -> np.ndarray:
        """Latencies for ``coef`` (``TERMS`` order) and transition ``p``; the same arithmetic as
        ``CalibratedCostModel.iteration_time``."""
        overhead, weights, c_pf, c_seq, c_dec, c_causal, c_ctx_pair, c_ctx, c_comm = coef
        w = weights * self.inv_tp
        c = (c_pf * self.prefill_tokens + c_dec * self.decode_seqs) * self.inv_tp
        lin = w * (1.0 + (c / w) ** p) ** (1.0 / p) if weights > 0 else c
        attn = (max(c_causal, c_ctx_pair) * self.causal_pairs + c_ctx_pair * self.context_pairs
                + c_ctx * self.decode_ctx) * self.inv_tp
        return overhead + c_seq * self.prefill_seqs + lin + attn + c_comm * self.comm


class CalibratedCostModel(CostModel):
    """Iteration latency from fitted terms (module docstring) on a ``tp`` x ``pp`` layout of a
    model with ``num_layers`` layers."""

    name = "calibrated"

    __slots__ = ("consts", "num_layers", "pp", "terms", "tp")

    def __init__(self, terms: CalibratedTerms, num_layers: int = 1, tp: int = 1,
                 pp: int = 1) -> None:
        if tp < 1 or pp < 1 or num_layers < 1:
            raise ValueError(f"tp, pp and num_layers must be >= 1, got {tp}, {pp}, {num_layers}")
        self.terms, self.num_layers, self.tp, self.pp = terms, num_layers, tp, pp
        t = terms
        w, c_pf, c_dec = t.weights_s / tp, t.prefill_token_s / tp, t.decode_token_s / tp
        c_causal, c_ctx_pair = max(t.causal_pair_s, t.context_pair_s) / tp, t.context_pair_s / tp
        comm = t.comm_token_s * comm_volume(num_layers, tp, pp)
        # Terms that make T = overhead + per token x N + per ctx x decode context exactly (no
        # weights floor, one per-token cost, no prefill attention): then it is computed in that
        # form, which compiled policy code can reproduce (``linear_coefficients``).
        linear = (w == 0 and c_pf == c_dec and c_causal == 0 and c_ctx_pair == 0
                  and t.prefill_seq_s == 0)
        self.consts = CalibratedConsts(t.overhead_s, w, t.transition_p, 1.0 / t.transition_p, c_pf,
                                       c_dec, t.prefill_seq_s, c_causal, c_ctx_pair,
                                       t.context_token_s / tp, comm, c_pf + comm, linear)

    def iteration_time(self, shape: BatchShape) -> float:
        return calibrated_time(self.consts, shape.prefill_tokens, shape.prefill_seqs,
                               shape.prefill_attn, shape.decode_seqs, shape.decode_ctx)

    def calibrated_consts(self) -> CalibratedConsts:
        return self.consts

    def linear_coefficients(self) -> tuple[float, float, float] | None:
        k = self.consts
        return (k.overhead_s, k.per_token_s, k.ctx_s) if k.linear else None

    def describe(self) -> dict[str, object]:
        return {"tp": self.tp, "pp": self.pp, "num_layers": self.num_layers,
                **self.terms.model_dump()}

    def __repr__(self) -> str:
        t = self.terms
        return (f"CalibratedCostModel(overhead {t.overhead_s * 1e3:.3g} ms, weights "
                f"{t.weights_s * 1e3:.3g} ms, prefill {t.prefill_token_s * 1e6:.3g} us/token, "
                f"decode {t.decode_token_s * 1e6:.3g} us/seq, tp={self.tp}, pp={self.pp})")
