"""TP all-reduce and PP send/recv times fitted to measured NCCL collectives.

An all-reduce of S bytes over ``ranks`` GPUs of one node (``AllReduceFit``) takes

    t(S) = max(latency_s, startup_s + ring(S) / busbw(S)),   ring(S) = 2 (ranks - 1) / ranks x S
    busbw(S) = bus_bandwidth x (S / ref_bytes)^(1 - exponent)   for S <= ref_bytes, else bus_bandwidth

``latency_s`` is the floor of small messages (launch, synchronisation, one protocol round),
``startup_s + ring / busbw`` the bandwidth-bound regime, and the bus bandwidth (nccl-tests'
"busbw": the ring's bytes per second) grows with the message size (NCCL uses more channels and
a heavier protocol for large messages) up to the largest fitted message ``ref_bytes``; beyond
it the bandwidth is held, not extrapolated. ``exponent`` 1 is the plain latency-bandwidth
("alpha-beta") model. A pipeline hop (``SendRecvFit``) is startup_s + S / bus_bandwidth.

The analytic model (``analytic.py``) charges an iteration of N forward tokens two all-reduces of
N x hidden x dtype bytes per layer under TP (the Megatron layout) and (pp - 1) hops of the same
size under PP, all layers in one pass.

Fits the package carries (``BUILTIN``): DGX-A100 and DGX-H100 nodes (8 GPUs over NVSwitch),
TP 2, 4 and 8 within one node, fitted by ``scripts/fit_collectives.py`` on Vidur's published NCCL
profiles (github.com/microsoft/vidur, ``data/profiling/network/{a100_dgx,h100_dgx}/``, commit
7d47513, MIT License, Copyright (c) Microsoft Corporation), kernel times of
``torch.distributed`` all-reduce and send/recv of fp16 buffers (2 KiB..64 MiB) as its profiler
records them. A TP degree that was not measured uses the nearest measured one (its ring factor
its own); hardware without a fit uses the A100 fit with the bus bandwidths scaled by its
interconnect bandwidth over the A100's (an assumption).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from accelgen.core.specs import AllReduceFit, CollectiveTerms, HardwareProfile, SendRecvFit

VIDUR_SOURCE = ("Vidur's NCCL profiles (github.com/microsoft/vidur, data/profiling/network/, "
                "commit 7d47513, MIT), fitted by scripts/fit_collectives.py")

# `.venv/bin/python scripts/fit_collectives.py --data /work/shared/calibration/network`
# (docs/costmodel.md has its error table). Intra-node rows only (devices_per_node = ranks).
BUILTIN: dict[str, CollectiveTerms] = {
    "a100": CollectiveTerms(
        all_reduce=[
            AllReduceFit(ranks=2, latency_s=5.02e-05, startup_s=4.28e-05,
                         bus_bandwidth=1.71e+11, exponent=0.989, ref_bytes=67108864.0),
            AllReduceFit(ranks=4, latency_s=2.16e-05, startup_s=2.06e-05,
                         bus_bandwidth=1.86e+11, exponent=0.769, ref_bytes=67108864.0),
            AllReduceFit(ranks=8, latency_s=3.42e-05, startup_s=3.35e-05,
                         bus_bandwidth=1.75e+11, exponent=0.833, ref_bytes=67108864.0),
        ],
        send_recv=SendRecvFit(startup_s=1.49e-05, bus_bandwidth=3.06e+11),
        source=f"DGX-A100, {VIDUR_SOURCE}"),
    "h100": CollectiveTerms(
        all_reduce=[
            AllReduceFit(ranks=2, latency_s=3.87e-05, startup_s=1.77e-05,
                         bus_bandwidth=2.92e+11, exponent=1, ref_bytes=67108864.0),
            AllReduceFit(ranks=4, latency_s=3.99e-05, startup_s=2.72e-05,
                         bus_bandwidth=3.6e+11, exponent=1, ref_bytes=67108864.0),
            AllReduceFit(ranks=8, latency_s=2.97e-05, startup_s=2.43e-05,
                         bus_bandwidth=3.68e+11, exponent=0.867, ref_bytes=67108864.0),
        ],
        send_recv=SendRecvFit(startup_s=7.71e-06, bus_bandwidth=3.56e+11),
        source=f"DGX-H100, {VIDUR_SOURCE}"),
}
# The node whose fit stands in for hardware without one (scaled by interconnect bandwidth).
FALLBACK_HARDWARE = "a100"
FALLBACK_LINK_BANDWIDTH = 300e9  # A100 NVLink 3, per direction (datasheets.py)


def builtin_collectives(hardware: HardwareProfile) -> CollectiveTerms:
    """The package's fit for ``hardware`` (by name), or the A100 fit with its bus bandwidths
    scaled by ``hardware``'s interconnect bandwidth over the A100's (latencies unchanged)."""
    fit = BUILTIN.get(hardware.name.lower())
    if fit is not None:
        return fit
    scale = hardware.interconnect_bandwidth / FALLBACK_LINK_BANDWIDTH
    base = BUILTIN[FALLBACK_HARDWARE]
    return CollectiveTerms(
        all_reduce=[f.model_copy(update={"bus_bandwidth": f.bus_bandwidth * scale})
                    for f in base.all_reduce],
        send_recv=base.send_recv.model_copy(
            update={"bus_bandwidth": base.send_recv.bus_bandwidth * scale}),
        source=f"A100 fit scaled to {hardware.name}'s interconnect bandwidth (x{scale:.3g}; an "
               f"assumption): {base.source}")


def ring_factor(ranks: int) -> float:
    """Bytes a ring all-reduce moves per byte of message, per GPU: 2 (ranks - 1) / ranks."""
    return 2.0 * (ranks - 1) / ranks


def nearest_fit(terms: CollectiveTerms, ranks: int) -> AllReduceFit:
    """The all-reduce fit for ``ranks`` GPUs: its own, else the nearest measured rank count on a
    log scale (ties: the larger)."""
    return min(terms.all_reduce,
               key=lambda f: (abs(math.log2(f.ranks / ranks)), -f.ranks))


def all_reduce_time(fit: AllReduceFit, ranks: int, nbytes: float) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``ranks`` GPUs (module docstring)."""
    if nbytes <= 0:
        return 0.0
    s = min(nbytes, fit.ref_bytes)
    bw = fit.bus_bandwidth * (s / fit.ref_bytes) ** (1.0 - fit.exponent)
    return max(fit.latency_s, fit.startup_s + ring_factor(ranks) * nbytes / bw)


