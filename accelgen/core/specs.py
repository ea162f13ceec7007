"""Pydantic configuration models shared by the CLI, the simulator and the pipeline.

Workload and SLO settings live in ``accelgen.workloads.workload_spec``; policy parameters live beside each
policy (``accelgen.policies.*``). This module holds the model/hardware/deployment description and
the top-level experiment settings of one simulated run.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_serializer,
    model_validator,
)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ModelProfile(StrictModel):
    """Transformer shape; enough for FLOPs, weight bytes and KV bytes per token."""

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    ffn_size: PositiveInt
    gated_ffn: bool = False  # SwiGLU (Llama) has three FFN matrices, ReLU/GELU (OPT) two
    vocab_size: PositiveInt = 50272
    dtype_bytes: PositiveInt = 2
    max_model_len: PositiveInt = 2048
    # The LM head shares the input embedding's weights (OPT: yes; Llama-2/3: no). Only the
    # weight bytes of `kv_cache_gb: auto` depend on it.
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def params_per_layer(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * h * 2 + h * kv * 2  # q, o and k, v projections
        ffn = (3 if self.gated_ffn else 2) * h * self.ffn_size
        return attn + ffn

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.vocab_size * self.hidden_size


class HardwareProfile(StrictModel):
    """One accelerator's datasheet numbers (dense fp16) and its links."""

    name: str
    peak_flops: PositiveFloat  # FLOP/s, dense fp16/bf16 tensor core
    mem_bandwidth: PositiveFloat  # bytes/s of device memory
    mem_bytes: PositiveFloat
    host_link_bandwidth: PositiveFloat  # bytes/s device<->host (swap), e.g. PCIe 4 x16
    interconnect_bandwidth: PositiveFloat  # bytes/s between GPUs (NVLink) for TP/PP traffic


Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class CalibratedTerms(StrictModel):
    """The free terms of the calibrated cost model (``accelgen.costmodel.calibrated``), in
    seconds, for the whole model on one GPU; ``accelgen calibrate`` fits them to measured
    iteration latencies. A deployment's TP degree divides the work terms, and its layout scales
    the communication term (see the model's docstring)."""

    overhead_s: Seconds = 0.0  # per iteration (engine CPU work, launches, sampling)
    weights_s: Seconds = 0.0  # weight streaming: the floor of the linear layers
    # How sharply that floor turns into compute (the roofline's exponent; no floor: unused).
    transition_p: float = Field(default=2.0, ge=1.0, le=16.0, allow_inf_nan=False)
    prefill_token_s: Seconds = 0.0  # per prefill token (linear layers)
    prefill_seq_s: Seconds = 0.0  # per prefill chunk (the engine's work per new sequence)
    decode_token_s: Seconds = 0.0  # per decode sequence (linear layers, its sampling)
    causal_pair_s: Seconds = 0.0  # per query-key pair inside the new prefill chunks
    context_pair_s: Seconds = 0.0  # per query-key pair against a chunk's prior context
    context_token_s: Seconds = 0.0  # per context token a decode reads (KV)
    comm_token_s: Seconds = 0.0  # per token per activation transfer (TP/PP)
    source: str = ""  # what the terms were fitted on


class AllReduceFit(StrictModel):
    """Fitted time of one all-reduce over ``ranks`` GPUs of one node (``accelgen.costmodel.
    collectives``): max(latency_s, startup_s + ring bytes / bus bandwidth(S)) for a message of S
    bytes, ring bytes = 2 (ranks - 1) / ranks x S, the bus bandwidth growing as
    (S / ref_bytes)^(1 - exponent) up to ``bus_bandwidth`` at ``ref_bytes`` and constant beyond."""

    ranks: int = Field(ge=2)
    latency_s: Seconds  # floor: the time of a small message
    startup_s: Seconds  # offset of the bandwidth-bound regime
    bus_bandwidth: PositiveFloat  # bytes/s at ref_bytes (nccl-tests' "busbw")
    exponent: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    ref_bytes: PositiveFloat  # the largest fitted message; the bandwidth is held beyond it


