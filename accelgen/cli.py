"""Command-line entry point: ``accelgen <command> ...``.

Each command lives in its own module that exposes ``add_parser(subparsers)``; the parser's
``func`` default runs it and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, description) of every sub-command; imported lazily so `accelgen --help` stays fast.
COMMANDS: dict[str, str] = {
    "download": "accelgen.workloads.download_cli",
    "trace": "accelgen.workloads.cli",
    "pivot": "accelgen.costmodel.cli",
    "calibrate": "accelgen.costmodel.calibrate_cli",
    "simulate": "accelgen.sim.cli",
    "profile": "accelgen.profiling.cli",
    "replay": "accelgen.vllm_integration.cli",
    "serve": "accelgen.vllm_integration.serve",
    "bench-serve": "accelgen.serving.cli",
    "fidelity": "accelgen.fidelity.cli",
    "engine-sweep": "accelgen.engine_regime.cli",
    "oracle": "accelgen.sim.oracle_cli",
    "capacity": "accelgen.costmodel.capacity_cli",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, module in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name)
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.startswith("accelgen"):
                continue  # command not built yet
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, rest = parser.parse_known_args(argv)
    if rest:
        if not getattr(args, "passthrough", False):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.passthrough_args = rest  # another program's options (`accelgen serve`: vLLM's)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"accelgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
