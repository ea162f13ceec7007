"""Discrete-event serving simulator driven by a cost model."""
