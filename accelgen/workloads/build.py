"""Workload config -> trace rows: pick sources, draw lengths, truncate and cap, arrivals, SLOs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from accelgen import __version__
from accelgen.workloads.arrivals import make_arrivals
from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.latency import (
    FALLBACK_NAME,
    LatencyReference,
    fallback_prefill_latency,
)
from accelgen.workloads.rng import stream
from accelgen.workloads.slo import PrefillLatency, assign_slos
from accelgen.workloads.sources import Source, open_sources
from accelgen.workloads.trace import COLUMN_NAMES, FORMAT, validate_trace
from accelgen.workloads.workload_spec import WorkloadConfig


@dataclass
class Trace:
    df: pd.DataFrame
    meta: dict[str, Any]


def apportion(shares: dict[str, float], n: int) -> dict[str, int]:
    """Exact request counts per source (largest remainder), so a 35 % share is 35 % of the
    trace, as the paper "ensured"; ties go to the earlier source."""
    names = list(shares)
    raw = np.array([shares[k] for k in names]) * n
    counts = np.floor(raw).astype(int)
    order = sorted(range(len(names)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - int(counts.sum())]:
        counts[i] += 1
    return {k: int(c) for k, c in zip(names, counts, strict=True)}


def _num_requests(cfg: WorkloadConfig, sources: dict[str, Source]) -> int:
    if cfg.num_requests is not None:
        return cfg.num_requests
    (src,) = sources.values()  # validated: None only for one record source, sequential
    assert src.num_records is not None
    return src.num_records


def build_trace(cfg: WorkloadConfig, prefill_latency: PrefillLatency | None = None,
                latency_name: str | None = None, *,
                reference: LatencyReference | None = None) -> Trace:
    """Generate the trace of ``cfg``. SLOs come from ``reference`` (a deployment's isolated
    latencies, :func:`accelgen.workloads.latency.resolve_latency_reference`; needed by
    ``slo.ttft_reference: isolated``), or from ``prefill_latency(n)`` (seconds of an isolated
    n-token prefill; enough for the paper's ``group_mean`` rule); default: the documented
    fallback prefill."""
    if reference is not None:
        if prefill_latency is not None:
            raise ValueError("give either prefill_latency or reference, not both")
        latency_name = reference.name
    elif prefill_latency is None:
        prefill_latency, latency_name = fallback_prefill_latency, FALLBACK_NAME
    checksums = _recorded_checksums(cfg)  # before the (slow) tokenizing of the files
    slo_latency = reference if reference is not None else prefill_latency
    assert slo_latency is not None
    sources = open_sources(cfg)
    n = _num_requests(cfg, sources)
    shares = {name: spec.share for name, spec in cfg.resolved_sources().items()}
    counts = apportion(shares, n)
    names = list(sources)
    labels = np.repeat(np.arange(len(names)), [counts[k] for k in names])
    if len(names) > 1:
        labels = stream(cfg.seed, "mix").permutation(labels)

    prompt_nat = np.empty(n, np.int64)
    output_nat = np.empty(n, np.int64)
    timestamps = None
    sequential = cfg.sampling == "sequential"
    for j, name in enumerate(names):
        draw = sources[name].draw(counts[name], stream(cfg.seed, "lengths", name), sequential)
        mask = labels == j
        prompt_nat[mask], output_nat[mask] = draw.prompt_len, draw.output_len
        if draw.timestamps is not None and len(names) == 1:
            timestamps = draw.timestamps

    origin = ", ".join(src.origin for src in sources.values())
    arrival = make_arrivals(cfg.arrival, n, stream(cfg.seed, "arrival"), timestamps, origin)
    output = np.minimum(output_nat, cfg.max_tokens)
    # A sequence (prompt + output) must fit in max_model_len, as a real engine requires: cut the
    # prompt, never the (already capped) output.
    prompt = (prompt_nat if cfg.max_model_len is None
              else np.minimum(prompt_nat, np.maximum(cfg.max_model_len - output, 1)))
    slo = assign_slos(cfg.slo, prompt, output, slo_latency, cfg.seed)
    predicted = {name: max(1, round(src.mean_output(cfg.max_tokens)))
                 for name, src in sources.items()}

    df = pd.DataFrame({
        "req_id": np.arange(n, dtype=np.int64),
        "arrival": arrival.astype(float),
        "source": np.asarray(names, dtype=object)[labels],
        "prompt_len": prompt,
        "prompt_len_natural": prompt_nat,
        "prompt_truncated": prompt < prompt_nat,
        "output_len": output,
        "output_len_natural": output_nat,
        "output_capped": output < output_nat,
        "ttft_slo": slo.ttft,
        "tbt_slo": slo.tbt,
        "jct_slo": slo.jct,
        "online": slo.online,
        "predicted_output_len": np.asarray([predicted[k] for k in names], np.int64)[labels],
    }, columns=list(COLUMN_NAMES))
    df = validate_trace(df, "<generated trace>")  # the writer's own invariants, checked once

    tokenizers = sorted({src.tokenizer for src in sources.values()})
    meta: dict[str, Any] = {
        "format": FORMAT,
        "accelgen_version": __version__,
        "seed": cfg.seed,
        "tokenizer": "; ".join(tokenizers),
        "prefill_latency": latency_name or "user-supplied function",
        "config": cfg.model_dump(mode="json"),
        "sources": {
            name: {"origin": src.origin, "tokenizer": src.tokenizer, "requests": counts[name],
                   "predicted_output_len": predicted[name], "skipped": src.skipped,
                   **({"records": src.num_records} if src.num_records is not None else {}),
                   **({"sha256": checksums[name]} if name in checksums else {}),
                   **src.stats}
            for name, src in sources.items()
        },
        "stats": {
            "requests": n,
            "prompts_truncated": int(df["prompt_truncated"].sum()),
            "outputs_capped": int(df["output_capped"].sum()),
            "offline": int((~slo.online).sum()),
            "unattainable_ttft": slo.unattainable_ttft,
            "ttft_reference": cfg.slo.ttft_reference,
            "ttft_below_chunked_prefill": slo.ttft_below_chunked,
            "tbt_below_isolated_decode": slo.tbt_below_decode,
            "tbt_raised": slo.tbt_raised,
        },
    }
    if reference is not None:
        meta["latency_reference"] = reference.describe()
    return Trace(df, meta)


def _recorded_checksums(cfg: WorkloadConfig) -> dict[str, str]:
    """``kind: datasets``: the sha256 of each source file (the trace's provenance: which bytes it
    was drawn from), checked against the one ``accelgen download`` recorded for it."""
    if cfg.kind != "datasets":
        return {}
    from accelgen.workloads.download import SUMS_FILE, file_sha256, read_sums

    out = {}
    for name, spec in cfg.resolved_sources().items():
        assert spec.path is not None
        if not spec.path.exists():
            continue  # open_sources says which files are missing and how to get them
        got = file_sha256(spec.path).sha256
        rec = read_sums(spec.path.parent).get(spec.path.name)
        if rec is not None and rec.sha256 != got:
            raise WorkloadError(
                f"{spec.path}: sha256 {got} is not the {rec.sha256} recorded in "
                f"{spec.path.parent / SUMS_FILE}: the file changed since it was downloaded. "
                f"Fetch it again with `accelgen download --force --only {name}`")
        out[name] = got
    return out
