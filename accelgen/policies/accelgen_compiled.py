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
from functools import cache, partial
from pathlib import Path
from typing import Any, NamedTuple, cast

from accelgen.policies.accelgen_table import RequestTable
from accelgen.policies.accelgen_workspace import Workspace

DecideFn = Callable[[Any], int]
# The compiled functions besides the decision: the table's rows (``RequestTable``), every step.
KERNELS = ("read_rows", "decode_rows", "set_deadlines")


class Build(NamedTuple):
    """One build of the compiled code: its name (aot, jit, python) and its functions."""

    name: str
    decide: DecideFn
    read_rows: Callable[..., int]
    decode_rows: Callable[..., int]
    set_deadlines: Callable[..., int]

_HERE = Path(__file__).resolve().parent
# Everything the compiled module is built from: the code, and the record layouts in its signature.
_SOURCES = (_HERE / "accelgen_decision.py", _HERE / "accelgen_workspace.py",
            _HERE / "accelgen_table.py", _HERE / "accelgen_compiled.py",
            _HERE.parent / "costmodel" / "linear.py", _HERE.parent / "costmodel" / "analytic.py",
            _HERE.parent / "costmodel" / "base.py", _HERE.parent / "core" / "iteration.py")
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


def _load_aot(path: Path) -> Build:
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Build("aot", module.decide, *(getattr(module, k) for k in KERNELS))


def _signature() -> tuple[Any, ...]:
    """``decide``'s argument types: the arrays (the step's inputs are in them)."""
    from numba import typeof

    return (typeof(Workspace(RequestTable(capacity=1)).arrays),)


def _kernel_signatures() -> dict[str, tuple[Any, ...]]:
    """The argument types of ``KERNELS``: the table's rows, slots, the values read."""
    from numba import typeof, types

    rows, ints = typeof(RequestTable(capacity=1).rows), types.int64[::1]
    # (``decode_rows`` reads the slots where the decision wrote them: a field of its lists)
    return {"read_rows": (rows, types.float64[:, ::1], types.bool_, ints),
            "decode_rows": (rows, types.int64[:], types.int64, types.float64, ints),
            "set_deadlines": (rows, ints)}


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


def _load_jit() -> Build:
    from accelgen.policies import accelgen_decision

    sig, decide = _signature(), accelgen_decision.decide
    _compile(lambda: decide.compile(sig))
    kernels = []
    for name, ksig in _kernel_signatures().items():
        fn = getattr(accelgen_decision, name)
        _compile(partial(fn.compile, ksig))
        kernels.append(fn.overloads[ksig].entry_point)
    # The compiled entry points, called directly: numba's dispatcher would resolve the argument
    # types on every call (the arrays keep their types: same dtypes, same layout).
    return Build("jit", cast(DecideFn, decide.overloads[sig].entry_point), *kernels)


@cache
def load() -> Build:
    """The build this process runs: its name, the decision function, the table's kernels."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "aot", "jit", "python"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, aot, jit or python")
    if mode == "python" or os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        os.environ["NUMBA_DISABLE_JIT"] = "1"  # read when numba is imported
        from accelgen.policies import accelgen_decision as ad

        if hasattr(ad.decide, "py_func"):
            raise RuntimeError(f"{ENV}=python: numba was imported before; set "
                               "NUMBA_DISABLE_JIT=1 when the process starts")
        return Build("python", ad.decide, *(getattr(ad, k) for k in KERNELS))
    if mode in ("auto", "aot"):
        path = aot_path()
        if path.exists():
            return _load_aot(path)
        if mode == "aot":
            raise FileNotFoundError(f"{ENV}=aot: no build of the current sources at {path} "
                                    "(python -m accelgen.policies.accelgen_compiled build)")
    return _load_jit()


def build(out: Path | None = None) -> Path:
    """Compile the decision ahead of time (numba's ``pycc``, for a generic CPU of this
    architecture; needs a C compiler). Written to a temporary name and moved into place, so
    concurrent builds and readers never see half a file; builds of earlier sources are removed."""
    import warnings

    from numba import types

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        from numba.pycc import CC

    from accelgen.policies import accelgen_decision

    out = out or aot_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    name = out.name.split(".")[0]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.use_nrt = False
        cc.export("decide", types.int64(*_signature()))(accelgen_decision.decide.py_func)
        for kernel, ksig in _kernel_signatures().items():
            cc.export(kernel, types.int64(*ksig))(getattr(accelgen_decision, kernel).py_func)
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
