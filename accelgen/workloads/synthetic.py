"""The embedded default workload: Alpaca / ShareGPT / BookCorpus length models (SPEC section 6).

Each dataset model is a categorical choice among three length buckets (prompts and outputs
independently) followed by a draw inside the bucket. Bucket probabilities are SPEC section 6's
solution of the paper's statistics; within-bucket shapes are the fitted literals of
:mod:`accelgen.workloads.fitted` (quantile tables from real traces, power-law tails where no trace
reaches). Output lengths here are *natural* (before the max_tokens cap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from accelgen.workloads import fitted

# Length buckets shared by prompts and outputs: [10, 512), [512, 4096), >= 4096.
BUCKET_EDGES: tuple[int, ...] = (10, 512, 4096)
BUCKET_LABELS: tuple[str, ...] = ("[10,512)", "[512,4K)", ">=4K")

# SPEC section 6. BookCorpus outputs are given as 3.4/59.4/37.1 %, which sums to 99.9 %; the
# missing 0.1 point goes to the middle bucket (the overall shares stay 51/36/13 %).
PROMPT_BUCKET_PROBS: dict[str, tuple[float, float, float]] = {
    "alpaca": (1.0, 0.0, 0.0),
    "sharegpt": (0.23, 0.77, 0.0),
    "bookcorpus": (0.0, 0.60, 0.40),
}
OUTPUT_BUCKET_PROBS: dict[str, tuple[float, float, float]] = {
    "alpaca": (1.0, 0.0, 0.0),
    "sharegpt": (0.62, 0.38, 0.0),
    "bookcorpus": (0.034, 0.595, 0.371),
}
_MEAN_GRID = 1 << 14  # midpoints used to integrate a shape's (capped) mean


class Shape(Protocol):
    """A within-bucket length distribution, sampled by inverse CDF from uniforms."""

    def sample(self, u: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class QuantileShape:
    """Piecewise-linear inverse CDF through evenly spaced quantiles (rounded to integers)."""

    values: tuple[int, ...]

    def sample(self, u: np.ndarray) -> np.ndarray:
        probs = np.linspace(0.0, 1.0, len(self.values))
        return np.rint(np.interp(u, probs, self.values)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class PowerLawShape:
    """p(x) ~ x^-(alpha+1) on [lo, hi] (alpha = 0 is log-uniform)."""

    lo: int
    hi: int
    alpha: float

    def sample(self, u: np.ndarray) -> np.ndarray:
        lo, hi, a = float(self.lo), float(self.hi), self.alpha
        if abs(a) < 1e-9:  # alpha -> 0: the log-uniform limit of the inverse CDF
            return np.clip(np.floor(lo * (hi / lo) ** u), self.lo, self.hi).astype(np.int64)
        x = lo * (1.0 - u * (1.0 - (lo / hi) ** a)) ** (-1.0 / a)
        return np.clip(np.floor(x), self.lo, self.hi).astype(np.int64)


def shape_for(dataset: str, kind: str, bucket: int) -> Shape:
    """The fitted shape of one (dataset, prompt|output, bucket); datasets without their own shape
    for a bucket (possible only through bucket overrides) use the dataset that defines it:
    ShareGPT for the short bucket, BookCorpus for the other two."""
    for ds in (dataset, "sharegpt" if bucket == 0 else "bookcorpus"):
        key = f"{ds}.{kind}.{bucket}"
        if key in fitted.QUANTILE_TABLES:
            return QuantileShape(fitted.QUANTILE_TABLES[key])
        if key in fitted.POWER_LAW_TAILS:
            lo, hi = fitted.POWER_LAW_TAILS[key]
            return PowerLawShape(lo, hi, fitted.TAIL_ALPHA)
    raise KeyError(f"no fitted shape for {dataset}.{kind}.{bucket}")


@dataclass(frozen=True)
class DatasetModel:
    """Prompt and natural-output length model of one dataset."""

    name: str
    prompt_probs: tuple[float, float, float]
    output_probs: tuple[float, float, float]

    def _draw(self, kind: str, probs: Sequence[float], n: int,
              rng: np.random.Generator) -> np.ndarray:
        # Draw all bucket choices, then all uniforms: the stream layout does not depend on the data.
        buckets = rng.choice(len(probs), size=n, p=np.asarray(probs, float))
        u = rng.random(n)
        out = np.empty(n, np.int64)
        for b, p in enumerate(probs):
            mask = buckets == b
            if p > 0 and mask.any():
                out[mask] = shape_for(self.name, kind, b).sample(u[mask])
        return out

    def sample_prompts(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self._draw("prompt", self.prompt_probs, n, rng)

    def sample_outputs(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self._draw("output", self.output_probs, n, rng)

    def mean_output(self, cap: int | None = None) -> float:
        """Population mean of the (capped) natural output length, by integration, not sampling:
        it is the S_g prediction and must not depend on the trace drawn."""
        u = (np.arange(_MEAN_GRID) + 0.5) / _MEAN_GRID
        total = 0.0
        for b, p in enumerate(self.output_probs):
            if p > 0:
                x = shape_for(self.name, "output", b).sample(u).astype(float)
                if cap is not None:
                    x = np.minimum(x, cap)
                total += p * float(x.mean())
        return total


def dataset_model(name: str, prompt_override: Mapping[Any, Sequence[float]] | None = None,
                  output_override: Mapping[Any, Sequence[float]] | None = None) -> DatasetModel:
    prompt = tuple((prompt_override or {}).get(name, PROMPT_BUCKET_PROBS[name]))
    output = tuple((output_override or {}).get(name, OUTPUT_BUCKET_PROBS[name]))
    return DatasetModel(name, prompt, output)  # type: ignore[arg-type]


def bucket_index(lengths: np.ndarray) -> np.ndarray:
    """0, 1, 2 for [.., 512), [512, 4096), >= 4096 (lengths below 10 count as bucket 0)."""
    return np.searchsorted(np.asarray(BUCKET_EDGES[1:]), lengths, side="right")


def bucket_shares(lengths: np.ndarray) -> np.ndarray:
    idx = bucket_index(np.asarray(lengths))
    return np.bincount(idx, minlength=len(BUCKET_LABELS)) / max(len(idx), 1)
