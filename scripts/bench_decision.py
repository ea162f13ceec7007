#!/usr/bin/env python
"""Decision-time benchmark: AccelGen vs vLLM on one large scheduler state (SPEC 4.3).

Builds 1,000 waiting and 256 running requests with realistic lengths and SLOs (the embedded
synthetic workload mix, TTFT/TBT SLOs from the OPT-13B cost model), then times each policy's
``schedule`` side by side in the same process: repeats alternate the two policies so both see the
same machine noise, and each decision advances simulated time so slacks change. Decisions are not
executed, so the state keeps its size. AccelGen's per-step hook (``on_step_end``, which refreshes
its arrays from the scheduled requests) is timed separately.

Two states: ``trace`` keeps the trace's arrivals (8 req/s: the queue spans two minutes, so nearly
every request is already late, as in an overloaded run); ``burst`` squeezes the waiting arrivals
into the last second, right after an iteration in which every decode emitted a token (a mix of
urgent, on-time and late requests); ``loose`` is that burst with TTFT SLOs of 20-60 s and TBT SLOs
of 1-3 s, so that step 2 (slack groups, Euclidean selection) forms most of the batch. (A full
batch with 256 running decodes of these contexts takes about 0.2 s, longer than the reading-speed
TBT, so in the first two states every decode is urgent.)

Each call is timed twice: wall clock (what the simulator records) and the thread's CPU time,
which leaves out time the OS gave to other processes; on a shared 2-core machine wall-clock
tails are mostly such preemptions.

Run:  .venv/bin/python scripts/bench_decision.py [--decisions 2000] [--repeats 5]
Prints per-repeat p50/p99 and the median over repeats. Not a unit test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from accelgen.core.kvcache import BlockManager, blocks_for
from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Request, Status
from accelgen.core.specs import Deployment
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.policies.registry import make_policy
from accelgen.workloads import WorkloadConfig, build_trace, to_requests


def build_state(num_waiting: int, num_running: int, seed: int, burst_s: float | None = None,
                loose_ttft: bool = False) -> tuple[SchedulerView, list[Request]]:
    """A scheduler view with ``num_running`` admitted requests (mostly decoding, a few partially
    prefilled) and ``num_waiting`` queued ones (a few preempted), at the latest arrival. With
    ``burst_s``, the waiting requests arrived within the last ``burst_s`` seconds; with
    ``loose_ttft`` TTFT SLOs are 20-60 s and TBT SLOs 1-3 s, so that little is urgent or late."""
    dep = Deployment()
    cost = make_cost_model(dep)
    pivot = deployment_pivot(dep)
    n = num_waiting + num_running
    cfg = WorkloadConfig(num_requests=n, seed=seed)
    trace = build_trace(cfg, prefill_latency=cost.prefill_time, latency_name=cost.name)
    reqs, out_len = to_requests(trace.df)
    reqs.sort(key=lambda r: r.arrival)
    rng = np.random.default_rng(seed)
    now = reqs[-1].arrival
    bs = dep.block_size
    running, waiting = reqs[:num_running], reqs[num_running:]
    if loose_ttft:
        for r in reqs:
            r.ttft_slo = float(rng.uniform(20.0, 60.0))
            r.tbt_slo = float(rng.uniform(1.0, 3.0))
        for r in running:  # admitted within the last second too
            r.arrival = now - float(rng.uniform(0.0, 1.0))
    if burst_s is not None:
        first = waiting[0].arrival
        for r in waiting:
            r.arrival = now - burst_s + burst_s * (r.arrival - first) / max(now - first, 1e-9)
    used = 0
    for r in running:
        r.status = Status.RUNNING
        if rng.random() < 0.05 and r.prompt_len > 1:  # partially prefilled
            r.num_computed_tokens = int(rng.integers(1, r.prompt_len))
        else:
            target = max(1, int(out_len[r.req_id]))
            r.num_output_tokens = int(rng.integers(1, target + 1))
            r.num_computed_tokens = r.prompt_len + r.num_output_tokens - 1
            # A burst arrives right after an iteration: every decode has just emitted a token.
            spread = r.tbt_slo if burst_s is None else 0.05
            r.last_token_time = now - float(rng.uniform(0.0, spread))
            r.first_token_time = r.last_token_time
        r.num_blocks = blocks_for(r.num_computed_tokens, bs)
        used += r.num_blocks
    for r in waiting:
        r.queued_since = r.arrival
        if rng.random() < 0.05 and not loose_ttft:  # preempted earlier (recompute), with some output emitted
            r.num_output_tokens = int(rng.integers(1, 64))
            r.last_token_time = now - float(rng.uniform(0.0, r.tbt_slo))
            r.first_token_time = r.last_token_time
            r.num_preemptions = 1
    # vLLM admits in FCFS order, so the partially prefilled requests are the newest admitted.
    running.sort(key=lambda r: (r.num_output_tokens == 0, r.arrival))
    # Enough KV for the running requests plus 10 % free: a larger deployment than one A100's
    # 12 GB, so that 256 requests can be running at once.
    kv = BlockManager(int(used * 1.1) + 1, bs)
    kv.num_free_blocks = kv.num_total_blocks - used
    view = SchedulerView(now=now, waiting=waiting, running=running, swapped=[], kv=kv, cost=cost,
                         pivot=pivot, max_model_len=8192)
    return view, reqs


Timings = dict[str, np.ndarray]


def time_decisions(policy: Policy, view: SchedulerView, decisions: int, dt: float,
                   hook: bool) -> Timings:
    """Wall and thread-CPU time (s) of each ``schedule`` call and, if ``hook``, the wall time of
    each ``on_step_end``."""
    t0 = view.now
    out = {"wall": np.empty(decisions), "cpu": np.empty(decisions),
           "hook": np.empty(decisions if hook else 0)}
    wall, cpu = time.perf_counter, time.thread_time
    for i in range(decisions):
        view.now = t0 + i * dt
        c, a = cpu(), wall()
        d: Decision = policy.schedule(view)
        out["wall"][i] = wall() - a
        out["cpu"][i] = cpu() - c
        if hook:
            a = wall()
            policy.on_step_end(view, d, 0.05)  # the decision is not executed: state unchanged
            out["hook"][i] = wall() - a
    view.now = t0
    return out


def pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) * 1e6


def bench_state(label: str, args: argparse.Namespace, burst_s: float | None,
                loose_ttft: bool = False) -> None:
    view, reqs = build_state(args.waiting, args.running, args.seed, burst_s, loose_ttft)
    params = dict(kv.split("=", 1) for kv in args.accelgen_params.split(",") if kv)
    accel = make_policy("accelgen", params)
    vllm = make_policy("vllm")
    for r in reqs:
        accel.on_arrival(r, r.arrival)
    first = accel.schedule(view)
    print(f"\n== state '{label}': {len(view.waiting)} waiting, {len(view.running)} running, "
          f"{view.kv.num_free_blocks}/{view.kv.num_total_blocks} blocks free, "
          f"S_pf={view.pivot.s_pf}; AccelGen schedules {len(first.scheduled)} "
          f"(forward size {sum(n for _, n in first.scheduled)}), "
          f"{int(first.info['n_urgent'])} urgent, {int(first.info['n_late'])} late, "
          f"{int(first.info['n_groups'])} groups")
    runs: dict[str, list[Timings]] = {"accelgen": [], "vllm": []}
    timers: list[tuple[str, Callable[[], Timings]]] = [
        ("accelgen", lambda: time_decisions(accel, view, args.decisions, 1e-4, hook=True)),
        ("vllm", lambda: time_decisions(vllm, view, args.decisions, 1e-4, hook=False)),
    ]
    print(f"{'repeat':>6} {'policy':>9} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>9} "
          f"{'cpu p99':>9}  (us)")
    for rep in range(args.repeats):
        for name, fn in timers if rep % 2 == 0 else timers[::-1]:
            t = fn()
            runs[name].append(t)
            print(f"{rep:>6} {name:>9} {pct(t['wall'], 50):9.1f} {pct(t['wall'], 99):9.1f} "
                  f"{pct(t['cpu'], 50):9.1f} {pct(t['cpu'], 99):9.1f}")

    def med(name: str, kind: str, q: float) -> float:
        return statistics.median(pct(t[kind], q) for t in runs[name])

    print(f"median of {args.repeats} repeats x {args.decisions} decisions (us):")
    for name in ("accelgen", "vllm"):
        print(f"  {name:9s} wall p50 {med(name, 'wall', 50):8.1f}  p99 {med(name, 'wall', 99):8.1f}"
              f"   cpu p50 {med(name, 'cpu', 50):8.1f}  p99 {med(name, 'cpu', 99):8.1f}")
    print(f"  accelgen on_step_end wall p50 {med('accelgen', 'hook', 50):8.1f}  "
          f"p99 {med('accelgen', 'hook', 99):8.1f}")
    for kind in ("wall", "cpu"):
        ratios = [pct(a[kind], 50) / pct(v[kind], 50)
                  for a, v in zip(runs["accelgen"], runs["vllm"], strict=True)]
        print(f"  ratio accelgen/vllm {kind} p50: {statistics.median(ratios):.1f} "
              f"(per repeat: {', '.join(f'{r:.1f}' for r in ratios)})")
    for kind in ("wall", "cpu"):
        ok = med("accelgen", kind, 50) < 1000 and med("accelgen", kind, 99) < 3000
        print(f"  target p50 < 1000 us and p99 < 3000 us ({kind}): {'met' if ok else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--waiting", type=int, default=1000)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--decisions", type=int, default=2000, help="decisions per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", choices=["trace", "burst", "loose", "all"], default="all")
    ap.add_argument("--accelgen-params", default="", help="k=v,... AccelGen parameter overrides")
    args = ap.parse_args(argv)
    if args.state in ("trace", "all"):
        bench_state("trace", args, None)
    if args.state in ("burst", "all"):
        bench_state("burst", args, 1.0)
    if args.state in ("loose", "all"):
        bench_state("loose", args, 1.0, loose_ttft=True)


if __name__ == "__main__":
    main()
