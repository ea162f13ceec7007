# Shared helpers: config validation, the experiment grid, and the input/params functions of the
# rules (named functions, no lambdas). All grid logic lives in accelgen.pipeline.grid.

import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from accelgen.pipeline import config_file as pipeline_config
from accelgen.pipeline.grid import SCENARIO_PREFIX, Grid, Run
from accelgen.pipeline.nbsource import code_digest
from accelgen.pipeline.resources import job_resources

# 1) The package's pydantic models (messages name the key, e.g. `systems.x.policy: unknown
#    policy`); 2) the JSON schema generated from them (config/schema.json).
try:
    PIPE = pipeline_config.load(config)
    GRID = Grid(PIPE)  # also checks the workloads the grid derives
except pipeline_config.PipelineConfigError as exc:
    raise WorkflowError(f"{exc}") from None
validate(config, "../config/schema.json", set_default=False)

# Jobs run the interpreter that runs Snakemake (the project's venv), not whatever is on PATH. Its
# path reaches them through the environment (set here) and not through the shell commands, since
# Snakemake re-runs every job whose command text changed, e.g. after the checkout was moved.
# Under `accelgen warm` (scripts/main.sh) it is the warm server's shim (accelgen/cli/warm.py).
os.environ.update(ACCELGEN_PYTHON=os.environ.get("ACCELGEN_WARM_PYTHON") or sys.executable)
PY = '"$ACCELGEN_PYTHON"'
ACCELGEN = f"{PY} -m accelgen.cli"
PIPELINE = f"{PY} -m accelgen.pipeline"
DATA = GRID.data_root
RESULTS = GRID.results_root
LOGS = GRID.logs_root
BENCH = GRID.bench_root
FIGS = GRID.figures_dir
# One simulation's results directory (wildcards: variant, deployment, system, seed).
RUN_DIR = f"{RESULTS}/runs/{{variant}}/{{deployment}}/{{system}}/seed{{seed}}"


wildcard_constraints:
    variant=r"[a-z0-9][a-z0-9._+-]*",
    deployment=r"[a-z0-9][a-z0-9._+-]*",
    system=r"[a-z0-9][a-z0-9._+-]*",
    scenario=r"[a-z0-9][a-z0-9._+-]*",
    seed=r"\d+",
    figure=r"[a-z0-9_]+",


def _quote(args):
    return " ".join(shlex.quote(a) for a in args)


# ---- workloads ------------------------------------------------------------------------------
def workload_spec(wildcards):
    return GRID.workload_spec_json(wildcards.variant)


def scenario_spec(wildcards):
    return GRID.scenario_spec_json(wildcards.scenario)


def trace_inputs(wildcards):
    inputs = {"workload": GRID.workload_yaml(wildcards.variant)}
    scenario = GRID.variant_scenario.get(wildcards.variant)
    if scenario is not None:
        inputs["scenario"] = GRID.scenario_csv(scenario)
    # Downloaded datasets (kind: datasets) and the profile behind the TTFT SLOs (profile stage).
    inputs["raw"] = GRID.raw_inputs(wildcards.variant)
    inputs["profile"] = GRID.deployment_inputs(wildcards.deployment)
    return inputs


def trace_args(wildcards):
    return _quote(GRID.trace_args(wildcards.variant, wildcards.deployment))


# ---- simulations ----------------------------------------------------------------------------
def deployment_spec(wildcards):
    return GRID.deployment_spec_json(wildcards.deployment)


def deployment_inputs(wildcards):
    return GRID.deployment_inputs(wildcards.deployment)


def _run(wildcards):
    return Run(wildcards.variant, wildcards.deployment, wildcards.system, int(wildcards.seed))


def system_args(wildcards):
    """The simulation's command; an Oracle search also reads its floor, AccelGen's own run of the
    trace, when the grid runs it (`accelgen oracle --floor-run`, floor_inputs)."""
    return _quote(GRID.system_args(wildcards.system, wildcards.variant, wildcards.deployment)
                  + GRID.floor_args(_run(wildcards)))


def floor_inputs(wildcards):
    floor = GRID.floor_run(_run(wildcards))
    return [] if floor is None else [GRID.run_summary(floor)]


def sim_mem_mb(wildcards):
    """SLURM memory of one simulation job, from measured full-size runs (accelgen.pipeline.resources)."""
    return job_resources(GRID, wildcards.variant, wildcards.system, wildcards.deployment,
                         int(wildcards.seed))["mem_mb"]


def sim_runtime(wildcards):
    """SLURM runtime (minutes) of one simulation job (accelgen.pipeline.resources)."""
    return job_resources(GRID, wildcards.variant, wildcards.system, wildcards.deployment,
                         int(wildcards.seed))["runtime"]


def replay_args(wildcards):
    return _quote(GRID.replay_args(wildcards.system, wildcards.variant, wildcards.deployment))


def replay_engine(wildcards):
    engine = GRID.engine_json(wildcards.deployment)
    return _quote(["--engine", engine]) if engine else ""


def deployment_gpus(wildcards):
    """GPUs of a real-engine job of the deployment (the SLURM executor's `gpu` resource)."""
    return GRID.gpus(wildcards.deployment)


# ---- download and profile stages (rules/download.smk, rules/profile.smk) ---------------------
def download_name(wildcards, output):
    return GRID.downloads()[output[0]]


def download_spec(wildcards, output):
    return GRID.download_spec_json(GRID.downloads()[output[0]])


def profile_args(wildcards):
    return _quote(GRID.profile_args(wildcards.deployment))


# ---- figures --------------------------------------------------------------------------------
def figure_inputs(wildcards):
    return GRID.figure_inputs(wildcards.figure)


def figure_spec(wildcards):
    return GRID.figure_spec_json(wildcards.figure)


def output_dir(wildcards, output):
    """The directory of a rule's first output (where a notebook writes its figures)."""
    return os.path.dirname(output[0])


# Notebook jobs re-run when the notebook's code changes (params.code), not when its file is saved
# with new outputs. Running a notebook in JupyterLab autosaves its outputs into notebooks/*.ipynb,
# which would otherwise make it newer than its figures (README, "Explore in JupyterLab").
def notebook_input(name):
    return ancient(f"notebooks/{name}.ipynb")


def notebook_code(name):
    path = f"notebooks/{name}.ipynb"
    return code_digest(path) if os.path.exists(path) else "missing"
