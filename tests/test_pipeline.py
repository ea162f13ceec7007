"""The Snakemake pipeline: lint, dry runs of the quick and paper configs, config errors that stop
everything before any job runs, the generated schema, and incremental re-runs on a tiny grid."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelgen.pipeline import config as pc
from accelgen.pipeline.grid import Grid

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
QUICK = ROOT / "config" / "quick.yaml"
PAPER = ROOT / "config" / "paper.yaml"


def snakemake(*args: str, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def job_counts(out: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    counts: dict[str, int] = {}
    m = re.search(r"Job stats:\n(.*?)\n\n", out, re.S)
    if not m:
        return counts
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def quick_dict() -> dict:
    return yaml.safe_load(QUICK.read_text())


# ----------------------------------------------------------------------------------------------
def test_schema_is_up_to_date():
    on_disk = (ROOT / "config" / "schema.json").read_text()
    assert on_disk == pc.json_schema_text(), (
        "config/schema.json is stale: run `python -m accelgen.pipeline schema "
        "--out config/schema.json`")


@pytest.mark.parametrize("path", [QUICK, PAPER], ids=["quick", "paper"])
def test_configs_validate_and_expand(path):
    grid = Grid(pc.load_file(path))
    keys = set(grid.figures)
    assert {f"fig{i:02d}" for i in range(1, 13)} <= keys, "every figure of SPEC section 8"
    assert grid.runs() and grid.traces()
    # Every run has a trace; system names are path-safe.
    traces = set(grid.traces())
    for run in grid.runs():
        assert grid.trace_path(run.variant, run.deployment, run.seed) in traces
        assert pc.SEGMENT_RE.match(run.system), run.system


def test_paper_config_is_the_paper_setup():
    cfg = pc.load_file(PAPER)
    assert cfg.workload.num_requests == 20000
    assert cfg.workload.arrival.rate == 8.0
    ev = cfg.experiments.evaluation
    assert set(ev.deployments) == {"opt-13b", "opt-175b", "llama-13b", "llama-3-70b"}
    assert {"vllm", "orca", "fastgen", "sarathi", "fastserve", "accelgen", "oracle"} <= \
        set(ev.systems)
    assert len(cfg.seeds) == 3


BAD = {
    "unknown policy": ({"systems": {"vllm": {"policy": "fastgn"}}}, "systems.vllm.policy"),
    "negative rate": ({"workload": {"arrival": {"rate": -1.0}}}, "workload.arrival.rate"),
    "missing trace file": ({"workload": {"kind": "vidur_csv", "path": "data/no/such/trace.csv",
                                         "sampling": "sequential", "num_requests": None}},
                           "workload.path"),
    "unknown deployment": ({"experiments": {"evaluation": {"deployments": ["opt-13"]}}},
                           "experiments.evaluation.deployments[0]"),
    "bad policy parameter": ({"systems": {"accelgen": {"policy": "accelgen",
                                                       "params": {"gamma": -3}}}},
                             "systems.accelgen.params"),
    "typo in a key": ({"experiments": {"ablation": {"sytems": ["accelgen"]}}},
                      "experiments.ablation.sytems"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_config_names_the_key(case):
    over, key = BAD[case]
    data = pc.deep_merge(quick_dict(), over)
    with pytest.raises(pc.PipelineConfigError) as err:
        pc.load(data)
    assert key in str(err.value), str(err.value)


# Errors only the grid's expansion shows (a derived workload), raised when the Grid is built.
BAD_GRID = {
    "long-prompt shares of a non-synthetic workload": (
        {"workload_variants": {"small": {"kind": "vidur_csv",
                                         "path": "tests/fixtures/workloads/vidur.csv",
                                         "sampling": "sequential", "num_requests": None}}},
        "experiments.sensitivity.long_fractions: needs a synthetic workload"),
}


@pytest.mark.parametrize("case", list(BAD_GRID), ids=list(BAD_GRID))
def test_bad_derived_workload_names_the_key(case):
    over, key = BAD_GRID[case]
    cfg = pc.load(pc.deep_merge(quick_dict(), over))
    with pytest.raises(pc.PipelineConfigError) as err:
        Grid(cfg)
    assert str(err.value).startswith("invalid pipeline config:") and key in str(err.value)


@pytest.mark.parametrize("case", ["unknown policy", "negative rate", "missing trace file",
                                  *BAD_GRID])
def test_bad_config_stops_snakemake_before_any_job(case, tmp_path):
    over, key = {**BAD, **BAD_GRID}[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(pc.deep_merge(quick_dict(), over)))
    res = snakemake("-n", "--configfile", str(bad))
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert key in out, out[-3000:]
    assert "Building DAG" not in out and "Job stats" not in out


def test_lint_is_clean():
    res = snakemake("--lint")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Congratulations, your workflow is in a good condition" in res.stdout + res.stderr


def test_lint_is_clean_with_the_vllm_backend():
    res = snakemake("--lint", "--config", "backend=vllm")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "good condition" in res.stdout + res.stderr


@pytest.mark.parametrize("path", [QUICK, PAPER], ids=["quick", "paper"])
def test_dry_run_plans_the_grid(path):
    res = snakemake("-n", "--configfile", str(path), "--forceall")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    counts = job_counts(res.stdout)
    grid = Grid(pc.load_file(path))
    assert counts.get("simulate") == len(grid.runs())
    assert counts.get("trace") == len(grid.traces())
    assert counts.get("aggregate") == len(grid.figures) + 1  # + claims.csv
    fidelity = int(grid.cfg.fidelity_on)  # notebook_fidelity (rules/fidelity.smk)
    assert sum(v for k, v in counts.items() if k.startswith("notebook_")) == \
        len(grid.groups()) + fidelity
    assert counts.get("fidelity_run", 0) == fidelity


# ----------------------------------------------------------------------------------------------
def tiny_config() -> dict:
    """Two 12-request simulations feeding figures 1-4 (others switched off)."""
    data = copy.deepcopy(quick_dict())
    data.update(
        name="citest", figures_dir="figs", seeds=[0],
        workload_variants={"tiny": {"num_requests": 12}},
        deployments={"opt-13b": {"label": "OPT-13B"}},
        systems={"vllm": {"policy": "vllm", "label": "vLLM"},
                 "sarathi": {"policy": "sarathi", "label": "Sarathi-Serve"}},
    )
    exps = {k: None for k in pc.Experiments.model_fields}
    exps["measurement"] = {"workload": "tiny", "deployments": ["opt-13b"],
                           "systems": ["vllm", "sarathi"]}
    data["experiments"] = exps
    return data


def test_rerun_does_nothing_and_deleting_a_result_reruns_only_its_dependents(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("config", "notebooks"):
        (work / name).symlink_to(ROOT / name)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config()))
    common = ["-s", str(ROOT / "Snakefile"), "-d", str(work), "--configfile", str(cfg)]
    # `results` (every trace and simulation: part of the default target) + one figure's CSV.
    targets = ["results", "figs/fig04_slo_attainment.csv"]
    res = snakemake(*common, "--cores", "2", *targets, cwd=work)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert (work / targets[1]).exists()

    again = snakemake(*common, "-n", *targets, cwd=work)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]

    run_dir = work / "results/citest/runs/tiny/opt-13b/vllm/seed0"
    (run_dir / "summary.json").unlink()
    res = snakemake(*common, "-n", *targets, cwd=work)
    assert res.returncode == 0
    counts = job_counts(res.stdout)
    counts.pop("results", None)  # the target rule itself
    assert counts == {"simulate": 1, "aggregate": 1}, res.stdout[-3000:]
    assert "system=sarathi" not in res.stdout  # the other simulation is left alone
