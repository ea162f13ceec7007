"""Pipeline job resources and the runtime estimate from the measured full-size runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelgen.core.specs import load_yaml
from accelgen.pipeline.config_file import load
from accelgen.pipeline.estimate import estimate_measured
from accelgen.pipeline.grid import Grid
from accelgen.pipeline.resources import (
    MEASURED,
    REFERENCE_REQUESTS,
    job_resources,
    run_job,
    sim_mem_mb,
    sim_runtime_min,
    sim_seconds,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("policy", sorted(MEASURED))
def test_full_size_job_gets_more_than_was_measured(policy: str) -> None:
    cost = MEASURED[policy]
    assert sim_mem_mb(policy, REFERENCE_REQUESTS) >= cost.rss_mb
    assert sim_runtime_min(policy, REFERENCE_REQUESTS) * 60 >= cost.seconds
    assert sim_seconds(policy, REFERENCE_REQUESTS) == pytest.approx(cost.seconds)
    # Smaller jobs cost less, never less than the floor.
    assert sim_mem_mb(policy, 1000) <= sim_mem_mb(policy, REFERENCE_REQUESTS)
    assert sim_seconds(policy, 1000) < sim_seconds(policy, REFERENCE_REQUESTS)


def test_variants_cost_their_base_policy_and_a_search_its_points() -> None:
    assert sim_seconds("accelgen/order", 5000) == sim_seconds("accelgen", 5000)
    assert sim_seconds("accelgen/chunk", 5000) == sim_seconds("accelgen", 5000)
    # (slack order is asked at every iteration: priced on its own, above FIFO Sarathi-Serve)
    assert sim_seconds("sarathi-slack", 5000) > sim_seconds("sarathi", 5000)
    assert sim_runtime_min("oracle", 20000, 9) > sim_runtime_min("oracle", 20000, 1)


def test_paper_grid_jobs_and_estimate() -> None:
    grid = Grid(load(load_yaml(ROOT / "config" / "paper.yaml")))
    oracle = next(r for r in grid.runs() if grid.systems[r.system].policy == "oracle")
    policy, n, points = run_job(grid, oracle.variant, oracle.system)
    assert policy == "oracle" and points > 1 and n > 0
    res = job_resources(grid, oracle.variant, oracle.system)
    assert res["mem_mb"] >= 1000 and res["runtime"] >= 10
    text = estimate_measured(ROOT / "config" / "paper.yaml")
    assert "CPU-hours" in text and "by figure" in text and "evaluation" in text


def test_a_search_is_priced_by_its_time_over_accelgens_measured_beside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same search measured on a host twice as slow (AccelGen's job beside it twice as
    long too) gets the same price; a search twice AccelGen's job costs twice AccelGen's price
    on its workload, and the grid's full searches of that workload get that price (the paper
    workload's also prices the searches of workloads not measured on their own)."""
    from accelgen.pipeline import resources as res

    accelgen = sim_seconds("accelgen", REFERENCE_REQUESTS)
    slow = res.SearchMeasured(search_s=2.0 * 300.0, floor_s=2.0 * 150.0)
    fast = res.SearchMeasured(search_s=300.0, floor_s=150.0)
    assert res.oracle_search_seconds("base", slow) == pytest.approx(
        res.oracle_search_seconds("base", fast))
    assert res.oracle_search_seconds("base", fast) == pytest.approx(2.0 * accelgen)
    monkeypatch.setattr(res, "WORKLOAD_MEASURED",
                        {("w", "accelgen"): 50.0, ("w", "oracle"): 999.0})
    assert res.oracle_search_seconds("w", fast) == pytest.approx(100.0)
    monkeypatch.setattr(res, "ORACLE_SEARCH_MEASURED",
                        {("base", "opt-13b"): slow, ("w", "opt-13b"): fast})
    full = sim_seconds("oracle", REFERENCE_REQUESTS, res.ORACLE_SEARCH_POINTS)
    assert res.oracle_pruned_fraction() == pytest.approx(
        (2.0 * accelgen - res.STARTUP_S) / (full - res.STARTUP_S))
    assert res.workload_seconds("w", "oracle", 20000, res.ORACLE_SEARCH_POINTS) == \
        pytest.approx(100.0)
    grid = Grid(load(load_yaml(ROOT / "config" / "paper.yaml")))
    search = next(r for r in grid.runs() if r.variant == "base"
                  and grid.systems[r.system].search is not None
                  and run_job(grid, r.variant, r.system, r.deployment, r.seed)[2]
                  == res.ORACLE_SEARCH_POINTS)
    assert res.job_seconds(grid, search) == pytest.approx(2.0 * accelgen)


