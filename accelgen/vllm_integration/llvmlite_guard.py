"""Keep vLLM's engine start-up working in a process that has loaded numba's LLVM bindings.

vLLM 0.32's CPU worker, when it starts, scans every loaded module's globals and reads
``vars(value).get(...)`` of each value that ``hasattr(value, "__dict__")``
(``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``). llvmlite's library object
(``llvmlite.binding.ffi.lib``, loaded with numba) answers any attribute, ``__dict__`` included,
with a C-function wrapper, so an engine started in a process that had run numba-compiled code
failed with ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``. Such a process:
one that ran AccelGen's decision through numba's JIT (``accelgen.policies.accelgen.build``;
the ahead-of-time build loads no numba) or a simulation before starting an engine, or a second
engine after the first one's plugin did.

``refuse_dunder_lookups`` makes that object refuse dunder names instead (llvmlite looks up only
C symbol names there). The plugin module and the replay's engine builder apply it.
"""

from __future__ import annotations


def refuse_dunder_lookups() -> None:
    """Make ``llvmlite.binding.ffi.lib`` raise AttributeError for ``__dunder__`` names (once per
    process; a no-op without llvmlite)."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    cls = type(ffi.lib)
    lookup = cls.__getattr__
    if getattr(lookup, "accelgen_guard", False):
        return

    def __getattr__(self: object, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    __getattr__.accelgen_guard = True  # type: ignore[attr-defined]
    cls.__getattr__ = __getattr__  # type: ignore[method-assign]
