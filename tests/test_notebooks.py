"""Every notebook runs under papermill on a tiny results set.

The results are produced by the same commands the Snakemake rules run (``accelgen trace``,
``accelgen simulate``, ``python -m accelgen.pipeline ...``), called in-process on a tiny grid
(a dozen requests per trace, every figure group switched on), so the CSVs have exactly the
pipeline's columns. Then each notebook is executed with papermill and must write its figures.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from accelgen.cli import main as accelgen_main
from accelgen.figures.catalog import FIGURES
from accelgen.figures.pipeline_outputs import CONFIG_ENV, pipeline_outputs
from accelgen.pipeline import config_file as pc
from accelgen.pipeline.__main__ import main as pipeline_main
from accelgen.pipeline.grid import Grid
from accelgen.pipeline.nbsource import code_digest, strip_outputs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Notebooks of the figure pipeline (one per figure group of the grid's figure table); others in
# notebooks/ belong to other parts of the project (e.g. fidelity.ipynb needs real-engine results,
# see docs/profiling.md).
PIPELINE_GROUPS = tuple(dict.fromkeys(group for _key, _fid, group, *_ in FIGURES))


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
                          "sarathi-nochunk", "sarathi-chunk512", "sarathi-tuned"}},
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
                     "systems": ["vllm", "accelgen", "sarathi-tuned"],
                     "load_factors": [0.5, 2, 8],
                     "envelope": {"system": "sarathi", "budgets": [128, 512]},
                     "slo_scale": {"systems": ["vllm", "accelgen"], "ttft_scales": [1, 4]},
                     "noise": {"systems": ["accelgen", "sarathi-tuned"], "levels": [0, 0.1],
                               "load_factors": [0.5, 2, 8]}},
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
            cmd = grid.system_args(run.system, run.variant, run.deployment)
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
    # engine.ipynb draws figure 17 from its CSV (rules/engine.smk; tested in
    # tests/test_engine_regime.py on a synthetic sweep).
    assert set(others) <= {"fidelity", "engine"}, others


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
        assert {"config", "figures_dir"} <= names, path.name
        if path.stem in PIPELINE_GROUPS:
            assert "figures" in names, path.name


def papermill_batches(jobs: list[dict], cwd: Path, processes: int = 2) -> list[str | None]:
    """Run papermill jobs (``tests/papermill_batch.py``: input, output, parameters) in
    ``processes`` processes side by side, each executing its share one after the other, every
    notebook in a kernel of its own; each job's error (None: it ran)."""
    shares = [list(range(len(jobs)))[k::processes] for k in range(processes)]

    def run(share: list[int]) -> list[tuple[int, str | None]]:
        if not share:
            return []
        res = subprocess.run([sys.executable, str(ROOT / "tests" / "papermill_batch.py")],
                             input=json.dumps([jobs[i] for i in share]), capture_output=True,
                             text=True, timeout=900, cwd=cwd)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
        return [(i, r["error"]) for i, r in zip(share, json.loads(res.stdout), strict=True)]

    errors: list[str | None] = [None] * len(jobs)
    with ThreadPoolExecutor(max_workers=processes) as pool:
        for part in pool.map(run, shares):
            for i, error in part:
                errors[i] = error
    return errors


@pytest.mark.parametrize(("deaths", "other", "want_error"), [
    (1, None, False), (2, None, False), (3, None, True), (0, "Kernel is dead", True),
    (0, None, False)])
def test_a_batch_starts_a_dead_kernel_again(monkeypatch: pytest.MonkeyPatch, deaths: int,
                                            other: str | None, want_error: bool) -> None:
    """``papermill_batch.run`` starts a notebook's kernel again when it died before answering
    (at most ``KERNEL_START_RETRIES`` times more); any other failure is the notebook's result."""
    import types

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import papermill_batch
    finally:
        sys.path.remove(str(ROOT / "tests"))
    calls = []

    def execute_notebook(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) <= deaths:
            raise RuntimeError("Kernel died before replying to kernel_info")
        if other is not None:
            raise RuntimeError(other)

    monkeypatch.setitem(sys.modules, "papermill",
                        types.SimpleNamespace(execute_notebook=execute_notebook))
    (result,) = papermill_batch.run([{"input": "a.ipynb", "output": "b.ipynb"}])
    assert (result["error"] is not None) == want_error
    assert len(calls) == min(deaths, papermill_batch.KERNEL_START_RETRIES) + 1


