"""config/cpu-engine.yaml end to end: the GPU path's rules on vLLM's CPU engine (marker ``vllm``).

Snakemake runs figure 9's target in a scratch directory: the download stage fetches the three
dataset files (small, in their real formats) from a loopback server this test starts, the profile
stage measures the tiny model on the vLLM CPU engine, the trace takes its TTFT SLOs from that
profile, stock vLLM and the AccelGen plugin replay it on the engine, and the notebook draws the
figure. About two minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from accelgen.workloads.datasets import CATALOGUE
from accelgen.workloads.download import read_sums
from accelgen.workloads.trace import load_trace, read_trace_metadata
from tests.lazy_vllm import needs_vllm
from tests.loopback import FileServer, dataset_files, download_section

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def meta_of(csv: Path) -> dict[str, str]:
    out = {}
    for line in csv.read_text().splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            out[key] = value
    return out


def test_cpu_engine_config_runs_download_profile_trace_replay_to_the_figure(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("config", "notebooks"):
        (work / name).symlink_to(ROOT / name)
    files = dataset_files()
    with FileServer(dict(files)) as server:
        cfg = yaml.safe_load((ROOT / "config" / "cpu-engine.yaml").read_text())
        cfg["download"] = download_section(server, "data/raw")
        cfg_file = tmp_path / "cpu-engine.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "snakemake", "fig09", "--cores", "2", "-s",
               str(ROOT / "Snakefile"), "-d", str(work), "--configfile", str(cfg_file)]
        res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "PYTHONUNBUFFERED": "1",
                                  "VLLM_CPU_KVCACHE_SPACE": "1"})
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        fetched = [r.path for r in server.requests]

    # download: the three files, byte for byte, with their checksums recorded
    raw = work / "data" / "raw"
    sums = read_sums(raw)
    for name, blob in files.items():
        assert (raw / name).read_bytes() == blob
        assert sums[name].size == len(blob)
    assert sorted(fetched) == sorted(f"/{n}" for n in files)

    # profile: the vLLM CPU engine's own step times, and its pivot
    prof = work / "results/cpu-engine/profiles/tiny-cpu.csv"
    meta = meta_of(prof)
    assert meta["backend"].startswith("vllm (LLMEngine.step()") and int(meta["S_pf"]) > 0
    assert prof.with_suffix(".png").exists()

    # trace: the paper's mix from the downloaded files, TTFT SLOs from the profile
    trace_path = work / "data/cpu-engine/traces/base/tiny-cpu/seed0.parquet"
    tmeta = read_trace_metadata(trace_path)
    assert str(prof.relative_to(work)) in tmeta["prefill_latency"]
    assert {tmeta["sources"][n]["sha256"] for n in ("alpaca", "sharegpt", "bookcorpus")} == {
        sums[CATALOGUE[n].file].sha256 for n in ("alpaca", "sharegpt", "bookcorpus")}
    trace = load_trace(trace_path)
    assert len(trace) == 24 and (trace["source"] == "bookcorpus").sum() == 8  # 35 % of 24

    # replays: stock vLLM and the plugin on the same engine, every request accounted for
    runs = work / "results/cpu-engine/runs/base/tiny-cpu"
    for system, policy in (("vllm-stock", "vllm-stock"), ("accelgen", "accelgen")):
        res_dir = runs / system / "seed0"
        summary = json.loads((res_dir / "summary.json").read_text())
        assert summary["backend"] == "vllm" and summary["policy"] == policy
        assert summary["num_requests"] == 24 and summary["num_finished"] >= 1
        assert summary["num_iterations"] > 0 and not summary["timed_out"]
        config = json.loads((res_dir / "config.json").read_text())
        cost = config["replay"]["adapter"]["cost"]["deployment"]
        assert cost["cost_model"] == "profile"
        assert cost["profile_csv"] == str(prof.relative_to(work))
        reqs = pd.read_parquet(res_dir / "requests.parquet")
        its = pd.read_parquet(res_dir / "iterations.parquet")
        assert len(reqs) == 24 and len(its) == summary["num_iterations"]

    # the figure: its numbers and its drawing
    figs = work / "paper_figures/cpu-engine"
    table = pd.read_csv(figs / "fig09_evaluation.csv")
    assert set(table["system"]) == {"vllm-stock", "accelgen"}
    assert (figs / "fig09_evaluation.png").exists() and (figs / "fig09_evaluation.pdf").exists()

    again = subprocess.run([*cmd, "-n"], cwd=work, capture_output=True, text=True, timeout=300)
    assert "Nothing to be done" in again.stdout + again.stderr