class SendRecvFit(StrictModel):
    """Fitted time of one point-to-point transfer (a pipeline hop) of S bytes:
    startup_s + S / bus_bandwidth."""

    startup_s: Seconds
    bus_bandwidth: PositiveFloat  # bytes/s


class CollectiveTerms(StrictModel):
    """The analytic model's communication terms for one kind of node: an all-reduce fit per
    measured TP degree (a degree not listed uses the nearest one's, with its own ring factor)
    and a send/recv fit for pipeline hops. ``accelgen calibrate --collectives`` fits them to
    ``nccl-tests`` output; the package carries fits for A100 and H100 nodes."""

    all_reduce: list[AllReduceFit] = Field(min_length=1)
    send_recv: SendRecvFit
    source: str = ""  # what the terms were fitted on

    @model_validator(mode="after")
    def _one_fit_per_degree(self) -> CollectiveTerms:
        ranks = [f.ranks for f in self.all_reduce]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"all_reduce: one fit per rank count, got ranks {ranks}")
        return self


class Deployment(StrictModel):
    """A model served on a number of GPUs with a KV-cache budget."""

    model: str = "opt-13b"
    hardware: str = "a100"
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    # GiB of KV cache per GPU (paper: 12 GB on OPT-13B), or "auto": what vLLM's
    # gpu_memory_utilization 0.9 leaves after weights and an activation reserve
    # (accelgen.costmodel.datasheets.auto_kv; docs/costmodel.md).
    kv_cache_gb: PositiveFloat | Literal["auto"] = 12.0
    block_size: PositiveInt = 32
    max_model_len: PositiveInt | None = None  # default: the model profile's
    cost_model: Literal["analytic", "profile", "calibrated"] = "analytic"
    profile_csv: Path | None = None  # for cost_model == "profile"
    calibration: CalibratedTerms | None = None  # for cost_model == "calibrated"
    # TP/PP communication of the analytic model; default: the package's fit for the hardware
    # (accelgen.costmodel.collectives).
    collectives: CollectiveTerms | None = None
    pivot_tolerance: PositiveFloat = 0.03

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    @model_validator(mode="after")
    def _profile_needs_csv(self) -> Deployment:
        if self.cost_model == "profile" and self.profile_csv is None:
            raise ValueError("cost_model 'profile' needs profile_csv")
        if self.cost_model == "calibrated" and self.calibration is None:
            raise ValueError("cost_model 'calibrated' needs calibration (the terms `accelgen "
                             "calibrate` writes)")
        if self.collectives is not None and self.cost_model != "analytic":
            raise ValueError(f"collectives: used by cost_model 'analytic' only, not "
                             f"{self.cost_model!r}")
        return self


