"""``accelgen replay``: serve a trace on a real engine at its arrival times.

``--backend vllm`` (the only backend; ``accelgen simulate`` is the simulator) runs vLLM in this
process with ``AccelGenScheduler`` driving the chosen policy, or with vLLM's own scheduler
(``--system stock``). Without ``--model`` it writes and serves a tiny random-weight model (CPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from accelgen.core.specs import load_yaml, parse_params


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a trace on a real vLLM engine", description=__doc__)
    p.add_argument("--trace", required=True, type=Path, help="trace file (.parquet or .csv)")
    p.add_argument("--backend", default="vllm", choices=["vllm"])
    p.add_argument("--system", choices=["accelgen", "stock"], default=None,
                   help="accelgen: the plugin running --policy (default); stock: vLLM's own "
                        "scheduler with the same recording")
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default=None,
                   help="--system stock: vLLM's queue mode; priority orders requests by their "
                        "SLO class (tight TBT first, offline last; the simulator's "
                        "vllm-priority)")
    p.add_argument("--policy", help="policy name for the plugin (default: accelgen)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="policy parameter")
    p.add_argument("--config", type=Path,
                   help="replay YAML {system, adapter: {policy, slo, cost, s_pf, t_pf}, engine: "
                        "{model, num_gpu_blocks, max_model_len, ...}}, or an experiment YAML "
                        "{deployment, policy, ...} as `accelgen simulate` reads it")
    p.add_argument("--model", help="model name or path (default: a tiny random-weight model)")
    p.add_argument("--num-gpu-blocks", type=int, help="KV blocks (vLLM num_gpu_blocks_override)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--s-pf", type=int, help="pivot forward size for the policy")
    p.add_argument("--t-pf", type=float, help="iteration latency at S_pf (s)")
    p.add_argument("--seed", type=int, help="engine seed (sampling, dummy weights)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's async scheduling (default: vLLM's, on on a GPU, off on CPU; "
                        "--async-scheduling turns it on on CPU too, the model then in a worker "
                        "process); --no-async-scheduling: sync steps, as the simulator models them")
    p.add_argument("--engine", metavar="JSON",
                   help="engine settings merged into the config's (EngineSpec fields, e.g. "
                        "'{\"model\": \"facebook/opt-13b\", \"load_format\": \"auto\", "
                        "\"extra_args\": {\"tensor_parallel_size\": 2}}'); the pipeline passes "
                        "a deployment's `engine:` this way")
    p.add_argument("--out", required=True, type=Path, help="results directory")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    from accelgen.vllm_integration.replay import ReplayConfig

    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    cfg = (from_experiment(data) if data and not {"system", "adapter", "engine"} & set(data)
           else ReplayConfig(**data))
    if args.system:
        cfg.system = args.system
    if args.scheduling_policy:
        cfg.scheduling_policy = args.scheduling_policy
    adapter = cfg.adapter.model_dump()
    if args.policy:
        adapter["policy"] = {"name": args.policy, "params": {}}
    adapter["policy"]["params"].update(parse_params(args.param))
    for key, value in (("s_pf", args.s_pf), ("t_pf", args.t_pf)):
        if value is not None:
            adapter[key] = value
    engine = cfg.engine.model_dump()
    if args.engine:
        engine = _merge(engine, _engine_json(args.engine))
    for key, value in (("model", args.model), ("num_gpu_blocks", args.num_gpu_blocks),
                       ("max_model_len", args.max_model_len),
                       ("max_num_batched_tokens", args.max_num_batched_tokens),
                       ("seed", args.seed), ("async_scheduling", args.async_scheduling)):
        if value is not None:
            engine[key] = value
    return ReplayConfig.model_validate({"system": cfg.system,
                                        "scheduling_policy": cfg.scheduling_policy,
                                        "adapter": adapter,
                                        "engine": engine,
                                        "warmup_requests": cfg.warmup_requests,
                                        "max_wall_s": cfg.max_wall_s})


def _engine_json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--engine: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--engine: expected a JSON object of engine settings")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in (nested mappings such as extra_args merge)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def from_experiment(data: dict[str, Any]) -> Any:
    """A replay of the simulator's experiment: the same policy, the deployment's cost model and
    pivot for the policy, and an engine with the deployment's KV capacity in tokens, block size
    and max_model_len (on CPU: the tiny model with that many KV blocks); its
    max_num_batched_tokens is the policy's largest token budget (``replay.engine_token_limit``)."""
    from accelgen.core.specs import ExperimentConfig
    from accelgen.costmodel.datasheets import kv_num_blocks
    from accelgen.costmodel.factory import deployment_pivot, effective_max_model_len
    from accelgen.vllm_integration.replay import ReplayConfig

    exp = ExperimentConfig(**data)
    dep = exp.deployment
    pivot = deployment_pivot(dep)
    max_model_len = effective_max_model_len(dep)
    adapter = {"policy": exp.policy.model_dump(), "s_pf": pivot.s_pf, "t_pf": pivot.t_pf,
               "cost": {"kind": "deployment", "deployment": dep.model_dump(mode="json")}}
    engine = {"block_size": dep.block_size, "max_model_len": max_model_len,
              "num_gpu_blocks": kv_num_blocks(dep) + 1,  # + vLLM's reserved null block
              "tiny": {"max_position_embeddings": max(8192, max_model_len)},
              "seed": exp.seed}
    return ReplayConfig.model_validate({"system": "accelgen", "adapter": adapter,
                                        "engine": engine})


def run(args: argparse.Namespace) -> int:
    from accelgen.vllm_integration.version import UnsupportedVLLMVersion, check_vllm_version
    from accelgen.workloads.trace import load_trace

    try:
        check_vllm_version()
    except UnsupportedVLLMVersion as exc:  # the CLI reports ValueErrors as one-line errors
        raise ValueError(str(exc)) from None
    from accelgen.results import outcome_counts
    from accelgen.vllm_integration.replay import replay_to_dir

    cfg = build_config(args)
    trace = load_trace(args.trace)
    out = replay_to_dir(trace, cfg, args.out, progress=not args.no_progress,
                        trace_path=str(args.trace))
    s, t = out.summary, out.timing_summary
    print(f"{s['policy']} on vLLM ({s['kv_blocks']} KV blocks): {s['num_iterations']} "
          f"iterations, {s['num_preemptions']} preemptions")
    print(f"  throughput {s['throughput_output_tps']:.1f} out tok/s, {s['throughput_rps']:.2f} "
          f"req/s; SLO attainment request {s['slo_attainment_request']:.3f}, iteration "
          f"{s['slo_attainment_iteration']:.3f}")
    print(f"  scheduler time per step: p50 {t['decision_time_p50'] * 1e6:.0f} us (vLLM's own "
          f"schedule() {t['vllm_schedule_time_p50'] * 1e6:.0f} us, policy "
          f"{t['policy_time_p50'] * 1e6:.0f} us)")
    print(f"  results: {args.out} ({outcome_counts(s)})")
    return 0
