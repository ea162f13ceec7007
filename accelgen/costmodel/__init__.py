"""Iteration-latency models: analytic roofline (calibrated) and measured profile tables."""

from accelgen.costmodel.base import CostModel

__all__ = ["CostModel"]
