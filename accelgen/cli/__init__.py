"""Command-line entry point: ``accelgen <command> ...`` (also ``python -m accelgen.cli``).

Each command lives in its own module of this package, named for the command, that exposes
``add_parser(subparsers)``; the parser's ``func`` default runs it and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Only this package parses options; the layers below it are libraries, and nothing outside it
# imports it (tests/test_layers.py). `accelgen serve`'s parser stays with the server launcher it
# drives (accelgen.vllm_integration.serve), whose ServerProcess scripts and tests use as a library.

# (module, description) of every sub-command; imported lazily so `accelgen --help` stays fast.
COMMANDS: dict[str, str] = {
    "download": "accelgen.cli.download",
    "trace": "accelgen.cli.trace",
    "pivot": "accelgen.cli.pivot",
    "calibrate": "accelgen.cli.calibrate",
    "fit-noise": "accelgen.cli.fit_noise",
    "simulate": "accelgen.cli.simulate",
    "profile": "accelgen.cli.profile",
    "replay": "accelgen.cli.replay",
    "serve": "accelgen.vllm_integration.serve",
    "bench-serve": "accelgen.cli.bench_serve",
    "fidelity": "accelgen.cli.fidelity",
    "engine-sweep": "accelgen.cli.engine_sweep",
    "oracle": "accelgen.cli.oracle",
    "capacity": "accelgen.cli.capacity",
    "warm": "accelgen.cli.warm",
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
