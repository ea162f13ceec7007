"""AccelGen's decision time by table size, inside a real simulation (a script, not a unit test).

``bench_decision.py`` times decisions on three built states; this one times every call of the
compiled decision while a trace is simulated as ``accelgen simulate`` does it, and groups the
calls by the number of live requests (powers of two): where a change costs time shows as the
table sizes it costs at (e.g. a slower pass over a long dormant queue only above a few thousand
live requests). Each tree runs in a fresh process, one after the other:

    .venv/bin/python scripts/bench_decision_sizes.py TRACE [--policy oracle] [--checkout DIR]

``--checkout`` runs another source tree (an export of the build before a change) on the same
trace after this one. Per tree it prints the wall time of the simulation, the decision's total,
and per size class the calls, mean microseconds per call and total seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# In the child: time each call of the decision that ``Workspace.run`` makes.
_CHILD = """
import sys, time
import numpy as np
try:
    from accelgen.core.specs import ExperimentConfig, PolicySpec, SimOptions
    from accelgen.costmodel.datasheets import DEPLOYMENTS
    from accelgen.policies.accelgen.workspace import Workspace
except ImportError:  # a checkout from before the decision became a package
    from accelgen.config import ExperimentConfig, PolicySpec, SimOptions
    from accelgen.costmodel.profiles import DEPLOYMENTS
    from accelgen.policies.accelgen_workspace import Workspace
from accelgen.sim.runner import simulate_to_dir
from accelgen.workloads.trace import load_trace

trace_path, policy, out = sys.argv[1:4]
by_size = np.zeros((64, 2))  # per bit length of the live-request count: ns, calls
run = Workspace.run

def timed_run(self, decide, cost, *step):
    size = min(int(step[0]).bit_length(), 63)
    def timed(arrays):
        t0 = time.perf_counter_ns()
        need = decide(arrays)
        by_size[size] += (time.perf_counter_ns() - t0, 1)
        return need
    return run(self, timed, cost, *step)

Workspace.run = timed_run
cfg = ExperimentConfig(deployment=DEPLOYMENTS["opt-13b"], policy=PolicySpec(name=policy),
                       sim=SimOptions(progress=False), seed=0)
trace = load_trace(trace_path)
t0 = time.perf_counter()
simulate_to_dir(trace, cfg, out, trace_path=trace_path)
wall = time.perf_counter() - t0
print(f"  simulation {wall:.1f} s, decision {by_size[:, 0].sum() / 1e9:.2f} s"
      f" in {int(by_size[:, 1].sum())} calls")
for bits, (ns, calls) in enumerate(by_size):
    if calls:
        print(f"  live < {2 ** bits:6d}: {int(calls):9d} calls {ns / calls / 1e3:8.2f} us/call"
              f" {ns / 1e9:7.2f} s")
"""


def _run(tree: Path, trace: Path, policy: str, out: Path) -> None:
    print(f"== {tree} ({policy})", flush=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, "-c", _CHILD, str(trace), policy, str(out)], cwd=tree,
                   env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path, help="a trace file (accelgen trace --out)")
    ap.add_argument("--policy", default="accelgen", help="accelgen or oracle (one Oracle run)")
    ap.add_argument("--checkout", type=Path, help="another source tree, run after this one")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_decision_sizes"),
                    help="results directory of the simulations (one per tree)")
    args = ap.parse_args()
    trees = [ROOT, *([args.checkout.resolve()] if args.checkout else [])]
    for k, tree in enumerate(trees):
        _run(tree, args.trace.resolve(), args.policy, args.out / f"tree{k}")
    print(f"bench_decision_sizes: {len(trees)} tree(s), {args.policy}, results in {args.out}")


if __name__ == "__main__":
    main()
