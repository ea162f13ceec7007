"""Build and run one simulation from a trace and an experiment config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from accelgen import metrics
from accelgen.core.kvcache import BlockManager
from accelgen.core.request import Request
from accelgen.core.specs import ExperimentConfig
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.factory import (
    deployment_pivot,
    kv_num_blocks,
    make_cost_model,
    resolve_hardware,
    resolve_model,
)
from accelgen.costmodel.noise import NoisyCost
from accelgen.policies.registry import make_policy
from accelgen.results import RunOutput, requests_frame
from accelgen.sim.engine import Simulator
from accelgen.workloads.trace import to_requests


def simulate(trace: pd.DataFrame, cfg: ExperimentConfig, *,
             progress: bool = False, charge_cost: CostModel | None = None,
             check: Callable[[float, Sequence[Request]], None] | None = None) -> RunOutput:
    """Simulate ``trace`` under ``cfg``. ``charge_cost``: a cost model that charges the
    iterations instead of the deployment's, which the policy still plans with (and which gives
    the pivot). ``check``: the simulator's periodic check (``Simulator``); what it raises ends
    the run and propagates."""
    dep = cfg.deployment
    model = resolve_model(dep.model)
    hardware = resolve_hardware(dep.hardware)
    max_model_len = dep.max_model_len or model.max_model_len
    cost = make_cost_model(dep)
    pivot = deployment_pivot(dep)  # cached per deployment
    policy = make_policy(cfg.policy.name, cfg.policy.params)
    swap_blocks = int(cfg.sim.swap_space_gb * 2**30 // (model.kv_bytes_per_token * dep.block_size))
    kv = BlockManager(kv_num_blocks(dep), dep.block_size, num_swap_blocks=swap_blocks)
    requests, output_len = to_requests(trace)
    charged = cost if charge_cost is None else charge_cost
    if cfg.sim.noise.on:  # the engine's noise on every charged iteration (SPEC 13)
        charged = NoisyCost(charged, cfg.sim.noise, cfg.seed)
    sim = Simulator(
        requests, output_len, policy, charged, kv, pivot,
        max_model_len=max_model_len,
        kv_bytes_per_token=model.kv_bytes_per_token,
        host_link_bandwidth=hardware.host_link_bandwidth * dep.num_gpus,
        add_scheduler_overhead=cfg.sim.add_scheduler_overhead,
        swap_overlap=cfg.sim.swap_overlap,
        max_iterations=cfg.sim.max_iterations,
        horizon_s=cfg.sim.horizon_s,
        progress=progress and cfg.sim.progress,
        planning_cost=cost,
        check=check,
    )
    res = sim.run()
    # (the requests are done: the frame takes their token times rather than a copy)
    req_df = requests_frame(res.requests, res.served_output_len, share_token_times=True)
    # The log's columns as stored (narrow integers and floats): written as int64 and float64.
    its_df = res.iterations.to_frame(narrow=True)
    wall_time_s, timing = res.wall_time_s, res.iterations.timing_frame()
    # The frames hold what the results need; the requests (their token times) and the log go
    # before the metrics run (a paper-size run: 17 M token times, 4 M iterations).
    del res, sim, requests
    summary = metrics.summarize(req_df, its_df, s_pf=pivot.s_pf, model=model, hardware=hardware,
                                num_gpus=dep.num_gpus)
    summary.update({"policy": cfg.policy.name, "model": dep.model, "hardware": dep.hardware,
                    "s_pf": pivot.s_pf, "t_pf": pivot.t_pf, "kv_blocks": kv.num_total_blocks,
                    "seed": cfg.seed})
    if cfg.sim.horizon_s is not None:
        # The window the metrics cover: arrivals from the trace's start, and only what was done
        # by the horizon (unfinished requests count as not served and as missing their SLOs).
        summary["horizon_s"] = cfg.sim.horizon_s
        summary["window_s"] = [float(trace["arrival"].min()) if len(trace) else 0.0,
                               cfg.sim.horizon_s]
    tsum = metrics.timing_summary(timing["decision_time"].to_numpy(), summary["makespan_s"])
    tsum["sim_wall_time_s"] = wall_time_s
    tsum["iterations_per_wall_s"] = len(its_df) / wall_time_s if wall_time_s > 0 else 0.0
    config = {"experiment": cfg.model_dump(mode="json"),
              "resolved": {"max_model_len": max_model_len, "s_pf": pivot.s_pf,
                           "t_pf": pivot.t_pf, "kv_blocks": kv.num_total_blocks,
                           "swap_blocks": swap_blocks, "policy_params": policy.params.model_dump(),
                           "cost_model": cost.name}}
    if isinstance(charged, NoisyCost):
        config["resolved"]["noise"] = {"run_factor": charged.run_factor,
                                       "seed": (cfg.sim.noise.seed if cfg.sim.noise.seed
                                                is not None else cfg.seed),
                                       "factors_drawn": charged.drawn}
    return RunOutput(req_df, its_df, summary, timing, tsum, config)


def simulate_to_dir(trace: pd.DataFrame, cfg: ExperimentConfig, out: Path | str, *,
                    progress: bool = False, trace_path: str | None = None) -> RunOutput:
    run = simulate(trace, cfg, progress=progress)
    if trace_path is not None:
        run.config["trace"] = trace_path
    run.write(out)
    return run
