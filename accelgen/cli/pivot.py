"""``accelgen pivot``: the pivot forward size of a deployment, beside the paper's value."""

from __future__ import annotations

import argparse
from pathlib import Path

from accelgen.core.specs import Deployment, kv_cache_gb_arg
from accelgen.costmodel.datasheets import (
    ALTERNATIVE_DEPLOYMENTS,
    DEPLOYMENTS,
    GIB,
    GPU_MEMORY_UTILIZATION,
    auto_kv,
    full_weight_bytes_per_gpu,
    kv_cache_gib,
    kv_num_blocks,
    resolve_model,
)
from accelgen.costmodel.factory import (
    deployment_pivot,
    effective_max_model_len,
    make_cost_model,
    resolve_deployment,
    resolve_hardware,
)
from accelgen.costmodel.pivot import PAPER_PIVOTS

TABLE_SIZES = (64, 128, 256, 384, 512, 768, 1024, 1280, 1536, 2048, 4096, 8192)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pivot", help="compute the pivot forward size S_pf and T_pf of a deployment",
        description=__doc__)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--deployment", metavar="NAME",
                       help="a default deployment: "
                            + ", ".join([*DEPLOYMENTS, *ALTERNATIVE_DEPLOYMENTS]))
    which.add_argument("--all", action="store_true",
                       help="every default (and alternative) deployment, one summary line each")
    p.add_argument("--model", help="model profile name (default opt-13b)")
    p.add_argument("--hardware", help="hardware profile name (default a100)")
    p.add_argument("--tp", type=int, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, help="pipeline-parallel degree")
    p.add_argument("--kv-cache-gb", type=kv_cache_gb_arg, metavar="GIB|auto",
                   help="GiB of KV cache per GPU, or auto (vLLM's gpu_memory_utilization 0.9 "
                        "after weights and an activation reserve)")
    p.add_argument("--profile-csv", type=Path,
                   help="use a measured profile table instead of the analytic model")
    p.add_argument("--calibration", type=Path, metavar="YAML",
                   help="use the calibrated terms of a deployment file `accelgen calibrate` "
                        "wrote instead of the analytic model")
    p.add_argument("--tolerance", type=float,
                   help="throughput improvement below which the curve counts as flat (0.03)")
    p.set_defaults(func=run)


def _kv_text(dep: Deployment) -> str:
    """``12 GiB`` or ``auto = 46.2 GiB (0.9 x 80 GiB - weights ... )``."""
    if dep.kv_cache_gb != "auto":
        return f"{dep.kv_cache_gb:g} GiB"
    a = auto_kv(dep)
    return (f"auto = {a.kv_gib:.2f} GiB ({GPU_MEMORY_UTILIZATION:g} x "
            f"{a.device_bytes / GIB:g} GiB - weights {a.weight_bytes / GIB:.2f} - activations "
            f"{a.activation_bytes / GIB:.2f} - non-torch {a.non_torch_bytes / GIB:.2f})")


def _deployment(args: argparse.Namespace) -> tuple[str, Deployment]:
    """The deployment asked for, and its name (a default's name only when unmodified)."""
    name = args.deployment or args.model or Deployment().model
    # Start from the named paper setup (e.g. opt-175b on 8 GPUs) when there is one.
    known = name in DEPLOYMENTS or name in ALTERNATIVE_DEPLOYMENTS
    dep = resolve_deployment(name) if (args.deployment or known) else Deployment()
    updates: dict[str, object] = {}
    for field in ("model", "hardware", "tp", "pp", "kv_cache_gb"):
        value = getattr(args, field)
        if value is not None and value != getattr(dep, field):
            updates[field] = value
    if args.tolerance is not None:
        updates["pivot_tolerance"] = args.tolerance
    if args.profile_csv is not None:
        updates.update(cost_model="profile", profile_csv=args.profile_csv)
    if args.calibration is not None:
        from accelgen.costmodel.calibration_files import read_calibration

        updates.update(cost_model="calibrated",
                       calibration=read_calibration(args.calibration).model_dump())
    # Validate through the pydantic model (model_copy(update=...) would not).
    dep = Deployment.model_validate({**dep.model_dump(), **updates})
    resolve_model(dep.model)  # clear error for an unknown name before anything else
    # The KV budget does not move the pivot: keep the name (and the paper's S_pf beside it).
    if not known or set(updates) - {"pivot_tolerance", "kv_cache_gb"}:
        name = "custom"
    return name, dep


