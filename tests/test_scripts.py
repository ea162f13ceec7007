"""The scripts under ``scripts/`` import only what the package has: a module that moves (a
refactor of the package) must take its scripts along, or this fails before a user runs one."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from typing import Any

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


def _measure_jobs() -> Any:
    """``scripts/measure_jobs.py`` as a module."""
    spec = importlib.util.spec_from_file_location("measure_jobs",
                                                  SCRIPTS[0].parent / "measure_jobs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_jobs_samples_each_group_evenly() -> None:
    """``scripts/measure_jobs.py``'s sample: every n-th run from the first, or as many of each
    system's (policy's) runs, so that a tuned variant is measured apart from its policy."""
    evenly_spaced = _measure_jobs().evenly_spaced
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

    table_rows = _measure_jobs().table_rows
    measured = [("vllm", 0.5, 3.0), ("vllm", 0.0625, 4.0), ("vllm", 0.5, 5.0),
                ("vllm-tuned", 1.0, 6.0), ("vllm", math.nan, 99.0)]
    assert table_rows(measured, 2.0) == ['    "vllm": ((0.0625, 2.00), (0.5, 2.00)),',
                                         '    "vllm-tuned": ((1.0, 3.00),),']


def test_measure_jobs_refuses_a_reference_beside_a_checkout(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--checkout`` compares two trees and would skip the reference job: the pair is refused
    (exit 2, both options named) before any work, not silently half-done."""
    with pytest.raises(SystemExit) as exited:
        _measure_jobs().main(["config/paper.yaml", "--reference", "--checkout", "/nonexistent"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--reference" in err and "--checkout" in err


def test_measure_jobs_writes_the_hosts_speed(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--speed-out`` (what ``scripts/paper_scaled.sh --reference`` reads): the reference job's
    CPU seconds, its price and their mean's ratio; refused without ``--reference`` (exit 2)
    before any work."""
    import json

    module = _measure_jobs()
    out = tmp_path / "deep" / "speed.json"
    module.write_speed(out, [48.0, 50.0], 98.0)
    assert json.loads(out.read_text()) == {"reference_cpu_s": [48.0, 50.0], "price_s": 98.0,
                                           "speed": 0.5}
    with pytest.raises(SystemExit) as exited:
        module.main(["config/paper.yaml", "--speed-out", str(out)])
    assert exited.value.code == 2
    assert "--speed-out needs --reference" in capsys.readouterr().err
