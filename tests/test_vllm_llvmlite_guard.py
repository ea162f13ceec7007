"""vLLM engines start in a process that has run numba-compiled code: the llvmlite guard of
``accelgen.vllm_integration`` (``llvmlite_guard``), applied by the plugin module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.lazy_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.vllm]

_PROBE = textwrap.dedent("""
    import numba

    @numba.njit
    def one(x):
        return x + 1

    one(1)  # loads llvmlite's library, as AccelGen's JIT decision does
    from vllm.triton_utils.dispatcher import _rebind_kernels

    try:
        _rebind_kernels([])  # the scan vLLM's CPU worker runs when an engine starts
        print("unguarded: ok")
    except AttributeError:
        print("unguarded: failed")
    import accelgen.vllm_integration.scheduler  # the plugin module applies the guard

    _rebind_kernels([])
    from llvmlite.binding import ffi

    assert not hasattr(ffi.lib, "__dict__")
    assert ffi.lib.LLVMPY_GetVersionInfo is not None  # C symbols still resolve
    print("guarded: ok")
""")


def test_an_engine_can_start_after_numba_compiled_code_ran() -> None:
    """In a fresh process: without the guard vLLM's start-up scan fails on llvmlite's library
    object (if a later llvmlite stops failing, the guard can go); with it the scan passes."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert out == ["unguarded: failed", "guarded: ok"]
