"""Option spellings shared by the command-line modules: one spelling per option across every
command (``tests/test_cli_options.py`` holds the rule); an older spelling stays accepted as a
hidden alias."""

from __future__ import annotations

import argparse


def hidden_alias(parser: argparse.ArgumentParser | argparse._ArgumentGroup, alias: str,
                 dest: str) -> None:
    """Accept ``alias`` for the option of ``parser`` that stores into ``dest``, with the same
    type, choices and action, but hidden from ``--help`` (an older spelling kept working)."""
    target = next((a for a in parser._actions if a.dest == dest and a.option_strings), None)
    if target is None:
        raise ValueError(f"no option stores into {dest!r}")
    kwargs: dict[str, object] = {"dest": dest, "help": argparse.SUPPRESS,
                                 "default": argparse.SUPPRESS}
    if isinstance(target, argparse._StoreTrueAction | argparse._StoreFalseAction):
        kwargs["action"] = "store_true" if isinstance(target, argparse._StoreTrueAction) \
            else "store_false"
    elif isinstance(target, argparse._AppendAction):
        kwargs.update(action="append", type=target.type, metavar=target.metavar)
    else:
        kwargs.update(type=target.type, choices=target.choices, nargs=target.nargs,
                      metavar=target.metavar)
    parser.add_argument(alias, **kwargs)  # type: ignore[arg-type]
