"""Which build of AccelGen's decision (``accelgen_decision.decide``) a process runs.

- **Ahead of time** (the default once built; ``bash scripts/setup.sh`` or ``python -m
  accelgen.policies.accelgen_compiled build``): a C extension module compiled with numba's
  ``pycc`` into ``__pycache__/``, named after a digest of its sources. It loads in milliseconds
  without importing numba (numba's own start-up is what a JIT cache cannot avoid).
- **JIT**: numba compiles the same functions on first use and caches them (``cache=True``), for
  sources without a matching build (e.g. while editing the decision).
- **Python**: ``NUMBA_DISABLE_JIT=1`` runs the same functions interpreted (for a debugger).

``ACCELGEN_DECISION=aot|jit|python`` forces one (``aot`` fails if no build matches).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, cast

from accelgen.policies.accelgen_table import RequestTable
from accelgen.policies.accelgen_workspace import Workspace

DecideFn = Callable[[Any], int]

_HERE = Path(__file__).resolve().parent
# Everything the compiled module is built from: the code, and the record layouts in its signature.
_SOURCES = (_HERE / "accelgen_decision.py", _HERE / "accelgen_workspace.py",
            _HERE / "accelgen_table.py", _HERE.parent / "costmodel" / "linear.py",
            _HERE.parent / "costmodel" / "analytic.py", _HERE.parent / "costmodel" / "base.py")
ENV = "ACCELGEN_DECISION"


def source_digest() -> str:
    h = hashlib.sha256()
    for f in _SOURCES:
        h.update(f.read_bytes())
    for dist in ("numba", "numpy"):
        h.update(importlib.metadata.version(dist).encode())
    return h.hexdigest()[:16]


def aot_path() -> Path:
    """Where the ahead-of-time build of the current sources lives (it may not exist)."""
    name = f"accelgen_decision_{source_digest()}"
    return _HERE / "__pycache__" / (name + sysconfig.get_config_var("EXT_SUFFIX"))


def _load_aot(path: Path) -> DecideFn:
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(DecideFn, module.decide)


def _signature() -> tuple[Any, ...]:
    """``decide``'s argument types: the arrays (the step's inputs are in them)."""
    from numba import typeof

    return (typeof(Workspace(RequestTable(capacity=1)).arrays),)


def _compile(compile_: Callable[[], object]) -> None:
    """Run numba's compilation; once more after dropping the decision's JIT cache if that cache
    cannot be read. (numba unpickles a cache index before checking that it is stale, and the
    index of a signature names the workspace's classes: after such a class changes, reading it
    fails.)"""
    try:
        compile_()
    except (AttributeError, ImportError):
        for stale in (_HERE / "__pycache__").glob("accelgen_decision.*.nb[ic]"):
            stale.unlink(missing_ok=True)
        compile_()


def _load_jit() -> DecideFn:
    from accelgen.policies.accelgen_decision import decide

    sig = _signature()
    _compile(lambda: decide.compile(sig))
    # The compiled entry point, called directly: numba's dispatcher would resolve the argument
    # types on every call (the arrays keep their types: same dtypes, same layout).
    return cast(DecideFn, decide.overloads[sig].entry_point)


@cache
def load() -> tuple[str, DecideFn]:
    """(build name, the decision function) for this process."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "aot", "jit", "python"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, aot, jit or python")
    if mode == "python" or os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        os.environ["NUMBA_DISABLE_JIT"] = "1"  # read when numba is imported
        from accelgen.policies.accelgen_decision import decide

        if hasattr(decide, "py_func"):
            raise RuntimeError(f"{ENV}=python: numba was imported before; set "
                               "NUMBA_DISABLE_JIT=1 when the process starts")
        return "python", decide
    if mode in ("auto", "aot"):
        path = aot_path()
        if path.exists():
            return "aot", _load_aot(path)
        if mode == "aot":
            raise FileNotFoundError(f"{ENV}=aot: no build of the current sources at {path} "
                                    "(python -m accelgen.policies.accelgen_compiled build)")
    return "jit", _load_jit()


def build(out: Path | None = None) -> Path:
    """Compile the decision ahead of time (numba's ``pycc``, for a generic CPU of this
    architecture; needs a C compiler). Written to a temporary name and moved into place, so
    concurrent builds and readers never see half a file; builds of earlier sources are removed."""
    import warnings

    from numba import types

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        from numba.pycc import CC

    from accelgen.policies.accelgen_decision import decide

    out = out or aot_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    name = out.name.split(".")[0]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.use_nrt = False
        cc.export("decide", types.int64(*_signature()))(decide.py_func)
        _compile(cc.compile)
        (built,) = Path(tmp).glob(name + "*")
        os.replace(built, out)
    for stale in out.parent.glob("accelgen_decision_*"):  # builds of earlier sources
        if stale.name != out.name:
            stale.unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        raise SystemExit("usage: python -m accelgen.policies.accelgen_compiled build")
    built = build()
    print(f"accelgen_compiled: built {built} ({built.stat().st_size // 1024} KiB)")
