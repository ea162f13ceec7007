"""Runtime estimate of a config's grid: from per-job times measured on full-size runs
(``estimate_measured``, the default), or from the per-job times of a finished run (``estimate``).

Each simulation of the target config is matched to a measured one (same deployment and system,
else same system, else same policy, else the median of all) and scaled by the ratio of request
counts. Simulated time under overload grows about linearly with the number of requests, and so
does the number of iterations; schedulers whose per-decision cost grows with the queue (AccelGen,
the Oracle, FastServe) scale worse, so ``alpha`` > 1 gives a more pessimistic figure.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from accelgen.pipeline.config_file import load_files
from accelgen.pipeline.grid import SCENARIO_PREFIX, Grid

ConfigFiles = Path | str | Sequence[Path | str]


def load_grid(config: ConfigFiles) -> tuple[Grid, str]:
    """The grid Snakemake runs with ``--configfile`` one config file, or several merged in order
    (a later file's keys over the earlier ones', nested mappings merged, all over the
    Snakefile's config/quick.yaml: ``config_file.merged_files``); and their names."""
    files = [config] if isinstance(config, (str, Path)) else list(config)
    if not files:
        raise ValueError("no config file given")
    return Grid(load_files(files)), " + ".join(str(f) for f in files)


def _num_requests(grid: Grid, variant: str) -> int:
    if variant.startswith(SCENARIO_PREFIX):
        return 0  # a fixed scenario: same size in every config
    n = grid.variants[variant].get("num_requests")
    return int(n) if n else 0


def measured_times(bench_dir: Path | str) -> pd.DataFrame:
    """One row per simulation benchmark: variant, deployment, system, seed, s, cpu_time."""
    rows = []
    root = Path(bench_dir) / "runs"
    for f in sorted(root.glob("*/*/*/seed*.tsv")):
        variant, deployment, system = f.parts[-4], f.parts[-3], f.parts[-2]
        t = pd.read_csv(f, sep="\t")
        rows.append({"variant": variant, "deployment": deployment, "system": system,
                     "seed": int(f.stem.removeprefix("seed")), "s": float(t["s"].iloc[-1]),
                     "cpu_time": float(t["cpu_time"].iloc[-1]) if "cpu_time" in t else
                     float(t["s"].iloc[-1])})
    return pd.DataFrame(rows)


def measured_warm_times(jobs_log: Path | str, results_dir: Path | str) -> pd.DataFrame:
    """``measured_times``'s rows from the jobs log of ``accelgen warm --jobs-log`` (a warm job's
    benchmark file times the shim, not the fork): every simulation job (``--out`` under
    ``results_dir/runs``) that exited 0, its last line if it ran more than once."""
    root = Path(results_dir).resolve() / "runs"
    rows: dict[Path, dict[str, Any]] = {}
    for line in Path(jobs_log).read_text().splitlines():
        job = json.loads(line)
        argv = job["argv"]
        if job["exit"] != 0 or "--out" not in argv:
            continue
        out = Path(job["cwd"], argv[argv.index("--out") + 1]).resolve()
        if out.parent.parent.parent.parent != root:
            continue  # not a simulation of this run (a trace, a workload config)
        rows[out] = {"variant": out.parts[-4], "deployment": out.parts[-3],
                     "system": out.parts[-2], "seed": int(out.name.removeprefix("seed")),
                     "s": float(job["wall_s"]), "cpu_time": float(job["cpu_s"])}
    return pd.DataFrame(list(rows.values()),
                        columns=["variant", "deployment", "system", "seed", "s", "cpu_time"])


def estimated_seconds(config: ConfigFiles, warm: bool = False) -> float:
    """The estimate's total (CPU seconds of every simulation), as ``estimate_measured`` prices
    them: to compare with a finished run's measured times (scripts/paper_scaled.sh); ``warm``:
    every simulation forked by ``accelgen warm``."""
    from accelgen.pipeline.resources import job_seconds

    target, _ = load_grid(config)
    return sum(job_seconds(target, r, warm) for r in target.runs())


def estimate_measured(config: ConfigFiles, cores: int = 2, warm: bool = False) -> str:
    """The estimate from the per-job costs measured on full-size runs
    (``accelgen.pipeline.resources``): each simulation's policy, request count and search
    points priced by ``job_seconds`` (``warm``: with a fork's fixed part, as under
    ``accelgen warm``)."""
    from accelgen.pipeline.resources import (
        CAPACITY_MEASURED_ON,
        MEASURED,
        MEASURED_ON,
        NOISY_CAPACITY_MEASURED_ON,
        ORACLE_SEARCH_MEASURED,
        WORKLOAD_MEASURED,
        WORKLOAD_MEASURED_ON,
        base_policy,
        job_seconds,
        oracle_pruned_fraction,
        run_job,
    )

    target, names = load_grid(config)
    exp_of_run: dict[tuple[str, str, str, int], str] = {}
    for fig in target.figures.values():
        for ref in fig.runs:
            exp_of_run.setdefault((ref["variant"], ref["deployment"], ref["system"], ref["seed"]),
                                  fig.experiment)
    runs = target.runs()
    total = 0.0
    per_exp: dict[str, float] = defaultdict(float)
    per_policy: dict[str, float] = defaultdict(float)
    for run in runs:
        policy = run_job(target, run.variant, run.system)[0]
        t = job_seconds(target, run, warm)
        total += t
        per_exp[exp_of_run.get((run.variant, run.deployment, run.system, run.seed), "?")] += t
        per_policy[policy] += t
    unmeasured = sorted({base_policy(run_job(target, r.variant, r.system)[0]) for r in runs}
                        - set(MEASURED))
    lines = [f"{names}: {len(runs)} simulations, {len(target.traces())} traces, "
             f"{len(target.figures)} figures",
             f"estimated simulation time{' under accelgen warm' if warm else ''}: "
             f"{total / 3600:.1f} CPU-hours "
             f"(~{total / 3600 / cores:.1f} h on {cores} cores), per-job times measured on "
             f"full-size runs ({MEASURED_ON}; accelgen/pipeline/resources.py), scaled by requests; "
             f"the capacity sweep's jobs from jobs measured per system and load factor "
             f"({CAPACITY_MEASURED_ON}); the Oracle's searches of full-size traces at "
             f"{oracle_pruned_fraction():.2f}x their unpruned price, as "
             f"{len(ORACLE_SEARCH_MEASURED)} search(es) measured with candidates stopped "
             f"(ORACLE_SEARCH_MEASURED); the single-dataset workloads' jobs from "
             f"{len(WORKLOAD_MEASURED)} jobs measured on them ({WORKLOAD_MEASURED_ON}); "
             f"AccelGen's capacity jobs under noise from noisy jobs ({NOISY_CAPACITY_MEASURED_ON})"]
    if unmeasured:
        lines.append(f"  not measured, priced as the slowest measured policy: {', '.join(unmeasured)}")
    lines.append("by figure (experiment):")
    for exp, t in sorted(per_exp.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {exp:12s} {t / 3600:8.2f} CPU-hours")
    lines.append("by policy:")
    for pol, t in sorted(per_policy.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {pol:16s} {t / 3600:8.2f} CPU-hours")
    return "\n".join(lines)


def estimate(config: ConfigFiles, bench_dir: Path | str, cores: int = 2, alpha: float = 1.0,
             measured_config: Path | str | None = None, startup_s: float = 2.0) -> str:
    """``startup_s``: the fixed part of a job (interpreter and imports), not scaled."""
    target, names = load_grid(config)
    meas = measured_times(bench_dir)
    if meas.empty:
        raise ValueError(f"no benchmark files under {bench_dir}/runs (run the pipeline first)")
    src_cfg = measured_config or Path("config") / f"{Path(bench_dir).name}.yaml"
    source = Grid(load_files([src_cfg]))
    meas["n"] = [_num_requests(source, v) for v in meas["variant"]]
    # (measured seconds, measured request count) per (deployment, system) and per system.
    by_dep_sys: dict[tuple[str, str, bool], list[tuple[float, int]]] = defaultdict(list)
    by_sys: dict[tuple[str, bool], list[tuple[float, int]]] = defaultdict(list)
    for r in meas.itertuples():
        scen = r.variant.startswith(SCENARIO_PREFIX)
        by_dep_sys[(r.deployment, r.system, scen)].append((r.s, r.n))
        by_sys[(r.system, scen)].append((r.s, r.n))
    everything = [v for vals in by_sys.values() for v in vals if v[1]]

    def scaled(vals: list[tuple[float, int]], n: int) -> float:
        return statistics.median(
            min(t, startup_s) + max(t - startup_s, 0.0) * ((n / m) ** alpha if n and m else 1.0)
            for t, m in vals)

    total = 0.0
    per_exp: dict[str, float] = defaultdict(float)
    runs = target.runs()
    exp_of_run: dict[tuple[str, str, str, int], str] = {}
    for fig in target.figures.values():
        for ref in fig.runs:
            exp_of_run.setdefault((ref["variant"], ref["deployment"], ref["system"], ref["seed"]),
                                  fig.experiment)
    def points(grid: Grid, system: str) -> int:
        from accelgen.experiments.oracle_search import DEFAULT_GRID, grid_points

        spec = grid.systems.get(system)
        if spec is None or spec.policy != "oracle":
            return 1
        return len(grid_points(spec.search or DEFAULT_GRID)) + 1  # + AccelGen's (the floor)

    for run in runs:
        scen = run.variant.startswith(SCENARIO_PREFIX)
        n = _num_requests(target, run.variant)
        base = run.system.split("-slo")[0].split("-systemslo")[0]
        vals = (by_dep_sys.get((run.deployment, run.system, scen))
                or by_dep_sys.get((run.deployment, base, scen))
                or by_sys.get((run.system, scen)) or by_sys.get((base, scen)) or everything)
        t = scaled(vals, n)
        if run.system in source.systems:  # an Oracle search over a larger grid costs more
            t *= points(target, run.system) / points(source, run.system)
        total += t
        per_exp[exp_of_run.get((run.variant, run.deployment, run.system, run.seed), "?")] += t
    lines = [f"{names}: {len(runs)} simulations, {len(target.traces())} traces, "
             f"{len(target.figures)} figures",
             f"estimated simulation time: {total / 3600:.1f} CPU-hours "
             f"(~{total / 3600 / cores:.1f} h on {cores} cores), from {len(meas)} measured jobs "
             f"in {bench_dir}: {startup_s:g} s startup + the rest scaled by "
             f"(requests / measured requests)^{alpha:g}"]
    for exp, t in sorted(per_exp.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {exp:12s} {t / 3600:8.2f} CPU-hours")
    return "\n".join(lines)
