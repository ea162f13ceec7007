"""The numba decorator of every compiled function of the decision (``build`` says which build
runs them): cached, numpy's float semantics, no reference counting (nothing is allocated)."""

from numba import njit

jit = njit(cache=True, error_model="numpy", _nrt=False)