def test_scaled_paper_overlay_is_the_paper_grid_with_fewer_requests() -> None:
    """config/paper-scaled.yaml over config/paper.yaml (scripts/paper_scaled.sh): the same
    simulations and traces (a capacity sweep's rates are placed by its own traces' capacity
    estimate: the same points, other names), each of at most 100 requests, priced lower; lower
    still as forks of ``accelgen warm`` (how scripts/paper_scaled.sh runs it)."""
    from accelgen.pipeline.estimate import estimated_seconds, load_grid

    paper_cfg = ROOT / "config" / "paper.yaml"
    files = [paper_cfg, ROOT / "config" / "paper-scaled.yaml"]
    paper, _ = load_grid(paper_cfg)
    scaled, names = load_grid(files)
    assert names.endswith("config/paper-scaled.yaml")
    key = lambda r: (r.variant.split("-rate")[0], r.deployment, r.system, r.seed)  # noqa: E731
    assert sorted(map(key, scaled.runs())) == sorted(map(key, paper.runs()))
    assert len(scaled.traces()) == len(paper.traces()) and len(scaled.figures) == len(paper.figures)
    assert all(run_job(scaled, r.variant, r.system)[1] <= 100 for r in scaled.runs())
    assert estimated_seconds(files) < estimated_seconds(paper_cfg) / 2
    assert estimated_seconds(files, warm=True) < estimated_seconds(files) / 2


def test_warm_jobs_log_gives_the_simulations_cpu_time(tmp_path: Path) -> None:
    """``accelgen warm --jobs-log``'s lines (scripts/paper_scaled.sh): a simulation job's line
    is its run's row (the last one if it ran twice); failed jobs, traces and another results
    directory's simulations are not."""
    from accelgen.pipeline.estimate import measured_warm_times

    run = "runs/capacity-rate0.5/opt-13b-auto/vllm/seed0"
    lines = [
        {"argv": ["-m", "accelgen.cli", "simulate", "--out", f"results/x/{run}"], "exit": 0,
         "cpu_s": 9.0, "wall_s": 9.5},
        {"argv": ["-m", "accelgen.cli", "simulate", "--out", f"results/x/{run}"], "exit": 0,
         "cpu_s": 1.5, "wall_s": 1.6},
        {"argv": ["-m", "accelgen.cli", "oracle", "--out", f"results/x/{run}".replace(
            "vllm", "oracle")], "exit": 1, "cpu_s": 0.2, "wall_s": 0.2},
        {"argv": ["-m", "accelgen.cli", "trace", "--out", "data/x/traces/a/b/seed0.parquet"],
         "exit": 0, "cpu_s": 0.4, "wall_s": 0.4},
        {"argv": ["-m", "accelgen.cli", "simulate", "--out", f"results/y/{run}"], "exit": 0,
         "cpu_s": 3.0, "wall_s": 3.0},
    ]
    log = tmp_path / "jobs.jsonl"
    log.write_text("".join(json.dumps({**j, "cwd": str(tmp_path)}) + "\n" for j in lines))
    rows = measured_warm_times(log, tmp_path / "results" / "x")
    assert rows.to_dict("records") == [{"variant": "capacity-rate0.5", "deployment":
                                        "opt-13b-auto", "system": "vllm", "seed": 0, "s": 1.6,
                                        "cpu_time": 1.5}]


