"""Plotting helpers shared by the notebooks: one palette, one style, bar/line/CDF panels.

Notebooks only load the CSVs the pipeline wrote and call these; no metric is computed here.
"""

from accelgen.figures.style import PALETTE, color, system_order

__all__ = ["PALETTE", "color", "system_order"]
