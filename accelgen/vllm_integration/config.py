"""Configuration of the vLLM scheduler plugin, and per-request SLOs from ``extra_args``.

vLLM constructs the scheduler itself (``Scheduler(vllm_config=..., ...)``), possibly in an engine
core child process, so the plugin cannot take constructor arguments. It reads, first found wins:

1. ``vllm_config.additional_config["accelgen"]`` (``LLM(additional_config=...)``,
   ``EngineArgs(additional_config=...)``, ``vllm serve --additional-config '{"accelgen": ...}'``):
   travels with the config into any process;
2. the environment variable ``ACCELGEN_VLLM_CONFIG``: JSON text, or the path of a JSON/YAML file
   (inherited by child processes);
3. the defaults below.

The value is an ``AdapterConfig`` mapping, e.g.
``{"policy": {"name": "accelgen", "params": {}}, "slo": {"ttft_slo": 1.0}, "s_pf": 256}``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError

from accelgen.config import Deployment, PolicySpec, StrictModel, load_yaml
from accelgen.costmodel.base import BatchShape, CostModel
from accelgen.policies.base import Pivot
from accelgen.request import Request

ENV_VAR = "ACCELGEN_VLLM_CONFIG"
ADDITIONAL_CONFIG_KEY = "accelgen"


class SLODefaults(StrictModel):
    """SLOs given to a request whose ``extra_args`` do not carry its own."""

    ttft_slo: PositiveFloat = 1.0
    tbt_slo: PositiveFloat = 0.1875  # the paper's reading-speed TBT
    jct_slo: PositiveFloat = math.inf
    online: bool = True
    predicted_output_len: PositiveInt = 256


class CostSpec(StrictModel):
    """The policy's iteration-latency model (it predicts; vLLM measures).

    ``linear``: T = base_s + per_token_s x S_f + per_ctx_s x decode context tokens (a quick fit of
    the engine's own step times, the default for the tiny CPU model); ``online``: the same line,
    started from those coefficients and refitted every ``refit_every`` steps to the engine's
    measured step times (a shared CPU's speed drifts with the load); ``profile``: a measured
    profile CSV (``accelgen.costmodel.table``); ``deployment``: the analytic or profiled model of
    a named deployment, as the simulator builds it.
    """

    kind: Literal["linear", "online", "profile", "deployment"] = "linear"
    base_s: NonNegativeFloat = 0.004
    per_token_s: NonNegativeFloat = 2e-5
    per_ctx_s: NonNegativeFloat = 0.0
    profile_csv: Path | None = None
    deployment: Deployment | None = None
    # online: the linear model refitted to the engine's own measured step times.
    window: PositiveInt = 256  # most recent steps in the fit
    refit_every: PositiveInt = 32  # steps between refits


class AdapterConfig(StrictModel):
    policy: PolicySpec = Field(default_factory=lambda: PolicySpec(name="accelgen"))
    slo: SLODefaults = Field(default_factory=SLODefaults)
    cost: CostSpec = Field(default_factory=CostSpec)
    # Pivot forward size S_pf and T_pf; None: found on the cost model (accelgen.costmodel.pivot).
    s_pf: PositiveInt | None = None
    t_pf: PositiveFloat | None = None
    pivot_tolerance: PositiveFloat = 0.03
    # Epoch seconds (time.time()) that the policy's clock calls 0; None: when the scheduler is
    # built. The replay runner sets it to its own start so trace and engine times agree.
    time_origin: float | None = None
    # Where a scheduler writes its per-step and per-request logs at shutdown (Parquet, same schema
    # as the simulator); needed when the engine core is a child process the caller cannot reach.
    log_dir: Path | None = None


def resolve_config(additional_config: Any = None) -> AdapterConfig:
    """The plugin configuration from vLLM's ``additional_config``, the environment, or defaults."""
    raw: Any = None
    source = "defaults"
    if isinstance(additional_config, Mapping) and ADDITIONAL_CONFIG_KEY in additional_config:
        raw, source = additional_config[ADDITIONAL_CONFIG_KEY], "additional_config['accelgen']"
    elif os.environ.get(ENV_VAR):
        raw, source = _from_env(os.environ[ENV_VAR]), f"${ENV_VAR}"
    if raw is None:
        return AdapterConfig()
    if isinstance(raw, AdapterConfig):
        return raw
    if isinstance(raw, str):
        raw = _from_env(raw)
    if not isinstance(raw, Mapping):
        raise ValueError(f"accelgen vLLM plugin config from {source} must be a mapping, "
                         f"got {type(raw).__name__}")
    try:
        return AdapterConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ValueError(f"bad accelgen vLLM plugin config from {source}: {exc}") from None


def _from_env(text: str) -> Any:
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"${ENV_VAR} is not valid JSON: {exc}") from None
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"${ENV_VAR} names {path}, which does not exist (give JSON text "
                                "starting with '{' or the path of a JSON/YAML file)")
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return load_yaml(path)


