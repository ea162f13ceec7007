"""Simulator speed benchmark (a script, not a unit test: wall-clock numbers are noisy here).

Builds two traces with `accelgen trace` (OPT-13B, A100):

- ``paper``: the paper's 20K requests at 8 req/s (``config/paper.yaml``, max_model_len 8191);
- ``bursty``: 3K requests of the same mix with gamma arrivals, CV 4, at 8 req/s.

and simulates each policy on each trace, every run in a fresh process (``accelgen.sim.runner``,
as ``accelgen simulate`` does, results written to a temporary directory), one at a time. Per run
it prints the wall and CPU time of the whole process (trace load, simulation, metrics, files), the
simulation loop's own wall time and iterations per second, the peak RSS (``ru_maxrss`` of the
child), and the ratio of the wall time to the ``vllm`` policy's in the same session. ``oracle``
runs one point of the Oracle's search (the Oracle's policy with its default parameters).

``--checkout DIR`` also runs another source tree (e.g. an export of the build before a change)
on the same traces, alternating the two trees run by run, and prints the ratio of their median
wall times side by side. Run it with nothing else busy and quote the load it prints:

    .venv/bin/python scripts/bench_sim.py \\
        --traces paper bursty [--policies vllm sarathi ...] [--checkout /tmp/base] [--repeats 3]

``--noise JSON`` instead runs this tree twice, alternating, without and with the engine's noise
(``sim.noise``, e.g. ``'{"kind": "lognormal", "step_sigma": 0.1}'``; docs/simulator.md): the
``noise/this`` ratio is the noise's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRACES = {
    "paper": ["--config", "config/paper.yaml", "--deployment", "opt-13b", "--max-model-len", "8191"],
    "bursty": ["--config", "config/paper.yaml", "--deployment", "opt-13b", "--max-model-len", "8191",
               "--num-requests", "3000", "--arrival", "gamma", "--cv", "4", "--rate", "8"],
    "quick": ["--config", "config/quick.yaml"],  # a smoke test of the script itself
}

# One simulation in a child process: the runner's path of `accelgen simulate`.
_CHILD = """
import sys
from accelgen.core.specs import ExperimentConfig, PolicySpec, SimOptions
from accelgen.costmodel.datasheets import DEPLOYMENTS
from accelgen.sim.runner import simulate_to_dir
from accelgen.workloads.trace import load_trace
trace_path, policy, out, noise = sys.argv[1:5]
sim = SimOptions(progress=False) if noise == "-" else SimOptions.model_validate(
    {"progress": False, "noise": __import__("json").loads(noise)})
cfg = ExperimentConfig(deployment=DEPLOYMENTS["opt-13b"], policy=PolicySpec(name=policy),
                       sim=sim, seed=0)
