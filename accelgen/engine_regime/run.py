"""Running an engine sweep (needs vllm): calibrate, plan, replay every point, simulate it.

1. **Calibration.** A stock replay of the calibration trace (``calibration/real-stock``); the
   engine's cost model is fitted on its steps (``accelgen.fidelity.run.calibrate_on``: every
   step's span, half held out) and written as a deployment (``calibration/deployment.yaml``).
2. **Plan** (``plan.json``): the deployment's pivot S_pf / T_pf, the TBT base and classes, the
   capacity estimate (``accelgen.costmodel.capacity`` on the calibrated deployment and seed
   ``cfg.seed``'s requests), the rates (load factors x the estimate), the tuned budget at the
   estimate, each system's budget, and the scheduling mode.
3. **Replays** (``real/<system>/seed<s>/rate<r>/``, ``point.json`` beside the results: times
   and the machine's load): every (seed, rate) point on every system; with ``interleave`` the
   systems take turns inside each point (the first system rotating from point to point), each
   on its own engine process (``engines``).
4. **Simulations** (``sim/<system>/seed<s>/rate<r>/``): the same points on the calibrated
   deployment with each system's policy (deterministic): the simulator's prediction. Then the
   host's speed during the replays (``speed.json``: each replay's steps against the calibrated
   model, median over the stock replays) and the same simulations charged at that speed, the
   policies still planning with the calibrated model as the plugin did (``sim-speed/``): what
   the prediction would have been had the calibration caught the host's speed of the sweep.
   And the simulations charged with the engine's noise fitted on the calibration replay's steps
   (``calibration/noise.yaml``, ``sim-noise/``; SPEC 13): the prediction with the noise.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from accelgen.core.specs import Deployment, ExperimentConfig, NoiseSpec, SimOptions
from accelgen.engine_regime import systems as sysmod
from accelgen.engine_regime.sweep_spec import EngineSweepConfig
from accelgen.engine_regime.traces import (
    calibration_trace,
    latency_reference,
    lengths,
    sweep_trace,
)

CONFIG_NAME = "engine_sweep.json"
PLAN_NAME = "plan.json"
POINT_NAME = "point.json"
SPEED_NAME = "speed.json"
NOISE_NAME = "noise.yaml"  # calibration/noise.yaml: the engine's noise (fit_calibration_noise)
CALIBRATION_DIR = "calibration"
Say = Callable[[str], None]


def rate_name(rate: float) -> str:
    return f"rate{rate:.4g}"


def point_dir(out: Path, source: str, system: str, seed: int, rate: float) -> Path:
    """Results directory of one point: ``source`` is ``real`` (the engine) or ``sim``."""
    return out / source / system / f"seed{seed}" / rate_name(rate)


def trace_path(out: Path, seed: int, rate: float) -> Path:
    return out / "traces" / f"seed{seed}-{rate_name(rate)}.parquet"


# --------------------------------------------------------------------------------------------
# calibration and plan


def calibrate(cfg: EngineSweepConfig, out: Path, say: Say) -> Deployment:
    """The calibration replay (a fresh process) and the cost model fitted on it."""
    from accelgen.fidelity.check_spec import FidelityConfig
    from accelgen.fidelity.run import calibrate_on

    cdir = out / CALIBRATION_DIR
    cdir.mkdir(parents=True, exist_ok=True)
    trace = calibration_trace(cfg)
    engine = {**cfg.engine_spec(), "max_num_batched_tokens": cfg.calibration.token_budget,
              "async_scheduling": cfg.async_scheduling}
    engine.pop("tiny")
    fid = FidelityConfig(engine=engine, omp_threads=cfg.omp_threads,
                         warmup_requests=cfg.warmup_requests, num_requests=len(trace))
    say(f"calibration replay: {len(trace)} requests at {cfg.calibration.rate:g} req/s, stock "
        f"vLLM, budget {cfg.calibration.token_budget}")
    summary = _calibration_replay(trace, fid, cfg, cdir / "real-stock")
    return calibrate_on(cdir / "real-stock", fid, int(summary["kv_blocks"]), cdir)


def _calibration_replay(trace: pd.DataFrame, fid: Any, cfg: EngineSweepConfig,
                        out: Path) -> dict[str, Any]:
    from accelgen.engine_regime.engines import EnginePool

    rc = {"system": "stock", "engine": {**fid.engine, "tiny": cfg.model.model_dump(mode="json"),
                                        "tiny_dir": str(out.parent / "model")},
          "warmup_requests": cfg.warmup_requests, "max_wall_s": cfg.max_wall_s}
    out.parent.mkdir(parents=True, exist_ok=True)
    tpath = out.parent / "trace.parquet"
    from accelgen.workloads.trace import write_trace

    write_trace(trace, {"generator": "accelgen.engine_regime.traces.calibration_trace"}, tpath)
    with EnginePool(cfg.omp_threads, cfg.cpus) as pool:
        summary, info = pool.replay("calibration", rc, trace, out, str(tpath))
    (out / POINT_NAME).write_text(json.dumps(info, indent=2) + "\n")
    return summary


def make_plan(cfg: EngineSweepConfig, dep: Deployment) -> dict[str, Any]:
    """Pivot, SLO classes, capacity estimate, rates and budgets (module docstring, step 2)."""
    from accelgen.costmodel.capacity import capacity_bound
    from accelgen.costmodel.factory import deployment_pivot, make_cost_model

    pivot = deployment_pivot(dep)
    base = sysmod.tbt_base(cfg, pivot.t_pf)
    prompt, output, _, _ = lengths(cfg, cfg.seed, cfg.num_requests)
    bound = capacity_bound(dep, prompt, output)
    estimate = bound.estimate_rps
    rates = [float(f"{f * estimate:.3g}") for f in cfg.load_factors]
    max_len = int(cfg.engine.get("max_model_len", 2048))
    tight = min(cfg.tbt_scale_set) * base
    tuned = sysmod.tune(make_cost_model(dep), tight, estimate, prompt, output, dep.block_size,
                        max_len, int(cfg.engine.get("max_num_seqs", 128)))
    budgets = {name: sysmod.budget_of(spec, pivot.s_pf, tuned.token_budget)
               for name, spec in cfg.systems.items()}
    return {"s_pf": pivot.s_pf, "t_pf": pivot.t_pf, "tbt_base": base,
            "tbt_classes": {f"tbt{s:g}": s * base for s in sorted(cfg.tbt_scale_set)},
            "paper_tbt_ratio": sysmod.paper_tbt_ratio(), "capacity_bound": bound.as_dict(),
            "estimate_rps": estimate, "rates": rates,
            "load_factors": list(cfg.load_factors), "seeds": cfg.seeds,
            "tuned": tuned.as_dict(), "budgets": budgets,
            "async_scheduling": cfg.async_scheduling,
            "labels": {name: spec.label or name for name, spec in cfg.systems.items()},
            "systems": {name: {"runs": spec.runs, "policy": spec.policy}
                        for name, spec in cfg.systems.items()},
            "kv_blocks": dep_kv_blocks(dep)}


def dep_kv_blocks(dep: Deployment) -> int:
    from accelgen.costmodel.factory import kv_num_blocks

    return int(kv_num_blocks(dep))


def read_plan(out: Path | str) -> dict[str, Any]:
    return dict(json.loads((Path(out) / PLAN_NAME).read_text()))


def read_config(out: Path | str) -> EngineSweepConfig:
    return EngineSweepConfig.model_validate_json((Path(out) / CONFIG_NAME).read_text())


def read_deployment(out: Path | str) -> Deployment:
    from accelgen.fidelity.run import read_deployment as read

    return read(out)


# --------------------------------------------------------------------------------------------
# the sweep


def write_traces(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment,
                 out: Path) -> dict[tuple[int, float], pd.DataFrame]:
    from accelgen.workloads.trace import write_trace

    ref = latency_reference(dep)
    traces = {}
    for seed in cfg.seeds:
        for rate in plan["rates"]:
            df = sweep_trace(cfg, seed, rate, ref, plan["tbt_base"])
            write_trace(df, {"generator": "accelgen.engine_regime.traces.sweep_trace",
                             "seed": seed, "rate": rate, "tbt_base": plan["tbt_base"]},
                        trace_path(out, seed, rate))
            traces[(seed, rate)] = df
    return traces


def points(cfg: EngineSweepConfig, plan: dict[str, Any]) -> list[tuple[int, float]]:
    return [(seed, rate) for seed in cfg.seeds for rate in plan["rates"]]


def replay_all(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment,
               traces: dict[tuple[int, float], pd.DataFrame], out: Path, say: Say) -> None:
    """Every point on every system's engine (module docstring, step 3)."""
    from accelgen.engine_regime.engines import EnginePool

    names = list(cfg.systems)
    configs = {name: sysmod.replay_config(cfg, spec, plan["budgets"][name], dep,
                                          str(out / "model"))
               for name, spec in cfg.systems.items()}
    pts = points(cfg, plan)
    # The start-up replay of every engine: the first seed's trace at the highest rate.
    top = traces[(cfg.seeds[0], max(plan["rates"]))]
    warm = top.iloc[:cfg.warmup_trace_requests].copy() if cfg.warmup_trace_requests else None
    done = 0
    total = len(pts) * len(names)
    t0 = time.time()
    with EnginePool(cfg.omp_threads, cfg.cpus) as pool:
        order = ([(k, [names[(k + i) % len(names)] for i in range(len(names))])
                  for k in range(len(pts))] if cfg.interleave else [])
        schedule = ([(pts[k], s) for k, turn in order for s in turn] if cfg.interleave
                    else [(p, s) for s in names for p in pts])
        last_system = None
        for (seed, rate), system in schedule:
            if not cfg.interleave and last_system not in (None, system):
                pool.close(last_system)  # one engine alive at a time
            last_system = system
            d = point_dir(out, "real", system, seed, rate)
            summary, info = pool.replay(system, configs[system], traces[(seed, rate)], d,
                                        str(trace_path(out, seed, rate)), warm)
            info.update(system=system, seed=seed, rate=rate,
                        async_scheduling=cfg.async_scheduling)
            (d / POINT_NAME).write_text(json.dumps(info, indent=2) + "\n")
            done += 1
            say(f"[{done}/{total}] {system} seed {seed} rate {rate:g}: request-level "
                f"attainment {summary['slo_attainment_request']:.2f}, "
                f"{summary['num_finished'] + summary['num_cut']} served "
                f"({info['end'] - info['start']:.0f} s, CPU busy "
                f"{info['cpu_shares'].get('busy', float('nan')):.0%}; "
                f"{time.time() - t0:.0f} s so far)")


