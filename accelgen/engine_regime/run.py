"""Running an engine sweep (needs vllm): calibrate, plan, search every system's capacity in the
simulator and inside vLLM.

1. **Calibration.** A stock replay of the calibration trace (``calibration/real-stock``); the
   engine's cost model is fitted on its steps (``accelgen.fidelity.run.calibrate_on``: every
   step's span, half held out) and written as a deployment (``calibration/deployment.yaml``).
   Then, on the same engine, the host's step jitter: ``jitter.steps`` identical steps timed
   (``calibration/jitter.json``; ``engines._step_jitter``).
2. **Plan** (``plan.json``): the deployment's pivot S_pf / T_pf, the TBT base and classes (the
   ``auto`` base raised where the jitter rule needs it: ``jitter_summary``), the capacity
   estimate (``accelgen.costmodel.capacity`` on the calibrated deployment and seed
   ``cfg.seed``'s requests), the searches' start and bounds, the tuned budget at the estimate,
   each system's budget, and the scheduling mode.
3. **The simulator's searches** (``sim/`` deterministic, ``sim-noise/`` charged with the
   engine's noise fitted on the calibration replay, ``calibration/noise.yaml``; SPEC 13): per
   system and seed a capacity search (``search``) from the plan's start, every probe a
   simulation of that (seed, rate) point on the calibrated deployment with the system's policy.
4. **The engine's searches** (``real/<system>/seed<s>/rate<r>/``, ``point.json`` beside the
   results: times and the machine's load): the same search per system and seed, every probe a
   replay on the system's engine process (``engines``), starting at the simulator's (with
   noise) seed-0 capacity of that system; with ``interleave`` the systems take turns, one
   probe each. Each source's probes and capacities: ``<source>/searches.json``.
5. **At the host's speed**: each replay's steps against the calibrated model (``speed.json``;
   median over the stock replays) and the simulator's searches charged at that speed, the
   policies still planning with the calibrated model as the plugin did (``sim-speed/``): what
   the prediction would have been had the calibration caught the host's speed of the sweep.

A (seed, rate) point's trace is made when a probe first asks for it (``traces/``); a seed fixes
the requests, a rate scales their arrival gaps (``traces``).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from accelgen.core.specs import Deployment, ExperimentConfig, NoiseSpec, SimOptions
from accelgen.engine_regime import systems as sysmod
from accelgen.engine_regime.search import CapacitySearch, new_search, next_start, round_rate
from accelgen.engine_regime.sweep_spec import EngineSweepConfig, JitterSpec
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
JITTER_NAME = "jitter.json"  # calibration/jitter.json: the identical steps' times
SEARCHES_NAME = "searches.json"  # <source dir>/searches.json: every search's probes
PREDICTION_DIRS = ("sim", "sim-speed", "sim-noise")
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


def calibrate(cfg: EngineSweepConfig, out: Path, say: Say) -> tuple[Deployment, list[float]]:
    """The calibration replay (a fresh process), the cost model fitted on it, and the host's
    step jitter timed on the same engine after the replay (``jitter.json``)."""
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
    summary, times = _calibration_replay(trace, fid, cfg, cdir / "real-stock")
    (cdir / JITTER_NAME).write_text(json.dumps({"step_s": times}, indent=2) + "\n")
    return calibrate_on(cdir / "real-stock", fid, int(summary["kv_blocks"]), cdir), times


def _calibration_replay(trace: pd.DataFrame, fid: Any, cfg: EngineSweepConfig,
                        out: Path) -> tuple[dict[str, Any], list[float]]:
    from accelgen.engine_regime.engines import EnginePool

    rc = {"system": "stock", "engine": {**fid.engine, "tiny": cfg.model.model_dump(mode="json"),
                                        "tiny_dir": str(out.parent / "model")},
          "warmup_requests": cfg.warmup_requests, "max_wall_s": cfg.max_wall_s}
    out.parent.mkdir(parents=True, exist_ok=True)
    tpath = out.parent / "trace.parquet"
    from accelgen.workloads.trace import write_trace

    write_trace(trace, {"generator": "accelgen.engine_regime.traces.calibration_trace"}, tpath)
    times: list[float] = []
    with EnginePool(cfg.omp_threads, cfg.cpus) as pool:
        summary, info = pool.replay("calibration", rc, trace, out, str(tpath))
        if cfg.jitter.steps:
            times = pool.step_jitter("calibration", rc,
                                     min(cfg.jitter.prompt_len, cfg.calibration.token_budget),
                                     cfg.jitter.steps)
    (out / POINT_NAME).write_text(json.dumps(info, indent=2) + "\n")
    return summary, times


def jitter_summary(times: list[float], spec: JitterSpec) -> dict[str, Any]:
    """The host's step jitter from identical steps' times (s): p50, p99, their difference (the
    jitter) and the relative spread; and the floor it puts under the tightest TBT class."""
    import numpy as np

    t = np.asarray(times, dtype=float)
    if not t.size:
        return {"steps": 0, "floor_s": spec.floor_ms / 1e3, "rule": jitter_rule(spec)}
    p50, p99 = float(np.quantile(t, 0.5)), float(np.quantile(t, 0.99))
    jitter = p99 - p50
    return {"steps": int(t.size), "prompt_len": spec.prompt_len, "p50_s": p50, "p99_s": p99,
            "p90_s": float(np.quantile(t, 0.9)), "jitter_s": jitter,
            "relative": jitter / p50 if p50 > 0 else math.nan,
            "floor_s": max(spec.multiple * jitter, spec.floor_ms / 1e3),
            "rule": jitter_rule(spec)}


def jitter_rule(spec: JitterSpec) -> str:
    return (f"tightest TBT SLO >= max({spec.multiple:g} x (p99 - p50 of {spec.steps} identical "
            f"{spec.prompt_len}-token steps), {spec.floor_ms:g} ms)")


def make_plan(cfg: EngineSweepConfig, dep: Deployment,
              jitter: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pivot, SLO classes (raised by the jitter rule where the host needs it), capacity
    estimate, the searches' bounds and budgets (module docstring, step 2)."""
    from accelgen.costmodel.capacity import capacity_bound
    from accelgen.costmodel.factory import deployment_pivot, make_cost_model

    pivot = deployment_pivot(dep)
    base_auto = sysmod.tbt_base(cfg, pivot.t_pf)
    jitter = jitter if jitter is not None else jitter_summary([], cfg.jitter)
    low = min(cfg.tbt_scale_set)
    base = max(base_auto, float(jitter["floor_s"]) / low)
    prompt, output, _, _ = lengths(cfg, cfg.seed, cfg.num_requests)
    bound = capacity_bound(dep, prompt, output)
    estimate = bound.estimate_rps
    sp = cfg.search
    max_len = int(cfg.engine.get("max_model_len", 2048))
    tight = low * base
    tuned = sysmod.tune(make_cost_model(dep), tight, estimate, prompt, output, dep.block_size,
                        max_len, int(cfg.engine.get("max_num_seqs", 128)))
    budgets = {name: sysmod.budget_of(spec, pivot.s_pf, tuned.token_budget)
               for name, spec in cfg.systems.items()}
    return {"s_pf": pivot.s_pf, "t_pf": pivot.t_pf, "tbt_base": base,
            "tbt_base_auto": base_auto, "tbt_base_raised": base > base_auto,
            "jitter": jitter,
            "tbt_classes": {f"tbt{s:g}": s * base for s in sorted(cfg.tbt_scale_set)},
            "paper_tbt_ratio": sysmod.paper_tbt_ratio(), "capacity_bound": bound.as_dict(),
            "estimate_rps": estimate, "start_rps": round_rate(sp.start_load * estimate),
            "rate_floor": round_rate(sp.min_load * estimate),
            "rate_ceiling": round_rate(sp.max_load * estimate),
            "search": sp.model_dump(mode="json"), "seeds": cfg.seeds,
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
# the sweep: traces, searches, replays, simulations


class Traces:
    """The sweep's traces, made when a probe first asks for its (seed, rate) and written to
    ``traces/``; every source probing that point reads the same one."""

    def __init__(self, cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment,
                 out: Path) -> None:
        self.cfg, self.plan, self.out = cfg, plan, out
        self.ref = latency_reference(dep)
        self._cache: dict[tuple[int, float], pd.DataFrame] = {}

    def get(self, seed: int, rate: float) -> pd.DataFrame:
        from accelgen.workloads.trace import load_trace, write_trace

        key = (seed, rate)
        if key not in self._cache:
            path = trace_path(self.out, seed, rate)
            if path.exists():
                self._cache[key] = load_trace(path)
            else:
                df = sweep_trace(self.cfg, seed, rate, self.ref, self.plan["tbt_base"])
                write_trace(df, {"generator": "accelgen.engine_regime.traces.sweep_trace",
                                 "seed": seed, "rate": rate,
                                 "tbt_base": self.plan["tbt_base"]}, path)
                self._cache[key] = df
        return self._cache[key]


# probe(system, seed, rate) -> the point's request-level attainment (its results written)
ProbeFn = Callable[[str, int, float], float]
Searches = dict[str, dict[int, CapacitySearch]]


def search_all(cfg: EngineSweepConfig, plan: dict[str, Any], starts: dict[str, float],
               probe: ProbeFn, say: Say | None = None, label: str = "",
               interleave: bool = True) -> Searches:
    """Every system's capacity search, repeat after repeat (``search`` module docstring):
    with ``interleave`` the systems take turns, one probe each (the first one rotating from
    turn to turn), so a slow phase of the host hits every system; otherwise one system's
    searches after another's. Returns the searches per system and seed."""
    est = float(plan["estimate_rps"])
    names = list(cfg.systems)
    seeds = cfg.seeds
    done: Searches = {n: {} for n in names}
    current = {n: new_search(cfg.search, starts[n], est, cfg.target, first=True) for n in names}
    seed_of = {n: 0 for n in names}
    t0, count = time.time(), 0

    def step(name: str) -> bool:
        """One probe of ``name``'s current search; False once every repeat of it is done."""
        nonlocal count
        if seed_of[name] >= len(seeds):
            return False
        s = current[name]
        rate = s.next_rate()
        assert rate is not None
        seed = seeds[seed_of[name]]
        att = probe(name, seed, rate)
        s.record(rate, att)
        count += 1
        if say is not None:
            say(f"{label}[{count}] {name} seed {seed} rate {rate:g}: request-level attainment "
                f"{att:.2f} ({time.time() - t0:.0f} s so far)")
        if s.done:
            done[name][seed] = s
            cap, where = s.capacity()
            if say is not None:
                say(f"{label}{name} seed {seed}: capacity {cap:.3g} req/s ({where}, "
                    f"{len(s.probes)} probes, {s.stopped_by})")
            seed_of[name] += 1
            if seed_of[name] < len(seeds):
                current[name] = new_search(cfg.search, next_start(s, starts[name]), est,
                                           cfg.target, first=False)
        return seed_of[name] < len(seeds)

    if interleave:
        turn = 0
        while any(seed_of[n] < len(seeds) for n in names):
            order = [names[(turn + i) % len(names)] for i in range(len(names))]
            for name in order:
                step(name)
            turn += 1
    else:
        for name in names:
            while step(name):
                pass
    return done


def write_searches(path: Path, searches: Searches) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {name: {str(seed): s.as_dict() for seed, s in per.items()}
            for name, per in searches.items()}
    path.write_text(json.dumps(data, indent=2) + "\n")


def read_searches(out: Path, source_dir: str) -> dict[str, dict[int, dict[str, Any]]]:
    """``<out>/<source_dir>/searches.json``: per system and seed, the search's probes and
    capacity (empty when that source did not run)."""
    path = out / source_dir / SEARCHES_NAME
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {name: {int(seed): s for seed, s in per.items()} for name, per in data.items()}


def probed_points(out: Path, source_dir: str) -> list[tuple[str, int, float]]:
    """(system, seed, rate) of every probe of a source, in search order."""
    return [(name, seed, float(p["rate"]))
            for name, per in read_searches(out, source_dir).items()
            for seed, s in per.items() for p in s["probes"]]


def first_capacities(searches: Searches, fallback: float) -> dict[str, float]:
    """Each system's capacity on its first repeat (the engine search's start)."""
    out = {}
    for name, per in searches.items():
        first = per[min(per)] if per else None
        out[name] = next_start(first, fallback) if first is not None else fallback
    return out


def search_engine(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment,
                  traces: Traces, starts: dict[str, float], out: Path, say: Say) -> Searches:
    """Every system's searches on its own engine process (module docstring, step 4)."""
    from accelgen.engine_regime.engines import EnginePool

    configs = {name: sysmod.replay_config(cfg, spec, plan["budgets"][name], dep,
                                          str(out / "model"))
               for name, spec in cfg.systems.items()}
    warm = {}
    if cfg.warmup_trace_requests:
        for name in cfg.systems:
            top = traces.get(cfg.seeds[0], round_rate(starts[name] * cfg.search.coarse_factor))
            warm[name] = top.iloc[:cfg.warmup_trace_requests].copy()
    with EnginePool(cfg.omp_threads, cfg.cpus) as pool:
        last: list[str] = []

        def probe(system: str, seed: int, rate: float) -> float:
            if not cfg.interleave and last and last[0] != system:
                pool.close(last[0])  # one engine alive at a time
            last[:] = [system]
            d = point_dir(out, "real", system, seed, rate)
            summary, info = pool.replay(system, configs[system], traces.get(seed, rate), d,
                                        str(trace_path(out, seed, rate)), warm.get(system))
            info.update(system=system, seed=seed, rate=rate,
                        async_scheduling=cfg.async_scheduling)
            (d / POINT_NAME).write_text(json.dumps(info, indent=2) + "\n")
            return float(summary["slo_attainment_request"])

        searches = search_all(cfg, plan, starts, probe, say, "engine ", cfg.interleave)
    write_searches(out / "real" / SEARCHES_NAME, searches)
    return searches


def step_ratio(run_dir: Path, dep: Deployment) -> float:
    """The median over a replay's steps of its span over the calibrated model's prediction: how
    fast the host ran the engine against the calibration (1: as calibrated)."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.fidelity.compare import step_residuals

    return float(step_residuals(run_dir, make_cost_model(dep))["ratio"].median())


def host_speed(cfg: EngineSweepConfig, dep: Deployment, out: Path) -> dict[str, Any]:
    """Every replay's ``step_ratio`` and their median over the stock systems' replays (the
    calibration's own kind of run; the plugin's own per-step time is not the host's): the
    factor the speed-corrected simulation (``sim-speed/``) charges the calibrated model at."""
    per = {f"{name}/seed{seed}/{rate_name(rate)}": step_ratio(
        point_dir(out, "real", name, seed, rate), dep)
        for name, seed, rate in probed_points(out, "real")
        if name in cfg.systems
        and (point_dir(out, "real", name, seed, rate) / "iterations.parquet").exists()}
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


def search_sim(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
               traces: Traces, say: Say | None = None, speed: float | None = None,
               noise: NoiseSpec | None = None) -> Searches:
    """The simulator's searches, from ``plan["start_rps"]``, each point on the calibrated
    deployment with each system's policy: deterministic (``sim/``); with ``speed``: charged at
    ``speed`` x the calibrated model while the policies still plan with it, as the real plugin
    did (``sim-speed/``); with ``noise``: charged with the engine's noise, seeded by the point's
    seed (``sim-noise/``)."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.sim.runner import simulate

    source = "sim" if speed is None else "sim-speed"
    if noise is not None:
        source = "sim-noise"
    charge = None if speed is None else make_cost_model(scaled(dep, speed))
    max_seqs = int(cfg.engine.get("max_num_seqs", 256))
    configs = {}
    for name, spec in cfg.systems.items():
        policy = sysmod.sim_policy(spec, plan["budgets"][name], max_seqs)
        # vLLM V1 recomputes preempted requests and never swaps (fidelity.run.simulate_run).
        configs[name] = ExperimentConfig(deployment=dep, policy=policy,
                                         sim=SimOptions(progress=False, swap_space_gb=0.0))

    def probe(system: str, seed: int, rate: float) -> float:
        ecfg = configs[system]
        if noise is not None:
            ecfg = ecfg.model_copy(update={"sim": SimOptions(
                progress=False, swap_space_gb=0.0,
                noise=noise.model_copy(update={"seed": seed}))})
        run = simulate(traces.get(seed, rate), ecfg, charge_cost=charge)
        run.config["trace"] = str(trace_path(out, seed, rate))
        if speed is not None:
            run.config["charged_at_speed"] = speed
        run.write(point_dir(out, source, system, seed, rate))
        return float(run.summary["slo_attainment_request"])

    starts = {name: float(plan["start_rps"]) for name in cfg.systems}
    searches = search_all(cfg, plan, starts, probe, None, source + " ", interleave=False)
    write_searches(out / source / SEARCHES_NAME, searches)
    if say is not None:
        n = sum(len(s.probes) for per in searches.values() for s in per.values())
        say(f"simulated the searches ({source}): {n} points; capacities "
            + ", ".join(f"{name} " + "/".join(f"{s.capacity()[0]:.3g}" for s in per.values())
                        for name, per in searches.items()))
    return searches


def predict_before(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
                   traces: Traces, say: Say | None = None) -> dict[str, float]:
    """The simulator's searches that need no replay of the sweep: deterministic (``sim/``) and
    with the noise fitted on the calibration replay (``sim-noise/``). Returns where each
    system's engine search starts: its seed-0 capacity with the noise (without it when no noise
    was fitted)."""
    fallback = float(plan["start_rps"])
    det = search_sim(cfg, plan, dep, out, traces, say)
    noise = fit_calibration_noise(out, dep)
    if noise is None:
        return first_capacities(det, fallback)
    if say is not None:
        say(f"noise fitted on the calibration replay ({NOISE_NAME}): step errors p10-p90 "
            f"{noise.step_quantiles[20]:.2f}-{noise.step_quantiles[180]:.2f}"  # type: ignore[index]
            " x the model")
    return first_capacities(search_sim(cfg, plan, dep, out, traces, say, noise=noise), fallback)


def predict_after(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
                  traces: Traces, say: Say | None = None) -> None:
    """The host's speed during the replays (``speed.json``) and the simulator's searches charged
    at it (``sim-speed/``)."""
    speed = host_speed(cfg, dep, out)
    (out / SPEED_NAME).write_text(json.dumps(speed, indent=2) + "\n")
    if say is not None:
        say(f"host speed during the replays: steps {speed['factor']:.2f} x the calibrated "
            f"model (median over the {speed['basis']})")
    search_sim(cfg, plan, dep, out, traces, say, speed=speed["factor"])


def simulate_sweep(cfg: EngineSweepConfig, plan: dict[str, Any], dep: Deployment, out: Path,
                   say: Say | None = None) -> None:
    """Every prediction again (``report --resimulate``; the replays and calibration stay)."""
    for source in PREDICTION_DIRS:
        if (out / source).is_dir():
            shutil.rmtree(out / source)
    traces = Traces(cfg, plan, dep, out)
    predict_before(cfg, plan, dep, out, traces, say)
    predict_after(cfg, plan, dep, out, traces, say)


def run_sweep(cfg: EngineSweepConfig, out: Path, say: Say | None = None) -> Path:
    """The whole sweep into ``out`` (cleared of an earlier sweep's files first)."""
    from accelgen.fidelity.run import MACHINE_NAME, machine_info, source_digests

    say = say or (lambda _m: None)
    out.mkdir(parents=True, exist_ok=True)
    for old in ("real", *PREDICTION_DIRS, "traces", CALIBRATION_DIR, PLAN_NAME, SPEED_NAME):
        p = out / old
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    (out / CONFIG_NAME).write_text(cfg.model_dump_json(indent=2) + "\n")
    (out / "sources.json").write_text(json.dumps(source_digests(), indent=2) + "\n")
    (out / MACHINE_NAME).write_text(json.dumps({**machine_info(), "cpus": cfg.cpus},
                                               indent=2) + "\n")
    dep, times = calibrate(cfg, out, say)
    plan = make_plan(cfg, dep, jitter_summary(times, cfg.jitter))
    (out / PLAN_NAME).write_text(json.dumps(plan, indent=2) + "\n")
    j = plan["jitter"]
    say(f"host jitter: {j['steps']} identical steps, p50 {j.get('p50_s', math.nan) * 1e3:.2f} "
        f"ms, p99 - p50 {j.get('jitter_s', math.nan) * 1e3:.2f} ms; tightest TBT class floor "
        f"{j['floor_s'] * 1e3:.1f} ms ({j['rule']}); TBT base "
        f"{plan['tbt_base'] * 1e3:.1f} ms (auto {plan['tbt_base_auto'] * 1e3:.1f} ms"
        + (", raised" if plan["tbt_base_raised"] else "") + ")")
    say(f"plan: S_pf {plan['s_pf']}, T_pf {plan['t_pf'] * 1e3:.1f} ms, TBT classes "
        + ", ".join(f"{v * 1e3:.0f} ms" for v in plan["tbt_classes"].values())
        + f"; capacity estimate {plan['estimate_rps']:.3g} req/s; rates searched in "
        f"{plan['rate_floor']:g}-{plan['rate_ceiling']:g}; tuned budget "
        f"{plan['tuned']['token_budget']}; budgets {plan['budgets']}")
    traces = Traces(cfg, plan, dep, out)
    starts = predict_before(cfg, plan, dep, out, traces, say)
    say("engine searches start at the simulator's seed-0 capacities: "
        + ", ".join(f"{k} {v:.3g}" for k, v in starts.items()))
    search_engine(cfg, plan, dep, traces, starts, out, say)
    predict_after(cfg, plan, dep, out, traces, say)
    return out
