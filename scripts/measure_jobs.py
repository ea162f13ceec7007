"""Run a sample of a config's simulation jobs as the pipeline runs them (the same `accelgen trace`
and simulation commands, one process each) and compare each job's measured CPU time with the
runtime estimate's (``accelgen.pipeline.resources.job_seconds``). Also the fixed part of a job:
the CPU time of the simulation command on a 1-request trace (interpreter, imports, I/O).

    python scripts/measure_jobs.py config/paper.yaml --sample 24 --work /tmp/jobs
    python scripts/measure_jobs.py config/paper.yaml config/paper-scaled.yaml --sample 24

Prints one line per job (policy, requests, measured CPU s, estimated s, peak memory and the
SLURM mem_mb it would get) and the totals; the sample is every ``len(runs) / sample``-th run
of the grid in its order, over all experiments.
Synthetic workloads and built-in deployments only (no downloads, no profile stage).

``--reference`` runs the job every per-job table is measured against (AccelGen on OPT-13B's
paper trace, seed 0) before and after the sample: the host's speed of the session is their mean
over its price, and the sample's CPU times over it are in the tables' units (the host's speed
changes 1.6-1.9x between sessions); each system's capacity-sweep jobs are printed as a row of
``CAPACITY_MEASURED``.

``--checkout DIR`` also runs every sampled job on another source tree (e.g. a clone
of the build before a change), alternating the two trees job by job, and prints both CPU times,
their ratio and whether the two runs' results files are byte-identical; ``--policies`` keeps the
runs of those policies:

    python scripts/measure_jobs.py config/paper.yaml --only capacity --per-policy --sample 4 \
        --policies vllm sarathi --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


class Measured(NamedTuple):
    cpu_s: float  # user + system
    rss_mb: float  # peak resident memory


def _run(cmd: list[str], log: Path, tree: Path | None = None) -> Measured:
    """CPU seconds (user + system) and peak memory of one command, its output in ``log``; with
    ``tree``, on that source tree (``python -m`` puts the working directory first on the path,
    so the command runs there too)."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tree)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return Measured(usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)  # (KiB on Linux)


