"""The vLLM CPU engine effects behind the fidelity check's engine step model (docs/profiling.md).

    PYTHONPATH=. /work/venv-vllm/bin/python scripts/vllm_step_effects.py [--renice -15]

Prints, for the tiny random-weight model on one OpenMP thread:

1. a fresh prefill after the engine was idle vs back to back with the previous step;
2. the first decode steps after a prefill vs the steady state;
3. oneDNN's first GEMM call at a new row count (token count) vs a repeated one
   (``vllm._custom_ops.onednn_mm``, the CPU linear layers' kernel);
4. mixed steps (3 decodes + a fresh prompt) at token counts new to the engine vs repeated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--renice", type=int, metavar="N", help="run at nice N in its own session")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/accelgen-step-effects"))
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.renice is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from fidelity import raise_priority

        raise_priority(args.renice)
    import torch
    from vllm import _custom_ops as ops

    from accelgen.profiling.grid import Shape
    from accelgen.profiling.vllm_backend import _Driver
    from accelgen.vllm_integration.replay import (
        ReplayConfig,
        build_engine,
        engine_scheduler,
        shutdown_engine,
    )

    engine = build_engine(ReplayConfig(system="stock", engine={"num_gpu_blocks": 1024}),
                          args.work_dir)
    try:
        sched = engine_scheduler(engine)
        d = _Driver(engine, sched, 1024)

        def step() -> float:
            t0 = time.perf_counter()
            d._step()
            return time.perf_counter() - t0

        ids: list[str] = []
        for _ in range(3):
            ids.append(d._add(64, 1))
            step()
        print("1. fresh prefill of 64 tokens (the token count is warm):")
        idle = []
        for _ in range(10):
            time.sleep(0.05)
            ids.append(d._add(64, 1))
            idle.append(step())
        b2b = []
        for _ in range(10):
            ids.append(d._add(64, 1))
            b2b.append(step())
        print(f"   after 50 ms idle: {_ms(idle)}; back to back: {_ms(b2b)}")
        print("2. decode steps after the prompts' prefill (first three, then steps 6..40):")
        for batch in (1, 4):
            run: list[str] = []
            d._decoding(Shape.decode(batch, 128), run, max_tokens=60)  # includes 2 settle steps
            d._drain(run)
            run = [d._add(128, 60) for _ in range(batch)]
            step()  # the prefill
            times = [step() for _ in range(40)]
            d._drain(run)
            print(f"   batch {batch}: " + ", ".join(f"{t * 1e3:.2f}" for t in times[:3])
                  + f" ms; steady {_ms(times[5:])}")
        print("3. oneDNN GEMM (64 x 256 weights), first call at a row count vs the same again:")
        w = torch.randn(256, 64)
        handler = ops.create_onednn_mm(w.t(), 32)
        first, again = [], []
        for m in range(100, 140):
            x = torch.randn(m, 64)
            t0 = time.perf_counter()
            ops.onednn_mm(handler, x, None)
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ops.onednn_mm(handler, x, None)
            again.append(time.perf_counter() - t0)
        print(f"   rows 100..139: first {_ms(first)}, again {_ms(again)}")
        print("4. mixed steps (3 decodes + a fresh prompt) at new token counts:")
        probe = d.probe_first_use(count=12)
        print(f"   first {_ms([c for _, c, _ in probe])}, the next two "
              f"{_ms([w for _, _, w in probe])} (prompts {probe[0][0]}..{probe[-1][0]})")
        d._drain(ids)
    finally:
        shutdown_engine(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
