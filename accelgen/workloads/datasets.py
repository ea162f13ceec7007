"""The paper's three datasets as files: what ``accelgen download`` fetches and where they land.

Each dataset is one file under the download directory (default ``data/raw/``), named as its
publisher names it; the URL (and an optional pinned sha256) comes from the config's
``download:`` section, defaulting to the public source below. ``workload.kind: datasets`` reads the
same files (:func:`dataset_paths`), so a trace never depends on where they came from, only on
their bytes (the sha256 in ``data/raw/SHA256SUMS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from accelgen.core.specs import StrictModel

DEFAULT_RAW_DIR = Path("data/raw")
# BookCorpus sentences read for `kind: datasets` (`max_records` overrides it). Its prompts
# concatenate consecutive sentences from a random start; only their token counts matter, so a
# prompt that wraps past the last row is still exact (the trace counts them:
# prompts_reusing_rows). Tokenizing more rows costs time at every trace build.
BOOKCORPUS_ROWS = 1_000_000
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Dataset:
    """One public dataset file: its name on disk, format, default source and terms."""

    name: str
    file: str
    format: str  # the workload loader that reads it (accelgen.workloads.loaders)
    url: str
    size: str  # as the hosting page shows it; the exact size is recorded on first download
    licence: str
    source: str  # the page that describes the data and its licence


CATALOGUE: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset("alpaca", "alpaca_data.json", "alpaca",
                "https://raw.githubusercontent.com/tatsu-lab/stanford_alpaca/main/alpaca_data.json",
                "about 22 MB",
                "CC BY-NC 4.0 (non-commercial use only)",
                "https://github.com/tatsu-lab/stanford_alpaca"),
        Dataset("sharegpt", "ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt",
                "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/"
                "resolve/main/ShareGPT_V3_unfiltered_cleaned_split.json",
                "about 670 MB",
                "Apache-2.0 as tagged by the uploader (conversations scraped from sharegpt.com; "
                "their authors' and OpenAI's terms may apply)",
                "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered"),
        # The Hugging Face `bookcorpus/bookcorpus` dataset (74,004,228 sentences) as the Hub's own
        # parquet conversion: plain files over HTTP, no dataset script, no `datasets` package. One
        # shard is millions of sentences, far more than a 20K-request trace concatenates.
        Dataset("bookcorpus", "bookcorpus-plain_text-train-0000.parquet", "bookcorpus",
                "https://huggingface.co/datasets/bookcorpus/bookcorpus/resolve/"
                "refs%2Fconvert%2Fparquet/plain_text/train/0000.parquet",
                "a few hundred MB (the first of the parquet shards of 74M sentences)",
                "unknown (the dataset card's licence field); the books were scraped from "
                "smashwords.com and are under their authors' copyright: research use only",
                "https://huggingface.co/datasets/bookcorpus/bookcorpus"),
    )
}


class DownloadSource(StrictModel):
    """Where one dataset comes from."""

    url: str = Field(description="http(s) URL of the file (a mirror or a local server works)")
    sha256: str | None = Field(default=None, description="expected sha256 (hex); default: the one "
                                                 "recorded in SHA256SUMS on first download")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {v!r} (a file you "
                             "already have: put it into the download directory instead)")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v.lower()):
            raise ValueError(f"not a sha256 (64 hex digits): {v!r}")
        return None if v is None else v.lower()


def _default_sources() -> dict[str, DownloadSource]:
    return {name: DownloadSource(url=d.url, sha256=None) for name, d in CATALOGUE.items()}


class DownloadConfig(StrictModel):
    """The ``download:`` section of an experiment config (``accelgen download``)."""

    dir: Path = Field(default=DEFAULT_RAW_DIR, description="where the files go (and SHA256SUMS)")
    datasets: dict[str, DownloadSource] = Field(
        default_factory=_default_sources,
        description="per dataset: url (default: the public source) and an optional pinned "
                    "sha256; datasets left out keep their defaults")
    retries: int = Field(default=5, ge=0, le=100, description="reconnects after a dropped connection "
                                                      "(each resumes where the last one stopped)")
    timeout_s: PositiveFloat = Field(default=60.0, description="seconds without data before a reconnect")
    chunk_bytes: PositiveInt = 1 << 20

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        # A section naming one dataset overrides that one; the others keep their defaults.
        if isinstance(data, dict) and isinstance(data.get("datasets"), dict):
            given = data["datasets"]
            merged: dict[str, Any] = {n: {"url": d.url} for n, d in CATALOGUE.items()}
            for name, value in given.items():
                merged[name] = ({**merged.get(name, {}), **value} if isinstance(value, dict)
                                else value)
            data = {**data, "datasets": merged}
        return data

    @field_validator("datasets")
    @classmethod
    def _known(cls, v: dict[str, DownloadSource]) -> dict[str, DownloadSource]:
        unknown = sorted(set(v) - set(CATALOGUE))
        if unknown:
            raise ValueError(f"unknown dataset(s) {', '.join(unknown)}; known: "
                             f"{', '.join(CATALOGUE)}")
        return v

    def path(self, name: str) -> Path:
        return self.dir / CATALOGUE[name].file


def dataset_paths(data_dir: Path | str) -> dict[str, Path]:
    """The file of every dataset under ``data_dir`` (what ``kind: datasets`` reads)."""
    return {name: Path(data_dir) / d.file for name, d in CATALOGUE.items()}


def describe() -> str:
    """What ``accelgen download`` fetches by default: names, files, URLs, sizes and licences."""
    lines = []
    for d in CATALOGUE.values():
        lines += [f"{d.name}: {d.file}", f"    {d.url}", f"    size: {d.size}",
                  f"    licence: {d.licence}", f"    see {d.source}"]
    return "\n".join(lines)
