"""Configuration of the vLLM scheduler plugin, and per-request SLOs from ``extra_args``.

vLLM constructs the scheduler itself (``Scheduler(vllm_config=..., ...)``), possibly in an engine
core child process, so the plugin cannot take constructor arguments. It reads, first found wins:

1. ``vllm_config.additional_config["accelgen"]`` (``LLM(additional_config=...)``,
   ``EngineArgs(additional_config=...)``, the OpenAI server's ``--additional-config
   '{"accelgen": ...}'``, which ``accelgen serve`` writes):
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

from accelgen.core.iteration import Pivot
from accelgen.core.policy import Policy
from accelgen.core.request import Request
from accelgen.core.specs import Deployment, PolicySpec, StrictModel, load_yaml
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.linear import LinearCostModel, OnlineLinearCostModel
from accelgen.policies.registry import make_policy

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
    policy: PolicySpec = Field(default_factory=lambda: PolicySpec(name="accelgen-closed"))
    slo: SLODefaults = Field(default_factory=SLODefaults)
    cost: CostSpec = Field(default_factory=CostSpec)
    # Pivot forward size S_pf and T_pf; None: found on the cost model (accelgen.costmodel.pivot).
    s_pf: PositiveInt | None = None
    t_pf: PositiveFloat | None = None
    pivot_tolerance: PositiveFloat = 0.03
    # Epoch seconds (time.time()) that the policy's clock calls 0; None: when the scheduler is
    # built. The replay runner sets it to its own start so trace and engine times agree.
    time_origin: float | None = None
    # Where a scheduler writes its per-request and per-step logs (Parquet, the simulator's
    # schema): needed when the engine core is a child process the caller cannot reach (a server).
    # Written atomically every `log_flush_interval_s` while requests are served, as soon as the
    # engine has none left in flight, and at shutdown (``logsink``).
    log_dir: Path | None = None
    log_flush_interval_s: PositiveFloat = 10.0
    # With log_dir: keep in memory the records the log has written (a replay builds its results
    # from them). False (a server): the scheduler forgets them once written, keeping counts, so
    # its memory follows the flush interval, not the run's length.
    keep_logged_records: bool = False
    # Seconds the engine keeps serving the requests it holds after SIGTERM; those still there
    # then end unfinished (``SHUTDOWN_REASON``), so the engine core stops, with its logs written,
    # within vLLM's --shutdown-timeout (after which vLLM kills it). None: ``shutdown_grace``.
    shutdown_grace_s: NonNegativeFloat | None = None


DEFAULT_SHUTDOWN_GRACE_S = 10.0
# Seconds the engine core needs after the grace period to end its last requests, write the logs
# and exit, before vLLM's --shutdown-timeout kills it.
SHUTDOWN_MARGIN_S = 5.0


def shutdown_grace(cfg: AdapterConfig, shutdown_timeout: float) -> float:
    """The grace period after SIGTERM (s): the configured one, else ``DEFAULT_SHUTDOWN_GRACE_S``
    shortened to leave ``SHUTDOWN_MARGIN_S`` of vLLM's ``shutdown_timeout``. (With a timeout of
    0 vLLM aborts every request at once itself.)"""
    if cfg.shutdown_grace_s is not None:
        return float(cfg.shutdown_grace_s)
    return max(0.0, min(DEFAULT_SHUTDOWN_GRACE_S, float(shutdown_timeout) - SHUTDOWN_MARGIN_S))


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


# vLLM's own default max_num_batched_tokens (its OpenAI server on CPU, and the replay's for stock
# vLLM and for a policy without a token budget of its own).
VLLM_DEFAULT_BATCHED_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class TokenLimit:
    """The engine's ``max_num_batched_tokens`` for a plugin configuration, and why."""

    tokens: int
    largest_budget: int | None  # the policy's own (None: it has none)
    user_set: bool

    def describe(self) -> str:
        if self.user_set:
            if self.largest_budget is not None and self.largest_budget > self.tokens:
                return (f"max_num_batched_tokens={self.tokens} (set by the user) caps the "
                        f"policy's token budget (its own largest: {self.largest_budget})")
            return f"max_num_batched_tokens={self.tokens} (set by the user)"
        if self.largest_budget is None:
            return (f"max_num_batched_tokens={self.tokens} (the policy has no token budget of "
                    "its own: vLLM's default 2048, at least max_model_len and max_num_seqs)")
        return (f"max_num_batched_tokens={self.tokens} (the policy's largest token budget"
                + (f", {self.largest_budget}, raised to max_num_seqs)"
                   if self.tokens > self.largest_budget else ")"))