# --------------------------------------------------------------------------------------------
# cost model and pivot


class LinearCostModel(CostModel):
    """T = base + per_token x S_f + per_ctx x decode context: a fit of a small engine's steps."""

    name = "linear"

    def __init__(self, base_s: float, per_token_s: float, per_ctx_s: float = 0.0) -> None:
        self.base_s, self.per_token_s, self.per_ctx_s = base_s, per_token_s, per_ctx_s

    def iteration_time(self, shape: BatchShape) -> float:
        n = shape.prefill_tokens + shape.decode_seqs
        if n <= 0:
            return 0.0
        return self.base_s + self.per_token_s * n + self.per_ctx_s * shape.decode_ctx

    def linear_coefficients(self) -> tuple[float, float, float] | None:
        # Subclasses that change iteration_time must not inherit this.
        if type(self).iteration_time is not LinearCostModel.iteration_time:
            return None
        return self.base_s, self.per_token_s, self.per_ctx_s


class OnlineLinearCostModel(LinearCostModel):
    """``LinearCostModel`` refitted to measured (forward size, step time) pairs.

    Policies memoise latencies per cost model and pivot, so a refit happens only every
    ``refit_every`` observations and the scheduler then hands the policy a new ``Pivot`` (see
    ``AccelGenScheduler``), which makes such caches rebuild.
    """

    name = "online-linear"

    def __init__(self, base_s: float, per_token_s: float, *, window: int = 256,
                 refit_every: int = 32) -> None:
        super().__init__(base_s, per_token_s)
        self._x: list[float] = []
        self._y: list[float] = []
        self.window, self.refit_every = window, refit_every
        self._since = 0
        self.refits = 0

    def observe(self, forward_size: int, seconds: float) -> bool:
        """Record one measured step; returns True when the coefficients changed."""
        if forward_size <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return False
        self._x.append(float(forward_size))
        self._y.append(seconds)
        if len(self._x) > self.window:
            del self._x[0], self._y[0]
        self._since += 1
        if self._since < self.refit_every:
            return False
        self._since = 0
        n = len(self._x)
        mx, my = sum(self._x) / n, sum(self._y) / n
        sxx = sum((x - mx) ** 2 for x in self._x)
        slope = (sum((x - mx) * (y - my) for x, y in zip(self._x, self._y, strict=True)) / sxx
                 if sxx > 0 else 0.0)
        # A line through noisy steps can tilt negative; latency never falls with more tokens.
        slope = max(slope, 0.0)
        self.base_s = max(my - slope * mx, 1e-6)
        self.per_token_s = slope
        self.refits += 1
        return True


def build_cost_model(spec: CostSpec) -> CostModel:
    if spec.kind == "linear":
        return LinearCostModel(spec.base_s, spec.per_token_s, spec.per_ctx_s)
    if spec.kind == "online":
        return OnlineLinearCostModel(spec.base_s, spec.per_token_s, window=spec.window,
                                     refit_every=spec.refit_every)
    if spec.kind == "profile":
        if spec.profile_csv is None:
            raise ValueError("cost kind 'profile' needs profile_csv")
        from accelgen.costmodel.table import ProfileCostModel

        return ProfileCostModel.from_csv(spec.profile_csv)
    if spec.deployment is None:
        raise ValueError("cost kind 'deployment' needs a deployment")
    from accelgen.costmodel.factory import make_cost_model

    return make_cost_model(spec.deployment)


