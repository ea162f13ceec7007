"""The Snakemake pipeline: lint, dry runs of the quick and paper configs, config errors that stop
everything before any job runs, the generated schema, and incremental re-runs on a tiny grid."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelgen.pipeline import config_file as pc
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


def assert_plans_the_grid(counts: dict[str, int], path: Path) -> None:
    """A dry run's job counts (``job_counts``) of the config file ``path`` with nothing built are
    the grid's: every simulation, trace, figure and notebook, once."""
    grid = Grid(pc.load_file(path))
    assert counts.get("simulate") == len(grid.runs())
    assert counts.get("trace") == len(grid.traces())
    assert counts.get("aggregate") == len(grid.figures) + 1  # + claims.csv
    fidelity = int(grid.cfg.fidelity_on)  # notebook_fidelity (rules/fidelity.smk)
    # notebook_engine (rules/engine.smk) when the engine sweep is part of the default target
    engine = int(grid.cfg.engine_on and grid.cfg.engine is not None
                 and grid.cfg.engine.in_default_target)
    assert sum(v for k, v in counts.items() if k.startswith("notebook_")) == \
        len(grid.groups()) + fidelity + engine
    assert counts.get("fidelity_run", 0) == fidelity
    assert counts.get("engine_run", 0) == engine


def test_dry_run_plans_the_grid():
    """The quick config; the paper config's plan (thousands of jobs, a DAG of half a minute) is
    checked where the docs' command lines are dry-run, from the same DAG
    (tests/test_doc_commands.py)."""
    res = snakemake("-n", "--configfile", str(QUICK), "--forceall")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_plans_the_grid(job_counts(res.stdout), QUICK)


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


# ----------------------------------------------------------------------------------------------
def project_venv(dest: Path) -> Path:
    """A venv inside a working copy, as `.venv` is, whose packages are this interpreter's (a .pth
    file): its interpreter path moves with the working copy. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next(dest.glob("lib/python*/site-packages"))
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in sys.path
                    if d.endswith("site-packages"))
    (site / "zz_test_packages.pth").write_text(lines)
    return dest / "bin" / "python"


@pytest.mark.slow
def test_reruns_follow_changes_not_saves_or_moves(tmp_path):
    """On a tiny grid run in a checkout with its own .venv: a re-run does nothing; a notebook
    saved with outputs re-runs nothing; after the checkout moves, nothing; a code change in a
    notebook re-runs that notebook; a deleted result re-runs exactly what depends on it."""
    first = tmp_path / "checkout"
    first.mkdir()
    for name in ("Snakefile", "environment.yml"):
        shutil.copy2(ROOT / name, first / name)
    for name in ("rules", "config", "notebooks", "profiles/default"):
        shutil.copytree(ROOT / name, first / name)
    python = project_venv(first / ".venv")
    (first / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()))

    def plan(where: Path, *targets: str, cores: str | None = None) -> subprocess.CompletedProcess:
        args = ["--cores", cores] if cores else ["-n"]
        return subprocess.run(
            [str(where / ".venv/bin/python"), "-m", "snakemake", *args, "--configfile",
             "tiny.yaml", "--", *(targets or ("results", "fig04"))], cwd=where,
            capture_output=True, text=True, timeout=600)

    res = plan(first, cores="2")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert python.exists()
    res = plan(first)
    assert "Nothing to be done" in res.stdout + res.stderr, res.stdout[-3000:]
    # The notebook saved after a run without the save hook (e.g. by another editor): the
    # executed copy's outputs and kernel details in the tracked file.
    tracked = first / "notebooks/measurement.ipynb"
    nb = json.loads(tracked.read_text())
    run = json.loads((first / "logs/citest/notebooks/measurement.ipynb").read_text())
    by_id = {c["id"]: c for c in run["cells"]}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell.update(outputs=by_id[cell["id"]]["outputs"],
                        execution_count=by_id[cell["id"]]["execution_count"])
    nb["metadata"] = run["metadata"]
    assert sum(len(c.get("outputs", [])) for c in nb["cells"]) >= 4
    tracked.write_text(json.dumps(nb, indent=1))
    res = plan(first)
    assert "Nothing to be done" in res.stdout + res.stderr, res.stdout[-3000:]

    moved = tmp_path / "renamed"
    first.rename(moved)
    res = plan(moved)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Nothing to be done" in res.stdout + res.stderr, res.stdout[-3000:]

    nb = json.loads((moved / "notebooks/measurement.ipynb").read_text())
    setup = next(c for c in nb["cells"] if "P.setup()" in "".join(c["source"]))
    setup["source"] = [*setup["source"], "\nprint('edited')"]
    (moved / "notebooks/measurement.ipynb").write_text(json.dumps(nb))
    counts = job_counts(plan(moved).stdout)
    assert counts.get("notebook_measurement") == 1, counts
    assert not {"simulate", "trace", "aggregate"} & set(counts), counts

    (moved / "results/citest/runs/tiny/opt-13b/vllm/seed0/summary.json").unlink()
    res = plan(moved, "results", "figs/fig04_slo_attainment.csv")
    counts = job_counts(res.stdout)
    counts.pop("results", None)  # the target rule itself
    assert counts == {"simulate": 1, "aggregate": 1}, res.stdout[-3000:]
    assert "system=sarathi" not in res.stdout  # the other simulation is left alone


# Jobs that take minutes to hours; every other rule takes seconds and runs on the submit host of
# a cluster (`localrule: True`), where queueing it would cost more than running it. A trace of
# downloaded datasets (config/gpu.yaml) tokenizes them: a job of its own; `download` stays local
# (compute nodes often have no internet).
CLUSTER_RULES = {
    "sim": ({"backend": "sim"}, [], {"simulate", "fidelity_run", "engine_run"}),
    "vllm": ({"backend": "vllm"}, [], {"replay", "fidelity_run", "engine_run"}),
    "gpu": ({}, ["config/gpu.yaml"], {"profile", "trace", "replay"}),
}


# The rules a cluster executor would submit (not local, not target-only), from Snakemake's parsed
# workflow. In a subprocess: a parsed workflow left in this process confuses vLLM's module scan.
REMOTE_RULES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import (ConfigSettings, OutputSettings, ResourceSettings,
                                      StorageSettings)
config, configfiles = json.loads(sys.argv[1]), [Path(p) for p in json.loads(sys.argv[2])]
with SnakemakeApi(OutputSettings()) as api:
    settings = ConfigSettings(config=config, configfiles=configfiles)
    workflow = api.workflow(snakefile=Path("Snakefile"), resource_settings=ResourceSettings(),
                            config_settings=settings, storage_settings=StorageSettings())._workflow
    print(json.dumps(sorted(r.name for r in workflow.rules
                            if not (r.name in workflow._localrules or r.norun))))
"""