def evenly_spaced(runs: list[Any], sample: int,
                  group: Callable[[Any], str] | None = None) -> list[Any]:
    """``sample`` of ``runs`` evenly spaced in their order (every ``len / sample``-th from the
    first); with ``group``, ``sample`` of each group's runs (the groups in order of first run)."""
    if group is None:
        return runs[::max(1, len(runs) // sample)][:sample]
    groups: dict[str, list[Any]] = {}
    for r in runs:
        groups.setdefault(group(r), []).append(r)
    return [r for rs in groups.values() for r in evenly_spaced(rs, sample)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="+", help="config file(s), merged in order")
    ap.add_argument("--sample", type=int, default=24, help="simulation jobs to run")
    ap.add_argument("--only", help="only runs whose variant starts with this")
    ap.add_argument("--per-policy", action="store_true",
                    help="--sample runs of each policy (evenly spaced in the grid's order) "
                         "instead of --sample runs in all")
    ap.add_argument("--per-system", action="store_true",
                    help="--sample runs of each system (a tuned variant apart from its policy)")
    ap.add_argument("--startup-repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/measure_jobs"))
    ap.add_argument("--checkout", type=Path,
                    help="another source tree to run every job on too, alternating")
    ap.add_argument("--policies", nargs="+", metavar="POLICY",
                    help="only the runs of these policies (base names: vllm, accelgen, ...)")
    ap.add_argument("--systems", nargs="+", metavar="SYSTEM", help="only these systems")
    ap.add_argument("--reference", action="store_true",
                    help="run the tables' reference job (AccelGen on OPT-13B's paper trace, "
                         "seed 0; a full-size config's) before and after the sample, and give "
                         "the sample in the tables' units: its CPU time over the host's speed "
                         "of the session, each system's capacity jobs as a row of CAPACITY_MEASURED")
    ap.add_argument("--speed-out", type=Path, metavar="JSON",
                    help="with --reference: write the host's speed there (the reference job's "
                         "CPU s before and after, its price, their ratio), for "
                         "scripts/paper_scaled.sh --reference")
    ap.add_argument("--deployments", nargs="+", metavar="NAME", help="only these deployments")
    ap.add_argument("--seeds", nargs="+", type=int, metavar="SEED", help="only these seeds")
    a = ap.parse_args(argv)
    if a.speed_out is not None and not a.reference:
        ap.error("--speed-out needs --reference (the speed is the reference job's)")
    if a.reference and a.checkout is not None:
        ap.error("--reference and --checkout: a side-by-side comparison is a ratio of two "
                 "trees measured together and needs no reference job; use one of them")

    from accelgen.pipeline.estimate import load_grid
    from accelgen.pipeline.grid import Run
    from accelgen.pipeline.resources import base_policy, job_resources, job_seconds, run_job

    grid, names = load_grid(a.config)
    py = sys.executable
    work = a.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    deployments: dict[str, Path] = {}
    traces: dict[tuple[str, str, int], Path] = {}

    def deployment_yaml(dep: str) -> Path:
        if dep not in deployments:
            out = work / "deployments" / f"{dep}.yaml"
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([py, "-m", "accelgen.pipeline", "write-yaml", "--spec",
                            grid.deployment_spec_json(dep), "--out", str(out)], check=True,
                           stdout=subprocess.DEVNULL)
            deployments[dep] = out
        return deployments[dep]

    def trace(variant: str, dep: str, seed: int) -> Path:
        key = (variant, dep, seed)
        if key not in traces:
            wl = work / "workloads" / f"{variant}.yaml"
            wl.parent.mkdir(parents=True, exist_ok=True)
            if not wl.exists():
                subprocess.run([py, "-m", "accelgen.pipeline", "write-yaml", "--spec",
                                grid.workload_spec_json(variant), "--out", str(wl)], check=True,
                               stdout=subprocess.DEVNULL)
            out = work / "traces" / variant / dep / f"seed{seed}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([py, "-m", "accelgen.cli", "trace", "--config", str(wl), "--out",
                            str(out), "--seed", str(seed), *grid.trace_args(variant, dep)],
                           check=True, stdout=subprocess.DEVNULL)
            traces[key] = out
        return traces[key]

    def simulate(run: Run, trace_file: Path, tag: str, tree: Path | None = None) -> Measured:
        """CPU seconds and peak memory of the run's job (on ``tree``'s sources when given); an
        Oracle search
        reads its floor (AccelGen's own run, simulated first and not counted) as the
        pipeline's does."""
        v, d, s, sd = run.variant, run.deployment, run.system, run.seed
        floor = grid.floor_run(run)
        extra = []
        if floor is not None:
            simulate(floor, trace_file, tag, tree)
            extra = ["--floor-run", str(work / "runs" / tag / v / d / floor.system / f"seed{sd}")]
        cmd = [py, *grid.system_args(s, v, d), *extra, "--trace", str(trace_file), "--config",
               str(deployment_yaml(d)), "--seed", str(sd), "--out",
               str(work / "runs" / tag / v / d / s / f"seed{sd}")]
        return _run(cmd, work / "logs" / f"{tag}-{v}-{d}-{s}-{sd}.log", tree)

    def same_results(run: Run, tag: str, other: str) -> bool:
        where = Path(run.variant) / run.deployment / run.system / f"seed{run.seed}"
        return all((work / "runs" / tag / where / f).read_bytes()
                   == (work / "runs" / other / where / f).read_bytes()
                   for f in ("requests.parquet", "iterations.parquet", "summary.json"))

    load_factor: dict[Run, float] = {}
    for fig in grid.figures.values():
        for ref in fig.runs:
            if "load_factor" in ref:
                load_factor[grid.same_as[Run(ref["variant"], ref["deployment"], ref["system"],
                                             ref["seed"])]] = ref["load_factor"]

    runs = [r for r in grid.runs() if not r.variant.startswith("scenario")
            and (a.only is None or r.variant.startswith(a.only))
            and (a.policies is None
                 or base_policy(run_job(grid, r.variant, r.system)[0]) in a.policies)
            and (a.systems is None or r.system in a.systems)
            and (a.deployments is None or r.deployment in a.deployments)
            and (a.seeds is None or r.seed in a.seeds)]
    if a.per_system:
        sample = evenly_spaced(runs, a.sample, lambda r: r.system)
    elif a.per_policy:
        sample = evenly_spaced(runs, a.sample,
                               lambda r: base_policy(run_job(grid, r.variant, r.system)[0]))
    else:
        sample = evenly_spaced(runs, a.sample)

    reference = Run(*REFERENCE_RUN)
    if a.reference and reference not in set(grid.runs()):
        ap.error(f"--reference: {names} has no reference job ({'/'.join(REFERENCE_RUN[:3])}, "
                 f"seed {reference.seed})")
    # The fixed part: the first sampled run's command on a 1-request trace.
    import pandas as pd

    first = sample[0]
    one = work / "one.parquet"
    pd.read_parquet(trace(first.variant, first.deployment, first.seed)).head(1).to_parquet(one)
    fixed = [simulate(first, one, f"startup{i}").cpu_s for i in range(a.startup_repeats)]
    print(f"fixed part ({first.system}, 1 request): CPU s {', '.join(f'{x:.2f}' for x in fixed)}"
          f" (median {statistics.median(fixed):.2f})")
    checkout = a.checkout.resolve() if a.checkout is not None else None
    if checkout is not None:
        return _side_by_side(sample, checkout, trace, simulate, same_results, grid, load_factor,
                             names)

    def reference_cpu_s(tag: str) -> float:
        tf = trace(reference.variant, reference.deployment, reference.seed)
        return simulate(reference, tf, tag).cpu_s

    ref_cpu = [reference_cpu_s("reference-before")] if a.reference else []
    tot_m = tot_e = 0.0
    over = 0  # jobs whose peak memory exceeded their SLURM mem_mb
    measured: list[tuple[str, float, float]] = []  # (system, load factor, CPU s)
    print(f"{'variant':28s} {'deployment':16s} {'system':22s} {'policy':16s} {'n':>6s} "
          f"{'pts':>3s} {'load':>9s} {'cpu_s':>8s} {'est_s':>8s} {'rss_mb':>7s} {'mem_mb':>7s}")
    for r in sample:
        tf = trace(r.variant, r.deployment, r.seed)
        got = simulate(r, tf, "job")
        policy, n, pts = run_job(grid, r.variant, r.system, r.deployment, r.seed)
        est = job_seconds(grid, r)
        mem = job_resources(grid, r.variant, r.system, r.deployment, r.seed)["mem_mb"]
        over += got.rss_mb > mem
        tot_m += got.cpu_s
        tot_e += est
        measured.append((r.system, load_factor.get(r, math.nan), got.cpu_s))
        print(f"{r.variant:28s} {r.deployment:16s} {r.system:22s} {policy:16s} {n:6d} {pts:3d} "
              f"{load_factor.get(r, math.nan):9.4g} {got.cpu_s:8.2f} {est:8.2f} "
              f"{got.rss_mb:7.0f} {mem:7d}", flush=True)
    print(f"measure_jobs: {names}: {len(sample)} of {len(runs)} simulation jobs measured "
          f"{tot_m:.1f} CPU s, the estimate {tot_e:.1f} s ({tot_e / tot_m - 1:+.0%} of measured); "
          f"{over} above their SLURM mem_mb")
    if a.reference:
        ref_cpu.append(reference_cpu_s("reference-after"))
        price = job_seconds(grid, reference)
        speed = host_speed(ref_cpu, price)
        for line in table_rows(measured, speed):
            print(line)
        print(f"measure_jobs: reference job {ref_cpu[0]:.1f} CPU s before, {ref_cpu[1]:.1f} "
              f"after, priced {price:.2f}: the host at {speed:.3f}x the "
              f"tables' time; the sample {tot_m / speed:.1f} CPU s in the tables' units, the "
              f"estimate {tot_e:.1f} ({tot_e / (tot_m / speed) - 1:+.0%})")
        if a.speed_out is not None:
            write_speed(a.speed_out, ref_cpu, price)
    return 0