def build_pivot(cfg: AdapterConfig, cost: CostModel, *, block_size: int,
                max_model_len: int) -> Pivot:
    if cfg.s_pf is not None:
        t_pf = cfg.t_pf if cfg.t_pf is not None else cost.forward_time(cfg.s_pf)
        return Pivot(s_pf=cfg.s_pf, t_pf=t_pf)
    from accelgen.costmodel.pivot import find_pivot

    max_size = max(block_size, min(8192, max_model_len) // block_size * block_size)
    p = find_pivot(cost, tolerance=cfg.pivot_tolerance, step=block_size, max_size=max_size)
    return Pivot(s_pf=p.s_pf, t_pf=cfg.t_pf if cfg.t_pf is not None else p.t_pf)


# --------------------------------------------------------------------------------------------
# per-request SLOs

SLO_KEYS = ("ttft_slo", "tbt_slo", "jct_slo")


class SLOError(ValueError):
    """A request's ``extra_args`` carry an SLO (or related field) that cannot be used."""


@dataclass(frozen=True, slots=True)
class RequestSLO:
    ttft_slo: float
    tbt_slo: float
    jct_slo: float
    online: bool
    predicted_output_len: int
    source: str
    req_id: int | None  # the trace's id when the client passes one


def request_extra_args(req: Request) -> dict[str, Any]:
    """The ``SamplingParams.extra_args`` that carry ``req``'s SLOs and bookkeeping fields to the
    plugin (what ``parse_request_slo`` reads back)."""
    return {"req_id": req.req_id, "ttft_slo": req.ttft_slo, "tbt_slo": req.tbt_slo,
            "jct_slo": req.jct_slo, "online": req.online, "source": req.source,
            "predicted_output_len": req.predicted_output_len}


def _is_number(v: Any) -> bool:
    # bool is an int subclass, but `ttft_slo=True` is a client bug, not one second.
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_request_slo(extra: Mapping[str, Any] | None, defaults: SLODefaults) -> RequestSLO:
    """SLOs and bookkeeping fields of one request; raises ``SLOError`` naming every bad field.

    Recognised keys: ``ttft_slo``, ``tbt_slo``, ``jct_slo`` (seconds, > 0; ``inf`` = none),
    ``online`` (bool), ``predicted_output_len`` (int >= 1), ``source`` (str), ``req_id``
    (int >= 0). Other keys are vLLM's or the client's and are ignored.
    """
    extra = extra or {}
    problems: list[str] = []
    online = extra.get("online", defaults.online)
    if not isinstance(online, bool):
        problems.append(f"online={online!r} is not a boolean")
    slo: dict[str, float] = {}
    for key in SLO_KEYS:
        if key not in extra or extra[key] is None:
            # An offline request has no per-token deadlines unless it asks for them.
            offline_token_slo = online is False and key != "jct_slo"
            slo[key] = math.inf if offline_token_slo else float(getattr(defaults, key))
            continue
        v = extra[key]
        if not _is_number(v):
            problems.append(f"{key}={v!r} is not a number (seconds)")
        elif math.isnan(v) or v <= 0:
            problems.append(f"{key}={v!r} must be > 0 seconds")
        else:
            slo[key] = float(v)
    pred = extra.get("predicted_output_len", defaults.predicted_output_len)
    if not (isinstance(pred, int) and not isinstance(pred, bool) and pred >= 1):
        problems.append(f"predicted_output_len={pred!r} is not an integer >= 1")
    source = extra.get("source", "unknown")
    if not isinstance(source, str):
        problems.append(f"source={source!r} is not a string")
    req_id = extra.get("req_id")
    if req_id is not None and not (isinstance(req_id, int) and not isinstance(req_id, bool)
                                   and req_id >= 0):
        problems.append(f"req_id={req_id!r} is not an integer >= 0")
    if problems:
        raise SLOError("; ".join(problems))
    return RequestSLO(ttft_slo=slo["ttft_slo"], tbt_slo=slo["tbt_slo"], jct_slo=slo["jct_slo"],
                      online=bool(online), predicted_output_len=int(pred), source=str(source),
                      req_id=req_id)
