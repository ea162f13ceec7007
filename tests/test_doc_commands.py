"""Every Snakemake command line the docs show (README.md and docs/*.md) parses and plans: each is
run as written with ``-n`` (a dry run) added after ``snakemake``, in a scratch copy of the
workflow (so a run in the checkout is neither read nor locked), and fails the test if Snakemake
rejects it. Files a command names that the docs define beside it (``vq.yaml`` = ``{...}``,
``echo '...' > no-fidelity.yaml``) are written from those definitions.

The SLURM profiles (``--profile profiles/slurm``) need the executor plugin, which CI does not
install (``scripts/setup.sh --cluster`` does). Where the plugin is missing, those commands run
with the profile as shipped except its ``executor: slurm`` line (the local executor plans the
same jobs with the same resources), and without the plugin's own options (``--slurm-*`` and
their value), which only the plugin's parser knows; the test says so in its output. Everything
else of such a command line, the target and every multi-value option included, is checked.
Where the plugin is installed, the commands run as written, except a ``--slurm-*`` option that
this plugin version does not have (``--slurm-status-command`` came with 2.0; the docs say which
version each command needs), which is left out and named in the output.

Cost: every command line runs in one Python process (``tests/snakemake_dry_runs.py``): each is
parsed by Snakemake's parser, and those that parse to the same settings but for their targets,
cores and job groups are planned by one dry run with all their targets (and the groups, where a
line has them), so a DAG is built once per configuration (the paper config's is the largest), not
once per line. That DAG's job counts also check the paper config's grid.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_pipeline import assert_plans_the_grid

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLUGIN = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
WORKFLOW = ("Snakefile", "environment.yml", "environment-gpu.yml", "rules", "config",
            "notebooks", "profiles")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as written
    argv: tuple[str, ...]  # after `snakemake`


def _brace(token: str) -> list[str]:
    """The shell's brace expansion of one ``{a,b}`` group (what the docs use)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m.group(1).split(",")
            for x in _brace(token[:m.start()] + alt + token[m.end():])]


