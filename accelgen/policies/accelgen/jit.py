"""The numba decorator of every compiled function of the decision (``build`` says which build
runs them): cached, numpy's float semantics, no reference counting (nothing is allocated)."""

from numba import njit

jit = njit(cache=True, error_model="numpy", _nrt=False)
# The same, inlined into its callers by numba itself (where LLVM would not: a function called
# once per candidate in a pass, whose call costs as much as its body).
jit_inline = njit(cache=True, error_model="numpy", _nrt=False, inline="always")