@pytest.mark.slow
def test_every_notebook_runs_under_papermill(tiny_figures, tmp_path):
    figures_dir, grid = tiny_figures
    groups = list(grid.groups())
    jobs = [{"input": str(ROOT / "notebooks" / f"{group}.ipynb"),
             "output": str(tmp_path / f"{group}.ipynb"),
             "parameters": {"figures_dir": str(figures_dir),
                            "figures": ",".join(f.id for f in grid.group_figures(group))}}
            for group in groups]
    errors = papermill_batches(jobs, cwd=figures_dir.parent)
    failed = [(g, log) for g, log in zip(groups, errors, strict=True) if log is not None]
    assert not failed, "\n\n".join(f"--- {g} ---\n{log}" for g, log in failed)
    for fig in grid.figures.values():
        for ext in ("png", "pdf"):
            assert (figures_dir / f"{fig.id}.{ext}").stat().st_size > 1000, (fig.id, ext)


# ----------------------------------------------------------------------------------------------
# A new user's first day: notebooks opened before any pipeline run, or after a run of another
# config, and exploring in JupyterLab.
def fresh_clone(dest: Path) -> Path:
    """What a notebook needs of a fresh clone (no results): Snakefile, config/, notebooks/."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", ".gitignore"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("config", "notebooks"):
        shutil.copytree(ROOT / name, dest / name)
    return dest


def papermill(notebook: Path, out: Path, *params: str, cwd: Path,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    args = [x for name, value in zip(params[::2], params[1::2], strict=True)
            for x in ("-p", name, value)]
    return subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3", "--no-progress-bar", str(notebook),
         str(out), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
        env={**os.environ, **(env or {})})


def printed(executed: Path) -> str:
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def expected_targets(name: str) -> list[str]:
    """The Snakemake targets whose outputs a notebook draws."""
    targets = [key for key, _fid, group, *_ in FIGURES if group == name]
    # fidelity.ipynb: target `fidelity`; engine.ipynb: `fig17` (rules/engine.smk)
    return targets or [{"engine": "fig17"}.get(name, name)]


@pytest.fixture(scope="module")
def notebooks_without_results(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """Every notebook run with its default parameters in a fresh clone: {name: executed copy}."""
    clone = fresh_clone(tmp_path_factory.mktemp("firstday") / "clone")
    out = clone.parent / "executed"
    out.mkdir()

    paths = sorted((clone / "notebooks").glob("*.ipynb"))
    jobs = [{"input": str(path), "output": str(out / path.name)} for path in paths]
    errors = papermill_batches(jobs, cwd=clone)
    failed = [f"--- {path.stem} ---\n{error}" for path, error in zip(paths, errors, strict=True)
              if error is not None]
    assert not failed, "\n".join(failed)
    return clone, {path.stem: out / path.name for path in paths}


def test_notebooks_without_results_say_which_target_to_run(notebooks_without_results):
    _clone, executed = notebooks_without_results
    assert set(executed) == {p.stem for p in NOTEBOOKS}
    for name, path in executed.items():
        text = printed(path)
        for target in expected_targets(name):
            assert f"run `snakemake --cores all {target}` first" in text, (name, target, text)


def test_a_notebook_finds_the_outputs_of_the_config_named_at_lab_start(tiny_figures, tmp_path):
    """JupyterLab started with ACCELGEN_CONFIG=config/paper.yaml: the notebook, unedited,
    reads and writes the paper config's figures_dir (paper_figures/paper/)."""
    figures_dir, _grid = tiny_figures
    clone = fresh_clone(tmp_path / "clone")
    paper_dir = clone / "paper_figures" / "paper"
    paper_dir.mkdir(parents=True)
    shutil.copy2(figures_dir / "fig10_ablation.csv", paper_dir)
    res = papermill(clone / "notebooks" / "ablation.ipynb", tmp_path / "out.ipynb",
                    cwd=clone / "notebooks", env={"ACCELGEN_CONFIG": "config/paper.yaml"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    for ext in ("png", "pdf"):
        assert (paper_dir / f"fig10_ablation.{ext}").stat().st_size > 1000, ext
    assert not (clone / "paper_figures" / "fig10_ablation.png").exists()


def test_config_parameter_resolves_outputs_and_names_the_command(tmp_path, monkeypatch, capsys):
    """The notebooks' `config` parameter (accelgen.figures.plots.use_config): the config's
    figures_dir, a partial config extending config/quick.yaml as under Snakemake, and a
    missing CSV named with the command for that config."""
    from accelgen.figures import plots as P

    clone = fresh_clone(tmp_path / "clone")
    monkeypatch.chdir(clone)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setattr(P, "_config", None)  # restored afterwards
    assert P.use_config(None, None) == "paper_figures"
    assert P.use_config("config/paper.yaml", None) == "paper_figures/paper"
    assert P.use_config("config/paper.yaml", "elsewhere") == "elsewhere"
    (clone / "mine.yaml").write_text("name: mine\n")
    out = pipeline_outputs("mine.yaml")
    assert (out.name, out.figures_dir, out.results_root) == ("mine", "paper_figures",
                                                             "results/mine")
    monkeypatch.setenv(CONFIG_ENV, "config/paper.yaml")
    figures_dir = P.use_config(None, None)
    assert figures_dir == "paper_figures/paper"
    capsys.readouterr()
    assert P.load(figures_dir, "extra_pivots") is None
    assert ("paper_figures/paper/extra_pivots.csv: missing (run `snakemake --cores all "
            "--configfile config/paper.yaml extra_pivots` first)") in capsys.readouterr().out
    grid = Grid(pc.load_file(ROOT / "config" / "paper.yaml"))
    assert pipeline_outputs("config/paper.yaml").results_root == grid.results_root


def test_tracked_notebooks_carry_no_outputs():
    """Notebooks are committed as JupyterLab saves them here: no outputs, nbformat's layout."""
    for path in NOTEBOOKS:
        text = path.read_text()
        stripped = json.dumps(strip_outputs(json.loads(text)), sort_keys=True, indent=1,
                              ensure_ascii=False) + "\n"
        assert text == stripped, f"{path.name}: outputs or run metadata committed"


def test_code_digest_ignores_outputs_and_sees_code(notebooks_without_results, tmp_path):
    _clone, executed = notebooks_without_results
    for name, path in executed.items():
        assert code_digest(path) == code_digest(ROOT / "notebooks" / f"{name}.ipynb"), name
    nb = json.loads((ROOT / "notebooks" / "ablation.ipynb").read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code"
                and "parameters" not in c["metadata"].get("tags", []))
    code["source"] = [*code["source"], "\nprint(1)"]
    edited = tmp_path / "ablation.ipynb"
    edited.write_text(json.dumps(nb))
    assert code_digest(edited) != code_digest(ROOT / "notebooks" / "ablation.ipynb")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_running_a_notebook_in_jupyterlab_leaves_git_clean(notebooks_without_results, tmp_path):
    """The Jupyter server of this venv (what JupyterLab runs on, with the config scripts/setup.sh
    installs) saves an executed notebook the way Lab's autosave sends it (PUT /api/contents):
    the tracked file stays as committed and `git status` is clean."""
    import urllib.request

    _clone, executed = notebooks_without_results
    repo = fresh_clone(tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "clone"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True, capture_output=True)
    name = "measurement.ipynb"
    nb = json.loads(executed["measurement"].read_text())
    assert any(c.get("outputs") for c in nb["cells"])  # outputs, execution counts, kernel info
    port, token = free_port(), "firstday"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={repo}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/status", headers=headers), timeout=5)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-3000:]
                time.sleep(0.5)
        body = json.dumps({"type": "notebook", "format": "json", "content": nb}).encode()
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/api/contents/notebooks/{name}", data=body,
                method="PUT", headers=headers), timeout=60) as res:
            assert res.status == 200
    finally:
        server.terminate()
        try:
            log = server.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            server.kill()
            log = server.communicate()[1]
    assert "accelgen.pipeline.nbsource | extension was successfully loaded" in log, \
        "the Jupyter config is missing from this venv: run `bash scripts/setup.sh`\n" + log[-3000:]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", status
    assert (repo / "notebooks" / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes()