simulate_to_dir(load_trace(trace_path), cfg, out, trace_path=trace_path)
"""


@dataclass(slots=True)
class Run:
    tree: str
    trace: str
    policy: str
    wall_s: float = float("nan")
    cpu_s: float = float("nan")  # user + system time of the child (less disturbed by load)
    sim_s: float = float("nan")
    iterations: int = 0
    rss_mb: float = float("nan")
    error: str = ""

    @property
    def it_per_s(self) -> float:
        return self.iterations / self.sim_s if self.sim_s > 0 else float("nan")


def build_trace(name: str, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "accelgen.cli", "trace", *TRACES[name], "--out",
                    str(out), "--quiet"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def run_one(tree: Path, label: str, trace_name: str, trace: Path, policy: str,
            timeout: float, noise: str = "-") -> Run:
    run = Run(label, trace_name, policy)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="bench_sim.") as tmp:
        out = Path(tmp) / "out"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(trace), policy, str(out),
                                 noise],
                                cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = t0 + timeout
        status, rusage = 0, None
        while rusage is None:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rusage = ru
            elif time.perf_counter() > deadline:
                proc.kill()
                _, status, rusage = os.wait4(proc.pid, 0)
                run.error = f"timeout after {timeout:.0f} s"
            else:
                time.sleep(0.05)
        run.wall_s = time.perf_counter() - t0
        run.rss_mb = rusage.ru_maxrss / 1024  # KiB on Linux
        run.cpu_s = rusage.ru_utime + rusage.ru_stime
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read() if proc.stderr else ""
        if not run.error and proc.returncode != 0:
            run.error = (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:120]
        if not run.error:
            timing = json.loads((out / "timing.json").read_text())
            summary = json.loads((out / "summary.json").read_text())
            run.sim_s = float(timing["sim_wall_time_s"])
            run.iterations = int(summary["num_iterations"])
    return run


def _median(runs: list[Run], attr: str) -> float:
    vals = [getattr(r, attr) for r in runs if not r.error]
    return statistics.median(vals) if vals else float("nan")


def _median_of(runs: list[Run], trace: str, policy: str, tree: str, attr: str) -> float:
    """``_median`` of the runs of one trace, policy and tree."""
    return _median([r for r in runs if (r.trace, r.policy, r.tree) == (trace, policy, tree)], attr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from accelgen.policies.registry import POLICIES

    ap.add_argument("--policies", nargs="+", default=list(POLICIES),
                    help="policy names (default: every built-in policy)")
    ap.add_argument("--traces", nargs="+", choices=list(TRACES), default=["paper", "bursty"])
    ap.add_argument("--trace-dir", type=Path, help="reuse/keep the traces here (default: temp)")
    ap.add_argument("--checkout", type=Path, help="another source tree to run alternately")
    ap.add_argument("--noise", metavar="JSON",
                    help="run this tree alternately without and with this noise spec")
    ap.add_argument("--repeats", type=int, default=1, help="runs per tree, policy and trace")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--json", type=Path, help="also write every run here")
    args = ap.parse_args()
    trees = [(Path(ROOT), "this")]
    if args.checkout is not None and args.noise is not None:
        ap.error("--checkout and --noise: one comparison at a time")
    if args.checkout is not None:
        trees.insert(0, (args.checkout.resolve(), "checkout"))
    if args.noise is not None:
        trees.append((Path(ROOT), "noise"))
    other_label = "checkout" if args.checkout is not None else "noise"
    compared = args.checkout is not None or args.noise is not None
    policies = ["vllm", *[p for p in args.policies if p != "vllm"]]  # vllm: the reference
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min); trees: "
          + ", ".join(f"{label}={tree}" for tree, label in trees), flush=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = args.trace_dir or Path(tmp)
        trace_dir.mkdir(parents=True, exist_ok=True)
        print(f"{'trace':6} {'policy':10} {'tree':8} {'wall s':>8} {'CPU s':>8} {'sim s':>8} "
              f"{'iterations':>10} {'it/s':>8} {'RSS MB':>7}", flush=True)
        for trace_name in args.traces:
            trace = trace_dir / f"{trace_name}.parquet"
            if not trace.exists():
                build_trace(trace_name, trace)
            for policy in policies:
                for _ in range(args.repeats):
                    for tree, label in trees:  # alternating: the same machine state for both
                        noise = args.noise if label == "noise" else "-"
                        r = run_one(tree, label, trace_name, trace, policy, args.timeout, noise)
                        runs.append(r)
                        note = f"  {r.error}" if r.error else ""
                        print(f"{trace_name:6} {policy:10} {label:8} {r.wall_s:8.1f} "
                              f"{r.cpu_s:8.1f} {r.sim_s:8.1f} {r.iterations:10d} {r.it_per_s:8.0f} "
                              f"{r.rss_mb:7.0f}{note}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    print("\nmedians (wall: the whole process; x vllm: wall / vllm's wall in the same tree"
          + (f"; this/{other_label} and {other_label}/this: wall ratios of the two)"
             if compared else ")"))
    for trace_name in args.traces:
        for _, label in trees:
            ref = _median_of(runs, trace_name, "vllm", label, "wall_s")
            for policy in policies:
                sel = [r for r in runs if (r.trace, r.policy, r.tree) == (trace_name, policy, label)]
                wall = _median(sel, "wall_s")
                line = (f"{trace_name:6} {policy:10} {label:8} wall {wall:8.1f} s  "
                        f"{_median(sel, 'it_per_s'):8.0f} it/s  RSS {_median(sel, 'rss_mb'):6.0f} MB"
                        f"  {wall / ref:5.2f} x vllm")
                if compared and label == "this":
                    other = _median_of(runs, trace_name, policy, other_label, "wall_s")
                    cpus = [_median_of(runs, trace_name, policy, t, "cpu_s")
                            for t in ("this", other_label)]
                    line += (f"  this/{other_label} {wall / other:5.2f}"
                             f" (CPU {cpus[0]:.1f} / {cpus[1]:.1f} s: {other_label}/this "
                             f"{cpus[1] / cpus[0]:5.2f})")
                    if args.noise is not None:
                        sims = [_median_of(runs, trace_name, policy, t, "sim_s")
                                for t in ("this", "noise")]
                        line += (f"  noise/this {other / wall:5.2f} (loop {sims[1] / sims[0]:5.2f}"
                                 ")")
                print(line)
    if args.json is not None:
        args.json.write_text(json.dumps([{**{k: getattr(r, k) for k in Run.__slots__},
                                          "it_per_s": r.it_per_s} for r in runs], indent=1))
    print(f"bench_sim: {len(runs)} runs, {sum(1 for r in runs if r.error)} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