def remote_rules(case: str) -> set[str]:
    config, configfiles, _ = CLUSTER_RULES[case]
    res = subprocess.run([sys.executable, "-c", REMOTE_RULES, json.dumps(config),
                          json.dumps(configfiles)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return set(json.loads(res.stdout.splitlines()[-1]))


@pytest.mark.parametrize("case", sorted(CLUSTER_RULES))
def test_only_long_jobs_go_to_the_cluster(case):
    assert remote_rules(case) == CLUSTER_RULES[case][2]


def test_slurm_profile_groups_the_paper_simulations():
    """The paper config's simulations go to SLURM in groups (a few hundred submissions, not
    thousands), each group sized as its simulations one after another on one core."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["groups"] == {"simulate": "simulations"}
    assert profile["cores"] == 1
    size = profile["group-components"]["simulations"]
    n = len(Grid(pc.load_file(PAPER)).runs())
    assert n > 4000 and -(-n // size) + 2 <= 500  # + fidelity_run and engine_run


@pytest.mark.parametrize("name, cases", [("slurm", ["sim", "vllm"]), ("slurm-gpu", ["gpu"])])
def test_slurm_profile_resources_apply_to_cluster_rules(name, cases):
    profile = yaml.safe_load((ROOT / "profiles" / name / "config.yaml").read_text())
    assert set(profile["set-resources"]) <= set().union(*(CLUSTER_RULES[c][2] for c in cases))
    defaults = profile["default-resources"]
    # Placeholders that work as they are: empty = the plugin's and the cluster's defaults.
    assert defaults["slurm_account"] == "" and defaults["slurm_partition"] == ""
    assert {"mem_mb", "runtime", "cpus_per_task"} <= set(defaults)
