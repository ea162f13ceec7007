"""Request sources: something that yields (prompt, natural output) length pairs.

Three kinds, one interface:

- :class:`SyntheticSource`: an embedded dataset model (:mod:`accelgen.workloads.synthetic`);
- :class:`RecordSource`: the records of an Alpaca / ShareGPT / Vidur / Azure file, drawn with
  replacement or taken in file order;
- :class:`BookCorpusSource`: BookCorpus text rows; each prompt concatenates consecutive rows,
  from a random start row, until it reaches a target length drawn from the BookCorpus prompt model
  (BookCorpus has no answers, so output lengths come from the BookCorpus output model).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.loaders import (
    Records,
    TextRows,
    hf_rows,
    load_alpaca,
    load_azure_csv,
    load_sharegpt,
    load_text_rows,
    load_vidur_csv,
    parse_alpaca,
    parse_sharegpt,
    parse_text_rows,
)
from accelgen.workloads.synthetic import DatasetModel, dataset_model
from accelgen.workloads.tokenizer import Tokenizer, get_tokenizer
from accelgen.workloads.workload_spec import SourceSpec, WorkloadConfig

# Rows fetched from an online BookCorpus when max_records is not set (the full set is 74M rows).
HF_BOOKCORPUS_DEFAULT_ROWS = 1_000_000


@dataclass
class Draw:
    prompt_len: np.ndarray  # int64, natural (before truncation)
    output_len: np.ndarray  # int64, natural (before the cap)
    timestamps: np.ndarray | None = None


@dataclass
class Source(ABC):
    name: str
    origin: str  # file path, hf:<name> or "embedded"
    tokenizer: str  # what produced the lengths
    skipped: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    @abstractmethod
    def draw(self, n: int, rng: np.random.Generator, sequential: bool = False) -> Draw:
        """``n`` requests; ``sequential`` takes records in file order (record sources only)."""

    @abstractmethod
    def mean_output(self, cap: int) -> float:
        """The dataset's mean capped output length: the S_g prediction of its requests."""

    @property
    def num_records(self) -> int | None:
        return None


@dataclass
class SyntheticSource(Source):
    model: DatasetModel | None = None

    def draw(self, n: int, rng: np.random.Generator, sequential: bool = False) -> Draw:
        assert self.model is not None
        return Draw(self.model.sample_prompts(n, rng), self.model.sample_outputs(n, rng))

    def mean_output(self, cap: int) -> float:
        assert self.model is not None
        return self.model.mean_output(cap)


@dataclass
class RecordSource(Source):
    records: Records | None = None

    @property
    def num_records(self) -> int:
        assert self.records is not None
        return len(self.records)

    def draw(self, n: int, rng: np.random.Generator, sequential: bool = False) -> Draw:
        rec = self.records
        assert rec is not None
        if sequential:
            if n > len(rec):
                raise WorkloadError(f"num_requests: {n} requested in file order but "
                                    f"{rec.origin} has only {len(rec)} usable records")
            idx = np.arange(n)
        else:
            idx = rng.integers(0, len(rec), size=n)
        ts = rec.timestamps[idx] if rec.timestamps is not None and sequential else None
        return Draw(rec.prompt_len[idx], rec.output_len[idx], ts)

    def mean_output(self, cap: int) -> float:
        # The dataset is the file: the mean over all its records, not over the requests drawn.
        assert self.records is not None
        return float(np.minimum(self.records.output_len, cap).mean())


