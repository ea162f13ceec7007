"""Iteration-latency models: analytic roofline (calibrated) and measured profile tables."""

from accelgen.costmodel.base import BatchShape, CostModel

__all__ = ["BatchShape", "CostModel"]