def test_one_simulation_under_two_names_runs_once_and_the_oracle_reads_its_floor() -> None:
    """The quick grid's tuned Sarathi-Serve budget equals a ladder budget at some rates: the two
    names share one results directory (one job); an Oracle search reads AccelGen's own run of
    its trace as its floor, and is priced without that point."""
    from accelgen.pipeline.grid import Run

    grid = Grid(load(load_yaml(ROOT / "config" / "quick.yaml")))
    runs = grid.runs()
    commands = [(tuple(grid.system_args(r.system, r.variant, r.deployment)), r.variant,
                 r.deployment, r.seed) for r in runs]
    assert len(set(commands)) == len(commands)
    shared = {a: b for a, b in grid.same_as.items() if a != b}
    assert shared and all(b in runs and a not in runs for a, b in shared.items())
    dirs = {r["system"]: r["dir"] for fig in grid.figures.values() for r in fig.runs
            if Run(r["variant"], r["deployment"], r["system"], r["seed"]) in shared}
    assert dirs and all(f"/{s}/" not in d for s, d in dirs.items())
    oracle = next(r for r in runs if grid.systems[r.system].search is not None)
    floor = grid.floor_run(oracle)
    assert floor is not None and grid.systems[floor.system].policy == "accelgen"
    assert (floor.variant, floor.deployment, floor.seed) == \
        (oracle.variant, oracle.deployment, oracle.seed)
    assert grid.floor_args(oracle) == ["--floor-run", grid.run_dir(floor)]
    with_floor = run_job(grid, oracle.variant, oracle.system, oracle.deployment, oracle.seed)
    assert with_floor[2] == run_job(grid, oracle.variant, oracle.system)[2] - 1
    assert grid.floor_run(floor) is None


def test_the_paper_config_runs_under_snakemake_as_written() -> None:
    """Snakemake merges ``--configfile config/paper.yaml`` over the Snakefile's quick config;
    the estimate reads it so (``load_grid``), and the paper config sets what it means: every
    simulation the same (policy, requests, search points) as the file read alone (a quick key
    leaking in once gave its Oracle the quick 2-point grid and figures 1-4 200 requests)."""
    from accelgen.pipeline.config_file import load_file
    from accelgen.pipeline.estimate import load_grid

    alone = Grid(load_file(ROOT / "config" / "paper.yaml"))
    merged, _ = load_grid(ROOT / "config" / "paper.yaml")

    def jobs(grid: Grid) -> list[tuple[object, ...]]:
        return sorted((r.variant, r.deployment, r.system, r.seed,
                       run_job(grid, r.variant, r.system, r.deployment, r.seed),
                       tuple(grid.system_args(r.system, r.variant, r.deployment)))
                      for r in grid.runs())

    assert jobs(merged) == jobs(alone)


