"""The closed loop's take-in of one measured iteration, compiled for a decode run's steps
(``decode_run.decode_run``): ``ClosedLoop.observe`` on its state record, with the same arithmetic in
the same order, so that a run decided in one call gives the plans that asking step by step gives.
A fit whose quantile changes (before the first online request finishes, every fit; after, the
first fit after each finish) takes the standard normal quantile from ``normal_quantile``, the
rational approximation ``statistics.NormalDist.inv_cdf`` evaluates (Wichura's AS241), in its
order of operations: the same value, bit for bit (``tests/test_closed_loop_runs.py``)."""

from __future__ import annotations

import math

import numpy as np

from accelgen.policies.accelgen import state as st
from accelgen.policies.accelgen.jit import jit


@jit
def take_in(loop: st.LoopState, errors: np.ndarray, scratch: np.ndarray, predicted: float,
            measured: float) -> int:
    """``ClosedLoop.observe(predicted, measured)`` on ``loop`` and its error window ``errors``
    (``scratch``: as long, for the fit): LOOP_CHANGED where the correction, the margin or the fit
    changed (``observe`` returns True), else LOOP_SAME."""
    if not (predicted > 0.0 and measured > 0.0 and math.isfinite(predicted)
            and math.isfinite(measured)):
        return st.LOOP_SAME
    size = len(errors)
    n = loop.n + 1 if loop.n < size else size
    observed, since = loop.observed + 1, loop.since + 1
    fits = since >= loop.every or n < loop.every
    correction, margin, median, sd = loop.correction, loop.margin, loop.median, loop.sd
    ratio = measured / predicted
    if abs(ratio - 1.0) <= st.EXACT_RATIO:
        ratio = 1.0
    errors[loop.i] = math.log(ratio / correction)
    loop.correction = correction + loop.weight * (ratio - correction)
    loop.i = (loop.i + 1) % size
    loop.n, loop.observed, loop.since = n, observed, since
    if fits:
        loop.since = 0
        tokens = loop.lsum / loop.ln if loop.ln else float(max(observed, 1))
        # (a request's deadlines: its first token's and each next token's)
        q = 1.0 - (1.0 - loop.target) / (max(tokens, 1.0) + 1.0)
        if q != loop.quantile:
            loop.quantile, loop.z = q, normal_quantile(q)
        for j in range(n):
            scratch[j] = errors[j]
        lo, mid, hi = (n - 1) // 4, (n - 1) // 2, (3 * (n - 1)) // 4
        # (each selection leaves the smaller values before its position: the next looks there)
        _select(scratch, 0, n - 1, hi)
        if mid < hi:
            _select(scratch, 0, hi - 1, mid)
        if lo < mid:
            _select(scratch, 0, mid - 1, lo)
        loop.median = scratch[mid]
        loop.sd = (scratch[hi] - scratch[lo]) / st.IQR_SD
        fitted = math.expm1(loop.median + loop.z * loop.sd)
        loop.margin = fitted if fitted > 0.0 else 0.0
    if (loop.correction != correction or loop.margin != margin or loop.median != median
            or loop.sd != sd):
        return st.LOOP_CHANGED
    return st.LOOP_SAME


@jit
def _select(a: np.ndarray, left: int, right: int, k: int) -> None:
    """Reorder ``a[left:right + 1]`` so that ``a[k]`` holds the value sorted order puts there,
    the ones before it no larger and the ones after it no smaller (Hoare's selection; the value
    is what ``np.partition`` gives: an order statistic)."""
    while left < right:
        pivot = a[(left + right) // 2]
        i, j = left, right
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            right = j
        elif k >= i:
            left = i
        else:
            return


# AS241's coefficients (Wichura 1988, PPND16), highest power first: near the median
# (|p - 0.5| <= 0.425), then the tails for r = sqrt(-log(min(p, 1 - p))) up to 5 and beyond.
_CENTRAL_NUM = (2.5090809287301226727e+3, 3.3430575583588128105e+4, 6.7265770927008700853e+4,
                4.5921953931549871457e+4, 1.3731693765509461125e+4, 1.9715909503065514427e+3,
                1.3314166789178437745e+2, 3.3871328727963666080e+0)
_CENTRAL_DEN = (5.2264952788528545610e+3, 2.8729085735721942674e+4, 3.9307895800092710610e+4,
                2.1213794301586595867e+4, 5.3941960214247511077e+3, 6.8718700749205790830e+2,
                4.2313330701600911252e+1, 1.0)
_NEAR_NUM = (7.7454501427834140764e-4, 2.2723844989269184583e-2, 2.4178072517745061177e-1,
             1.2704582524523683826e+0, 3.6478483247632046050e+0, 5.7694972214606914055e+0,
             4.6303378461565452959e+0, 1.4234371107496835773e+0)
_NEAR_DEN = (1.0507500716444168432e-9, 5.4759380849953449460e-4, 1.5198666563616457197e-2,
             1.4810397642748007459e-1, 6.8976733498510000455e-1, 1.6763848301838038494e+0,
             2.0531916266377588219e+0, 1.0)
_FAR_NUM = (2.0103343992922881326e-7, 2.7115555687434875782e-5, 1.2426609473880784386e-3,
            2.6532189526576123093e-2, 2.9656057182850489123e-1, 1.7848265399172913358e+0,
            5.4637849111641143699e+0, 6.6579046435011037772e+0)
_FAR_DEN = (2.0442631033899397856e-15, 1.4215117583164458887e-7, 1.8463183175100546818e-5,
            7.8686913114561329059e-4, 1.4875361290850614853e-2, 1.3692988092273580531e-1,
            5.9983220655588793769e-1, 1.0)


@jit
def normal_quantile(p: float) -> float:
    """The standard normal quantile of ``p`` (0 < p < 1), as ``NormalDist().inv_cdf(p)``."""
    q = p - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        return _horner(_CENTRAL_NUM, r) * q / _horner(_CENTRAL_DEN, r)
    r = math.sqrt(-math.log(p if q <= 0.0 else 1.0 - p))
    if r <= 5.0:
        x = _horner(_NEAR_NUM, r - 1.6) / _horner(_NEAR_DEN, r - 1.6)
    else:
        x = _horner(_FAR_NUM, r - 5.0) / _horner(_FAR_DEN, r - 5.0)
    return -x if q < 0.0 else x


@jit
def _horner(coefficients: tuple[float, ...], r: float) -> float:
    acc = coefficients[0]
    for c in coefficients[1:]:
        acc = acc * r + c
    return acc
