"""AccelGen decides as the build before its decision became one compiled implementation: the
golden digests (``tests/accelgen_golden.py``) of this process's build, of the JIT build and of the
interpreted one (``NUMBA_DISABLE_JIT=1``), each in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelgen.policies.accelgen.build import load
from tests import accelgen_golden as golden

WANT: dict[str, str] = json.loads(golden.DIGESTS.read_text())
ROOT = Path(__file__).resolve().parent.parent


def test_the_golden_runs_decide_as_the_reference_build() -> None:
    got = golden.run_digests()
    assert sorted(got) == sorted(WANT)
    differ = [name for name in WANT if got[name] != WANT[name]]
    assert not differ, f"decisions changed ({load()[0]} build): {differ}"


def _digests_in_a_fresh_process(env: dict[str, str], names: list[str]) -> tuple[str, dict]:
    code = ("import json, sys; sys.path.insert(0, 'tests'); import accelgen_golden as g; "
            "from accelgen.policies.accelgen.build import load; "
            f"print(json.dumps([load()[0], g.run_digests({names!r})]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env},
                         capture_output=True, text=True, timeout=900, check=True).stdout
    build, digests = json.loads(out.strip().splitlines()[-1])
    return build, digests


@pytest.mark.slow
@pytest.mark.parametrize(("env", "build", "names"), [
    ({"NUMBA_DISABLE_JIT": "1"}, "python", ["overload/accelgen", "overload/oracle"]),
    ({"ACCELGEN_DECISION": "jit"}, "jit",
     ["overload/accelgen", "overload/no-chunk", "overload/oracle", "long/era-request"]),
], ids=["jit-off", "jit"])
def test_other_builds_decide_the_same(env: dict[str, str], build: str, names: list[str]) -> None:
    """The interpreted debugging path (``NUMBA_DISABLE_JIT=1``) and numba's JIT run the same
    functions as the ahead-of-time build, with the same results files."""
    ran, got = _digests_in_a_fresh_process(env, names)
    assert ran == build
    assert got == {name: WANT[name] for name in names}


def test_the_closed_loop_decides_as_the_open_loop_in_the_deterministic_simulator() -> None:
    """The simulator charges what the cost model predicts: no error, no margin, the same files."""
    for trace in ("overload", "moderate", "long"):
        assert WANT[f"{trace}/closed-loop"] == WANT[f"{trace}/budget-batch"]
