"""Pydantic models of a workload: where requests come from, when they arrive, which SLOs they get.

Experiment YAML files (``config/quick.yaml``, ``config/paper.yaml``) hold other top-level sections
too (deployments, systems, ...); :meth:`WorkloadConfig.from_yaml` reads only its own key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from accelgen.core.specs import StrictModel, load_yaml
from accelgen.workloads.errors import WorkloadError

# allow_inf_nan=False: an infinite rate or scale would pass gt=0 and poison every later number.
PosFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
# [low, high] of a uniform draw.
Scale = tuple[PosFinite, PosFinite]
# Probabilities of the length buckets [10, 512), [512, 4096), >= 4096.
BucketProbs = tuple[Fraction, Fraction, Fraction]

FileFormat = Literal["alpaca", "sharegpt", "bookcorpus", "vidur_csv", "azure_csv"]
SyntheticDataset = Literal["alpaca", "sharegpt", "bookcorpus"]
SYNTHETIC_DATASETS: tuple[str, ...] = ("alpaca", "sharegpt", "bookcorpus")
# Formats whose records carry their own lengths (and maybe timestamps) and can be replayed in order.
RECORD_FORMATS: tuple[str, ...] = ("alpaca", "sharegpt", "vidur_csv", "azure_csv")
TIMESTAMP_FORMATS: tuple[str, ...] = ("vidur_csv", "azure_csv")
# SPEC section 6: Alpaca 25 %, ShareGPT 40 %, BookCorpus 35 %.
DEFAULT_MIX: dict[SyntheticDataset, float] = {"alpaca": 0.25, "sharegpt": 0.40, "bookcorpus": 0.35}
SHARE_TOLERANCE = 1e-6


def _check_scale(name: str, scale: tuple[float, float]) -> None:
    if scale[0] > scale[1]:
        raise ValueError(f"{name}: low {scale[0]} is above high {scale[1]}")


def _check_shares(name: str, shares: Mapping[Any, float]) -> None:
    total = sum(shares.values())
    if not shares or abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValueError(f"{name}: shares must sum to 1, got {total:g} ({shares})")


class SourceSpec(StrictModel):
    """One dataset of a workload: a local file, a Hugging Face dataset, or an embedded model."""

    format: Literal["synthetic", "alpaca", "sharegpt", "bookcorpus", "vidur_csv", "azure_csv"]
    share: Fraction = 1.0
    path: Path | None = None
    hf_dataset: str | None = None  # e.g. "tatsu-lab/alpaca"; needs the `datasets` package
    hf_split: str = "train"
    hf_data_files: str | None = None  # e.g. "ShareGPT_V3_unfiltered_cleaned_split.json"
    max_records: PositiveInt | None = None  # read at most this many records (rows for BookCorpus)
    # format "synthetic": which embedded model; default: the source's name in the mix.
    synthetic: SyntheticDataset | None = None

    def check(self, name: str) -> None:
        """Cross-field rules; ``name`` is the config key used in messages."""
        def key(k: str) -> str:
            return f"{name}.{k}" if name else k

        has_path, has_hf = self.path is not None, self.hf_dataset is not None
        if self.format == "synthetic":
            if has_path or has_hf:
                raise ValueError(f"{key('path')}: format 'synthetic' takes no path or hf_dataset")
            return
        if self.format in TIMESTAMP_FORMATS and not has_path:
            raise ValueError(f"{key('path')}: format '{self.format}' needs a local path")
        if has_path == has_hf:
            raise ValueError(f"{key('path')}: give exactly one of path or hf_dataset")


class ArrivalConfig(StrictModel):
    """Arrival process (SPEC section 6)."""

    kind: Literal["poisson", "gamma", "replay"] = "poisson"
    rate: PosFinite = 8.0  # lambda, requests/s (paper: 8)
    cv: PosFinite = 1.0  # gamma: coefficient of variation of the gaps (burstiness); 1 = Poisson
    # replay: a file of timestamps (CSV column arrived_at / TIMESTAMP, or one number per line);
    # default: the timestamps of the input file itself (vidur_csv arrived_at, azure_csv TIMESTAMP).
    replay_path: Path | None = None
    speedup: PosFinite = 1.0  # replay: divide replayed gaps by this


# `ttft_reference: isolated` (SPEC section 11): defaults of the keys a config leaves unset.
ISOLATED_TTFT_SCALE: tuple[float, float] = (1.0, 3.0)
ISOLATED_TBT_SCALE_KIND: Literal["set", "range"] = "set"


class SLOConfig(StrictModel):
    """SLO assignment (SPEC sections 6 and 11; rules in docs/workloads.md)."""

    # group_mean: the paper's rule (TTFT reference = mean isolated prefill of the length group);
    # isolated: the request's own isolated prefill chunked at S_pf plus one T_pf (SPEC 11),
    # with TBT SLOs below an isolated decode iteration raised to tbt_floor_factor x it.
    ttft_reference: Literal["group_mean", "isolated"] = "group_mean"
    length_group: PositiveInt = 512  # TTFT (group_mean): prompts grouped by this many tokens
    # U[low, high] x the TTFT reference; default [0.5, 1.5], or [1, 3] with `isolated`
    ttft_scale: Scale = (0.5, 1.5)
    tbt_base: PosFinite = 0.1875  # reading speed, s/token
    # "set": scale uniform over tbt_scale_set (paper section 3); "range": U[tbt_scale_range]
    # (paper section 5, the evaluation). Default "range", or "set" with `isolated`.
    tbt_scale_kind: Literal["set", "range"] = "range"
    tbt_scale_set: list[PosFinite] = Field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0],
                                           min_length=1)
    tbt_scale_range: Scale = (0.75, 1.25)
    offline_fraction: Fraction = 0.0  # share of requests that are offline (JCT SLO only)
    # offline JCT SLO = U[offline_jct_scale] x (group mean isolated prefill + tbt_base x (n_out-1))
    offline_jct_scale: Scale = (1.0, 2.0)
    # isolated: a TBT SLO below one isolated decode iteration is raised to this multiple of it
    tbt_floor_factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.2

    @model_validator(mode="after")
    def _scales(self) -> SLOConfig:
        if self.ttft_reference == "isolated":
            # The mode's own defaults for keys the config does not set (assigned here, so a
            # dumped config states the values used).
            if "ttft_scale" not in self.model_fields_set:
                self.ttft_scale = ISOLATED_TTFT_SCALE
            if "tbt_scale_kind" not in self.model_fields_set:
                self.tbt_scale_kind = ISOLATED_TBT_SCALE_KIND
        _check_scale("ttft_scale", self.ttft_scale)
        _check_scale("tbt_scale_range", self.tbt_scale_range)
        _check_scale("offline_jct_scale", self.offline_jct_scale)
        return self


class WorkloadConfig(StrictModel):
    """Everything that determines a trace file (together with the prefill-latency function)."""

    kind: Literal["synthetic", "alpaca", "sharegpt", "bookcorpus", "vidur_csv", "azure_csv",
                  "mix", "datasets"] = "synthetic"
    # None: every record of the input file, in file order (single-file kinds only).
    num_requests: PositiveInt | None = 500
    seed: NonNegativeInt = 0
    # "replacement": draw records uniformly with replacement (the paper's 20K trace);
    # "sequential": the first num_requests records in file order (needed to replay timestamps).
    sampling: Literal["replacement", "sequential"] = "replacement"
    max_model_len: PositiveInt | None = 8192  # prompt + capped output fit in it (None: never)
    max_tokens: PositiveInt = 2048  # output cap
    tokenizer: str = "opt"  # gpt2 | opt | hf:<name or local path>; used by text formats only

    # single-file kinds (alpaca, sharegpt, bookcorpus, vidur_csv, azure_csv); kind datasets: the
    # directory `accelgen download` wrote the three files into (default data/raw)
    path: Path | None = None
    hf_dataset: str | None = None
    hf_split: str = "train"
    hf_data_files: str | None = None
    max_records: PositiveInt | None = None
    source_name: str | None = None  # label in the trace's `source` column (default: the kind)

    # kinds synthetic and datasets: dataset shares; synthetic: optional bucket-probability
    # overrides per dataset
    mix: dict[SyntheticDataset, Fraction] = Field(default_factory=lambda: dict(DEFAULT_MIX))
    prompt_buckets: dict[SyntheticDataset, BucketProbs] = Field(default_factory=dict)
    output_buckets: dict[SyntheticDataset, BucketProbs] = Field(default_factory=dict)

    # kind mix: named sources with shares
    sources: dict[str, SourceSpec] = Field(default_factory=dict)

    arrival: ArrivalConfig = Field(default_factory=ArrivalConfig)
    slo: SLOConfig = Field(default_factory=SLOConfig)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadConfig:
        if not (self.tokenizer in ("gpt2", "opt") or self.tokenizer.startswith("hf:")):
            raise ValueError(f"tokenizer: expected gpt2, opt or hf:<name>, got {self.tokenizer!r}")
        for key, table in (("prompt_buckets", self.prompt_buckets),
                           ("output_buckets", self.output_buckets)):
            for ds, probs in table.items():
                if abs(sum(probs) - 1.0) > SHARE_TOLERANCE:
                    raise ValueError(f"{key}.{ds}: probabilities must sum to 1, got {sum(probs):g}")
        if self.kind == "synthetic":
            _check_shares("mix", self.mix)
        elif self.kind == "datasets":
            _check_shares("mix", self.mix)
            if self.hf_dataset is not None or self.sources:
                raise ValueError("kind 'datasets' reads the downloaded files (path: their "
                                 "directory, default data/raw); hf_dataset and sources do not "
                                 "apply")
        elif self.kind == "mix":
            if not self.sources:
                raise ValueError("sources: kind 'mix' needs at least one source")
            _check_shares("sources", {k: s.share for k, s in self.sources.items()})
            for name, spec in self.sources.items():
                spec.check(f"sources.{name}")
        else:
            self._single_spec().check("")

        single_records = self.kind in RECORD_FORMATS
        if self.sampling == "sequential" and not single_records:
            raise ValueError(f"sampling: 'sequential' needs a record file kind "
                             f"({', '.join(RECORD_FORMATS)}), not {self.kind!r}")
        if self.num_requests is None and not (single_records and self.sampling == "sequential"):
            raise ValueError("num_requests: may be omitted only with sampling 'sequential' "
                             "on a record file kind (then every record is used)")
        own_times = self.kind in TIMESTAMP_FORMATS and self.sampling == "sequential"
        if self.arrival.kind == "replay" and self.arrival.replay_path is None and not own_times:
            raise ValueError("arrival.replay_path: replaying without a timestamp file needs "
                             "kind vidur_csv or azure_csv with sampling 'sequential'")
        return self

    def _single_spec(self) -> SourceSpec:
        fmt: Any = self.kind  # a single-file kind is a source format
        return SourceSpec(format=fmt, path=self.path, hf_dataset=self.hf_dataset,
                          hf_split=self.hf_split, hf_data_files=self.hf_data_files,
                          max_records=self.max_records)

    def resolved_sources(self) -> dict[str, SourceSpec]:
        """The workload as named sources with shares (one source for single-file kinds)."""
        if self.kind == "synthetic":
            return {name: SourceSpec(format="synthetic", share=share, synthetic=name)
                    for name, share in self.mix.items() if share > 0}
        if self.kind == "mix":
            return {name: spec for name, spec in self.sources.items() if spec.share > 0}
        if self.kind == "datasets":
            return self._dataset_sources()
        return {self.source_name or self.kind: self._single_spec()}

    def _dataset_sources(self) -> dict[str, SourceSpec]:
        """The paper's mix drawn from the files `accelgen download` wrote (``kind: datasets``):
        Alpaca and ShareGPT records with replacement, BookCorpus prompts built from the first
        ``max_records`` (default 1M) sentences of its shard."""
        from accelgen.workloads.datasets import BOOKCORPUS_ROWS, CATALOGUE, DEFAULT_RAW_DIR

        root = self.path if self.path is not None else DEFAULT_RAW_DIR
        out: dict[str, SourceSpec] = {}
        for name, share in self.mix.items():
            if share <= 0:
                continue
            ds = CATALOGUE[name]
            fmt: Any = ds.format
            limit = self.max_records or (BOOKCORPUS_ROWS if name == "bookcorpus" else None)
            out[name] = SourceSpec(format=fmt, share=share, path=root / ds.file,
                                   max_records=limit)
        return out

    # ----------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, data: Any, origin: str = "workload config",
              prefix: str = "workload") -> WorkloadConfig:
        """Validate a mapping; errors become one :class:`WorkloadError` naming every bad key
        (as ``<prefix>.<key path>``)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise WorkloadError(
                f"{origin}: invalid workload config:\n{_format_errors(exc, prefix)}") from None

    @classmethod
    def from_yaml(cls, path: Path | str, key: str | None = "workload") -> WorkloadConfig:
        """Read ``key`` of a YAML file (the whole file when ``key`` is None)."""
        data = load_yaml(path)
        if key is not None:
            if key not in data:
                raise WorkloadError(f"{path}: no top-level '{key}' section")
            data = data[key]
        return cls.parse(data, origin=str(path), prefix=key or "workload")

    def updated(self, **changes: Any) -> WorkloadConfig:
        """A copy with top-level fields replaced, validated again (model_copy does not validate)."""
        data = self.model_dump(mode="python")
        data.update({k: v for k, v in changes.items()})
        return type(self).parse(data, origin="workload config (after command-line overrides)")


def _format_errors(exc: ValidationError, prefix: str) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join([prefix, *(str(p) for p in err["loc"])])
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict) or err["loc"] == () else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)
