"""mypy over the package, as a test: in its own xdist group it runs on the worker that is not
running the real-engine tests, beside them (the suite's critical path), instead of before the
whole suite in scripts/test.sh."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "accelgen"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "Success: no issues found" in res.stdout, res.stdout[-2000:]


def imported_modules(package: Path, top: str) -> set[str]:
    """The modules of ``top`` (and ``top`` itself) that the package's files import (``from
    top.x import name`` counts as ``top.x``: a submodule imported by name that way would not be
    seen, and the package imports none)."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found.update(n for n in names if n == top or n.startswith(top + "."))
    return found


def followed(module: str, overrides: list[dict[str, object]]) -> bool:
    """Whether mypy follows ``module`` under ``overrides``: the most specific pattern that names
    it decides (a module's own name over a wildcard, a longer wildcard over a shorter)."""
    best: tuple[int, str] | None = None
    for section in overrides:
        patterns = section["module"]
        assert isinstance(patterns, list)
        for pattern in patterns:
            if pattern == module:
                rank = 10_000
            elif pattern.endswith(".*") and (module == pattern[:-2]
                                             or module.startswith(pattern[:-1])):
                rank = len(pattern)
            else:
                continue
            if best is None or rank > best[0]:
                best = (rank, str(section.get("follow_imports", "normal")))
    return best is None or best[1] == "normal"


def test_mypy_follows_every_vllm_module_the_package_imports() -> None:
    """The config skips vLLM but for the modules the plugin imports (pyproject.toml): a new
    import of a skipped module would make its types Any, unchecked, without a word."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    imported = imported_modules(ROOT / "accelgen", "vllm")
    assert "vllm.v1.core.sched.scheduler" in imported, sorted(imported)
    assert not followed("vllm.model_executor.models.opt", overrides)  # (the skip itself works)
    assert not followed("openai.types", overrides)
    skipped = sorted(m for m in imported if not followed(m, overrides))
    assert not skipped, f"vLLM modules imported by accelgen but not followed by mypy: {skipped}"
