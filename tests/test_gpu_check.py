"""``scripts/gpu_check.sh`` on a CPU: the GPU check's steps (torch profile of the tiny model on
the quick grid, the calibration fitted on half and reported on the other half beside the analytic
model, the summary) run end to end, and bad input stops it before anything is written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from accelgen.core.specs import ExperimentConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_gpu_check_runs_on_a_cpu(tmp_path: Path) -> None:
    res = run("--device", "cpu", "--model", "tiny", "--out", "gc", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "gc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gc"]  # no gc.partial left
    for name in ("profile.csv", "calibrated.yaml", "calibrated.errors.csv", "calibrate.txt",
                 "summary.json", "summary.txt", "profile.log"):
        assert (out / name).stat().st_size > 0, name
    assert res.stdout.strip().splitlines()[-1].startswith("gpu_check: wrote gc (")
    dep = ExperimentConfig.model_validate(yaml.safe_load((out / "calibrated.yaml").read_text()))
    assert dep.deployment.cost_model == "calibrated" and dep.deployment.model == "tiny"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["holdout"] == "half" and summary["num_points"] >= 10
    held = {r["kind"] for r in summary["calibrated"] if r["set"] == "held-out"}
    assert {"prefill", "decode", "all"} <= held
    assert {r["set"] for r in summary["analytic"]} == {"fit", "held-out"}
    text = (out / "summary.txt").read_text()
    assert "held-out  all" in text and "analytic" in text and "not meaningful" in text


def test_gpu_check_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    res = run("--device", "cpu", "--repeats", "0", cwd=tmp_path)
    assert res.returncode == 2 and "--repeats must be a positive integer" in res.stderr
    res = run("--device", "cpu", "--grid", "huge", cwd=tmp_path)
    assert res.returncode == 2 and "--grid must be standard or quick" in res.stderr
    res = run("--device", "cpu", "--model", "tiny", "--python", "no-such-python", cwd=tmp_path)
    assert res.returncode == 2 and "no Python at no-such-python" in res.stderr
    import torch

    if not torch.cuda.is_available():  # CI: a CUDA device that is not there
        res = run("--device", "cuda", "--model", "tiny", cwd=tmp_path)
        assert res.returncode == 2 and "torch sees no CUDA device" in res.stderr
    assert list(tmp_path.iterdir()) == []
