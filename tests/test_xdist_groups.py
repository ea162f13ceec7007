"""The suite's xdist grouping (tests/conftest.py): under ``--dist loadgroup`` the tests of one
module run on one worker, and the real-engine tests (marker ``vllm``) all on one worker; the
engine group is queued first and a module with a ``slow`` test next, whatever their sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = f'''
import importlib.util
spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_configure = suite.pytest_configure
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
'''

MODULE = '''
import os
import pytest

@pytest.mark.parametrize("i", range(4))
def test_plain(i, tmp_path_factory):
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.vllm
def test_engine():
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"engine {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''

SLOW = '''

@pytest.mark.slow
def test_slow():
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


@pytest.mark.slow
def test_a_module_and_the_engine_tests_each_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: engine\n    slow: slow\n")
    # The engine group has 3 tests, each module 4 (test_c 5): xdist's own order (most tests
    # first) would start the workers on test_c and another module.
    extra = {"test_a": "", "test_b": SLOW, "test_c": "\ndef test_extra():\n    pass\n"}
    for name, more in extra.items():
        (tmp_path / f"{name}.py").write_text(MODULE + more)
    where = tmp_path / "where.txt"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", str(tmp_path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "WHERE": str(where)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    first: dict[str, str] = {}
    for line in where.read_text().splitlines():
        group, worker = line.split()
        workers.setdefault(group, set()).add(worker)
        first.setdefault(worker, group)
    assert sorted(first.values()) == ["engine", "test_b"], first
    assert set(workers) == {"test_a", "test_b", "test_c", "engine"}
    assert all(len(w) == 1 for w in workers.values()), workers
    # Both workers were used (the groups spread), so one worker per group is not a fluke.
    assert len(set().union(*workers.values())) == 2, workers
