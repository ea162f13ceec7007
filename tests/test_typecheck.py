"""mypy over the package, as a test: in its own xdist group it runs on the worker that is not
running the real-engine tests, beside them (the suite's critical path), instead of before the
whole suite in scripts/test.sh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "accelgen"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "Success: no issues found" in res.stdout, res.stdout[-2000:]