def policy_largest_budget(cfg: AdapterConfig, *, block_size: int, max_model_len: int
                          ) -> int | None:
    """The most tokens the configured policy schedules in one iteration with no engine limit
    (``Policy.largest_budget`` at the pivot the plugin will compute), before the engine starts."""
    cost = build_cost_model(cfg.cost)
    pivot = build_pivot(cfg, cost, block_size=block_size, max_model_len=max_model_len)
    return make_engine_policy(cfg.policy).largest_budget(pivot)


def choose_token_limit(cfg: AdapterConfig | None, user: int | None, *, block_size: int,
                       max_model_len: int, max_num_seqs: int) -> TokenLimit:
    """``max_num_batched_tokens`` for an engine running ``cfg``'s policy (None: stock vLLM):
    ``user``'s where set (the policy then plans within it), else the policy's largest token
    budget (at least ``max_num_seqs``, which vLLM requires), else vLLM's default (for the plugin
    at least ``max_model_len``, so that a policy scheduling whole prompts is never cut)."""
    largest = (policy_largest_budget(cfg, block_size=block_size, max_model_len=max_model_len)
               if cfg is not None else None)
    if user is not None:
        return TokenLimit(user, largest, True)
    if cfg is None:
        return TokenLimit(max(VLLM_DEFAULT_BATCHED_TOKENS, max_num_seqs), None, False)
    if largest is None:
        return TokenLimit(max(VLLM_DEFAULT_BATCHED_TOKENS, max_model_len, max_num_seqs), None,
                          False)
    return TokenLimit(max(largest, max_num_seqs), largest, False)


# --------------------------------------------------------------------------------------------
# per-request SLOs
#
# One rule for every way a request's SLOs arrive: ``SamplingParams.extra_args`` read by the
# scheduler inside the engine, and ``vllm_xargs`` / the ``X-AccelGen-SLO`` header read by the
# HTTP middleware (``slo_http``) before the request reaches the engine.

def make_engine_policy(spec: PolicySpec) -> Policy:
    """The policy object a real engine runs, from the one registry; clairvoyant policies are
    refused (a real engine cannot tell them true output lengths or future arrivals)."""
    policy = make_policy(spec.name, spec.params)
    if policy.clairvoyant:
        raise ValueError(f"policy {spec.name!r} needs clairvoyant information (true output "
                         "lengths, future arrivals) that a real engine cannot give")
    return policy


SLO_KEYS = ("ttft_slo", "tbt_slo", "jct_slo")
# Keys of extra_args the plugin reads; anything else is vLLM's or the client's.
REQUEST_KEYS = (*SLO_KEYS, "online", "predicted_output_len", "source", "req_id")
# Largest finite SLO (s): about 11.6 days. A larger finite value is a client bug (a unit slip,
# an overflow) that would silently act as "no deadline"; `inf` (or leaving the key out of a
# request whose default is inf) says that on purpose.
MAX_SLO_S = 1e6
MAX_PREDICTED_OUTPUT_LEN = 10_000_000
# Client-given req_ids are < AUTO_REQ_ID_BASE; the plugin numbers requests without one from it
# upward, so an id a client picks never collides with one the plugin picked.
AUTO_REQ_ID_BASE = 1 << 40
MAX_SOURCE_LEN = 200


