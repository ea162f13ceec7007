"""SPEC section 11: SLOs feasible at zero load (``ttft_reference: isolated``) and KV ``auto``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from accelgen.cli import main
from accelgen.core.iteration import BatchShape
from accelgen.core.specs import Deployment
from accelgen.costmodel.datasheets import (
    DEPLOYMENTS,
    GIB,
    GPU_MEMORY_UTILIZATION,
    HARDWARE,
    MODELS,
    auto_kv,
    full_weight_bytes_per_gpu,
    kv_bytes_per_token_per_gpu,
    kv_num_tokens,
)
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.costmodel.isolated import ChunkedPrefill, isolated_decode_time
from accelgen.workloads import WorkloadConfig, build_trace, read_trace_metadata
from accelgen.workloads.errors import WorkloadError
from accelgen.workloads.latency import LatencyReference, resolve_latency_reference

FIXTURES = Path(__file__).parent / "fixtures" / "workloads"
ISOLATED = {"ttft_reference": "isolated"}


def isolated_trace(deployment: str, n: int = 400, seed: int = 0, **slo: object):
    dep = DEPLOYMENTS[deployment]
    cfg = WorkloadConfig(num_requests=n, seed=seed, max_model_len=dep.max_model_len
                         or MODELS[dep.model].max_model_len, slo={**ISOLATED, **slo})
    return build_trace(cfg, reference=resolve_latency_reference(deployment=deployment))


# -- the chunked reference ----------------------------------------------------------------------

def test_chunked_prefill_sums_its_chunks_with_their_context() -> None:
    cost = make_cost_model(DEPLOYMENTS["opt-13b"])
    chunked = ChunkedPrefill(cost, 512)

    def piece(n: int, ctx: int) -> float:
        s = BatchShape()
        s.add_prefill(n, ctx)
        return cost.iteration_time(s)

    assert chunked(100) == pytest.approx(piece(100, 0))
    assert chunked(512) == pytest.approx(piece(512, 0))
    assert chunked(1300) == pytest.approx(piece(512, 0) + piece(512, 512) + piece(276, 1024))
    assert chunked(0) == 0.0
    # later chunks read more context: never cheaper than the first
    assert piece(512, 4096) > piece(512, 0)


def test_isolated_decode_grows_with_context() -> None:
    cost = make_cost_model(DEPLOYMENTS["opt-13b"])
    assert 0 < isolated_decode_time(cost, 10) < isolated_decode_time(cost, 8000)


# -- acceptance: every built-in deployment, 0 unattainable TTFT SLOs -------------------------------

@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_isolated_trace_has_no_unattainable_ttft_slo(deployment: str) -> None:
    trace = isolated_trace(deployment)
    df, stats = trace.df, trace.meta["stats"]
    ref = resolve_latency_reference(deployment=deployment)
    pivot = deployment_pivot(DEPLOYMENTS[deployment])
    assert (ref.s_pf, ref.t_pf) == (pivot.s_pf, pivot.t_pf)
    chunked = np.array([ref.chunked_prefill(int(p)) for p in df["prompt_len"]])  # type: ignore[misc]
    unchunked = np.array([ref.prefill(int(p)) for p in df["prompt_len"]])
    # isolated prefill (chunked at S_pf) + T_pf <= SLO for every request
    assert np.all(chunked + pivot.t_pf <= df["ttft_slo"].to_numpy())
    assert np.all(np.minimum(unchunked, chunked) <= df["ttft_slo"].to_numpy())
    assert stats["unattainable_ttft"] == 0 and stats["ttft_below_chunked_prefill"] == 0
    # the scale is U[1, 3] of that reference: heterogeneous, not all at the floor
    ratio = df["ttft_slo"].to_numpy() / (chunked + pivot.t_pf)
    assert ratio.min() >= 1.0 and ratio.max() <= 3.0 and ratio.std() > 0.3
    # every TBT SLO is at least one isolated decode iteration at the request's longest context
    ctx = df["prompt_len"].to_numpy() + df["output_len"].to_numpy() - 1
    floor = np.array([ref.decode(int(c)) for c in ctx])  # type: ignore[misc]
    assert np.all(df["tbt_slo"].to_numpy() >= floor)


def test_group_mean_traces_of_the_same_requests_have_unattainable_slos() -> None:
    """The paper's rule on the same requests: about half the TTFT SLOs are below the isolated
    prefill (why regime `capacity` needs `isolated`)."""
    cfg = WorkloadConfig(num_requests=400, seed=0)
    stats = build_trace(cfg, reference=resolve_latency_reference(deployment="opt-13b")
                        ).meta["stats"]
    assert stats["ttft_reference"] == "group_mean"
    assert 0.3 < stats["unattainable_ttft"] / 400 < 0.7
    assert stats["ttft_below_chunked_prefill"] > stats["unattainable_ttft"]
    assert stats["tbt_raised"] == 0


def test_isolated_defaults_and_explicit_values() -> None:
    slo = WorkloadConfig(slo=ISOLATED).slo
    assert slo.ttft_scale == (1.0, 3.0) and slo.tbt_scale_kind == "set"
    assert slo.tbt_scale_set == [0.25, 0.5, 1.0, 2.0] and slo.tbt_base == 0.1875
    explicit = WorkloadConfig(slo={**ISOLATED, "ttft_scale": [2, 4], "tbt_scale_kind": "range"})
    assert explicit.slo.ttft_scale == (2.0, 4.0) and explicit.slo.tbt_scale_kind == "range"
    paper = WorkloadConfig().slo
    assert paper.ttft_reference == "group_mean" and paper.ttft_scale == (0.5, 1.5)
    assert paper.tbt_scale_kind == "range"
    # a dumped config states the values used and reads back the same
    assert WorkloadConfig.model_validate(WorkloadConfig(slo=ISOLATED).model_dump()).slo == slo


def test_tbt_slos_below_an_isolated_decode_are_raised_and_counted() -> None:
    """A slow deployment's decode iteration (its cost model scaled 20x) is above the 47 ms
    class: those SLOs are raised to 1.2x the iteration and counted."""
    base = resolve_latency_reference(deployment="opt-13b")
    assert base.decode is not None and base.chunked_prefill is not None

    def slow_decode(ctx: int) -> float:
        return 20 * base.decode(ctx)  # type: ignore[misc]

    ref = LatencyReference(prefill=base.prefill, name="slow", chunked_prefill=base.chunked_prefill,
                           s_pf=base.s_pf, t_pf=base.t_pf, decode=slow_decode)
    cfg = WorkloadConfig(num_requests=300, seed=2, slo=ISOLATED)
    trace = build_trace(cfg, reference=ref)
    df, stats = trace.df, trace.meta["stats"]
    floor = np.array([slow_decode(int(p + o - 1))
                      for p, o in zip(df["prompt_len"], df["output_len"], strict=True)])
    drawn = build_trace(cfg, reference=base).df["tbt_slo"].to_numpy()  # same draws, no raise
    raised = drawn < floor
    assert stats["tbt_raised"] == stats["tbt_below_isolated_decode"] == int(raised.sum()) > 0
    np.testing.assert_allclose(df["tbt_slo"].to_numpy()[raised], 1.2 * floor[raised])
    np.testing.assert_array_equal(df["tbt_slo"].to_numpy()[~raised], drawn[~raised])
    steps = np.maximum(df["output_len"].to_numpy() - 1, 0)
    np.testing.assert_allclose(df["jct_slo"], df["ttft_slo"] + df["tbt_slo"] * steps)


def test_isolated_needs_a_deployment_reference() -> None:
    with pytest.raises(WorkloadError, match=r"isolated.*cost model"):
        build_trace(WorkloadConfig(num_requests=10, slo=ISOLATED))


def test_group_mean_outputs_unchanged_by_the_reference_object() -> None:
    """A bare prefill function and the full reference give the same group_mean rows."""
    ref = resolve_latency_reference(deployment="opt-13b")
    cfg = WorkloadConfig(num_requests=300, seed=5, slo={"offline_fraction": 0.2})
    a = build_trace(cfg, ref.prefill, ref.name).df
    b = build_trace(cfg, reference=ref).df
    assert a.equals(b)


@pytest.mark.parametrize(("fmt", "name"), [
    ("alpaca", "alpaca_data.json"), ("sharegpt", "sharegpt.json"),
    ("vidur_csv", "vidur.csv"), ("azure_csv", "azure.csv"),
])
def test_isolated_on_every_record_format(fmt: str, name: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file = tmp_path / "w.yaml"
    cfg_file.write_text("workload:\n  slo: {ttft_reference: isolated}\n")
    out = tmp_path / "t.parquet"
    assert main(["trace", "--config", str(cfg_file), "--input", str(FIXTURES / name),
                 "--format", fmt, "--num-requests", "40", "--deployment", "llama-13b",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TTFT SLO reference: isolated" in text
    assert "unattainable by design): 0 (0.0% of online)" in text
    assert "shorter than the prefill chunked at S_pf + T_pf: 0 (0.0% of online)" in text
    assert "raised to 1.2x it:" in text
    stats = read_trace_metadata(out)["stats"]
    assert stats["ttft_reference"] == "isolated" and stats["ttft_below_chunked_prefill"] == 0


def test_trace_cli_prints_the_shares_in_group_mean_mode(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--num-requests", "200", "--deployment", "opt-13b",
                 "--out", str(tmp_path / "t.parquet")]) == 0
    text = capsys.readouterr().out
    assert "TTFT SLO reference: group_mean" in text
    assert "TTFT SLO shorter than the prefill chunked at S_pf + T_pf:" in text
    assert "TBT SLO below one isolated decode iteration (unattainable, not raised): 0" in text


# -- kv_cache_gb: auto ------------------------------------------------------------------------------

def test_auto_kv_is_vllms_rule_per_gpu() -> None:
    for name, dep in DEPLOYMENTS.items():
        auto = dep.model_copy(update={"kv_cache_gb": "auto"})
        a = auto_kv(auto)
        model, hw = MODELS[dep.model], HARDWARE[dep.hardware]
        assert a.usable_bytes == int(GPU_MEMORY_UTILIZATION * hw.mem_bytes)
        assert a.weight_bytes == full_weight_bytes_per_gpu(model, dep.tp, dep.pp)
        assert a.kv_bytes == a.usable_bytes - a.weight_bytes - a.activation_bytes \
            - a.non_torch_bytes > 0, name
        assert 0 < a.activation_bytes < 2 * GIB and a.non_torch_bytes == GIB
        per_gpu = kv_bytes_per_token_per_gpu(model, dep.tp, dep.pp)
        assert kv_num_tokens(auto) == a.kv_bytes // per_gpu
    # one A100 with a 13B model: 0.9 x 80 GiB - ~24 GiB of weights - ~2 GiB -> ~46 GiB of KV
    a13 = auto_kv(Deployment(model="opt-13b", kv_cache_gb="auto"))
    assert 45 < a13.kv_gib < 47
    # TP splits the weights: OPT-175B's 8 GPUs each keep ~30 GiB
    assert 28 < auto_kv(DEPLOYMENTS["opt-175b"].model_copy(update={"kv_cache_gb": "auto"})
                        ).kv_gib < 31


def test_auto_kv_refuses_a_model_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="nothing left for KV"):
        kv_num_tokens(Deployment(model="opt-175b", tp=1, kv_cache_gb="auto"))


def test_pivot_cli_shows_auto_kv(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pivot", "--deployment", "opt-13b", "--kv-cache-gb", "auto"]) == 0
    out = capsys.readouterr().out
    blocks = kv_num_tokens(Deployment(model="opt-13b", kv_cache_gb="auto")) // 32
    assert "KV/GPU: auto = 46.2" in out and f"KV blocks: {blocks} x 32" in out
    assert "paper's S_pf: 768" in out
    assert main(["pivot", "--all"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("opt-13b "))
    assert "12.00" in row.split() and "46.21" in row.split() and str(blocks) in row.split()


def test_pipeline_deployment_accepts_auto() -> None:
    from accelgen.pipeline.config_file import DeploymentSpec, resolve_deployment_spec

    dep = resolve_deployment_spec("opt-13b-auto", DeploymentSpec(base="opt-13b",
                                                                 kv_cache_gb="auto"))
    assert dep.kv_cache_gb == "auto" and kv_num_tokens(dep) > 4 * kv_num_tokens(
        DEPLOYMENTS["opt-13b"]) * 0.9