@dataclass
class BookCorpusSource(Source):
    rows: TextRows | None = None
    model: DatasetModel | None = None

    def draw(self, n: int, rng: np.random.Generator, sequential: bool = False) -> Draw:
        assert self.rows is not None and self.model is not None
        target = self.model.sample_prompts(n, rng)
        outputs = self.model.sample_outputs(n, rng)
        counts = self.rows.counts
        starts = rng.integers(0, len(counts), size=n)
        cum = np.concatenate([[0], np.cumsum(counts)])
        total, n_rows = int(cum[-1]), len(counts)
        # Want the fewest consecutive rows (wrapping at the end) from `start` whose tokens reach
        # the target: find the first cumulative position >= cum[start] + content target.
        content = np.maximum(target - self.rows.special_tokens, 1)
        need = cum[starts] + content
        cycles = (need - 1) // total
        end = np.searchsorted(cum, need - cycles * total, side="left")
        tokens = cycles * total + cum[end] - cum[starts]
        used_rows = cycles * n_rows + end - starts
        self.stats["prompts_reusing_rows"] = self.stats.get("prompts_reusing_rows", 0) + int(
            (used_rows > n_rows).sum())
        return Draw((tokens + self.rows.special_tokens).astype(np.int64), outputs)

    def mean_output(self, cap: int) -> float:
        assert self.model is not None
        return self.model.mean_output(cap)


# --------------------------------------------------------------------------------------------


def _rows(spec: SourceSpec, limit: int | None) -> tuple[list[Any], str]:
    assert spec.hf_dataset is not None
    rows = hf_rows(spec.hf_dataset, spec.hf_split, spec.hf_data_files, limit)
    return rows, f"hf:{spec.hf_dataset}"


def open_source(name: str, spec: SourceSpec, cfg: WorkloadConfig,
                tokenizer: Callable[[], Tokenizer]) -> Source:
    """Load one configured source; ``tokenizer()`` is called only for text formats."""
    fmt = spec.format
    if fmt == "synthetic":
        ds = spec.synthetic or name
        if ds not in ("alpaca", "sharegpt", "bookcorpus"):
            raise WorkloadError(f"sources.{name}.synthetic: no embedded model named {ds!r}")
        model = dataset_model(ds, cfg.prompt_buckets, cfg.output_buckets)
        return SyntheticSource(name, "embedded", "none (embedded length model)", model=model)
    if fmt in ("vidur_csv", "azure_csv"):
        assert spec.path is not None
        loader = load_vidur_csv if fmt == "vidur_csv" else load_azure_csv
        rec = loader(spec.path, spec.max_records)
        return RecordSource(name, rec.origin, "none (lengths from file)", records=rec)
    tok = tokenizer()
    if fmt == "bookcorpus":
        model = dataset_model("bookcorpus", cfg.prompt_buckets, cfg.output_buckets)
        if spec.path is not None:
            rows = load_text_rows(spec.path, tok, spec.max_records)
        else:
            raw, origin = _rows(spec, spec.max_records or HF_BOOKCORPUS_DEFAULT_ROWS)
            rows = parse_text_rows(raw, origin, tok, column="text")
        return BookCorpusSource(name, rows.origin, tok.name, dict(rows.skipped), rows=rows,
                                model=model)
    if spec.path is not None:
        load = load_alpaca if fmt == "alpaca" else load_sharegpt
        rec = load(spec.path, tok, spec.max_records)
    else:
        raw, origin = _rows(spec, spec.max_records)
        rec = (parse_alpaca if fmt == "alpaca" else parse_sharegpt)(raw, origin, tok)
    return RecordSource(name, rec.origin, tok.name, dict(rec.skipped), records=rec)


def open_sources(cfg: WorkloadConfig) -> dict[str, Source]:
    if cfg.kind == "datasets":
        missing = [str(spec.path) for spec in cfg.resolved_sources().values()
                   if spec.path is not None and not spec.path.exists()]
        if missing:
            raise FileNotFoundError(
                f"workload kind 'datasets' reads the downloaded dataset files; not found: "
                f"{', '.join(missing)}. Fetch them with `accelgen download` (the pipeline's "
                f"download stage does this), or use the built-in mix (kind: synthetic)")
    # One tokenizer instance for all text sources, built only if some source needs it.
    tokenizer = functools.cache(functools.partial(get_tokenizer, cfg.tokenizer))
    return {name: open_source(name, spec, cfg, tokenizer)
            for name, spec in cfg.resolved_sources().items()}
