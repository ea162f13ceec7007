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
