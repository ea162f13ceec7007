"""The scripts under ``scripts/`` import only what the package has: a module that moves (a
refactor of the package) must take its scripts along, or this fails before a user runs one."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


def _accelgen_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every ``import accelgen...`` / ``from accelgen... import name``."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelgen"):
            out += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("accelgen")]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_resolve(script: Path) -> None:
    missing = []
    for module, name in _accelgen_imports(script):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            missing.append(f"{module} ({e})")
            continue
        if name is not None and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports what the package does not have: {missing}"


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) > 5


def test_measure_jobs_samples_each_group_evenly() -> None:
    """``scripts/measure_jobs.py``'s sample: every n-th run from the first, or as many of each
    system's (policy's) runs, so that a tuned variant is measured apart from its policy."""
    import sys

    sys.path.insert(0, str(SCRIPTS[0].parent))
    try:
        from measure_jobs import evenly_spaced  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    runs = [(system, i) for i in range(12) for system in ("vllm", "vllm-tuned", "sarathi")]
    assert evenly_spaced(runs, 4) == runs[0:36:9]
    per_system = evenly_spaced(runs, 3, lambda r: r[0])
    assert [r[0] for r in per_system] == ["vllm"] * 3 + ["vllm-tuned"] * 3 + ["sarathi"] * 3
    assert [r[1] for r in per_system] == [0, 4, 8] * 3
    assert evenly_spaced(runs[:2], 5) == runs[:2]


def test_measure_jobs_gives_a_systems_jobs_in_the_tables_units() -> None:
    """``--reference``'s rows: the mean CPU time per load factor over the session's speed, as
    ``CAPACITY_MEASURED`` holds them (a job without a load factor is not a capacity job)."""
    import math
    import sys

    sys.path.insert(0, str(SCRIPTS[0].parent))
    try:
        from measure_jobs import table_rows  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    measured = [("vllm", 0.5, 3.0), ("vllm", 0.0625, 4.0), ("vllm", 0.5, 5.0),
                ("vllm-tuned", 1.0, 6.0), ("vllm", math.nan, 99.0)]
    assert table_rows(measured, 2.0) == ['    "vllm": ((0.0625, 2.00), (0.5, 2.00)),',
                                         '    "vllm-tuned": ((1.0, 3.00),),']
