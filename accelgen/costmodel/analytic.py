"""Analytic roofline iteration-latency model, calibrated on measured A100 kernel times.

Per transformer layer, summed over all layers of the model:

- Linear layers (QKV/O projections, FFN, and the element-wise ops around them): a smooth roofline
  ``(t_compute^p + t_weights^p)^(1/p)`` over the forward size S, where
  t_compute = 2 * params * S / (peak * compute_eff) and t_weights = weight bytes /
  (bandwidth * memory_eff). The measured curve bends gradually from weight streaming to compute
  (no sharp ``max``): p is fitted. Plus a fixed per-layer cost (kernel launches, small ops).
- Prefill attention: compute-bound on query-key pairs. Pairs of the causal (new x new) triangle
  and pairs against prior context run at different measured efficiencies (the kernel wastes
  work on diagonal tiles), so they get separate constants. From the batch aggregates the causal
  part is estimated as min(prefill_attn, P(P+1)/2) with P = prefill tokens: exact for one chunk,
  an overestimate (hence conservative) when several chunks share an iteration.
- Decode attention: memory-bound on the KV bytes read (decode_ctx tokens), plus a per-sequence
  and a fixed per-layer cost; compute-bound instead if that is ever larger (not for fp16 MHA/GQA
  on GPUs).
- LM head: a roofline over the sampled sequences (one logit row per sequence). Not in the
  calibration data (which has no LM head); its weights add about 0.2-0.3 ms per iteration.
- Multi-GPU: TP divides weights, FLOPs, heads and KV heads by tp and adds two all-reduces of
  S x hidden x dtype bytes per layer (Megatron layout); PP adds (pp - 1) point-to-point transfers
  of the same size. Their times are fitted to measured NCCL collectives (``collectives.py``:
  a latency floor, a startup and a bus bandwidth that grows with the message size, per TP degree;
  the package's fits are DGX-A100 and DGX-H100 nodes; ``Deployment.collectives`` takes a user's
  own, ``accelgen calibrate --collectives``). With PP the scheduler is charged a full pipeline
  pass per iteration (all layers, no micro-batch overlap, i.e. the bubble is never filled):
  simple and pessimistic for throughput, which is why the default OPT-175B layout is TP 8 (see
  datasheets.py).
- ``extra_overhead_s``: a constant per iteration for engine CPU work, sampling and so on. The
  calibration data are GPU kernel times only, so the default is 0 (a real engine adds a few ms).

Efficiencies fitted on A100 kernel times are applied to every hardware profile; on other GPUs
this is an assumption, and a measured profile table (``cost_model: profile``) should be preferred.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple, final

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import CollectiveTerms, HardwareProfile, ModelProfile
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.collectives import builtin_collectives, comm_terms, comm_time


@dataclass(frozen=True, slots=True)
class Calibration:
    """Efficiency constants of the analytic model (fractions of datasheet peak, and seconds)."""

    linear_compute_eff: float
    linear_memory_eff: float
    linear_transition_p: float
    linear_layer_fixed_s: float  # per layer per iteration
    attn_causal_eff: float
    attn_context_eff: float
    attn_prefill_fixed_s: float  # per layer, iterations with prefill
    attn_decode_mem_eff: float
    attn_decode_seq_head_s: float  # per layer, per decode sequence, per attention head
    attn_decode_fixed_s: float  # per layer, iterations with decodes
    # (TP/PP communication: ``collectives.py``, fitted on measured NCCL collectives.)
    source: str = ""


# Fitted by `scripts/fit_costmodel.py` (see docs/costmodel.md) on Vidur's published A100-80GB
# profiles (github.com/microsoft/vidur, data/profiling/compute/a100/, MIT): per-op linear-layer
# times of internlm-20b (the Llama-2-13B layer shape), Llama-2-7B and CodeLlama-34B at TP 1, and
# Llama-2-7B prefill/decode attention points, as collected for this project under
# calibration/a100_13b_class/. Command:
#   .venv/bin/python scripts/fit_costmodel.py --calibration /work/shared/calibration/a100_13b_class
A100_CALIBRATION = Calibration(
    linear_compute_eff=0.6774,
    linear_memory_eff=0.8429,
    linear_transition_p=1.677,
    linear_layer_fixed_s=5.479e-05,
    attn_causal_eff=0.1559,
    attn_context_eff=0.3625,
    attn_prefill_fixed_s=3.593e-05,
    attn_decode_mem_eff=1.0,  # at its bound: the per-sequence term absorbs the rest
    attn_decode_seq_head_s=3.264e-08,
    attn_decode_fixed_s=7.664e-06,
    source="fit of Vidur A100 profiles (calibration/a100_13b_class), scripts/fit_costmodel.py",
)


class RooflineTerms(NamedTuple):
    """The per-iteration constants of ``AnalyticCostModel`` (seconds; ``p`` the roofline's
    transition exponent): all ``roofline_time`` needs."""

    fixed_s: float  # per iteration: fixed per-layer costs, PP transfers' startup, extra overhead
    comm_tok_s: float  # per forward token: PP transfers
    lin_w_s: float  # linear layers: weight streaming
    lin_tok_s: float  # linear layers: compute per forward token
    p: float
    inv_p: float
    lm_w_s: float  # LM head: weight streaming
    lm_tok_s: float  # LM head: compute per sampled sequence
    pf_fixed_s: float  # iterations with prefill
    causal_s: float  # per query-key pair of the causal triangle
    ctx_s: float  # per query-key pair against prior context
    dec_fixed_s: float  # iterations with decodes
    dec_seq_s: float  # per decode sequence
    dec_ctx_s: float  # per context token a decode reads
    # TP all-reduces of all layers for N forward tokens (``collectives.CommTerms``):
    # max(ar_floor_s, ar_startup_s + ar_tok_s x m^ar_exp x N / m), m = min(N, ar_cap);
    # ar_tok_s is 0 without TP.
    ar_floor_s: float
    ar_startup_s: float
    ar_tok_s: float
    ar_exp: float
    ar_cap: float


def roofline_time(t: RooflineTerms, prefill_tokens: int, prefill_seqs: int, prefill_attn: float,
                  decode_seqs: int, decode_ctx: int) -> float:
    """Latency of an iteration with these ``BatchShape`` aggregates. Plain arithmetic, so that
    numba compiles the same function for AccelGen's decision (``policies.accelgen.budget``), and the
    two agree to the last bit."""
    n = prefill_tokens + decode_seqs
    if n <= 0:
        return 0.0
    p, inv_p = t.p, t.inv_p
    lin_w = t.lin_w_s
    out = t.fixed_s + n * t.comm_tok_s
    if t.ar_tok_s > 0.0:
        m = n if n < t.ar_cap else t.ar_cap
        ar = t.ar_startup_s + t.ar_tok_s * m ** t.ar_exp * (n / m)
        out += ar if ar > t.ar_floor_s else t.ar_floor_s
    out += lin_w * (1.0 + (n * t.lin_tok_s / lin_w) ** p) ** inv_p
    sampled = prefill_seqs + decode_seqs
    if sampled > 0:
        lm_w = t.lm_w_s
        out += lm_w * (1.0 + (sampled * t.lm_tok_s / lm_w) ** p) ** inv_p
    if prefill_tokens > 0:
        causal = prefill_tokens * (prefill_tokens + 1) * 0.5
        if causal > prefill_attn:
            causal = prefill_attn
        out += t.pf_fixed_s + causal * t.causal_s + (prefill_attn - causal) * t.ctx_s
    if decode_seqs > 0:
        out += t.dec_fixed_s + decode_seqs * t.dec_seq_s + decode_ctx * t.dec_ctx_s
    return out


def roofline_decode_times(t: RooflineTerms, decode_seqs: int,
                          decode_ctx: np.ndarray) -> np.ndarray:
    """``roofline_time`` of decode-only iterations (``decode_seqs`` sequences, no prefill) at
    each context total of ``decode_ctx``: ``roofline_time`` itself with the array for the
    context, so only its last term is elementwise and every value is the one it gives for that
    context alone, to the last bit (tests/test_costmodel.py checks it)."""
    if decode_seqs <= 0:
        return np.zeros(len(decode_ctx))
    times = roofline_time(t, 0, 0, 0.0, decode_seqs, decode_ctx)  # type: ignore[arg-type]
    return np.asarray(times, dtype=np.float64)


def roofline_min_token_time(t: RooflineTerms) -> float:
    """A lower bound on ``roofline_time`` of any iteration with a decode or a prefill chunk: the
    terms every such iteration carries (the fixed ones, one token's transfers, the weights
    streamed once, the LM head's weights, the cheaper of the prefill's and one decode's fixed
    attention costs). Every other term adds to them only when none is negative, so a fit with a
    negative term gives no bound (0.0)."""
    if not (t.p > 0.0 and t.lin_w_s > 0.0 and t.lm_w_s > 0.0 and min(t) >= 0.0):
        return 0.0
    out = (t.fixed_s + t.comm_tok_s + t.lin_w_s + t.lm_w_s
           + min(t.pf_fixed_s, t.dec_fixed_s + t.dec_seq_s))
    if t.ar_tok_s > 0.0:
        out += t.ar_floor_s  # (roofline_time's all-reduce is at least its floor)
    return out


def _roofline(t_compute: float, t_memory: float, p: float) -> float:
    """Smooth maximum of two times; p -> infinity gives max(), p = 1 the sum."""
    return t_memory * (1.0 + (t_compute / t_memory) ** p) ** (1.0 / p)


class AnalyticCostModel(CostModel):
    """Roofline iteration latency of ``model`` on ``tp x pp`` GPUs of ``hardware``."""

    name = "analytic"

    __slots__ = ("_causal", "_comm", "_comm_tok", "_ctx", "_dec_ctx", "_dec_fixed", "_dec_seq", "_fixed",
                 "_inv_p", "_lin_tok", "_lin_w", "_lm_tok", "_lm_w", "_p", "_pf_fixed",
                 "calibration", "collectives", "extra_overhead_s", "hardware", "model", "pp",
                 "terms", "tp")

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, tp: int = 1, pp: int = 1,
                 calibration: Calibration = A100_CALIBRATION,
                 extra_overhead_s: float = 0.0,
                 collectives: CollectiveTerms | None = None) -> None:
        if tp < 1 or pp < 1:
            raise ValueError(f"tp and pp must be >= 1, got tp={tp}, pp={pp}")
        if pp > model.num_layers:
            raise ValueError(f"pp={pp} exceeds the {model.num_layers} layers of {model.name}")
        if extra_overhead_s < 0:
            raise ValueError(f"extra_overhead_s must be >= 0, got {extra_overhead_s}")
        self.model, self.hardware, self.tp, self.pp = model, hardware, tp, pp
        self.calibration, self.extra_overhead_s = calibration, extra_overhead_s
        self.collectives = (collectives if collectives is not None
                            else builtin_collectives(hardware))
        c = calibration
        peak, bw, dt = hardware.peak_flops, hardware.mem_bandwidth, model.dtype_bytes
        layers, hidden, head_dim = model.num_layers, model.hidden_size, model.head_dim
        heads = model.num_heads / tp
        kv_heads = math.ceil(model.num_kv_heads / tp)  # replicated when fewer than tp
        params = model.params_per_layer / tp

        # Everything below is per iteration (all layers of the full pass) so that the hot path
        # is a handful of multiply-adds.
        self._p, self._inv_p = c.linear_transition_p, 1.0 / c.linear_transition_p
        self._lin_tok = layers * 2.0 * params / (peak * c.linear_compute_eff)
        self._lin_w = layers * params * dt / (bw * c.linear_memory_eff)
        lm_params = model.vocab_size * hidden / tp
        self._lm_tok = 2.0 * lm_params / (peak * c.linear_compute_eff)
        self._lm_w = lm_params * dt / (bw * c.linear_memory_eff)

        # One token's activations travel in every all-reduce and pipeline hop.
        self._comm = comm = comm_terms(self.collectives, layers, hidden * dt, tp, pp)
        self._comm_tok = comm.tok_s
        self._fixed = layers * c.linear_layer_fixed_s + comm.fixed_s + extra_overhead_s

        pair_flops = 4.0 * heads * head_dim  # QK^T and PV, per query-key pair
        self._ctx = layers * pair_flops / (peak * c.attn_context_eff)
        # Moving a pair from context to the causal triangle must never make an iteration cheaper
        # (keeps iteration_time monotone in prefill_tokens whatever the fit says).
        self._causal = max(layers * pair_flops / (peak * c.attn_causal_eff), self._ctx)
        self._pf_fixed = layers * c.attn_prefill_fixed_s
        kv_token_bytes = 2.0 * kv_heads * head_dim * dt
        self._dec_ctx = layers * max(kv_token_bytes / (bw * c.attn_decode_mem_eff),
                                     pair_flops / (peak * c.attn_context_eff))
        self._dec_seq = layers * heads * c.attn_decode_seq_head_s
        self._dec_fixed = layers * c.attn_decode_fixed_s

        self.terms = RooflineTerms(
            self._fixed, self._comm_tok, self._lin_w, self._lin_tok, self._p, self._inv_p,
            self._lm_w, self._lm_tok, self._pf_fixed, self._causal, self._ctx, self._dec_fixed,
            self._dec_seq, self._dec_ctx, comm.ar_floor_s, comm.ar_startup_s, comm.ar_tok_s,
            comm.ar_exp, comm.ar_cap)

    @final
    def iteration_time(self, shape: BatchShape) -> float:
        return roofline_time(self.terms, shape.prefill_tokens, shape.prefill_seqs,
                             shape.prefill_attn, shape.decode_seqs, shape.decode_ctx)

    @final
    def roofline_terms(self) -> RooflineTerms:
        return self.terms

    @final
    def decode_times(self, decode_seqs: int, decode_ctx: np.ndarray) -> np.ndarray:
        return roofline_decode_times(self.terms, decode_seqs, decode_ctx)

    @final
    def min_token_iteration_time(self) -> float:
        return roofline_min_token_time(self.terms)

    def breakdown(self, shape: BatchShape) -> dict[str, float]:
        """The terms of ``iteration_time`` (seconds), for inspection and tests."""
        out = dict.fromkeys(("fixed", "linear", "lm_head", "comm", "prefill_attn",
                             "decode_attn"), 0.0)
        n = shape.prefill_tokens + shape.decode_seqs
        if n <= 0:
            return out
        out["fixed"] = self._fixed - self._comm.fixed_s
        out["comm"] = comm_time(self._comm, n)
        out["linear"] = _roofline(n * self._lin_tok, self._lin_w, self._p)
        sampled = shape.prefill_seqs + shape.decode_seqs
        if sampled > 0:
            out["lm_head"] = _roofline(sampled * self._lm_tok, self._lm_w, self._p)
        if shape.prefill_tokens > 0:
            causal = min(shape.prefill_attn, shape.prefill_tokens * (shape.prefill_tokens + 1) / 2)
            out["prefill_attn"] = (self._pf_fixed + causal * self._causal
                                   + (shape.prefill_attn - causal) * self._ctx)
        if shape.decode_seqs > 0:
            out["decode_attn"] = (self._dec_fixed + shape.decode_seqs * self._dec_seq
                                  + shape.decode_ctx * self._dec_ctx)
        return out

    def describe(self) -> dict[str, object]:
        return {"model": self.model.name, "hardware": self.hardware.name, "tp": self.tp,
                "pp": self.pp, "extra_overhead_s": self.extra_overhead_s,
                "calibration": asdict(self.calibration),
                "collectives": self.collectives.source}

    def __repr__(self) -> str:
        return (f"AnalyticCostModel({self.model.name}, {self.hardware.name}, tp={self.tp}, "
                f"pp={self.pp})")