class SLOError(ValueError):
    """A request's ``extra_args`` carry an SLO (or related field) that cannot be used.

    ``problems`` lists ``(field, message)`` for every bad field; ``str()`` joins the messages.
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))

    @property
    def fields(self) -> list[str]:
        return [name for name, _ in self.problems]


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


def _is_int(v: Any) -> bool:
    # bool is an int subclass, but `ttft_slo=True` is a client bug, not one second.
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


def _slo_problem(key: str, v: Any) -> str | None:
    if not _is_number(v):
        return f"{key}={v!r} is not a number (seconds)"
    if math.isnan(v) or v <= 0:
        return f"{key}={v!r} must be > 0 seconds"
    if v > MAX_SLO_S and not math.isinf(v):
        return (f"{key}={v!r} is larger than {MAX_SLO_S:g} s (use inf, or leave it out, for no "
                "deadline)")
    return None


def parse_request_slo(extra: Mapping[str, Any] | None, defaults: SLODefaults) -> RequestSLO:
    """SLOs and bookkeeping fields of one request; raises ``SLOError`` naming every bad field.

    Recognised keys: ``ttft_slo``, ``tbt_slo``, ``jct_slo`` (seconds, 0 < v <= ``MAX_SLO_S`` or
    ``inf`` for none; missing or None: the default), ``online`` (bool; 0 and 1 too, because
    vLLM's OpenAI server turns JSON booleans in ``vllm_xargs`` into integers),
    ``predicted_output_len`` (int in [1, ``MAX_PREDICTED_OUTPUT_LEN``]), ``source`` (str of at most
    ``MAX_SOURCE_LEN`` characters), ``req_id`` (int in [0, ``AUTO_REQ_ID_BASE``)). Any other key
    ending in ``_slo`` is refused as a misspelt SLO; other keys are vLLM's or the client's and are
    ignored.
    """
    extra = extra or {}
    problems: list[tuple[str, str]] = []
    for key in extra:
        if isinstance(key, str) and key.endswith("_slo") and key not in SLO_KEYS:
            problems.append((key, f"{key} is not an SLO the plugin knows (known: "
                                  f"{', '.join(SLO_KEYS)})"))
    online = extra.get("online", defaults.online)
    if _is_int(online) and online in (0, 1):
        online = bool(online)
    if not isinstance(online, bool):
        problems.append(("online", f"online={online!r} is not a boolean"))
    slo: dict[str, float] = {}
    for key in SLO_KEYS:
        if key not in extra or extra[key] is None:
            # An offline request has no per-token deadlines unless it asks for them.
            offline_token_slo = online is False and key != "jct_slo"
            slo[key] = math.inf if offline_token_slo else float(getattr(defaults, key))
        elif (why := _slo_problem(key, extra[key])) is not None:
            problems.append((key, why))
        else:
            slo[key] = float(extra[key])
    pred = extra.get("predicted_output_len", defaults.predicted_output_len)
    if not (_is_int(pred) and 1 <= pred <= MAX_PREDICTED_OUTPUT_LEN):
        problems.append(("predicted_output_len", f"predicted_output_len={pred!r} is not an "
                                                 f"integer in [1, {MAX_PREDICTED_OUTPUT_LEN}]"))
    source = extra.get("source", "unknown")
    if not (isinstance(source, str) and len(source) <= MAX_SOURCE_LEN):
        shown = f"{source[:40]!r}... ({len(source)} characters)" if isinstance(source, str) \
            else repr(source)
        problems.append(("source", f"source={shown} is not a string of at most "
                                   f"{MAX_SOURCE_LEN} characters"))
    req_id = extra.get("req_id")
    if req_id is not None and not (_is_int(req_id) and 0 <= req_id < AUTO_REQ_ID_BASE):
        problems.append(("req_id", f"req_id={req_id!r} is not an integer in [0, 2**40)"))
    if problems:
        raise SLOError(problems)
    return RequestSLO(ttft_slo=slo["ttft_slo"], tbt_slo=slo["tbt_slo"], jct_slo=slo["jct_slo"],
                      online=bool(online), predicted_output_len=int(pred), source=str(source),
                      req_id=req_id)