def _snakemake_parts(text: str) -> list[tuple[str, ...]]:
    """The argv after ``snakemake`` of each snakemake command in one shell line."""
    out = []
    for part in re.split(r"&&|;|\|", text):
        try:
            tokens = shlex.split(part, comments=True)
        except ValueError:
            continue
        if tokens[:1] == ["time"]:
            tokens = tokens[1:]
        # A bare `snakemake` in prose names the program; a command line has arguments.
        if len(tokens) > 1 and (tokens[0] == "snakemake" or tokens[0].endswith("/snakemake")):
            out.append(tuple(itertools.chain.from_iterable(_brace(t) for t in tokens[1:])))
    return out


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def documented_commands(path: Path, text: str | None = None) -> list[Command]:
    """Snakemake command lines of a Markdown file: lines of fenced and indented code blocks
    (with their backslash continuations) and inline code spans (which may wrap lines)."""
    text = path.read_text() if text is None else text
    name = path.name if path.parent == ROOT else f"{path.parent.name}/{path.name}"
    found: list[Command] = []
    prose = list(text)
    for block in re.finditer(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", text, re.S | re.M):
        start = block.start(1)
        for k in range(block.start(), block.end()):
            if prose[k] != "\n":
                prose[k] = " "  # keep offsets, drop the block from the prose
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            first = i
            line = lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            where = f"{name}:{_line_of(text, start) + first}"
            found += [Command(where, line.strip(), argv) for argv in _snakemake_parts(line)]
            i += 1
    spans = "".join(prose)
    # Indented code blocks (and indented prose, which yields no command line).
    lines = spans.split("\n")
    for n, line in enumerate(lines):
        if line.startswith("    ") and line.strip() and not lines[n - 1].rstrip().endswith("\\"):
            k = n
            while line.rstrip().endswith("\\") and k + 1 < len(lines):
                k += 1
                line = line.rstrip()[:-1] + " " + lines[k]
            if "`" not in line:
                found += [Command(f"{name}:{n + 1}", line.strip(), argv)
                          for argv in _snakemake_parts(line)]
    for m in re.finditer(r"(`+)(.+?)\1", spans, re.S):
        content = m.group(2)
        inner = [c.group(2) for c in re.finditer(r"(`+)(.+?)\1", content, re.S)] or [content]
        for code in inner:
            flat = " ".join(code.split())
            where = f"{name}:{_line_of(text, m.start())}"
            found += [Command(where, flat, argv) for argv in _snakemake_parts(flat)]
    return found


def defined_files(texts: list[str]) -> dict[str, str]:
    """YAML files the docs define for their commands: `NAME.yaml` = `{...}`, and
    echo '...' > NAME.yaml."""
    out: dict[str, str] = {}
    for text in texts:
        for m in re.finditer(r"`([\w.-]+\.ya?ml)`\s*=\s*`(\{.*?\})`", text, re.S):
            out[m.group(1)] = " ".join(m.group(2).split()) + "\n"
        for m in re.finditer(r"echo '([^']*)' > ([\w.-]+\.ya?ml)", text):
            out[m.group(2)] = m.group(1) + "\n"
    return out


def plugin_options() -> tuple[str, set[str]] | None:
    """The installed SLURM executor plugin's version and its own options, or None."""
    if not PLUGIN:
        return None
    import dataclasses
    from importlib.metadata import version

    import snakemake_executor_plugin_slurm as slurm

    return (version("snakemake-executor-plugin-slurm"),
            {"--slurm-" + f.name.replace("_", "-") for f in dataclasses.fields(slurm.ExecutorSettings)})


def dry_run_argv(cmd: Command) -> tuple[list[str], str]:
    """The argv of the dry run, and what was changed for a missing SLURM plugin, or for
    options the installed plugin version does not have ('' if nothing)."""
    argv = list(cmd.argv)
    if not any(a.startswith("profiles/slurm") for a in argv):
        return ["-n", *argv], ""
    plugin = plugin_options()
    known = plugin[1] if plugin else set()
    kept: list[str] = []
    dropped: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("--slurm-") and a.split("=")[0] not in known:
            skip = "=" not in a
            dropped.append(a.split("=")[0])
        else:
            kept.append(a)
    if plugin is None:
        note = "SLURM plugin missing: local executor"
    elif dropped:
        note = f"SLURM plugin {plugin[0]} installed"
    else:
        return ["-n", *argv], ""
    if dropped:
        note += f", without {', '.join(dropped)} (" + (
            "the plugin's own options" if plugin is None else
            "options of another plugin version, docs/ARTIFACT.md says which") + ")"
    return ["-n", *kept], note


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch copy of the workflow, the docs' own YAML files beside it, and the SLURM
    profiles without ``executor: slurm`` where the plugin is missing."""
    work = tmp_path_factory.mktemp("doc-commands")
    for name in WORKFLOW:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name)
        elif src.exists():
            shutil.copy2(src, work / name)
    for name, body in defined_files([d.read_text() for d in DOCS]).items():
        (work / name).write_text(body)
    if not PLUGIN:
        for profile in (work / "profiles").glob("slurm*/config.yaml"):
            lines = profile.read_text().splitlines(keepends=True)
            profile.write_text("".join(ln for ln in lines if not ln.startswith("executor:")))
    return work


@dataclass(frozen=True)
class Plan:
    error: str | None  # None: planned
    jobs: dict[str, int]  # the plan's job counts per rule


def dry_run(argvs: list[list[str]], cwd: Path) -> list[Plan]:
    """``tests/snakemake_dry_runs.py`` on ``argvs`` in ``cwd``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "snakemake_dry_runs.py")],
                         input=json.dumps(argvs), cwd=cwd, capture_output=True, text=True,
                         timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    stderr = res.stderr.strip()[-600:]
    return [Plan(r["error"] if r["error"] is None else f"{r['error']}\n  (stderr: {stderr})",
                 r["jobs"]) for r in json.loads(res.stdout)]


def all_documented() -> list[Command]:
    return [c for d in DOCS for c in documented_commands(d)]


def test_the_docs_show_the_commands_this_test_checks() -> None:
    """The extraction finds the commands of README.md and docs/ARTIFACT.md (a change of the
    Markdown that hides them from this test fails here)."""
    cmds = all_documented()
    by_doc = {d: [c for c in cmds if c.where.startswith(d + ":")]
              for d in ("README.md", "docs/ARTIFACT.md")}
    assert len(by_doc["README.md"]) >= 5 and len(by_doc["docs/ARTIFACT.md"]) >= 8, by_doc
    argvs = {c.argv for c in cmds}
    assert ("--profile", "profiles/slurm", "--configfile", "config/paper.yaml") in argvs
    assert any("--slurm-status-command" in a for a in argvs)
    # Targets come before the multi-value options (--configfile, --set-resources, ...), not
    # after them behind `--`: one way to write a command line.
    assert not [c.where for c in cmds if "--" in c.argv]


