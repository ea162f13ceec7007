"""Policies by name: the one registry of the simulator, the pipeline and the vLLM plugin.

A name is one of:
- a built-in policy (``POLICIES``) or a named variant (``VARIANTS``: a built-in policy plus
  fixed parameter overrides);
- a policy registered at run time with ``register_policy`` (tests, notebooks; visible in this
  process only, e.g. to a vLLM engine whose core runs in this process);
- an out-of-tree class, ``"package.module:Class"`` or ``"package.module.Class"``, imported on use
  (a vLLM engine core in a child process imports it itself).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from accelgen.core.policy import Policy

# name -> "module:Class"
POLICIES: dict[str, str] = {
    "vllm": "accelgen.policies.vllm:VLLMPolicy",
    "vllm-v0": "accelgen.policies.vllm_v0:VLLMV0Policy",
    "sarathi": "accelgen.policies.sarathi:SarathiPolicy",
    "accelgen": "accelgen.policies.accelgen:AccelGenPolicy",
    "orca": "accelgen.policies.orca:OrcaPolicy",
    "fastgen": "accelgen.policies.fastgen:FastGenPolicy",
    "fastserve": "accelgen.policies.fastserve:FastServePolicy",
    "oracle": "accelgen.policies.accelgen.oracle:OraclePolicy",
    "edf": "accelgen.policies.edf:EDFPolicy",
    "vllm-priority": "accelgen.policies.vllm_priority:VLLMPriorityPolicy",
}

# Named variants used by the figures (ablation, system-wide SLO, ordering study).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "accelgen/order": ("accelgen", {"order": False}),
    "accelgen/chunk": ("accelgen", {"chunk": False}),
    "accelgen/batch": ("accelgen", {"batch": False}),
    "sarathi-slack": ("sarathi", {"order": "slack"}),
    # This artifact's extension (SPEC 13): AccelGen planning with measured iterations.
    "accelgen-closed": ("accelgen", {"closed_loop": True}),
}

# Registered at run time: name -> factory(**params).
_REGISTERED: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str, factory: Callable[..., Policy]) -> None:
    """Make ``factory(**params)`` a policy named ``name`` in this process (it may replace an
    earlier registration, not a built-in name)."""
    if name in POLICIES or name in VARIANTS:
        raise ValueError(f"policy name {name!r} is built in")
    _REGISTERED[name] = factory


def policy_names() -> list[str]:
    """The built-in, variant and registered names (import paths are accepted besides)."""
    return sorted([*POLICIES, *VARIANTS, *_REGISTERED])


def _is_import_path(name: str) -> bool:
    return ":" in name or "." in name


def _import(path: str, name: str) -> Any:
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ValueError(f"policy {name!r}: cannot import {module}: {exc}") from exc
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ValueError(f"policy {name!r}: {module} has no {attr!r}") from None


def policy_class(name: str) -> type[Policy]:
    """The class of a built-in policy or variant, or of an out-of-tree import path."""
    base = VARIANTS[name][0] if name in VARIANTS else name
    if base in POLICIES:
        cls = _import(POLICIES[base], name)
    elif _is_import_path(name):
        cls = _import(name, name)
    else:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())} (or a "
                         "class as package.module:Class)")
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ValueError(f"policy {name!r} is not an accelgen.core.policy.Policy subclass")
    return cls


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """A policy object by name; ``params`` override the variant's and the policy's defaults."""
    factory: Callable[..., Policy] = (_REGISTERED[name] if name in _REGISTERED
                                      else policy_class(name))
    merged = dict(VARIANTS[name][1]) if name in VARIANTS else {}
    merged.update(params or {})
    try:
        return factory(**merged)
    except Exception as exc:  # pydantic ValidationError -> name the policy and the key
        raise ValueError(f"bad parameters for policy {name!r}: {exc}") from exc
