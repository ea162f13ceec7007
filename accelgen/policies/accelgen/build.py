"""Which build of the compiled decision a process runs: ahead of time (numba's ``pycc``), JIT or
plain Python (``docs/accelgen.md``, *The builds*); ``ACCELGEN_DECISION=aot|jit|python`` forces one."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sysconfig
import tempfile
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any, NamedTuple

from accelgen.policies.accelgen.table import RequestTable
from accelgen.policies.accelgen.workspace import Workspace

ENV = "ACCELGEN_DECISION"
_HERE = Path(__file__).resolve().parent
_CACHE = _HERE / "__pycache__"
# Everything the compiled module is built from: the code, and the record layouts in its signature
# (not the policy's modules, which run in Python).
_SOURCES = (*sorted(p for p in _HERE.glob("*.py")
                    if p.name not in ("__init__.py", "__main__.py", "policy.py", "oracle.py",
                                      "closed_loop.py")),
            *(_HERE.parent.parent / "costmodel" / f
              for f in ("linear.py", "analytic.py", "calibrated.py", "base.py")),
            _HERE.parent.parent / "core" / "iteration.py")


class Build(NamedTuple):
    """One build (aot, jit, python): the decision and the table's kernels (``rank``: every step)."""

    name: str
    decide: Callable[[Any], int]
    read_rows: Callable[..., int]
    decode_rows: Callable[..., int]
    set_deadlines: Callable[..., int]
    decode_run: Callable[..., int]


def source_digest() -> str:
    h = hashlib.sha256()
    for f in _SOURCES:
        h.update(f.read_bytes())
    for dist in ("numba", "numpy"):
        h.update(importlib.metadata.version(dist).encode())
    return h.hexdigest()[:16]


def aot_path() -> Path:
    """Where the ahead-of-time build of the current sources lives (it may not exist)."""
    return _CACHE / f"decide_{source_digest()}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _exports() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """The compiled functions in ``Build``'s order, each with its argument types."""
    import numpy as np
    from numba import typeof, types

    from accelgen.policies.accelgen import decide, decode_run, rank
    from accelgen.policies.accelgen.state import DECODE_RUN, LOOP_STATE

    ints, floats, rows = types.int64[::1], types.float64[::1], typeof(RequestTable(capacity=1).rows)
    arrays = typeof(Workspace(RequestTable(capacity=1)).arrays)
    run = typeof(np.zeros(1, DECODE_RUN).view(np.recarray))
    loop = typeof(np.zeros(1, LOOP_STATE).view(np.recarray))
    return {"decide": (decide.decide, (arrays,)),
            "read_rows": (rank.read_rows, (rows, types.float64[:, ::1], types.bool_, ints)),
            "decode_rows": (rank.decode_rows, (rows, ints, types.int64, types.float64, ints)),
            "set_deadlines": (rank.set_deadlines, (rows, ints)),
            "decode_run": (decode_run.decode_run,
                           (arrays, floats, floats, ints, ints, ints, run, floats,
                            types.float64[:, ::1], loop, floats, floats))}


def _compile(compile_: Callable[[], object]) -> None:
    """Run numba's compilation, once more after dropping the JIT cache if it cannot be read (numba
    unpickles a cache index, which names the record types, before checking that it is stale)."""
    try:
        compile_()
    except (AttributeError, ImportError):
        _drop_jit_cache()
        compile_()


def _drop_jit_cache() -> None:
    for stale in _CACHE.glob("*.nb[ic]"):
        stale.unlink(missing_ok=True)


def _fresh_jit_cache() -> None:
    """Drop the JIT cache unless it was built from the current sources. numba checks a cached function
    against its own file only, not the files of the functions it calls, and the ahead-of-time build
    reads the same cache: a caller's cached code would keep an edited callee's old code."""
    stamp, digest = _CACHE / "jit_sources", source_digest()
    if not stamp.exists() or stamp.read_text() != digest:
        _drop_jit_cache()
        _CACHE.mkdir(exist_ok=True)
        stamp.write_text(digest)


def _load_jit() -> Build:
    _fresh_jit_cache()
    entries = []
    for fn, sig in _exports().values():
        _compile(partial(fn.compile, sig))
        # The compiled entry point, called directly: numba's dispatcher would resolve the argument
        # types on every call (the arrays keep their types: same dtypes, same layout).
        entries.append(fn.overloads[sig].entry_point)
    return Build("jit", *entries)


@cache
def load() -> Build:
    """The build this process runs."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "aot", "jit", "python"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, aot, jit or python")
    if mode == "python" or os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        os.environ["NUMBA_DISABLE_JIT"] = "1"  # read when numba is imported
        fns = [fn for fn, _ in _exports().values()]
        if hasattr(fns[0], "py_func"):
            raise RuntimeError(f"{ENV}=python: numba was imported before; set "
                               "NUMBA_DISABLE_JIT=1 when the process starts")
        return Build("python", *fns)
    if mode in ("auto", "aot"):
        path = aot_path()
        if path.exists():
            spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return Build("aot", *(getattr(module, k) for k in Build._fields[1:]))
        if mode == "aot":
            raise FileNotFoundError(f"{ENV}=aot: no build of the current sources at {path} "
                                    "(python -m accelgen.policies.accelgen)")
    return _load_jit()


def build(out: Path | None = None) -> Path:
    """Compile the decision ahead of time (for a generic CPU of this architecture; needs a C
    compiler), to a temporary name moved into place (concurrent builds and readers never see half a
    file); builds of earlier sources are removed."""
    import warnings

    from numba import types

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        from numba.pycc import CC

    out = out or aot_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    _fresh_jit_cache()
    name = out.name.split(".")[0]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.use_nrt = False
        for fn_name, (fn, sig) in _exports().items():
            cc.export(fn_name, types.int64(*sig))(fn.py_func)
        _compile(cc.compile)
        (built,) = Path(tmp).glob(name + "*")
        os.replace(built, out)
    for stale in out.parent.glob("decide_*"):  # builds of earlier sources
        if stale.name != out.name:
            stale.unlink(missing_ok=True)
    return out