def host_speed(reference_cpu_s: list[float], price: float) -> float:
    """CPU seconds per second of the tables: the reference job's mean CPU time over its price."""
    return statistics.mean(reference_cpu_s) / price


def write_speed(path: Path, reference_cpu_s: list[float], price: float) -> None:
    """The host's speed as JSON: the reference job's CPU seconds (before and after), its price
    in the tables' units, and ``host_speed`` of them (``speed``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"reference_cpu_s": reference_cpu_s, "price_s": price,
                                "speed": host_speed(reference_cpu_s, price)}) + "\n")


# The job every per-job table is measured against (``accelgen.pipeline.resources``: its price
# is the unit): (variant, deployment, system, seed).
REFERENCE_RUN = ("base", "opt-13b", "accelgen", 0)


def table_rows(measured: list[tuple[str, float, float]], speed: float) -> list[str]:
    """Each system's jobs (system, load factor, CPU s) as a row of the capacity tables
    (``CAPACITY_MEASURED``): the mean CPU time per load factor over ``speed``, load factors
    ascending (jobs without one left out)."""
    by_system: dict[str, dict[float, list[float]]] = {}
    for system, lf, cpu_s in measured:
        if not math.isnan(lf):
            by_system.setdefault(system, {}).setdefault(lf, []).append(cpu_s / speed)
    return [f'    "{system}": (' + ", ".join(f"({lf!r}, {statistics.mean(v):.2f})"
                                             for lf, v in sorted(points.items()))
            + ("," if len(points) == 1 else "") + "),"  # (a one-point table is still a tuple)
            for system, points in by_system.items()]


def _side_by_side(sample: list[Any], checkout: Path, trace: Any, simulate: Any,
                  same_results: Any, grid: Any, load_factor: dict[Any, float],
                  names: str) -> int:
    """Every sampled job on this tree and on ``checkout``, alternating which runs first."""
    from accelgen.pipeline.resources import run_job

    here = Path(__file__).resolve().parent.parent
    print(f"{'system':22s} {'policy':16s} {'deployment':16s} {'load':>9s} {'this_s':>8s} "
          f"{'other_s':>8s} {'ratio':>6s} identical")
    tot_this = tot_other = 0.0
    differ = 0
    for i, r in enumerate(sample):
        tf = trace(r.variant, r.deployment, r.seed)
        order = [("this", here), ("other", checkout)]
        cpu = {tag: simulate(r, tf, tag, tree).cpu_s for tag, tree in (order if i % 2 == 0
                                                                       else order[::-1])}
        same = same_results(r, "this", "other")
        differ += not same
        tot_this += cpu["this"]
        tot_other += cpu["other"]
        policy = run_job(grid, r.variant, r.system, r.deployment, r.seed)[0]
        print(f"{r.system:22s} {policy:16s} {r.deployment:16s} "
              f"{load_factor.get(r, math.nan):9.4g} {cpu['this']:8.2f} {cpu['other']:8.2f} "
              f"{cpu['other'] / cpu['this']:6.2f} {same}", flush=True)
    print(f"measure_jobs: {names}: {len(sample)} jobs on this tree and on {checkout}: "
          f"{tot_this:.1f} vs {tot_other:.1f} CPU s ({tot_other / tot_this:.2f}x); "
          f"{len(sample) - differ} with identical results, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
