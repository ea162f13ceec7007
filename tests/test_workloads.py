"""Workload generation: the embedded mix, arrivals, SLOs, trace files and configs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.cli import main
from accelgen.core.request import Request
from accelgen.workloads import (
    WorkloadConfig,
    WorkloadError,
    build_trace,
    load_trace,
    read_trace_metadata,
    to_requests,
    write_trace,
)
from accelgen.workloads import trace as trace_mod
from accelgen.workloads.arrivals import gamma, poisson
from accelgen.workloads.build import apportion
from accelgen.workloads.synthetic import (
    PowerLawShape,
    QuantileShape,
    bucket_shares,
    dataset_model,
)
from accelgen.workloads.trace import COLUMN_NAMES

ROOT = Path(__file__).resolve().parents[1]


def linear_prefill(n: int) -> float:
    return 0.01 + 1e-4 * n


@pytest.fixture(scope="module")
def paper_scale() -> pd.DataFrame:
    # n = 20,000 as in the acceptance criterion; the fallback latency keeps it fast.
    return build_trace(WorkloadConfig(num_requests=20_000, seed=20_240_101)).df


# --------------------------------------------------------------------------------------------
# the embedded mix


def test_default_mix_bucket_shares(paper_scale: pd.DataFrame) -> None:
    prompt = bucket_shares(paper_scale["prompt_len_natural"].to_numpy())
    output = bucket_shares(paper_scale["output_len_natural"].to_numpy())
    np.testing.assert_allclose(prompt, [0.34, 0.52, 0.14], atol=0.02)
    np.testing.assert_allclose(output, [0.51, 0.36, 0.13], atol=0.02)
    share_book = (paper_scale["source"] == "bookcorpus").mean()
    assert abs(share_book - 0.35) <= 0.01
    assert paper_scale["prompt_len_natural"].min() >= 10


def test_per_dataset_buckets_follow_spec(paper_scale: pd.DataFrame) -> None:
    by = {name: grp for name, grp in paper_scale.groupby("source")}
    assert by["alpaca"]["prompt_len_natural"].max() < 512
    assert by["alpaca"]["output_len_natural"].max() < 512
    sg = by["sharegpt"]["prompt_len_natural"].to_numpy()
    assert sg.max() <= 2048
    assert abs((sg < 512).mean() - 0.23) < 0.03
    bc = by["bookcorpus"]["prompt_len_natural"].to_numpy()
    assert bc.min() >= 512 and bc.max() <= 102_400
    assert abs((bc >= 4096).mean() - 0.40) < 0.03


def test_truncation_and_cap_are_recorded(paper_scale: pd.DataFrame) -> None:
    df = paper_scale
    # prompt + capped output fits in max_model_len; only the prompt is cut
    assert (df["prompt_len"] + df["output_len"]).max() == 8192
    limit = 8192 - df["output_len"]
    assert (df["prompt_truncated"] == (df["prompt_len_natural"] > limit)).all()
    assert (df.loc[df["prompt_truncated"], "prompt_len"] == limit[df["prompt_truncated"]]).all()
    assert df["output_len"].max() == 2048
    assert (df["output_capped"] == (df["output_len_natural"] > 2048)).all()
    assert df["output_capped"].sum() > 0.1 * len(df)  # the >= 4K natural outputs


def test_predicted_output_len_is_the_dataset_mean(paper_scale: pd.DataFrame) -> None:
    for name, grp in paper_scale.groupby("source"):
        predicted = grp["predicted_output_len"].unique()
        assert len(predicted) == 1, name  # one value per dataset, never per request
        sample_mean = grp["output_len"].mean()
        assert abs(predicted[0] - sample_mean) < 0.05 * sample_mean, name


def test_population_mean_matches_large_sample() -> None:
    model = dataset_model("sharegpt")
    sample = model.sample_outputs(200_000, np.random.default_rng(3))
    assert model.mean_output(2048) == pytest.approx(np.minimum(sample, 2048).mean(), rel=0.01)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=50))
def test_shapes_stay_inside_their_range(us: list[float]) -> None:
    u = np.asarray(us)
    q = QuantileShape((512, 600, 700, 2048))
    assert ((q.sample(u) >= 512) & (q.sample(u) <= 2048)).all()
    p = PowerLawShape(4096, 102_400, 0.1)
    x = p.sample(u)
    assert ((x >= 4096) & (x <= 102_400)).all()
    assert (np.diff(p.sample(np.sort(u))) >= 0).all()  # inverse CDF is monotone


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0.01, 1), min_size=1),
       st.integers(0, 5000))
def test_apportion_is_exact(raw: dict[str, float], n: int) -> None:
    total = sum(raw.values())
    shares = {k: v / total for k, v in raw.items()}
    counts = apportion(shares, n)
    assert sum(counts.values()) == n
    assert all(abs(counts[k] - shares[k] * n) < 1 for k in shares)


def test_bucket_override_changes_long_prompt_share() -> None:
    cfg = WorkloadConfig(num_requests=4000, mix={"bookcorpus": 1.0},
                         prompt_buckets={"bookcorpus": (0.0, 0.9, 0.1)})
    long = (build_trace(cfg).df["prompt_len_natural"] >= 4096).mean()
    assert abs(long - 0.1) < 0.02


# --------------------------------------------------------------------------------------------
# arrivals


def test_poisson_mean_gap_and_untruncated_tail() -> None:
    t = poisson(20_000, 8.0, np.random.default_rng(7))
    gaps = np.diff(t, prepend=0.0)
    assert abs(gaps.mean() - 1 / 8) <= 0.02 / 8
    # Exponential tail: P(gap > 3/lambda) = e^-3; a truncated or clipped sampler fails this.
    assert abs((gaps > 3 / 8).mean() - math.exp(-3)) < 0.006
    assert gaps.max() > 6 / 8


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_cv(cv: float) -> None:
    t = gamma(20_000, 8.0, cv, np.random.default_rng(11))
    gaps = np.diff(t, prepend=0.0)
    assert abs(gaps.std() / gaps.mean() - cv) <= 0.05 * cv
    assert abs(gaps.mean() - 1 / 8) <= 0.05 / 8


def test_arrivals_in_trace_are_non_decreasing_and_rate_is_honoured() -> None:
    cfg = WorkloadConfig(num_requests=3000, arrival={"kind": "gamma", "rate": 4.0, "cv": 3.0})
    arr = build_trace(cfg).df["arrival"].to_numpy()
    assert (np.diff(arr) >= 0).all()
    assert abs(len(arr) / arr[-1] - 4.0) < 0.4


# --------------------------------------------------------------------------------------------
# SLOs


def _reference_ttft(df: pd.DataFrame) -> np.ndarray:
    iso = df["prompt_len"].map(linear_prefill)
    group = df["prompt_len"] // 512
    return iso.groupby(group).transform("mean").to_numpy()


def test_slo_rules_online() -> None:
    cfg = WorkloadConfig(num_requests=3000, seed=5)
    df = build_trace(cfg, linear_prefill, "linear").df
    ratio = df["ttft_slo"].to_numpy() / _reference_ttft(df)
    assert ratio.min() >= 0.5 and ratio.max() <= 1.5
    assert ratio.min() < 0.55 and ratio.max() > 1.45  # the whole range is used
    tbt = df["tbt_slo"].to_numpy() / 0.1875
    assert tbt.min() >= 0.75 and tbt.max() <= 1.25
    np.testing.assert_allclose(df["jct_slo"],
                               df["ttft_slo"] + df["tbt_slo"] * (df["output_len"] - 1))
    assert df["online"].all()


def test_slo_tbt_from_set_and_unattainable_count() -> None:
    cfg = WorkloadConfig(num_requests=2000, seed=9, slo={"tbt_scale_kind": "set"})
    trace = build_trace(cfg, linear_prefill, "linear")
    df = trace.df
    scales = set(np.round(df["tbt_slo"] / 0.1875, 9))
    assert scales == {0.25, 0.5, 1.0, 2.0}
    iso = df["prompt_len"].map(linear_prefill)
    assert trace.meta["stats"]["unattainable_ttft"] == int((df["ttft_slo"] < iso).sum()) > 0


def test_offline_requests_get_jct_only() -> None:
    cfg = WorkloadConfig(num_requests=1000, seed=2,
                         slo={"offline_fraction": 0.3, "offline_jct_scale": (1.5, 2.5)})
    df = build_trace(cfg, linear_prefill, "linear").df
    off = df[~df["online"]]
    assert len(off) == 300
    assert np.isinf(off["ttft_slo"]).all() and np.isinf(off["tbt_slo"]).all()
    ref = _reference_ttft(df)[~df["online"].to_numpy()]
    base = ref + 0.1875 * (off["output_len"].to_numpy() - 1)
    scale = off["jct_slo"].to_numpy() / base
    assert scale.min() >= 1.5 and scale.max() <= 2.5


def test_components_use_independent_streams() -> None:
    base = build_trace(WorkloadConfig(num_requests=500, seed=4), linear_prefill).df
    other = WorkloadConfig(num_requests=500, seed=4, arrival={"rate": 2.0},
                           slo={"tbt_scale_kind": "set", "offline_fraction": 0.5})
    changed = build_trace(other, linear_prefill).df
    for col in ("source", "prompt_len_natural", "output_len_natural"):
        assert (base[col] == changed[col]).all(), col
    assert not np.allclose(base["arrival"], changed["arrival"])
    np.testing.assert_allclose(base["arrival"] * 8.0, changed["arrival"] * 2.0)


def test_prefill_latency_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelgen.workloads.latency import fallback_prefill_latency, resolve_prefill_latency

    # Fallback: about 72 ms for 512 tokens on an A100 (the calibration table's value).
    assert fallback_prefill_latency(512) == pytest.approx(0.072, rel=0.1)
    _, name = resolve_prefill_latency("opt-13b", "a100")
    assert "cost model" in name
    monkeypatch.setitem(sys.modules, "accelgen.costmodel.factory", None)  # not importable
    fn, name = resolve_prefill_latency("opt-13b", "a100")
    assert fn is fallback_prefill_latency and name.startswith("fallback")


def test_bad_prefill_latency_is_reported() -> None:
    with pytest.raises(WorkloadError, match="prefill_latency"):
        build_trace(WorkloadConfig(num_requests=10), lambda n: 0.0)


# --------------------------------------------------------------------------------------------
# trace files


def test_same_config_and_seed_give_identical_bytes(tmp_path: Path) -> None:
    cfg = WorkloadConfig(num_requests=800, seed=3)
    paths = []
    for name in ("a", "b"):
        trace = build_trace(cfg)
        paths.append(write_trace(trace.df, trace.meta, tmp_path / name / "t.parquet")[0])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    other = build_trace(cfg.updated(seed=4))
    third = write_trace(other.df, other.meta, tmp_path / "c.parquet")[0]
    assert third.read_bytes() != paths[0].read_bytes()


def test_cli_twice_gives_identical_bytes(tmp_path: Path) -> None:
    outs = [tmp_path / f"{i}.parquet" for i in range(2)]
    for out in outs:
        assert main(["trace", "--config", str(ROOT / "config/quick.yaml"), "--out", str(out),
                     "--quiet", "--num-requests", "300"]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()


def test_write_load_roundtrip_and_metadata(tmp_path: Path) -> None:
    trace = build_trace(WorkloadConfig(num_requests=300, seed=1, slo={"offline_fraction": 0.2}))
    pq_path, csv_path = write_trace(trace.df, trace.meta, tmp_path / "t.parquet", csv=True)
    from_pq, from_csv = load_trace(pq_path), load_trace(csv_path)
    assert list(from_pq.columns) == list(COLUMN_NAMES)
    pd.testing.assert_frame_equal(from_pq, from_csv, check_dtype=False)
    assert from_pq["req_id"].dtype == np.int64 and from_pq["online"].dtype == bool
    meta = read_trace_metadata(pq_path)
    assert meta["seed"] == 1 and meta["tokenizer"] and meta["config"]["num_requests"] == 300
    assert sorted(tmp_path.iterdir()) == [csv_path, pq_path]  # no temporary files left


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = build_trace(WorkloadConfig(num_requests=20))

    def boom(table: object, where: object, **kw: object) -> None:
        Path(str(where)).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(trace_mod.pq, "write_table", boom)
    with pytest.raises(OSError):
        write_trace(trace.df, trace.meta, tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_load_trace_names_file_row_and_column(tmp_path: Path) -> None:
    trace = build_trace(WorkloadConfig(num_requests=10))
    df = trace.df.copy()
    df.loc[4, "arrival"] = df.loc[3, "arrival"] - 1.0
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with pytest.raises(WorkloadError, match=r"bad\.csv: row 4: field 'arrival'"):
        load_trace(bad)
    df = trace.df.drop(columns=["tbt_slo"])
    df.to_csv(bad, index=False)
    with pytest.raises(WorkloadError, match="field 'tbt_slo': missing column"):
        load_trace(bad)
    df = trace.df.copy()
    df["output_len"] = df["output_len"].astype(object)
    df.loc[2, "output_len"] = "many"
    df.to_csv(bad, index=False)
    with pytest.raises(WorkloadError, match="row 2: field 'output_len': not a number"):
        load_trace(bad)


def test_to_requests_keeps_output_length_out_of_requests() -> None:
    df = build_trace(WorkloadConfig(num_requests=50)).df
    reqs, out = to_requests(df)
    assert all(isinstance(r, Request) for r in reqs)
    assert [r.req_id for r in reqs] == list(range(50))
    assert not hasattr(reqs[0], "output_len")
    np.testing.assert_array_equal(out, df["output_len"].to_numpy())
    assert reqs[7].predicted_output_len == df["predicted_output_len"][7]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300),
       max_len=st.sampled_from([None, 512, 2048, 8192]), offline=st.floats(0, 1))
def test_trace_invariants(seed: int, n: int, max_len: int | None, offline: float) -> None:
    cfg = WorkloadConfig(num_requests=n, seed=seed, max_model_len=max_len,
                         slo={"offline_fraction": offline})
    df = build_trace(cfg, linear_prefill).df  # build_trace validates its own rows too
    assert len(df) == n and (df["req_id"] == np.arange(n)).all()
    if max_len is not None:
        assert df["prompt_len"].max() <= max_len
    assert df["output_len"].max() <= 2048
    assert (~df["online"]).sum() == round(offline * n)
    assert np.isfinite(df["jct_slo"]).all()


# --------------------------------------------------------------------------------------------
# configs


@pytest.mark.parametrize(("name", "lo", "hi"), [("quick", 400, 600), ("paper", 20_000, 20_000)])
def test_shipped_configs(name: str, lo: int, hi: int) -> None:
    cfg = WorkloadConfig.from_yaml(ROOT / "config" / f"{name}.yaml")
    assert cfg.kind == "synthetic" and cfg.sampling == "replacement"
    assert cfg.num_requests is not None and lo <= cfg.num_requests <= hi
    assert cfg.arrival.kind == "poisson" and cfg.arrival.rate == 8.0
    if name == "quick":  # the CLI's built-in default is the quick workload
        assert cfg == WorkloadConfig()


def test_config_reads_only_its_section(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("deployments: {opt: {model: opt-13b}}\nsystems: [vllm]\n"
                    "workload: {num_requests: 7, arrival: {rate: 2}}\n")
    cfg = WorkloadConfig.from_yaml(path)
    assert cfg.num_requests == 7 and cfg.arrival.rate == 2
    with pytest.raises(WorkloadError, match="no top-level 'other' section"):
        WorkloadConfig.from_yaml(path, key="other")


@pytest.mark.parametrize(("data", "needle"), [
    ({"arrival": {"rate": 0}}, "workload.arrival.rate"),
    ({"arrival": {"rate": float("inf")}}, "workload.arrival.rate"),
    ({"arrival": {"kind": "gamma", "cv": -1}}, "workload.arrival.cv"),
    ({"slo": {"tbt_base": float("nan")}}, "workload.slo.tbt_base"),
    ({"slo": {"ttft_scale": [1.5, 0.5]}}, "ttft_scale"),
    ({"slo": {"offline_fraction": 1.5}}, "workload.slo.offline_fraction"),
    ({"num_requests": 0}, "workload.num_requests"),
    ({"max_tokens": -3}, "workload.max_tokens"),
    ({"mix": {"alpaca": 0.5, "sharegpt": 0.2}}, "mix"),
    ({"mix": {"wikipedia": 1.0}}, "workload.mix.wikipedia"),
    ({"prompt_buckets": {"alpaca": [0.5, 0.5, 0.5]}}, "prompt_buckets.alpaca"),
    ({"kind": "vidur_csv", "hf_dataset": "x"}, "path"),
    ({"kind": "mix", "sources": {}}, "sources"),
    ({"tokenizer": "bert"}, "tokenizer"),
    ({"nonsense": 1}, "workload.nonsense"),
])
def test_config_errors_name_the_key(data: dict, needle: str) -> None:
    with pytest.raises(WorkloadError) as err:
        WorkloadConfig.parse(data)
    assert needle in str(err.value)


def test_cli_summary_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q" / "trace.parquet"
    assert main(["trace", "--out", str(out), "--num-requests", "200", "--csv", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for needle in ("[10,512)", "[512,4K)", ">=4K", "bookcorpus", "unattainable", "p99",
                   "truncated prompts", f"wrote {out}", f"wrote {out.with_suffix('.csv')}"):
        assert needle in text, needle
    assert len(load_trace(out)) == 200


def test_cli_rejects_bad_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.parquet"
    assert main(["trace", "--out", str(out), "--rate", "-2"]) == 2
    assert "workload.arrival.rate" in capsys.readouterr().err
    assert not out.exists()


def test_cli_ttft_slos_follow_the_parallel_layout(tmp_path: Path) -> None:
    """TTFT SLOs come from the deployment's own layout: 8-way TP prefills faster than 1 GPU."""
    means = {}
    for tp in (1, 8):
        out = tmp_path / f"tp{tp}.parquet"
        assert main(["trace", "--out", str(out), "--num-requests", "100", "--seed", "1",
                     "--model", "opt-175b", "--tp", str(tp), "--quiet"]) == 0
        means[tp] = trace_mod.load_trace(out)["ttft_slo"].mean()
    assert means[8] < 0.5 * means[1]


def test_cli_takes_the_deployments_max_model_len(tmp_path: Path) -> None:
    """`--deployment D` truncates to D's max_model_len unless --max-model-len (or the config's
    workload.max_model_len) says otherwise; the trace's metadata records what was used."""

    def mml(*args: str) -> int:
        out = tmp_path / "t.parquet"
        assert main(["trace", "--out", str(out), "--num-requests", "200", "--seed", "0",
                     "--quiet", *args]) == 0
        used = read_trace_metadata(out)["config"]["max_model_len"]
        trace = load_trace(out)
        assert (trace["prompt_len"] + trace["output_len"] <= used).all()
        return used

    assert mml() == 8192  # no deployment: the workload's default
    assert mml("--deployment", "llama-13b") == 4096
    assert mml("--deployment", "llama-3-70b") == 131072
    assert mml("--deployment", "llama-13b", "--max-model-len", "3000") == 3000
    cfg = tmp_path / "w.yaml"
    cfg.write_text("workload: {max_model_len: 2500}\n")
    assert mml("--deployment", "llama-13b", "--config", str(cfg)) == 2500
