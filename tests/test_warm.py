"""``accelgen warm``: jobs forked from the warm server write what the interpreter writes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accelgen.cli import warm_client
from accelgen.cli.warm import ONE_THREAD
from accelgen.workloads.trace import write_trace

# The files of a run that do not time the machine (timing.* holds wall-clock measurements).
RESULT_FILES = ("config.json", "summary.json", "requests.parquet", "iterations.parquet")


def _trace(path: Path, n: int = 24) -> None:
    rng = np.random.default_rng(5)
    prompt, out = rng.integers(50, 600, n), rng.integers(5, 60, n)
    ttft, tbt = rng.uniform(0.1, 1.0, n), rng.uniform(0.05, 0.3, n)
    write_trace(pd.DataFrame({
        "req_id": np.arange(n), "arrival": np.sort(rng.uniform(0, 3.0, n)), "source": "test",
        "prompt_len": prompt, "prompt_len_natural": prompt, "prompt_truncated": False,
        "output_len": out, "output_len_natural": out, "output_capped": False,
        "ttft_slo": ttft, "tbt_slo": tbt, "jct_slo": ttft + tbt * (out - 1), "online": True,
        "predicted_output_len": 150}), {}, path)


def _warm(script: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``accelgen warm [options] -- sh -c script``; the script finds the shim in
    $ACCELGEN_WARM_PYTHON. Its jobs get the thread settings Snakemake gives a one-thread job."""
    return subprocess.run([sys.executable, "-m", "accelgen.cli", "warm", *options, "--", "sh",
                           "-c", script],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ONE_THREAD})


def test_warm_jobs_write_what_the_interpreter_writes(tmp_path: Path) -> None:
    _trace(tmp_path / "t.parquet")
    sim = "-m accelgen.cli simulate --policy {} --trace t.parquet --deployment opt-13b " \
          "--kv-cache-gb 1 --no-progress --out {}"
    for policy in ("accelgen", "vllm"):
        subprocess.run([sys.executable, *shlex.split(sim.format(policy, f"cold-{policy}"))],
                       cwd=tmp_path, check=True, capture_output=True, timeout=300)
    py = '"$ACCELGEN_WARM_PYTHON"'
    script = "; ".join([
        *(f"{py} {sim.format(p, f'warm-{p}')} > {p}.log 2> {p}.err; echo {p}=$?"
          for p in ("accelgen", "vllm")),
        f"{py} -m accelgen.cli simulate --trace missing.parquet --out x; echo bad=$?",
        # a job with other thread settings than the server's: declined, run by the interpreter
        f"OMP_NUM_THREADS=2 {py} {sim.format('vllm', 'declined')} > /dev/null; echo declined=$?",
        # not a warm job: the interpreter runs it
        f"{py} -c 'import sys; print(sys.flags.no_site)'"])
    res = _warm(script, tmp_path, "--jobs-log", "logs/jobs.jsonl")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:4] == ["accelgen=0", "vllm=0", "bad=2", "declined=0"], res.stdout
    assert lines[4] == "0"  # the real interpreter, with its site-packages
    # (the two simulations and the failing one forked; the other thread settings declined)
    assert "jobs run warm: 3, handed back to the interpreter: 1; jobs log: " in lines[5], lines[5]
    # one line per forked job, with what the fork used (not the shim, not the server)
    logged = [json.loads(x) for x in (tmp_path / "logs/jobs.jsonl").read_text().splitlines()]
    assert [(j["argv"][-1], j["exit"]) for j in logged] == [
        ("warm-accelgen", 0), ("warm-vllm", 0), ("x", 2)]
    assert all(j["cwd"] == str(tmp_path) and 0 < j["cpu_s"] <= j["wall_s"] * 1.5 + 0.1
               and j["max_rss_mb"] > 0 for j in logged), logged
    assert "missing.parquet" in res.stderr  # the job's stderr is the caller's
    for run in ("accelgen", "vllm"):
        for name in RESULT_FILES:
            cold = (tmp_path / f"cold-{run}" / name).read_bytes()
            assert (tmp_path / f"warm-{run}" / name).read_bytes() == cold, (run, name)
        assert "results: warm-" in (tmp_path / f"{run}.log").read_text()
    for name in RESULT_FILES:
        assert ((tmp_path / "declined" / name).read_bytes()
                == (tmp_path / "cold-vllm" / name).read_bytes())


@pytest.mark.parametrize(("argv", "warm"), [
    (["-m", "accelgen.cli", "simulate", "--trace", "t"], True),
    (["-m", "accelgen.pipeline", "aggregate", "--spec", "@-"], True),
    (["-m", "accelgen.cli", "fidelity", "run"], False),  # the real engine: its own processes
    (["-m", "papermill", "nb.ipynb"], False),
    (["-c", "print(1)"], False),
])
def test_which_jobs_are_warm(argv: list[str], warm: bool) -> None:
    assert warm_client.warm_job(argv) is warm


def test_without_a_server_the_interpreter_runs_the_job(tmp_path: Path) -> None:
    client = Path(warm_client.__file__)
    env = {**os.environ, warm_client.PYTHON_ENV: sys.executable,
           warm_client.SOCKET_ENV: str(tmp_path / "no-such-socket")}
    res = subprocess.run([sys.executable, "-S", "-P", str(client), "-m", "accelgen.cli",
                          "simulate", "--help"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--trace" in res.stdout, res.stderr
