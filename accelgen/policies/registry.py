"""Policies by name. Variants are a registered policy plus fixed parameter overrides."""

from __future__ import annotations

import importlib
from typing import Any

from accelgen.policies.base import Policy

# name -> "module:Class"
POLICIES: dict[str, str] = {
    "vllm": "accelgen.policies.vllm:VLLMPolicy",
    "vllm-v0": "accelgen.policies.vllm_v0:VLLMV0Policy",
    "sarathi": "accelgen.policies.sarathi:SarathiPolicy",
    "accelgen": "accelgen.policies.accelgen:AccelGenPolicy",
    "orca": "accelgen.policies.orca:OrcaPolicy",
    "fastgen": "accelgen.policies.fastgen:FastGenPolicy",
    "fastserve": "accelgen.policies.fastserve:FastServePolicy",
    "oracle": "accelgen.policies.oracle:OraclePolicy",
    "edf": "accelgen.policies.edf:EDFPolicy",
}

# Named variants used by the figures (ablation, system-wide SLO, ordering study).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "accelgen/order": ("accelgen", {"order": False}),
    "accelgen/chunk": ("accelgen", {"chunk": False}),
    "accelgen/batch": ("accelgen", {"batch": False}),
    "sarathi-slack": ("sarathi", {"order": "slack"}),
}


def policy_names() -> list[str]:
    return sorted([*POLICIES, *VARIANTS])


def policy_class(name: str) -> type[Policy]:
    base = VARIANTS[name][0] if name in VARIANTS else name
    if base not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    module, cls = POLICIES[base].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ValueError(f"policy {name!r} is registered but {module} is not available: {exc}") from exc
    return getattr(mod, cls)


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Instantiate a policy; ``params`` override the variant's and the policy's defaults."""
    cls = policy_class(name)
    merged = dict(VARIANTS[name][1]) if name in VARIANTS else {}
    merged.update(params or {})
    try:
        return cls(**merged)
    except Exception as exc:  # pydantic ValidationError -> name the policy and the key
        raise ValueError(f"bad parameters for policy {name!r}: {exc}") from exc
