"""Which build of AccelGen's compiled decision (``decide.decide`` and the table's kernels) a
process runs.

- **Ahead of time** (the default once built; ``bash scripts/setup.sh`` or ``python -m
  accelgen.policies.accelgen``): a C extension module compiled with numba's ``pycc`` into
  ``__pycache__/``, named after a digest of its sources. It loads in milliseconds without
  importing numba (numba's own start-up is what a JIT cache cannot avoid).
- **JIT**: numba compiles the same functions on first use and caches them, for sources without a
  matching build (e.g. while editing the decision).
- **Python**: ``NUMBA_DISABLE_JIT=1`` runs the same functions interpreted (for a debugger).

``ACCELGEN_DECISION=aot|jit|python`` forces one (``aot`` fails if no build matches).
"""

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

DecideFn = Callable[[Any], int]
KERNELS = ("read_rows", "decode_rows", "set_deadlines")  # the table's, in ``rank``: every step
ENV = "ACCELGEN_DECISION"
_HERE = Path(__file__).resolve().parent
_CACHE = _HERE / "__pycache__"
# Everything the compiled module is built from: the code, and the record layouts in its signature
# (not the policy's modules, which run in Python).
_SOURCES = (*sorted(p for p in _HERE.glob("*.py") if p.name not in ("__init__.py", "policy.py", "oracle.py")),
            *(_HERE.parent.parent / "costmodel" / f for f in ("linear.py", "analytic.py", "base.py")),
            _HERE.parent.parent / "core" / "iteration.py")


class Build(NamedTuple):
    """One build of the compiled code: its name (aot, jit, python) and its functions."""

    name: str
    decide: DecideFn
    read_rows: Callable[..., int]
    decode_rows: Callable[..., int]
    set_deadlines: Callable[..., int]


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


def _signatures() -> dict[str, tuple[Any, ...]]:
    """The argument types of ``decide`` (the arrays) and of the ``KERNELS`` (the table's rows, slots,
    the values read)."""
    from numba import typeof, types

    ints = types.int64[::1]
    rows = typeof(RequestTable(capacity=1).rows)
    return {"decide": (typeof(Workspace(RequestTable(capacity=1)).arrays),),
            "read_rows": (rows, types.float64[:, ::1], types.bool_, ints),
            "decode_rows": (rows, ints, types.int64, types.float64, ints),
            "set_deadlines": (rows, ints)}


def _functions() -> dict[str, Any]:
    from accelgen.policies.accelgen import decide, rank

    return {"decide": decide.decide, **{k: getattr(rank, k) for k in KERNELS}}


def _compile(compile_: Callable[[], object]) -> None:
    """Run numba's compilation, once more after dropping the JIT cache if it cannot be read (numba
    unpickles a cache index before checking that it is stale, and an index names the record
    types: after one changes, reading it fails)."""
    try:
        compile_()
    except (AttributeError, ImportError):
        _drop_jit_cache()
        compile_()


def _drop_jit_cache() -> None:
    for stale in _CACHE.glob("*.nb[ic]"):
        stale.unlink(missing_ok=True)


def _load_jit() -> Build:
    # numba checks a cached function against its own file only, not the files of the functions
    # it calls: the cache is dropped whenever any source changed.
    stamp, digest = _CACHE / "jit_sources", source_digest()
    if not stamp.exists() or stamp.read_text() != digest:
        _drop_jit_cache()
        _CACHE.mkdir(exist_ok=True)
        stamp.write_text(digest)
    entries = []
    for name, fn in _functions().items():
        sig = _signatures()[name]
        _compile(partial(fn.compile, sig))
        # The compiled entry point, called directly: numba's dispatcher would resolve the argument
        # types on every call (the arrays keep their types: same dtypes, same layout).
        entries.append(fn.overloads[sig].entry_point)
    return Build("jit", *entries)


@cache
def load() -> Build:
    """The build this process runs: its name, the decision function, the table's kernels."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "aot", "jit", "python"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, aot, jit or python")
    if mode == "python" or os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        os.environ["NUMBA_DISABLE_JIT"] = "1"  # read when numba is imported
        fns = _functions()
        if hasattr(fns["decide"], "py_func"):
            raise RuntimeError(f"{ENV}=python: numba was imported before; set "
                               "NUMBA_DISABLE_JIT=1 when the process starts")
        return Build("python", *fns.values())
    if mode in ("auto", "aot"):
        path = aot_path()
        if path.exists():
            spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return Build("aot", *(getattr(module, k) for k in ("decide", *KERNELS)))
        if mode == "aot":
            raise FileNotFoundError(f"{ENV}=aot: no build of the current sources at {path} "
                                    "(python -m accelgen.policies.accelgen)")
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

    out = out or aot_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    name = out.name.split(".")[0]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.use_nrt = False
        for fn_name, fn in _functions().items():
            cc.export(fn_name, types.int64(*_signatures()[fn_name]))(fn.py_func)
        _compile(cc.compile)
        (built,) = Path(tmp).glob(name + "*")
        os.replace(built, out)
    for stale in out.parent.glob("decide_*"):  # builds of earlier sources
        if stale.name != out.name:
            stale.unlink(missing_ok=True)
    return out

