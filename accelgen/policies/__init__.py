"""Scheduling policies: AccelGen and the baselines, behind one interface (``accelgen.core.policy``)."""

from accelgen.policies.registry import make_policy, policy_names

__all__ = ["make_policy", "policy_names"]