def test_a_workload_measured_on_its_own_prices_its_jobs_from_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job on a workload measured on its own costs what was measured there (scaled by
    requests, the fixed part not); a policy not measured there its paper-trace price times a
    measured policy's ratio (AccelGen's for its family, else the mean); an Oracle search the
    same with its stopped candidates; a workload not measured is priced as before."""
    from accelgen.pipeline import resources as res

    monkeypatch.setattr(res, "WORKLOAD_MEASURED", {("w", "accelgen"): 42.0, ("w", "vllm"): 11.0,
                                                   ("w", "oracle"): 300.0})
    fixed = res.fixed_seconds("accelgen")
    assert res.workload_seconds("w", "accelgen", 20000, 1) == pytest.approx(42.0)
    assert res.workload_seconds("w", "accelgen/order", 10000, 1) == pytest.approx(
        fixed + (42.0 - fixed) / 2)
    assert res.workload_seconds("w", "oracle", 20000, res.ORACLE_SEARCH_POINTS) == \
        pytest.approx(300.0)
    ratio = (42.0 - fixed) / (sim_seconds("accelgen", REFERENCE_REQUESTS) - res.STARTUP_S)
    two_points = res.workload_seconds("w", "oracle", 20000, 2)
    assert two_points == pytest.approx(fixed + (sim_seconds("oracle", 20000, 2) - res.STARTUP_S)
                                       * ratio * res.oracle_pruned_fraction())
    vllm_ratio = (11.0 - res.fixed_seconds("vllm")) / (
        sim_seconds("vllm", REFERENCE_REQUESTS) - res.STARTUP_S)
    sarathi = res.workload_seconds("w", "sarathi", 20000, 1)
    assert sarathi == pytest.approx(res.fixed_seconds("sarathi") + (
        sim_seconds("sarathi", REFERENCE_REQUESTS) - res.STARTUP_S) * (ratio + vllm_ratio) / 2)
    assert res.workload_seconds("other", "accelgen", 20000, 1) is None


def test_a_noisy_capacity_job_of_accelgen_costs_what_noisy_jobs_measured() -> None:
    """Under noise the closed loop never rests (priced from its noisy jobs, above its noiseless
    price at low load); a policy not measured under noise is priced as without it, unscaled."""
    from accelgen.pipeline import resources as res

    lf = 0.03125
    for policy, table in res.NOISY_CAPACITY_MEASURED.items():
        measured = dict(table)[lf]
        assert res.capacity_seconds(policy, 1000, lf, noisy=True) == pytest.approx(measured)
    closed = res.capacity_seconds("accelgen-closed", 1000, lf, noisy=True)
    assert closed is not None and closed > res.capacity_seconds("accelgen-closed", 1000, lf)
    assert "vllm" not in res.NOISY_CAPACITY_MEASURED
    assert res.capacity_seconds("vllm", 1000, lf, noisy=True) == pytest.approx(
        res.CAPACITY_FIXED_S + res._interpolated(
            tuple((x, t - res.CAPACITY_FIXED_S) for x, t in res.CAPACITY_MEASURED["vllm"]), lf))


def test_a_capacity_job_is_priced_by_its_system_before_its_policy() -> None:
    """A tuned budget takes more iterations than its policy's own setting: a system measured on
    its own is priced from its jobs, its noisy copy of figure 18 as it; a system not measured
    from its policy's jobs."""
    from accelgen.pipeline import resources as res
    from accelgen.pipeline.grid import Run

    lf = 1.0
    tuned = res.capacity_seconds("vllm", 1000, lf, system="vllm-tuned")
    own = res.capacity_seconds("vllm", 1000, lf)
    assert tuned == pytest.approx(dict(res.CAPACITY_MEASURED["vllm-tuned"])[lf])
    assert own is not None and tuned != pytest.approx(own)
    assert res.capacity_seconds("vllm", 1000, lf, system="someone-elses-vllm") == own
    grid = Grid(load(load_yaml(ROOT / "config" / "paper.yaml")))
    noisy = next(r for r in grid.runs() if r.system.startswith("vllm-priority-tuned-noise"))
    assert grid.noise_of[noisy.system] == "vllm-priority-tuned"
    plain = Run(noisy.variant, noisy.deployment, "vllm-priority-tuned", noisy.seed)
    untuned = Run(noisy.variant, noisy.deployment, "vllm-priority", noisy.seed)
    assert res.job_seconds(grid, noisy) == res.job_seconds(grid, plain)
    assert res.job_seconds(grid, plain) != res.job_seconds(grid, untuned)
    # A tuned system of a user's own name costs what the paper config's tuned system does.
    cfg = load_yaml(ROOT / "config" / "paper.yaml")
    cfg["systems"]["my-vllm-priority"] = {"policy": "vllm-priority", "budget": "tuned"}
    cfg["experiments"]["capacity"]["systems"].append("my-vllm-priority")
    mine = Grid(load(cfg))
    renamed = Run(plain.variant, plain.deployment, "my-vllm-priority", plain.seed)
    assert res.job_seconds(mine, renamed) == res.job_seconds(grid, plain)


def test_a_job_of_longer_requests_or_a_search_gets_the_memory_it_holds() -> None:
    """The SLURM memory of a job covers what such jobs held (measured: AccelGen 2,632 MB,
    FastServe 1,685, vLLM 1,544 on the BookCorpus-only 20K-request trace); an Oracle search
    holds three runs at once (the floor, the best so far, the one running)."""
    from accelgen.pipeline import resources as res

    for policy, peak in (("accelgen", 2632), ("fastserve", 1685), ("vllm", 1544)):
        assert res.sim_mem_mb(policy, 20000, "base-only-bookcorpus") >= peak
        assert res.sim_mem_mb(policy, 20000, "base-only-bookcorpus") > res.sim_mem_mb(policy, 20000)
    one = res.sim_mem_mb("oracle", 20000, "base", 1)
    search = res.sim_mem_mb("oracle", 20000, "base", 12)
    assert search >= 1.5 * (res.BASE_MB + 3 * (res.MEASURED["oracle"].rss_mb - res.BASE_MB))
    assert search > one == res.sim_mem_mb("oracle", 20000)
    # (two points and the floor beside them: three runs too)
    assert res.sim_mem_mb("oracle", 20000, "base", 2) == search