def _summary(name: str, dep: Deployment) -> str:
    pivot = deployment_pivot(dep)
    paper = PAPER_PIVOTS.get(name)
    paper_txt = f"{paper}" if paper is not None else "-"
    auto = dep.model_copy(update={"kv_cache_gb": "auto"})
    return (f"{name:<18} {dep.model:<12} {dep.hardware:<5} {dep.tp:>2} {dep.pp:>2} "
            f"{kv_cache_gib(dep):>7.2f} {kv_num_blocks(dep):>7} {kv_cache_gib(auto):>8.2f} "
            f"{kv_num_blocks(auto):>7} {pivot.s_pf:>6} {pivot.t_pf * 1e3:>9.1f} {paper_txt:>9}")


def run(args: argparse.Namespace) -> int:
    if args.all:
        if any(getattr(args, f) is not None for f in ("model", "hardware", "tp", "pp",
                                                       "kv_cache_gb", "profile_csv",
                                                       "calibration")):
            raise ValueError("--all takes no model/hardware/layout options (only --tolerance)")
        print(f"{'deployment':<18} {'model':<12} {'hw':<5} {'tp':>2} {'pp':>2} "
              f"{'KV GiB':>7} {'blocks':>7} {'auto GiB':>8} {'blocks':>7} {'S_pf':>6} "
              f"{'T_pf(ms)':>9} {'paper S_pf':>9}")
        for name in [*DEPLOYMENTS, *ALTERNATIVE_DEPLOYMENTS]:
            dep = resolve_deployment(name)
            if args.tolerance is not None:
                dep.pivot_tolerance = args.tolerance
            print(_summary(name, dep))
        print("KV GiB: per GPU as configured (the paper's); auto: kv_cache_gb auto (vLLM's "
              f"gpu_memory_utilization {GPU_MEMORY_UTILIZATION:g} after weights and an "
              "activation reserve, docs/costmodel.md)")
        print("paper S_pf: the values reported in the paper (section 4.2), for comparison only")
        return 0

    name, dep = _deployment(args)
    cost = make_cost_model(dep)
    pivot = deployment_pivot(dep)
    model = resolve_model(dep.model)
    paper = PAPER_PIVOTS.get(name)
    hardware = resolve_hardware(dep.hardware)
    print(f"deployment {name}: {model.name} on {dep.tp * dep.pp} x {hardware.name} "
          f"(tp {dep.tp}, pp {dep.pp}), cost model {cost!r}")
    weights = full_weight_bytes_per_gpu(model, dep.tp, dep.pp)
    print(f"weights/GPU: {weights / GIB:.1f} GiB, KV/GPU: {_kv_text(dep)}, "
          f"KV blocks: {kv_num_blocks(dep)} x {dep.block_size}, "
          f"max_model_len: {effective_max_model_len(dep)}")
    if weights + kv_cache_gib(dep) * GIB > hardware.mem_bytes:
        print(f"warning: weights + KV exceed the {hardware.mem_bytes / GIB:g} GiB of one "
              f"{hardware.name}; this layout would not load")
    print(f"S_pf = {pivot.s_pf} tokens, T_pf = {pivot.t_pf * 1e3:.1f} ms "
          f"(tolerance {dep.pivot_tolerance:g}); paper's S_pf: "
          + (f"{paper}" if paper is not None else "not reported"))
    print(f"{'forward size':>12} {'T (ms)':>9} {'tokens/s':>9} {'vs best':>8}")
    sizes = sorted({*(s for s in TABLE_SIZES if s <= 8192), pivot.s_pf})
    rows = [(s, cost.forward_time(s)) for s in sizes]
    best = max(s / t for s, t in rows)
    for s, t in rows:
        mark = "  <- S_pf" if s == pivot.s_pf else ""
        print(f"{s:>12} {t * 1e3:>9.1f} {s / t:>9.0f} {s / t / best:>8.1%}{mark}")
    return 0