def send_recv_time(fit: SendRecvFit, nbytes: float) -> float:
    """Seconds of one point-to-point transfer of ``nbytes``."""
    return fit.startup_s + nbytes / fit.bus_bandwidth if nbytes > 0 else 0.0


class CommTerms(NamedTuple):
    """An iteration's communication as the analytic model charges it, for N forward tokens:

        fixed_s + tok_s x N + max(ar_floor_s, ar_startup_s + ar_tok_s x m^ar_exp x N / m),
        m = min(N, ar_cap)

    (the all-reduce part only under TP; ``ar_tok_s`` 0 otherwise). ``analytic.roofline_time``
    evaluates it; ``comm_time`` is the same in plain Python."""

    fixed_s: float  # PP hops' startup
    tok_s: float  # PP hops: per forward token
    ar_floor_s: float  # all-reduces: floor, all of them
    ar_startup_s: float
    ar_tok_s: float  # coefficient of m^ar_exp
    ar_exp: float
    ar_cap: float  # forward tokens whose message is ref_bytes


NO_COMM = CommTerms(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0)


def comm_terms(terms: CollectiveTerms, num_layers: int, token_bytes: float, tp: int,
               pp: int) -> CommTerms:
    """Per-iteration communication of a ``tp`` x ``pp`` layout of a ``num_layers``-layer model
    whose one token's activations take ``token_bytes``: 2 all-reduces per layer (TP) and
    (pp - 1) hops (PP), every layer in one pass."""
    fixed = tok = floor = startup = coef = 0.0
    exp, cap = 1.0, 1.0
    if pp > 1:
        p2p = terms.send_recv
        fixed = (pp - 1) * p2p.startup_s
        tok = (pp - 1) * token_bytes / p2p.bus_bandwidth
    if tp > 1:
        f = nearest_fit(terms, tp)
        n_ar = 2.0 * num_layers
        exp = f.exponent
        floor, startup = n_ar * f.latency_s, n_ar * f.startup_s
        # ring(S) / busbw(S) = ring x ref^(1 - exp) x S^exp / busbw with S = m x token_bytes.
        coef = (n_ar * ring_factor(tp) * f.ref_bytes ** (1.0 - exp) * token_bytes ** exp
                / f.bus_bandwidth)
        cap = f.ref_bytes / token_bytes
    return CommTerms(fixed, tok, floor, startup, coef, exp, cap)


def comm_time(c: CommTerms, n: int) -> float:
    """Seconds of an iteration's communication for ``n`` forward tokens."""
    if n <= 0:
        return 0.0
    out = c.fixed_s + n * c.tok_s
    if c.ar_tok_s > 0.0:
        m = n if n < c.ar_cap else c.ar_cap
        ar = c.ar_startup_s + c.ar_tok_s * m ** c.ar_exp * (n / m)
        out += ar if ar > c.ar_floor_s else c.ar_floor_s
    return out


def token_transfer_s(hardware: HardwareProfile, token_bytes: float) -> float:
    """One token's activations over one transfer at the bus bandwidth of ``hardware``'s widest
    fitted all-reduce at its largest message: the per-token communication term of the
    calibrated model (``calibrated.py``, linear in the tokens, no latency) before a fit."""
    widest = max(builtin_collectives(hardware).all_reduce, key=lambda f: f.ranks)
    return token_bytes / widest.bus_bandwidth
