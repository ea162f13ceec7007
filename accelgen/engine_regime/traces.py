"""The traces of an engine sweep: the calibration replay's, and one per (seed, rate) with SLOs
from the engine's own calibrated cost model (SPEC 11's ``isolated`` rule).

A seed fixes the requests (lengths, SLOs, online or not) and the shape of the arrival process
(unit-rate exponential gaps); a rate only scales the gaps, so every rate of a seed serves the
same requests, as in regime ``capacity``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from accelgen.core.specs import Deployment
from accelgen.engine_regime.sweep_spec import EngineSweepConfig
from accelgen.workloads.latency import LatencyReference
from accelgen.workloads.trace import validate_trace
from accelgen.workloads.workload_spec import SLOConfig

BUCKET_NAMES = ("short", "medium", "long")


def latency_reference(dep: Deployment) -> LatencyReference:
    """What the ``isolated`` SLO rule needs of the engine: its calibrated model's isolated
    prefill (one pass, and chunked at its pivot), T_pf and one isolated decode iteration."""
    from accelgen.costmodel.factory import deployment_pivot, make_cost_model
    from accelgen.costmodel.isolated import ChunkedPrefill, isolated_decode_time

    cost = make_cost_model(dep)
    pivot = deployment_pivot(dep)

    def decode(context: int) -> float:
        return isolated_decode_time(cost, context)

    return LatencyReference(prefill=cost.prefill_time, name="the engine's calibrated cost model",
                            chunked_prefill=ChunkedPrefill(cost, pivot.s_pf), s_pf=pivot.s_pf,
                            t_pf=pivot.t_pf, decode=decode)


def lengths(cfg: EngineSweepConfig, seed: int, n: int) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray, np.ndarray]:
    """``(prompt_len, output_len, bucket, unit_gaps)`` of ``n`` requests of ``seed``."""
    rng = np.random.default_rng([seed, 17])
    share = np.array([b[2] for b in cfg.prompt_buckets], dtype=float)
    bucket = rng.choice(len(share), n, p=share / share.sum())
    lo = np.array([b[0] for b in cfg.prompt_buckets])[bucket]
    hi = np.array([b[1] for b in cfg.prompt_buckets])[bucket]
    prompt = rng.integers(lo, hi)
    out = rng.integers(cfg.output_range[0], cfg.output_range[1] + 1, n)
    gaps = rng.exponential(1.0, n)
    return prompt, out, bucket, gaps


def slo_config(cfg: EngineSweepConfig, tbt_base: float) -> SLOConfig:
    return SLOConfig(ttft_reference="isolated", ttft_scale=cfg.ttft_scale, tbt_base=tbt_base,
                     tbt_scale_kind="set", tbt_scale_set=list(cfg.tbt_scale_set),
                     offline_fraction=cfg.offline_fraction)


def sweep_trace(cfg: EngineSweepConfig, seed: int, rate: float, ref: LatencyReference,
                tbt_base: float) -> pd.DataFrame:
    """The trace of one sweep point (``cfg.num_requests`` requests of ``seed`` at ``rate``)."""
    from accelgen.workloads.slo import assign_slos

    prompt, out, bucket, gaps = lengths(cfg, seed, cfg.num_requests)
    slos = assign_slos(slo_config(cfg, tbt_base), prompt, out, ref, seed)
    n = len(prompt)
    names = np.asarray(BUCKET_NAMES + ("other",) * max(0, len(cfg.prompt_buckets) - 3))
    df = pd.DataFrame({
        "req_id": np.arange(n, dtype=np.int64), "arrival": np.cumsum(gaps) / rate,
        "source": names[bucket], "prompt_len": prompt, "prompt_len_natural": prompt,
        "prompt_truncated": False, "output_len": out, "output_len_natural": out,
        "output_capped": False, "ttft_slo": slos.ttft, "tbt_slo": slos.tbt,
        "jct_slo": slos.jct, "online": slos.online,
        "predicted_output_len": np.full(n, cfg.predicted_output_len, np.int64)})
    return validate_trace(df)


def calibration_trace(cfg: EngineSweepConfig) -> pd.DataFrame:
    """The calibration replay's trace: the sweep's lengths at the calibration rate (its SLOs are
    never read: stock vLLM ignores them)."""
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace

    c = cfg.calibration
    return mixed_slo_trace(c.num_requests, c.rate, c.seed, buckets=cfg.prompt_buckets,
                           source_names=(*BUCKET_NAMES, "other"),
                           output_range=(cfg.output_range[0], cfg.output_range[1] + 1),
                           online_share=1.0, ttft_range=(1.0, 2.0), tbt_choices=(1.0,),
                           predicted_output_len=cfg.predicted_output_len)


def tbt_class(tbt_slo: np.ndarray, online: np.ndarray, tbt_base: float,
              scales: list[float]) -> np.ndarray:
    """Each request's SLO class: ``tbt<scale>`` of the drawn TBT scale (a TBT raised to the
    engine's decode floor counts in the smallest class at or above it), ``offline``."""
    ordered = np.sort(np.asarray(scales, dtype=float))
    ratio = np.asarray(tbt_slo, dtype=float) / tbt_base
    idx = np.minimum(np.searchsorted(ordered, ratio * (1 - 1e-9)), len(ordered) - 1)
    labels = np.array([f"tbt{s:g}" for s in ordered])[idx]
    return np.where(np.asarray(online, dtype=bool), labels, "offline")
