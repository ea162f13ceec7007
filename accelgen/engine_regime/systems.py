"""Each system of the sweep inside vLLM (a replay configuration) and in the simulator (a policy),
the token budgets they run with, and the SLO scale of the engine.

**Tuned budget** (SPEC 12): Sarathi-Serve's rule as the pipeline's ``budget: tuned`` systems
resolve it (``accelgen.costmodel.budget``): the largest multiple of the block size whose
predicted iteration - a chunk of that many prompt tokens beside the decode batch near the knee -
meets the tightest TBT class, on the engine's calibrated cost model; the decode batch is Little's
law at the capacity estimate with iterations of that class (``knee_decodes``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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


@dataclass(frozen=True, slots=True)
class TunedBudget:
    """The tuned budget and what it was computed from (written into the plan)."""

    token_budget: int
    tbt_slo_s: float  # the tightest TBT class
    rate: float  # the capacity estimate it was tuned at
    num_decodes: int
    decode_context: float
    predicted_s: float  # the predicted iteration at token_budget
    meets: bool  # False: not even one block meets the class (then one block)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tune(cost: CostModel, tight_tbt: float, rate: float, prompt_len: np.ndarray,
         output_len: np.ndarray, block_size: int, max_budget: int,
         max_num_seqs: int) -> TunedBudget:
    """Sarathi-Serve's budget (``accelgen.costmodel.budget.tuned_token_budget``, the rule of
    the pipeline's tuned systems) for the sweep's requests at ``rate``."""
    from accelgen.costmodel.budget import knee_decodes, tuned_token_budget

    decodes = knee_decodes(prompt_len, output_len, rate=rate, t_iteration=tight_tbt,
                           max_num_seqs=max_num_seqs)
    t = tuned_token_budget(cost, tight_tbt, prompt_len, decodes, block_size=block_size,
                           max_tokens=max_budget)
    return TunedBudget(t.token_budget, tight_tbt, rate, decodes.num_seqs, decodes.mean_context,
                       t.predicted_s, t.meets)


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
    """The simulator's model of a system: vLLM's policy (``vllm``, or ``vllm-priority`` for its
    priority mode) at the stock engine's budget, or the policy the plugin hosts with the same
    parameters."""
    if spec.runs == "stock":
        return PolicySpec(name=spec.policy, params={"token_budget": budget,
                                                    "max_num_seqs": max_num_seqs})
    params = dict(spec.params)
    if budget is not None:
        params["token_budget"] = budget
    return PolicySpec(name=spec.policy, params=params)


def replay_config(cfg: EngineSweepConfig, spec: SystemSpec, budget: int | None,
                  dep: Deployment, tiny_dir: str) -> dict[str, Any]:
    """The ``ReplayConfig`` of a system's replays: stock vLLM with ``max_num_batched_tokens`` =
    its budget (and its queue mode: FCFS or priority), or the plugin planning with the
    calibrated deployment ``dep``, as the simulator's policy does (the engine's
    ``max_num_batched_tokens`` the policy's largest token budget unless the sweep's engine sets
    one, which then caps the policy's budget: ``replay.engine_token_limit``)."""
    engine = cfg.engine_spec()
    engine["tiny_dir"] = tiny_dir
    if spec.runs == "stock":
        engine["max_num_batched_tokens"] = budget
    engine["async_scheduling"] = cfg.async_scheduling
    adapter: dict[str, Any] = {"cost": {"kind": "deployment",
                                        "deployment": dep.model_dump(mode="json")}}
    if spec.runs == "plugin":
        adapter["policy"] = sim_policy(spec, budget, 0).model_dump(mode="json")
    return {"system": "stock" if spec.runs == "stock" else "accelgen",
            "scheduling_policy": spec.scheduling_policy, "adapter": adapter,
            "engine": engine, "warmup_requests": cfg.warmup_requests,
            "max_wall_s": cfg.max_wall_s}