def step_ratio(run_dir: Path, dep: Deployment) -> float:
    """The median over a replay's steps of its span over the calibrated model's prediction: how
    fast the host ran the engine against the calibration (1: as calibrated)."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.fidelity.compare import step_residuals

    return float(step_residuals(run_dir, make_cost_model(dep))["ratio"].median())


def host_speed(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment,
               out: Path) -> dict[str, Any]:
    """Every replay's ``step_ratio`` and their median over the stock systems' replays (the
    calibration's own kind of run; the plugin's own per-step time is not the host's): the
    factor the speed-corrected simulation (``sim-speed/``) charges the calibrated model at."""
    per = {f"{name}/seed{seed}/{rate_name(rate)}": step_ratio(
        point_dir(out, "real", name, seed, rate), dep)
        for name in cfg.systems for seed, rate in points(cfg, plan)
        if (point_dir(out, "real", name, seed, rate) / "iterations.parquet").exists()}
    stock = [v for k, v in per.items() if cfg.systems[k.split("/")[0]].runs == "stock"]
    basis = stock or list(per.values())
    factor = float(pd.Series(basis).median()) if basis else 1.0
    return {"factor": factor, "basis": "stock replays" if stock else "replays",
            "per_replay": per}


def scaled(dep: Deployment, factor: float) -> Deployment:
    """``dep`` with every time term of its calibrated model multiplied by ``factor``."""
    from accelgen.costmodel.calibrated import TERMS

    terms = dep.calibration
    if terms is None:
        raise ValueError("a calibrated deployment is needed")
    return dep.model_copy(update={"calibration": terms.model_copy(
        update={t: getattr(terms, t) * factor for t in TERMS})})


def fit_calibration_noise(out: Path, dep: Deployment) -> NoiseSpec | None:
    """The engine's noise around the calibrated model, fitted on the calibration replay's
    steps (``accelgen.costmodel.noise``; written to ``calibration/noise.yaml``). One replay
    gives no spread of the run factor: the prediction charges the step noise around the
    calibrated model's level."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.costmodel.noise import fit_replays, fixed_run, write_noise

    cdir = out / CALIBRATION_DIR
    if not (cdir / "real-stock" / "iterations.parquet").exists():
        return None  # no calibration replay's steps (a sweep from elsewhere): no noise
    spec, record = fit_replays([cdir / "real-stock"], make_cost_model(dep), "empirical")
    spec = fixed_run(spec)
    write_noise(cdir / NOISE_NAME, spec, record,
                f"accelgen.engine_regime.run.fit_calibration_noise({out})")
    return spec


def simulate_all(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
                 traces: dict[tuple[int, float], pd.DataFrame] | None = None,
                 say: Say | None = None, speed: float | None = None,
                 noise: NoiseSpec | None = None) -> None:
    """Every point on the calibrated deployment, each system's simulated policy (step 4). With
    ``speed``: the iterations charged at ``speed`` x the calibrated model while the policies
    still plan with it (as the real plugin did), into ``sim-speed/``. With ``noise``: charged
    with the engine's noise (seeded by the point's seed), into ``sim-noise/``."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.sim.runner import simulate
    from accelgen.workloads.trace import load_trace

    source = "sim" if speed is None else "sim-speed"
    if noise is not None:
        source = "sim-noise"
    charge = None if speed is None else make_cost_model(scaled(dep, speed))
    max_seqs = int(cfg.engine.get("max_num_seqs", 256))
    for name, spec in cfg.systems.items():
        policy = sysmod.sim_policy(spec, plan["budgets"][name], max_seqs)
        # vLLM V1 recomputes preempted requests and never swaps (fidelity.run.simulate_run).
        ecfg = ExperimentConfig(deployment=dep, policy=policy,
                                sim=SimOptions(progress=False, swap_space_gb=0.0))
        for seed, rate in points(cfg, plan):
            tpath = trace_path(out, seed, rate)
            trace = traces[(seed, rate)] if traces is not None else load_trace(tpath)
            pcfg = ecfg if noise is None else ecfg.model_copy(update={"sim": SimOptions(
                progress=False, swap_space_gb=0.0,
                noise=noise.model_copy(update={"seed": seed}))})
            run = simulate(trace, pcfg, charge_cost=charge)
            run.config["trace"] = str(tpath)
            if speed is not None:
                run.config["charged_at_speed"] = speed
            run.write(point_dir(out, source, name, seed, rate))
        if say is not None:
            say(f"simulated {name}: {len(points(cfg, plan))} points ({source})")


def simulate_sweep(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
                   traces: dict[tuple[int, float], pd.DataFrame] | None = None,
                   say: Say | None = None) -> None:
    """The simulator's two predictions: at the calibrated speed (``sim/``), and at the host's
    speed during the replays (``speed.json``, ``sim-speed/``)."""
    simulate_all(cfg, plan, dep, out, traces, say)
    speed = host_speed(cfg, plan, dep, out)
    (out / SPEED_NAME).write_text(json.dumps(speed, indent=2) + "\n")
    if say is not None:
        say(f"host speed during the replays: steps {speed['factor']:.2f} x the calibrated "
            f"model (median over the {speed['basis']})")
    simulate_all(cfg, plan, dep, out, traces, say, speed=speed["factor"])
    noise = fit_calibration_noise(out, dep)
    if noise is None:
        return
    if say is not None:
        say(f"noise fitted on the calibration replay ({NOISE_NAME}): step errors p10-p90 "
            f"{noise.step_quantiles[20]:.2f}-{noise.step_quantiles[180]:.2f}"  # type: ignore[index]
            " x the model")
    simulate_all(cfg, plan, dep, out, traces, say, noise=noise)


def run_sweep(cfg: EngineSweepConfig, out: Path, say: Say | None = None) -> Path:
    """The whole sweep into ``out`` (cleared of an earlier sweep's files first)."""
    from accelgen.fidelity.run import MACHINE_NAME, machine_info, source_digests

    say = say or (lambda _m: None)
    out.mkdir(parents=True, exist_ok=True)
    for old in ("real", "sim", "sim-speed", "sim-noise", "traces", CALIBRATION_DIR, PLAN_NAME, SPEED_NAME):
        p = out / old
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    (out / CONFIG_NAME).write_text(cfg.model_dump_json(indent=2) + "\n")
    (out / "sources.json").write_text(json.dumps(source_digests(), indent=2) + "\n")
    (out / MACHINE_NAME).write_text(json.dumps({**machine_info(), "cpus": cfg.cpus},
                                               indent=2) + "\n")
    dep = calibrate(cfg, out, say)
    plan = make_plan(cfg, dep)
    (out / PLAN_NAME).write_text(json.dumps(plan, indent=2) + "\n")
    say(f"plan: S_pf {plan['s_pf']}, T_pf {plan['t_pf'] * 1e3:.1f} ms, TBT classes "
        + ", ".join(f"{v * 1e3:.0f} ms" for v in plan["tbt_classes"].values())
        + f"; capacity estimate {plan['estimate_rps']:.3g} req/s; rates "
        + ", ".join(f"{r:g}" for r in plan["rates"])
        + f"; tuned budget {plan['tuned']['token_budget']}; budgets {plan['budgets']}")
    traces = write_traces(cfg, plan, dep, out)
    replay_all(cfg, plan, dep, traces, out, say)
    simulate_sweep(cfg, plan, dep, out, traces, say)
    return out