class NoiseSpec(StrictModel):
    """The engine's deviation from the cost model, in the simulator (SPEC 13): every iteration
    is charged ``predicted x run factor x step error``. The run factor is drawn once per run,
    ``exp(N(run_mu, run_sigma))``; the step error once per iteration: ``lognormal``:
    ``exp(N(step_mu, step_sigma))``; ``empirical``: from the measured errors' quantiles
    (``step_quantiles`` at evenly spaced probabilities 0..1, linear between them). Each step
    error is read off a standard normal score; ``phase_share`` of that score's variance is a
    host phase that carries over from step to step (an AR(1) process, ``phase_persistence``
    its correlation between consecutive iterations), the rest is drawn anew each step:
    ``phase_share`` 0 (the default) draws every step independently. Either way the step
    errors' distribution is the one given; the phase only decides whether slow steps come
    alone or in runs, as a real host's do. A share ``stall_prob`` of the steps (the slowest
    scores) are stalls instead: the step takes its predicted time x run factor plus a stall of
    ``stall_quantiles`` seconds (at evenly spaced probabilities), added rather than multiplied,
    since a host's stall (the client or another process holding the core) does not grow with
    the batch; the other steps draw the step error from the rest of the scores.
    Seeded (``seed``, default the run's seed): the same draws for the same run. ``none``: the
    deterministic simulator, exactly as without this section. The policy never sees the noise:
    it plans with the cost model. ``accelgen fit-noise`` fits it to real replays
    (``accelgen.costmodel.noise``; docs/simulator.md)."""

    kind: Literal["none", "lognormal", "empirical"] = "none"
    step_mu: float = Field(0.0, allow_inf_nan=False)
    step_sigma: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    step_quantiles: list[PositiveFloat] | None = None
    run_mu: float = Field(0.0, allow_inf_nan=False)
    run_sigma: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    phase_share: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    phase_persistence: float = Field(0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    stall_prob: float = Field(0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    stall_quantiles: list[NonNegativeFloat] | None = None  # seconds added to a stalled step
    seed: int | None = None
    source: str = ""  # what it was fitted on

    @model_validator(mode="after")
    def _complete(self) -> NoiseSpec:
        q = self.step_quantiles
        if self.kind == "empirical" and (q is None or len(q) < 2):
            raise ValueError("kind 'empirical' needs step_quantiles (at least 2 values)")
        if q is not None and any(b < a for a, b in itertools.pairwise(q)):
            raise ValueError("step_quantiles: must not decrease")
        sq = self.stall_quantiles
        if self.stall_prob > 0 and (sq is None or len(sq) < 2):
            raise ValueError("stall_prob > 0 needs stall_quantiles (at least 2 values)")
        if sq is not None and any(b < a for a, b in itertools.pairwise(sq)):
            raise ValueError("stall_quantiles: must not decrease")
        return self

    @property
    def on(self) -> bool:
        return self.kind != "none"


class SimOptions(StrictModel):
    """How the simulator runs (not what it simulates)."""

    add_scheduler_overhead: bool = False  # add measured decision wall time to simulated time
    max_iterations: PositiveInt | None = None
    # Stop at this simulated time (s): no iteration starts at or after it; requests not done by
    # then end ``unfinished`` (with the reason) and the summary states the window. Off: None.
    horizon_s: PositiveFloat | None = None
    progress: bool = True
    swap_space_gb: float = Field(64.0, ge=0.0)  # host memory for swapped KV (FastServe)
    # Host transfers run on copy streams beside the iteration's compute, as FastServe's proactive
    # swapping does (its paper, section 5): an iteration takes max(compute, transfer).
    swap_overlap: bool = True
    # The engine's noise around the cost model (NoiseSpec); kind none: deterministic.
    noise: NoiseSpec = Field(default_factory=NoiseSpec)

    @model_serializer(mode="wrap")
    def _without_none_noise(self, handler: Any) -> Any:
        # Without noise the dump is the one of a build without the field (config.json, the
        # pipeline's deployment files): a run without noise is described as before.
        data = handler(self)
        if isinstance(data, dict) and not self.noise.on:
            data.pop("noise", None)
        return data


class PolicySpec(StrictModel):
    name: str = "vllm"
    params: dict[str, Any] = Field(default_factory=dict)


class ExperimentConfig(StrictModel):
    """One simulated (or replayed) run: a deployment, a policy and simulator options."""

    deployment: Deployment = Field(default_factory=Deployment)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    sim: SimOptions = Field(default_factory=SimOptions)
    seed: int = 0


def kv_cache_gb_arg(text: str) -> float | str:
    """argparse type of ``--kv-cache-gb``: a number of GiB or ``auto``."""
    import argparse

    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB or 'auto', "
                                         f"got {text!r}")
    return value


def load_yaml(path: Path | str) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``["gamma=0.5", "era_scope=request"]`` -> ``{"gamma": 0.5, "era_scope": "request"}``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param expects KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out
