"""One spelling per option across every command line (`accelgen <command>` and `python -m
accelgen.pipeline <command>`): every parser is walked, and a destination spelled two ways (two
visible spellings, in one command or in two), a spelling that stores into two destinations, one
value kind (a parser function of the package, e.g. ``kv_cache_gb_arg``) stored under two
destinations (the same option named two ways: ``--kv-gb`` and ``--kv-cache-gb`` once), or a
hidden alias of nothing visible fails the test. An older spelling stays accepted as a hidden alias
(``accelgen.cli.options.hidden_alias``)."""

from __future__ import annotations

import argparse
import importlib
from collections import defaultdict
from collections.abc import Iterator

import pytest

from accelgen.cli import COMMANDS, build_parser
from accelgen.cli import main as cli_main


def _commands(parser: argparse.ArgumentParser, path: str
              ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every sub-command parser under it, with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by its command line (each module imported afresh for its own
    ``add_parser``, so that a patched module is seen)."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name in COMMANDS:
        top = build_parser([name])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        if name in sub.choices:
            out.update(_commands(sub.choices[name], f"accelgen {name}"))
    pipeline = importlib.import_module("accelgen.pipeline.__main__")
    out.update(_commands(pipeline.build_parser(), "python -m accelgen.pipeline"))
    return out


def spelling_conflicts(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What breaks the one-spelling rule, one line each (empty: nothing)."""
    visible: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    dests: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    kinds: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    problems = []
    for command, parser in parsers.items():
        shown = {a.dest for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS}
        for a in parser._actions:
            if not a.option_strings or a.dest == "help":
                continue
            # --x / --no-x of a BooleanOptionalAction are one option, spelled once.
            boolean = isinstance(a, argparse.BooleanOptionalAction)
            for spelling in a.option_strings:
                dests[spelling][a.dest].add(command)
                if a.help != argparse.SUPPRESS and not (boolean and spelling.startswith("--no-")):
                    visible[a.dest][spelling].add(command)
            kind = a.type
            if callable(kind) and getattr(kind, "__module__", "").startswith("accelgen"):
                kinds[f"{kind.__module__}.{kind.__qualname__}"][a.dest].add(command)
            if a.help == argparse.SUPPRESS and a.dest not in shown:
                problems.append(f"{command}: hidden {'/'.join(a.option_strings)} is an alias of "
                                f"no visible option ({a.dest})")
    for dest, spellings in sorted(visible.items()):
        if len(spellings) > 1:
            problems.append(f"destination {dest!r} is spelled " + ", ".join(
                f"{s} ({', '.join(sorted(c))})" for s, c in sorted(spellings.items())))
    for spelling, where in sorted(dests.items()):
        if len(where) > 1:
            problems.append(f"{spelling} stores into " + ", ".join(
                f"{d} ({', '.join(sorted(c))})" for d, c in sorted(where.items())))
    for kind_name, where in sorted(kinds.items()):
        if len(where) > 1:
            problems.append(f"values parsed by {kind_name} are stored as " + ", ".join(
                f"{d} ({', '.join(sorted(c))})" for d, c in sorted(where.items())))
    return problems


def test_every_option_has_one_spelling() -> None:
    parsers = all_parsers()
    assert len(parsers) >= len(COMMANDS) + 7  # every command, fidelity's and the pipeline's
    assert spelling_conflicts(parsers) == []


def _plant(monkeypatch: pytest.MonkeyPatch, module: str, command: str, *spelling: str,
           dest: str, hidden: bool = False) -> None:
    """Make ``module``'s parser for ``command`` also take ``spelling`` into ``dest`` (a KV
    budget option parses its value as the others do)."""
    from accelgen.core.specs import kv_cache_gb_arg

    mod = importlib.import_module(module)
    original = mod.add_parser

    def add_parser(sub: argparse._SubParsersAction) -> None:
        original(sub)
        sub.choices[command].add_argument(
            *spelling, dest=dest, help=argparse.SUPPRESS if hidden else "planted",
            type=kv_cache_gb_arg if spelling[0].startswith("--kv-gb") else None)

    monkeypatch.setattr(mod, "add_parser", add_parser)


@pytest.mark.parametrize("module, command, spelling, dest, hidden, found", [
    # the KV option spelled as `accelgen simulate` once spelled it, in `accelgen capacity`
    ("accelgen.cli.capacity", "capacity", "--kv-gb", "kv_cache_gb", False,
     "destination 'kv_cache_gb' is spelled --kv-cache-gb (accelgen calibrate, accelgen "
     "capacity, accelgen pivot, accelgen simulate), --kv-gb (accelgen capacity)"),
    # a second visible spelling in another command
    ("accelgen.cli.replay", "replay", "--kv-blocks", "num_gpu_blocks", False,
     "destination 'num_gpu_blocks' is spelled --kv-blocks (accelgen replay), --num-gpu-blocks"),
    # one spelling, two destinations
    ("accelgen.cli.simulate", "simulate", "--seeds", "seed_list", False,
     "--seeds stores into"),
    # a hidden alias of nothing visible
    ("accelgen.cli.simulate", "simulate", "--old-name", "gone", True,
     "accelgen simulate: hidden --old-name is an alias of no visible option (gone)"),
    # the KV budget under its own destination again, as `accelgen simulate` once had it
    ("accelgen.cli.replay", "replay", "--kv-gb", "kv_gb", False,
     "values parsed by accelgen.core.specs.kv_cache_gb_arg are stored as kv_cache_gb (accelgen "
     "calibrate, accelgen capacity, accelgen pivot, accelgen simulate), kv_gb (accelgen replay)"),
])
def test_a_planted_second_spelling_is_found(monkeypatch: pytest.MonkeyPatch, module: str,
                                            command: str, spelling: str, dest: str,
                                            hidden: bool, found: str) -> None:
    if spelling == "--seeds":  # one spelling into two destinations: plant it twice
        _plant(monkeypatch, "accelgen.cli.capacity", "capacity", spelling,
               dest="seed_count")
    _plant(monkeypatch, module, command, spelling, dest=dest, hidden=hidden)
    problems = spelling_conflicts(all_parsers())
    assert any(found in p for p in problems), problems


@pytest.mark.parametrize("argv, dest, value", [
    (["simulate", "--trace", "t", "--out", "o", "--kv-gb", "auto"], "kv_cache_gb", "auto"),
    (["simulate", "--trace", "t", "--out", "o", "--kv-cache-gb", "3"], "kv_cache_gb", 3.0),
    (["profile", "--num-blocks", "65"], "num_gpu_blocks", 65),
    (["calibrate", "--points", "p", "--out", "o", "--kv-gb", "2"], "kv_cache_gb", 2.0),
])
def test_an_older_spelling_still_works_hidden(argv: list[str], dest: str, value: object,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    args, _ = build_parser(argv).parse_known_args(argv)
    assert getattr(args, dest) == value
    with pytest.raises(SystemExit):
        cli_main([argv[0], "--help"])
    shown = capsys.readouterr().out
    old = next(a for a in argv if a in ("--kv-gb", "--num-blocks", "--kv-cache-gb"))
    assert (old in shown) == (old == "--kv-cache-gb")
