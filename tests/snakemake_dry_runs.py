"""Dry runs of many Snakemake command lines in one process (``tests/test_doc_commands.py``):

    python tests/snakemake_dry_runs.py < argvs.json > results.json    # in the workflow's dir

Each command line (a JSON list of argv lists, ``-n`` among them) is parsed by Snakemake's own
parser, profiles included (``snakemake.cli.parse_args``: options, their values, resource
specifications, the profile's settings); a line it rejects fails there. Lines that parse to the
same plan (the same config files, config, workflow: everything but their targets and how jobs
run, ``HOW_TO_RUN``) are planned together: one ``args_to_api`` call (what ``snakemake`` runs
after parsing) with the first line's settings and every target of the group, so the workflow
is read and its DAG built once per plan, not once per line; lines with the default target form
their own plan. Job groups (a cluster profile's ``groups``) decide how planned jobs are
submitted, not which: a plan with groups among its lines is run with them, so that the grouping
is planned too. Imports (Snakemake, jsonschema, the package) are paid once. The result: for each
line, ``{"error": null or the error's last lines, "jobs": the plan's job counts per rule}``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import re
import sys
import time
import traceback
from typing import Any

# Settings that change how jobs run, not which jobs are planned: lines that differ only in these
# (and in their targets) share one dry run. Executor plugins' own settings start with their name.
HOW_TO_RUN = {"cores", "jobs", "local_cores", "profile", "executor", "default_resources",
              "set_resources", "resources", "set_threads", "latency_wait", "retries",
              "max_jobs_per_timespan", "rerun_incomplete", "printshellcmds", "targets",
              "groups", "group_components"}


def _key(args: Any) -> str:
    """What decides the plan of a command line: everything it sets except ``HOW_TO_RUN`` and
    executor plugin settings, and whether it has targets (the default target is another
    plan)."""
    fields = {k: repr(v) for k, v in vars(args).items()
              if k not in HOW_TO_RUN and not k.startswith("slurm")}
    return repr(sorted(fields.items())) + repr(bool(args.targets))


def _tail(text: str, lines: int = 4) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def job_counts(log: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run's log as {rule: count}."""
    counts: dict[str, int] = {}
    m = re.search(r"Job stats:\n(.*?)\n\n", log, re.S)
    for line in m.group(1).splitlines() if m else []:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def _plan(parser: Any, args: Any, targets: list[str]) -> dict[str, Any]:
    """The dry run ``args`` stands for, with ``targets``: its error's last lines (None when it
    planned) and its job counts."""
    from snakemake.cli import args_to_api

    args.targets = targets
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            ok = args_to_api(args, parser)
    except BaseException:  # a workflow error is the result to report
        return {"error": _tail(out.getvalue() + traceback.format_exc()) or "failed", "jobs": {}}
    error = None if ok else (_tail(out.getvalue()) or "failed (its log: stderr)")
    return {"error": error, "jobs": job_counts(out.getvalue())}


def _parse(argv: list[str]) -> tuple[Any, Any]:
    """Snakemake's parser on ``argv`` (its messages kept out of this process's output)."""
    from snakemake.cli import parse_args

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return parse_args(argv)


def _without_profile(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--profile":
            skip = True
        elif not a.startswith("--profile="):
            out.append(a)
    return out


def dry_runs(argvs: list[list[str]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{"error": None, "jobs": {}} for _ in argvs]
    groups: dict[str, list[tuple[int, Any, Any, list[str]]]] = {}
    for i, argv in enumerate(argvs):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                parser, args = _parse(argv)
        except SystemExit:  # argparse's error: usage and message on stderr
            results[i]["error"] = _tail(err.getvalue()) or "rejected by Snakemake's parser"
            continue
        except Exception:  # e.g. a target read as a resource: ValueError in a type converter
            results[i]["error"] = _tail(err.getvalue() + traceback.format_exc())
            continue
        groups.setdefault(_key(args), []).append((i, parser, args, list(args.targets)))
    for key, members in groups.items():
        gc.collect()  # the previous plan's DAG
        started = time.process_time()
        # The line with job groups when there is one (their grouping is planned too), else
        # the first.
        first, parser, args, _ = next((m for m in members if m[2].groups), members[0])
        # The plan without the profile when that is the same plan: a cluster profile's job
        # limits and default resources make a dry run of thousands of jobs slower, not other.
        with contextlib.suppress(Exception, SystemExit):
            plain_parser, plain = _parse(_without_profile(argvs[first]))
            if _key(plain) == key and plain.groups == args.groups:
                parser, args = plain_parser, plain
        targets = list(dict.fromkeys(t for *_, own in members for t in own))
        planned = _plan(parser, args, targets)
        for i, _, _, own in members:
            # A failed plan of several lines: each line alone says which of them fails.
            results[i] = planned if planned["error"] is None or len(members) == 1 else \
                _plan(parser, args, own)
        print(f"dry run of lines {[m[0] for m in members]}: targets {targets or 'default'}, "
              f"{time.process_time() - started:.1f} s CPU", file=sys.__stderr__)
    return results


if __name__ == "__main__":
    json.dump(dry_runs(json.load(sys.stdin)), sys.stdout)
