"""Scheduling policies: AccelGen and the baselines, behind one interface."""

from accelgen.policies.base import Decision, Pivot, Policy, PolicyParams, SchedulerView
from accelgen.policies.registry import make_policy, policy_names

__all__ = ["Decision", "Pivot", "Policy", "PolicyParams", "SchedulerView", "make_policy",
           "policy_names"]
