"""What a fidelity check runs: the trace, the engine, the rounds; and the simulator's view of
that engine (deployment, policies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from accelgen.core.specs import CalibratedTerms, Deployment, PolicySpec, StrictModel
from accelgen.costmodel.datasheets import GIB, resolve_model

SYSTEMS = ("stock", "accelgen")
SIM_MODEL = "tiny"  # the simulator needs a ModelProfile only for KV bytes/token and metrics


class FidelityConfig(StrictModel):
    """The trace, the engine and the rounds of one fidelity check."""

    num_requests: PositiveInt = 200
    # Poisson arrivals, requests/s: below both systems' knee on a host up to 1.3x slower than
    # the calibrated one (scripts/fidelity_rate_check.py; docs/profiling.md 3.5).
    rate: PositiveFloat = 12.0
    seed: int = 0
    # Prompt lengths: uniform within a bucket chosen with these probabilities.
    prompt_buckets: list[tuple[int, int, float]] = Field(
        default_factory=lambda: [(16, 128, 0.5), (128, 512, 0.35), (512, 1024, 0.15)])
    output_range: tuple[int, int] = (8, 128)  # uniform, inclusive
    online_fraction: float = 0.8
    ttft_slo_range: tuple[float, float] = (0.05, 0.5)
    tbt_slo_choices: list[float] = Field(default_factory=lambda: [0.01, 0.02, 0.05])
    predicted_output_len: PositiveInt = 64
    # EngineSpec fields (accelgen.vllm_integration.replay) of every replay.
    engine: dict[str, Any] = Field(default_factory=lambda: {
        "block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048,
        "max_num_seqs": 128, "num_gpu_blocks": 512})
    omp_threads: PositiveInt | None = 1  # OMP_NUM_THREADS of the engines
    # CPUs every replay process is pinned to (os.sched_setaffinity; its threads inherit it);
    # None: not pinned. The replay's client (the loop that adds requests at their arrival
    # times) and the engine core share one thread, so they are always on the same CPU.
    cpus: list[NonNegativeInt] | None = None
    # Rounds of (stock replay, AccelGen replay). The cost model is fitted on round 0's stock
    # replay; every other round's replays are predicted out of sample.
    rounds: int = Field(3, ge=2)
    systems: list[str] = Field(default_factory=lambda: list(SYSTEMS))
    warmup_requests: int = 4

    @field_validator("systems")
    @classmethod
    def _systems(cls, v: list[str]) -> list[str]:
        unknown = [s for s in v if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown system(s) {', '.join(unknown)}; known: "
                             f"{', '.join(SYSTEMS)}")
        if "stock" not in v:
            raise ValueError("the cost model is fitted on the stock replay: `stock` is needed")
        return [s for s in SYSTEMS if s in v]


def make_trace(cfg: FidelityConfig) -> pd.DataFrame:
    """A small synthetic trace in the trace-file schema (``accelgen.workloads.trace``); offline
    requests get a JCT SLO of twice a nominal 0.5 s + 20 ms per output token."""
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace

    return mixed_slo_trace(
        cfg.num_requests, cfg.rate, cfg.seed, buckets=cfg.prompt_buckets,
        source_names=("short", "medium", "long", "other"),
        output_range=(cfg.output_range[0], cfg.output_range[1] + 1),
        online_share=cfg.online_fraction, ttft_range=cfg.ttft_slo_range,
        tbt_choices=cfg.tbt_slo_choices, offline_jct=lambda out: 2.0 * (0.5 + 0.02 * out),
        predicted_output_len=cfg.predicted_output_len)


def write_trace_file(cfg: FidelityConfig, path: Path) -> Path:
    from accelgen.workloads.trace import write_trace

    write_trace(make_trace(cfg), {"generator": "accelgen.fidelity.check_spec.make_trace",
                                  "config": cfg.model_dump(mode="json")}, path)
    return path


def engine_deployment(engine: dict[str, Any], kv_blocks: int,
                      calibration: CalibratedTerms) -> Deployment:
    """A deployment the simulator runs like the engine: its KV blocks, block size and context
    length (the KV budget is chosen to give exactly ``kv_blocks`` blocks), and the calibrated
    cost model of its steps."""
    from accelgen.costmodel.factory import kv_num_blocks

    model = resolve_model(SIM_MODEL)
    block = int(engine.get("block_size", 32))
    gb = kv_blocks * block * model.kv_bytes_per_token / GIB
    dep = Deployment(model=SIM_MODEL, hardware="cpu", kv_cache_gb=gb, block_size=block,
                     max_model_len=int(engine.get("max_model_len", 2048)),
                     cost_model="calibrated", calibration=calibration)
    if kv_num_blocks(dep) != kv_blocks:
        raise AssertionError(f"deployment has {kv_num_blocks(dep)} KV blocks, wanted {kv_blocks}")
    return dep


def sim_policy(system: str, engine: dict[str, Any]) -> PolicySpec:
    """The simulator's model of a replayed system."""
    if system == "stock":
        # vLLM's scheduler: its token budget is max_num_batched_tokens, not S_pf.
        return PolicySpec(name="vllm", params={
            "token_budget": int(engine.get("max_num_batched_tokens", 2048)),
            "max_num_seqs": int(engine.get("max_num_seqs", 256))})
    if system == "accelgen":
        return PolicySpec(name="accelgen")
    raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def accelgen_adapter(dep: Deployment) -> dict[str, Any]:
    """The AccelGen plugin's configuration: the policy, planning with ``dep``'s cost model (the
    calibrated one), as the simulated AccelGen does."""
    return {"policy": {"name": "accelgen"},
            "cost": {"kind": "deployment", "deployment": dep.model_dump(mode="json")}}
