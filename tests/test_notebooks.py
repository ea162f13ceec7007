"""Every notebook runs under papermill on a tiny results set.

The results are produced by the same commands the Snakemake rules run (``accelgen trace``,
``accelgen simulate``, ``python -m accelgen.pipeline ...``), called in-process on a tiny grid
(a dozen requests per trace, every figure group switched on), so the CSVs have exactly the
pipeline's columns. Then each notebook is executed with papermill and must write its figures.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from accelgen.cli import main as accelgen_main
from accelgen.pipeline import config as pc
from accelgen.pipeline.__main__ import main as pipeline_main
from accelgen.pipeline.grid import Grid

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Notebooks of the figure pipeline (one per figure group); others in notebooks/ belong to other
# parts of the project (e.g. fidelity.ipynb needs real-engine results, see docs/profiling.md).
PIPELINE_GROUPS = ("measurement", "scenarios", "workload", "evaluation", "ablation", "sensitivity",
                   "capacity")


def tiny_grid_config() -> dict:
    data = copy.deepcopy(yaml.safe_load((ROOT / "config" / "quick.yaml").read_text()))
    small = {"num_requests": 10}
    data.update(
        name="nbtest", figures_dir="figs", seeds=[0],
        workload_variants={"tiny": small, "tiny-m": {**small, "slo": {"tbt_scale_kind": "set"}},
                           "tiny-cap": {**small, "slo": {"ttft_reference": "isolated",
                                                         "ttft_scale": [1, 3],
                                                         "tbt_scale_kind": "set"}}},
        deployments={"opt-13b": {"label": "OPT-13B"},
                     "opt-13b-16k": {"base": "opt-13b", "max_model_len": 16384,
                                     "label": "OPT-13B (16K)"}},
        systems={k: v for k, v in data["systems"].items()
                 if k in {"vllm", "sarathi", "accelgen", "accelgen-no-order", "sarathi-slack",
                          "sarathi-nochunk", "sarathi-chunk512"}},
    )
    data["experiments"] = {
        "measurement": {"workload": "tiny-m", "deployments": ["opt-13b"],
                        "systems": ["vllm", "sarathi"]},
        "system_slo": {"workload": "tiny-m", "deployments": ["opt-13b"], "system": "sarathi",
                       "slos": [0.2, 1.0]},
        "era": {"deployments": ["opt-13b-16k"], "systems": ["sarathi", "accelgen"],
                "num_short": 4},
        "ordering": {"workload": "tiny-m", "deployments": ["opt-13b"],
                     "systems": ["sarathi", "sarathi-slack"]},
        "features": {"workload": "tiny", "deployment": "opt-13b", "num_requests": 300},
        "evaluation": {"workload": "tiny", "deployments": ["opt-13b"],
                       "systems": ["vllm", "sarathi", "accelgen"]},
        "ablation": {"workload": "tiny", "deployments": ["opt-13b"],
                     "systems": ["accelgen", "accelgen-no-order"]},
        "sensitivity": {"workload": "tiny", "deployments": ["opt-13b"],
                        "systems": ["accelgen", "vllm"], "long_fractions": [0.0, 0.14],
                        "rates": [2, 8]},
        "datasets": {"workload": "tiny", "deployments": ["opt-13b"],
                     "systems": ["vllm", "accelgen"]},
        "chunking": {"deployment": "opt-13b-16k", "systems": ["sarathi-nochunk",
                                                             "sarathi-chunk512"],
                     "num_others": 7},
        "capacity": {"workload": "tiny-cap", "deployments": ["opt-13b"],
                     "systems": ["vllm", "accelgen"], "load_factors": [0.5, 2, 8],
                     "slo_scale": {"systems": ["vllm", "accelgen"], "ttft_scales": [1, 4]}},
    }
    return data


def ok(code: int) -> None:
    assert code == 0


@pytest.fixture(scope="module")
def tiny_figures(tmp_path_factory) -> tuple[Path, Grid]:
    """Run the tiny grid's rule commands in-process; return the figures directory."""
    import os

    work = tmp_path_factory.mktemp("nbtest")
    old = Path.cwd()
    os.chdir(work)
    try:
        grid = Grid(pc.load(tiny_grid_config()))
        for scenario in grid.scenarios:
            ok(pipeline_main(["scenario", "--spec", grid.scenario_spec_json(scenario),
                              "--out", grid.scenario_csv(scenario)]))
        for variant in grid.variants:
            ok(pipeline_main(["write-yaml", "--spec", grid.workload_spec_json(variant),
                              "--out", grid.workload_yaml(variant)]))
        for variant, dep, seed in grid.trace_jobs():
            ok(accelgen_main(["trace", "--config", grid.workload_yaml(variant), "--out",
                              grid.trace_path(variant, dep, seed), "--seed", str(seed),
                              *grid.trace_args(variant, dep), "--quiet"]))
        for dep in grid.cfg.deployments:
            ok(pipeline_main(["write-yaml", "--spec", grid.deployment_spec_json(dep),
                              "--out", grid.deployment_yaml(dep)]))
        for run in grid.runs():
            cmd = grid.system_args(run.system)
            assert cmd[:3] == ["-m", "accelgen.cli", "simulate"]  # no Oracle search here
            ok(accelgen_main([*cmd[2:], "--trace",
                              grid.trace_path(run.variant, run.deployment, run.seed),
                              "--config", grid.deployment_yaml(run.deployment),
                              "--seed", str(run.seed), "--out", grid.run_dir(run)]))
        for fig in grid.figures.values():
            ok(pipeline_main(["aggregate", "--spec", grid.figure_spec_json(fig.id),
                              "--out", grid.figure_file(fig.id, "csv")]))
        ok(pipeline_main(["aggregate", "--spec", grid.figure_spec_json("claims"),
                          "--out", grid.figure_file("claims", "csv")]))
    finally:
        os.chdir(old)
    return work / grid.figures_dir, grid


