"""Each system of the sweep inside vLLM (a replay configuration) and in the simulator (a policy),
the token budgets they run with, and the SLO scale of the engine.

**Tuned budget** (SPEC 12, Sarathi-Serve's rule): the largest token budget whose predicted
iteration - a fresh prefill chunk of that many tokens beside the expected decode batch - meets
the tightest TBT class. The expected decode batch is Little's law at the capacity estimate:
rate x mean decode steps per request x the iteration time, which under this budget is the tight
TBT SLO itself; its sequences read the mean prompt plus half the mean output each.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import Deployment, PolicySpec
from accelgen.costmodel.base import CostModel
from accelgen.engine_regime.sweep_spec import EngineSweepConfig, SystemSpec

PAPER_TBT_BASE_S = 0.1875  # the paper's reading-speed TBT (SPEC 6)
PAPER_DEPLOYMENT = "opt-13b"  # the paper's engine the TBT classes were set for (one A100)


def paper_tbt_ratio() -> float:
    """0.1875 s over the pivot iteration T_pf of OPT-13B on one A100 (the analytic model): the
    paper's TBT base in units of its engine's pivot iteration (about 2.7)."""
    from accelgen.costmodel.factory import deployment_pivot, resolve_deployment

    return PAPER_TBT_BASE_S / deployment_pivot(resolve_deployment(PAPER_DEPLOYMENT)).t_pf


def tbt_base(cfg: EngineSweepConfig, t_pf: float) -> float:
    """The TBT base of the sweep's SLOs: ``cfg.tbt_base``, or for ``auto`` the engine's T_pf in
    the paper's proportion (``paper_tbt_ratio``)."""
    return float(cfg.tbt_base) if cfg.tbt_base != "auto" else t_pf * paper_tbt_ratio()


def decode_batch(rate: float, mean_output: float, iteration_s: float) -> int:
    """Little's law: requests decoding at once when ``rate`` requests/s each take
    ``mean_output - 1`` decode iterations of ``iteration_s`` (at least 1)."""
    return max(1, math.ceil(rate * max(mean_output - 1.0, 0.0) * iteration_s))


def tuned_token_budget(cost: CostModel, tbt_slo: float, num_decodes: int, decode_context: int,
                       block_size: int, max_budget: int) -> int:
    """The largest multiple of ``block_size`` up to ``max_budget`` whose iteration (one fresh
    prefill chunk of that many tokens plus ``num_decodes`` decodes of ``decode_context`` tokens
    each) ``cost`` predicts within ``tbt_slo``; ``block_size`` when none does (the smallest
    budget that still makes progress)."""
    best = block_size
    for b in range(block_size, max_budget + 1, block_size):
        shape = BatchShape()
        shape.add_prefill(b, 0)
        for _ in range(num_decodes):
            shape.add_decode(decode_context)
        if cost.iteration_time(shape) <= tbt_slo:
            best = b
        else:
            break  # iteration time grows with the chunk
    return best


@dataclass(frozen=True, slots=True)
class TunedBudget:
    """The tuned budget and what it was computed from (written into the plan)."""

    token_budget: int
    tbt_slo_s: float  # the tightest TBT class
    rate: float  # the capacity estimate it was tuned at
    num_decodes: int
    decode_context: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tune(cost: CostModel, tight_tbt: float, rate: float, mean_prompt: float, mean_output: float,
         block_size: int, max_budget: int) -> TunedBudget:
    """``tuned_token_budget`` at ``rate`` for the workload's mean lengths (module docstring)."""
    n = decode_batch(rate, mean_output, tight_tbt)
    ctx = round(mean_prompt + mean_output / 2)
    b = tuned_token_budget(cost, tight_tbt, n, ctx, block_size, max_budget)
    return TunedBudget(b, tight_tbt, rate, n, ctx)


def budget_of(spec: SystemSpec, s_pf: int, tuned: int) -> int | None:
    """The token budget a system runs with (None: the hosted policy's own rule)."""
    if spec.budget is None:
        return None
    if spec.budget == "paper":
        return s_pf
    if spec.budget == "tuned":
        return tuned
    return int(spec.budget)


def sim_policy(spec: SystemSpec, budget: int | None, max_num_seqs: int) -> PolicySpec:
    """The simulator's model of a system: vLLM's policy at the stock engine's budget, or the
    policy the plugin hosts with the same parameters."""
    if spec.runs == "stock":
        return PolicySpec(name="vllm", params={"token_budget": budget,
                                               "max_num_seqs": max_num_seqs})
    params = dict(spec.params)
    if budget is not None:
        params["token_budget"] = budget
    return PolicySpec(name=spec.policy, params=params)


def replay_config(cfg: EngineSweepConfig, spec: SystemSpec, budget: int | None,
                  dep: Deployment, tiny_dir: str) -> dict[str, Any]:
    """The ``ReplayConfig`` of a system's replays: stock vLLM with ``max_num_batched_tokens`` =
    its budget, or the plugin (its budget left to the policy, at most max_model_len) planning
    with the calibrated deployment ``dep``, as the simulator's policy does."""
    engine = cfg.engine_spec()
    engine["tiny_dir"] = tiny_dir
    max_len = int(engine.get("max_model_len", 2048))
    engine["max_num_batched_tokens"] = budget if spec.runs == "stock" else max_len
    engine["async_scheduling"] = cfg.async_scheduling
    adapter: dict[str, Any] = {"cost": {"kind": "deployment",
                                        "deployment": dep.model_dump(mode="json")}}
    if spec.runs == "plugin":
        adapter["policy"] = sim_policy(spec, budget, 0).model_dump(mode="json")
    return {"system": "stock" if spec.runs == "stock" else "accelgen", "adapter": adapter,
            "engine": engine, "warmup_requests": cfg.warmup_requests,
            "max_wall_s": cfg.max_wall_s}
