"""Named sets of SLO classes, for benchmark requests that come without SLOs of their own
(``accelgen bench-serve --dataset-name random --slo-classes NAME``, or a trace whose SLOs are
replaced).

A class is a share of the requests and their SLOs: an online class has a TTFT and a TBT SLO (its
JCT SLO is derived, TTFT + TBT x (output tokens - 1), as in ``workloads.slo``); an offline class
has only a JCT SLO. Each request draws its class by the shares, from the named stream
``("slo_classes", NAME)`` of the seed, so a request set is the same for the same seed and set.

Sets (seconds):

- ``tiny-cpu``, for the tiny random-weight model on CPU (a decode step of a few milliseconds on
  an idle core, ten times more on a busy one): ``interactive`` 30 % (TTFT 0.5, TBT 0.05),
  ``standard`` 50 % (TTFT 1, TBT 0.1), ``batch`` 20 % (offline, JCT 30).
- ``chat``, for a chat model on a GPU: ``interactive`` 30 % (TTFT 0.25, TBT 0.025),
  ``standard`` 50 % (TTFT 1, TBT 0.05), ``batch`` 20 % (offline, JCT 600).

Within a set every online class has its own TBT SLO, so the per-class attainment of the results
(``serving.report.class_attainment``) names them apart by their TBT as well as by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from accelgen.workloads.rng import stream


@dataclass(frozen=True, slots=True)
class SLOClass:
    name: str
    share: float
    online: bool = True
    ttft_slo: float = math.inf  # s (online)
    tbt_slo: float = math.inf  # s (online)
    jct_slo: float | None = None  # s (offline; online: derived)


SLO_CLASS_SETS: dict[str, tuple[SLOClass, ...]] = {
    "tiny-cpu": (SLOClass("interactive", 0.3, ttft_slo=0.5, tbt_slo=0.05),
                 SLOClass("standard", 0.5, ttft_slo=1.0, tbt_slo=0.1),
                 SLOClass("batch", 0.2, online=False, jct_slo=30.0)),
    "chat": (SLOClass("interactive", 0.3, ttft_slo=0.25, tbt_slo=0.025),
             SLOClass("standard", 0.5, ttft_slo=1.0, tbt_slo=0.05),
             SLOClass("batch", 0.2, online=False, jct_slo=600.0)),
}


@dataclass(frozen=True, slots=True)
class DrawnSLOs:
    """Per request: its class's name and SLOs."""

    slo_class: np.ndarray  # str
    online: np.ndarray  # bool
    ttft_slo: np.ndarray
    tbt_slo: np.ndarray
    jct_slo: np.ndarray


def slo_class_set(name: str) -> tuple[SLOClass, ...]:
    try:
        return SLO_CLASS_SETS[name]
    except KeyError:
        raise ValueError(f"unknown SLO class set {name!r} (known: "
                         f"{', '.join(SLO_CLASS_SETS)})") from None


def draw_slo_classes(name: str, output_len: np.ndarray, seed: int) -> DrawnSLOs:
    """A class of the set ``name`` for each request (output lengths ``output_len``)."""
    classes = slo_class_set(name)
    share = np.array([c.share for c in classes], dtype=np.float64)
    pick = stream(seed, "slo_classes", name).choice(len(classes), size=len(output_len),
                                                     p=share / share.sum())
    online = np.array([c.online for c in classes])[pick]
    ttft = np.array([c.ttft_slo if c.online else math.inf for c in classes])[pick]
    tbt = np.array([c.tbt_slo if c.online else math.inf for c in classes])[pick]
    fixed = np.array([c.jct_slo if c.jct_slo is not None else math.nan for c in classes])[pick]
    steps = np.maximum(np.asarray(output_len, dtype=np.int64) - 1, 0)
    with np.errstate(invalid="ignore"):
        derived = ttft + tbt * steps
    jct = np.where(online & np.isnan(fixed), derived, fixed)
    names = np.array([c.name for c in classes], dtype=object)[pick]
    return DrawnSLOs(names, online, ttft, tbt, jct)