PLANTED = ("Submit one figure:\n\n```bash\n.venv/bin/snakemake --profile profiles/slurm "
           "--set-resources simulate:slurm_account=X fig07\n```\n")


def planted_pair() -> tuple[Command, Command]:
    """The issue's command (the target after `--set-resources`), found in Markdown as the docs'
    are, and the same command with the target first."""
    (cmd,) = documented_commands(ROOT / "docs" / "planted.md", PLANTED)
    fixed = Command(cmd.where, cmd.text, ("--profile", "profiles/slurm", "fig07",
                                          "--set-resources", "simulate:slurm_account=X"))
    return cmd, fixed


def config_files(argv: Sequence[str]) -> tuple[str, ...]:
    """The ``--configfile`` arguments of a command line (the files its plan reads)."""
    files: list[str] = []
    taking = False
    for a in argv:
        if a.startswith("-"):
            taking = a == "--configfile"
            if a.startswith("--configfile="):
                files.append(a.split("=", 1)[1])
        elif taking:
            files.append(a)
    return tuple(files)


@pytest.fixture(scope="module")
def plans(workdir: Path) -> dict[tuple[str, ...], Plan]:
    """Every documented command line and the planted pair, dry-run in two processes beside
    each other: the lines of the paper config in one, the rest in the other (each the lines of
    whole configs, so that no plan is built twice). A dry run of the paper config is a minute of
    one core, and the docs have two such plans (with and without the fidelity stage)."""
    argvs = list(dict.fromkeys(c.argv for c in [*all_documented(), *planted_pair()]))
    paper = config_files(PAPER_RUN)
    halves = ([a for a in argvs if config_files(a) == paper],
              [a for a in argvs if config_files(a) != paper])
    with ThreadPoolExecutor(max_workers=2) as pool:
        planned = list(pool.map(
            lambda half: dry_run([dry_run_argv(Command("", "", a))[0] for a in half], workdir),
            halves))
    return {a: plan for half, got in zip(halves, planned, strict=True)
            for a, plan in zip(half, got, strict=True)}


@pytest.mark.slow
def test_every_documented_snakemake_command_plans(plans: dict[tuple[str, ...], Plan]) -> None:
    runs: dict[tuple[str, ...], list[Command]] = {}
    for cmd in all_documented():
        runs.setdefault(cmd.argv, []).append(cmd)
    notes = [f"{', '.join(c.where for c in cmds)}: {note}" for cmds in runs.values()
             if (note := dry_run_argv(cmds[0])[1])]
    failed = [f"{', '.join(c.where for c in cmds)}: snakemake {shlex.join(argv)}\n    "
              f"{plans[argv].error}" for argv, cmds in runs.items()
              if plans[argv].error is not None]
    print(f"{len(runs)} distinct command lines dry-run; " + "; ".join(notes))
    assert not failed, "documented commands that do not parse or plan:\n" + "\n".join(failed)


def test_a_target_after_a_multi_value_option_is_caught(
        plans: dict[tuple[str, ...], Plan]) -> None:
    """The defect this test exists for: `--set-resources` takes every word after it, so a
    target written after it is read as a resource and Snakemake stops; with the target first
    the same command plans."""
    bad, good = planted_pair()
    assert bad.argv[-1] == "fig07" and plans[bad.argv].error is not None
    assert "not enough values to unpack" in str(plans[bad.argv].error), plans[bad.argv]
    assert plans[good.argv].error is None, plans[good.argv]


PAPER_RUN = ("--cores", "all", "--configfile", "config/paper.yaml")


@pytest.mark.slow
def test_the_documented_paper_run_plans_every_job_of_its_grid(
        plans: dict[tuple[str, ...], Plan]) -> None:
    """The paper config's plan (thousands of jobs) has every simulation, trace, figure and
    notebook of its grid once: checked here, on the DAG the docs' paper command built, rather
    than on a second DAG of its own (tests/test_pipeline.py checks the quick config)."""
    assert PAPER_RUN in plans, "the docs no longer show `snakemake " + " ".join(PAPER_RUN) + "`"
    assert_plans_the_grid(plans[PAPER_RUN].jobs, ROOT / "config" / "paper.yaml")