def test_every_figure_group_has_a_notebook():
    names = {p.stem for p in NOTEBOOKS}
    grid = Grid(pc.load_file(ROOT / "config" / "quick.yaml"))
    assert set(grid.groups()) <= names
    assert set(grid.groups()) == set(PIPELINE_GROUPS)


def test_notebooks_outside_the_pipeline_are_known():
    others = sorted(p.stem for p in NOTEBOOKS if p.stem not in PIPELINE_GROUPS)
    # Not a figure group of the grid: fidelity.ipynb reads a fidelity runs directory (real-engine
    # replays), run by its own rule (rules/fidelity.smk) and tested below on synthetic runs.
    assert set(others) <= {"fidelity"}, others


def test_fidelity_notebook_runs_under_papermill(tmp_path):
    from tests.fidelity_fakes import fake_fidelity_runs

    runs = fake_fidelity_runs(tmp_path / "runs")
    figs = tmp_path / "figs"
    res = subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3", "--no-progress-bar",
         str(ROOT / "notebooks" / "fidelity.ipynb"), str(tmp_path / "out.ipynb"),
         "-p", "runs_dir", str(runs), "-p", "figures_dir", str(figs)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    for ext in ("png", "pdf"):
        assert (figs / f"fidelity.{ext}").stat().st_size > 1000, ext


def test_notebooks_have_a_parameters_cell_of_literals():
    import ast

    import nbformat

    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(cells) == 1, path
        tree = ast.parse(cells[0].source)
        for node in tree.body:
            assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant), \
                f"{path.name}: parameters must be literal assignments"
        names = {t.id for n in tree.body for t in n.targets}
        assert "figures_dir" in names, path.name
        if path.stem in PIPELINE_GROUPS:
            assert "figures" in names, path.name


def run_notebook(path: Path, figures_dir: Path, figures: str, out: Path) -> tuple[int, str]:
    res = subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3", "--no-progress-bar", str(path),
         str(out), "-p", "figures_dir", str(figures_dir), "-p", "figures", figures],
        capture_output=True, text=True, timeout=600, cwd=figures_dir.parent)
    return res.returncode, res.stdout[-2000:] + res.stderr[-4000:]


def test_every_notebook_runs_under_papermill(tiny_figures, tmp_path):
    figures_dir, grid = tiny_figures
    jobs = []
    for group in grid.groups():
        ids = ",".join(f.id for f in grid.group_figures(group))
        jobs.append((group, ROOT / "notebooks" / f"{group}.ipynb", ids))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda j: (j[0], *run_notebook(j[1], figures_dir, j[2],
                                                               tmp_path / f"{j[0]}.ipynb")),
                                jobs))
    failed = [(g, log) for g, code, log in results if code != 0]
    assert not failed, "\n\n".join(f"--- {g} ---\n{log}" for g, log in failed)
    for fig in grid.figures.values():
        for ext in ("png", "pdf"):
            assert (figures_dir / f"{fig.id}.{ext}").stat().st_size > 1000, (fig.id, ext)
