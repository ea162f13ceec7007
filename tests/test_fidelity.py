"""Fidelity check: the trace, the simulator side, the engine step model and the comparison.

The end-to-end check against a real engine needs vllm (marker ``vllm``); everything else runs on
results directories the simulator writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accelgen.costmodel.base import BatchShape
from accelgen.costmodel.factory import kv_num_blocks
from accelgen.costmodel.table import ProfileCostModel
from accelgen.profiling.engine_model import EngineStepModel, fit_decode, parse_plugin_overhead
from accelgen.profiling.fidelity import (
    TARGETS,
    FidelityConfig,
    compare,
    compare_all,
    cpu_shares,
    cpu_ticks,
    make_trace,
    parse_cpu_line,
    sim_deployment,
    simulate_run,
)
from accelgen.profiling.grid import Shape
from accelgen.profiling.measure import Measurement, write_profile
from accelgen.profiling.vllm_backend import (
    FIRST_USE_KEY,
    FIRST_USE_REPLAY_KEY,
    JITTER_KEY,
    PLUGIN_KEY,
)
from accelgen.workloads.trace import validate_trace

ENGINE = {"block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048,
          "max_num_seqs": 128}


def _step_time(shape: Shape, scale: float = 1.0) -> float:
    """A synthetic engine: 1.5 ms per step, 4 us per token, 20 us per decode, quadratic attention."""
    pairs = sum(n * (shape.prefill_ctx + (n + 1) / 2) for n in shape.chunks())
    return scale * (1.5e-3 + 4e-6 * shape.forward_size + 2e-5 * shape.decode_seqs
                    + 5e-10 * (pairs + shape.decode_ctx))


def _profile(path: Path, scale: float = 1.0, meta: dict[str, object] | None = None) -> Path:
    shapes = [Shape.prefill(s) for s in (16, 32, 64, 128, 256, 512, 1024, 2048)]
    shapes += [Shape.prefill(128, ctx=512), Shape.prefill(256, seqs=4)]
    shapes += [Shape.decode(b, c) for b in (1, 4, 16, 64) for c in (64, 512)]
    shapes += [Shape.mixed(128, 8, 256)]
    meas = [Measurement(s, [_step_time(s, scale)]) for s in shapes]
    return write_profile(path, meas, meta or {"backend": "synthetic"})


def test_trace_is_valid_and_reproducible() -> None:
    cfg = FidelityConfig(num_requests=120, seed=3)
    a, b = make_trace(cfg), make_trace(cfg)
    pd.testing.assert_frame_equal(a, b)
    validate_trace(a)
    assert len(a) == 120 and a["arrival"].is_monotonic_increasing
    assert a["prompt_len"].between(16, 1023).all()
    assert a["output_len"].between(*cfg.output_range).all()
    assert (a["prompt_len"] + a["output_len"] < ENGINE["max_model_len"]).all()
    offline = ~a["online"]
    assert np.isinf(a.loc[offline, "ttft_slo"]).all() and np.isfinite(a.loc[~offline,
                                                                              "ttft_slo"]).all()
    assert not make_trace(FidelityConfig(num_requests=120, seed=4)).equals(a)


@pytest.mark.parametrize("blocks", [1, 17, 512, 4095])
def test_sim_deployment_has_the_engines_kv_blocks(tmp_path: Path, blocks: int) -> None:
    dep = sim_deployment(_profile(tmp_path / "p.csv"), blocks, ENGINE)
    assert kv_num_blocks(dep) == blocks
    assert dep.block_size == 32 and dep.max_model_len == 2048 and dep.cost_model == "profile"


def _sim(tmp_path: Path, name: str, scale: float, system: str = "stock") -> Path:
    prof = _profile(tmp_path / f"{name}.csv", scale)
    trace = make_trace(FidelityConfig(num_requests=150, rate=40.0, seed=1))
    out = tmp_path / name
    simulate_run(trace, system, sim_deployment(prof, 512, ENGINE), ENGINE, out)
    return out


def test_compare_is_zero_on_identical_runs_and_catches_a_slower_engine(tmp_path: Path) -> None:
    a = _sim(tmp_path, "a", 1.0)
    same = compare(a, a, "stock")
    assert set(TARGETS) <= set(same["metric"])
    checked = same[same["metric"].isin(list(TARGETS))]
    assert (checked["rel_err"].abs() < 1e-12).all() and checked["met"].all()
    # A 3x slower engine: longer TTFT and TBT than the "real" run, beyond every target.
    slow = compare(a, _sim(tmp_path, "slow", 3.0), "stock").set_index("metric")
    for key in ("ttft_p50", "tbt_p50", "tbt_p90"):
        assert slow.loc[key, "rel_err"] > TARGETS[key]
        assert not slow.loc[key, "met"]
    assert slow.loc["iter_latency_mean", "rel_err"] > 1.0


def test_compare_all_takes_medians_over_rounds(tmp_path: Path) -> None:
    import shutil

    a = _sim(tmp_path, "a", 1.0)
    b = _sim(tmp_path, "b", 1.3)
    out = tmp_path / "runs"
    # round 0: sim equals real; rounds 1 and 2: sim 1.3x slower than real.
    for k, sim in ((0, a), (1, b), (2, b)):
        shutil.copytree(a, out / f"round-{k}" / "real-stock")
        shutil.copytree(sim, out / f"round-{k}" / "sim-stock")
    table = compare_all(out, systems=("stock",)).set_index("metric")
    per_b = compare(a, b, "stock").set_index("metric")
    assert (table["rounds"] == 3).all()
    assert table.loc["tbt_p50", "rel_err"] == pytest.approx(per_b.loc["tbt_p50", "rel_err"])
    assert table.loc["tbt_p50", "sim_min"] == pytest.approx(per_b.loc["tbt_p50", "real"])
    assert table.loc["tbt_p50", "rounds_met"] in (1, 3)
    with pytest.raises(FileNotFoundError):
        compare_all(tmp_path / "nothing-here")


# -- the engine step model ------------------------------------------------------------------


def test_decode_fit_recovers_a_linear_decode_cost(tmp_path: Path) -> None:
    rows = [Shape.decode(b, c).row(1e-3 + 3e-5 * b + 2e-8 * b * c)
            for b in (1, 4, 16, 64) for c in (64, 256, 1024)]
    a, b, c = fit_decode(rows)
    assert (a, b, c) == pytest.approx((1e-3, 3e-5, 2e-8), rel=1e-6)
    with pytest.raises(ValueError):
        fit_decode(rows[:2])


def test_engine_model_charges_first_use_once_and_plans_without_state(tmp_path: Path) -> None:
    prof = _profile(tmp_path / "p.csv", meta={
        FIRST_USE_KEY: "0.002",
        PLUGIN_KEY: "0.0005 + 2e-05 x batch_size (synthetic)"})
    table = ProfileCostModel.from_csv(prof)
    m = EngineStepModel.from_csv(prof, warm_sizes={128})
    mixed = BatchShape()
    mixed.add_prefill(100, 0)
    for _ in range(3):
        mixed.add_decode(200)
    warm = table.iteration_time(mixed)
    assert m.iteration_time(mixed) == pytest.approx(warm + 0.002)
    assert m.iteration_time(mixed) == pytest.approx(warm)  # 103 tokens: seen now
    assert m.first_uses == 1
    fresh = BatchShape()
    fresh.add_prefill(128, 0)
    assert m.iteration_time(fresh) == pytest.approx(table.iteration_time(fresh))  # warm size
    # Planning (forward_time) is the table's warm cost and records nothing.
    assert m.forward_time(777) == pytest.approx(table.forward_time(777))
    assert 777 not in m.seen
    # Decode-only steps use the decode rows' own fit, below the fresh-prefill curve here.
    dec = BatchShape()
    for _ in range(4):
        dec.add_decode(64)
    m.seen.add(4)
    assert m.iteration_time(dec) == pytest.approx(_step_time(Shape.decode(4, 64)), rel=0.02)
    # The plugin overhead is opt-in.
    p = EngineStepModel.from_csv(prof, warm_sizes={4}, plugin=True)
    assert p.iteration_time(dec) == pytest.approx(m.iteration_time(dec) + 0.0005 + 4 * 2e-5)


def test_engine_model_charges_the_penalty_probed_next_to_its_replay(tmp_path: Path) -> None:
    prof = _profile(tmp_path / "p.csv", meta={
        FIRST_USE_KEY: "0.002", FIRST_USE_REPLAY_KEY: json.dumps({"stock": 0.005})})
    assert EngineStepModel.from_csv(prof, replay="stock").first_use_s == pytest.approx(0.005)
    # No slices around that replay (or no replay named): the profile-wide median.
    assert EngineStepModel.from_csv(prof, replay="accelgen").first_use_s == pytest.approx(0.002)
    assert EngineStepModel.from_csv(prof).first_use_s == pytest.approx(0.002)
    assert EngineStepModel.from_csv(prof, replay="stock", first_use=False).first_use_s == 0.0
    shape = BatchShape()
    shape.add_prefill(300, 0)
    m = EngineStepModel.from_csv(prof, replay="stock")
    warm = ProfileCostModel.from_csv(prof).iteration_time(shape)
    assert m.iteration_time(shape) == pytest.approx(warm + 0.005)
    assert m.iteration_time(shape) == pytest.approx(warm)


def test_jitter_draws_follow_the_measured_quantiles_and_are_seeded(tmp_path: Path) -> None:
    levels = [round(0.025 + 0.05 * i, 3) for i in range(20)]
    ratios = [0.8 + 0.6 * lv for lv in levels]  # uniform between 0.8 and 1.4
    prof = _profile(tmp_path / "p.csv", meta={JITTER_KEY: json.dumps(
        {"levels": levels, "ratios": ratios})})
    shape = BatchShape()
    shape.add_prefill(256, 0)

    def draws(seed: int) -> np.ndarray:
        m = EngineStepModel.from_csv(prof, warm_sizes={256}, jitter=True, seed=seed)
        return np.array([m.iteration_time(shape) for _ in range(4000)])

    base = ProfileCostModel.from_csv(prof).iteration_time(shape)
    a = draws(7) / base
    assert np.array_equal(a, draws(7) / base)
    assert not np.array_equal(a, draws(8) / base)
    assert a.min() >= 0.8 - 1e-9 and a.max() <= 1.4 + 1e-9
    assert np.median(a) == pytest.approx(1.1, abs=0.02)
    assert np.quantile(a, 0.9) == pytest.approx(1.34, abs=0.02)
    with pytest.raises(ValueError, match=JITTER_KEY):
        EngineStepModel.from_csv(_profile(tmp_path / "q.csv"), jitter=True)
    with pytest.raises(ValueError):
        EngineStepModel(ProfileCostModel.from_csv(prof), (1e-3, 0.0, 0.0),
                        jitter=([0.1, 0.9], [1.2, 1.1]))


def test_plugin_overhead_text_round_trips() -> None:
    assert parse_plugin_overhead("0.000693 + 2.05e-05 x batch_size (stuff: 1: +0.2 ms)") == \
        pytest.approx((0.000693, 2.05e-5))
    with pytest.raises(ValueError):
        parse_plugin_overhead("garbage")


def test_engine_model_needs_the_plugin_line_when_asked(tmp_path: Path) -> None:
    prof = _profile(tmp_path / "p.csv")
    with pytest.raises(ValueError, match=PLUGIN_KEY):
        EngineStepModel.from_csv(prof, plugin=True)
    assert EngineStepModel.from_csv(prof).first_use_s == 0.0


# -- the engine processes' environment ------------------------------------------------------
def test_engine_env_gives_onednn_a_large_cache_unless_the_user_set_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from accelgen.vllm_integration.replay import (
        ONEDNN_CACHE_CAPACITY,
        ONEDNN_CACHE_ENV,
        EngineSpec,
        _prepare_env,
        engine_env_defaults,
    )

    assert ONEDNN_CACHE_ENV == "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    assert ONEDNN_CACHE_CAPACITY >= 16384  # far above oneDNN's default of 1024 primitives
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    assert engine_env_defaults() == {ONEDNN_CACHE_ENV: str(ONEDNN_CACHE_CAPACITY)}
    assert os.environ[ONEDNN_CACHE_ENV] == str(ONEDNN_CACHE_CAPACITY)
    # setdefault: a value the user chose wins, also through the engine's start-up.
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "2048")
    assert engine_env_defaults() == {ONEDNN_CACHE_ENV: "2048"}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    _prepare_env(EngineSpec())
    assert os.environ[ONEDNN_CACHE_ENV] == "2048"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    monkeypatch.delenv(ONEDNN_CACHE_ENV)
    _prepare_env(EngineSpec())
    assert os.environ[ONEDNN_CACHE_ENV] == str(ONEDNN_CACHE_CAPACITY)


def test_replays_run_in_a_fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each replay starts with an empty kernel cache (the engine step model's assumption): the
    # replay job is a module-level function run in a spawned process.
    import inspect
    import os
    import pickle

    from accelgen.profiling import fidelity
    from accelgen.vllm_integration.replay import (
        ONEDNN_CACHE_CAPACITY,
        ONEDNN_CACHE_ENV,
        in_fresh_process,
    )

    src = inspect.getsource(fidelity.replay_run)
    assert "_in_fresh_process" in src and "_replay_job" in src
    assert "in_fresh_process(job" in inspect.getsource(fidelity._in_fresh_process)
    assert 'get_context("spawn")' in inspect.getsource(in_fresh_process)
    assert pickle.loads(pickle.dumps(fidelity._replay_job)) is fidelity._replay_job
    cfg = FidelityConfig()
    # _in_fresh_process sets these in this process too: restore them after the test.
    if cfg.omp_threads is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", str(cfg.omp_threads))
    monkeypatch.setenv(ONEDNN_CACHE_ENV,
                       os.environ.get(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY)))
    assert fidelity._in_fresh_process(cfg, os.getpid) != os.getpid()


# -- end to end on the real engine ----------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_fidelity_smoke_on_the_vllm_cpu_engine(tmp_path: Path,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vllm")
    from accelgen.profiling.fidelity import run_fidelity

    cfg = FidelityConfig(num_requests=30, rate=20.0, rounds=1, systems=["stock"],
                         profile_quick=True, profile_repeats=2)
    # The engines' logs go to the terminal: long, and what one needs when this test fails.
    with capfd.disabled():
        out = run_fidelity(cfg, tmp_path / "fid")
    rdir = out / "round-0"
    prof = rdir / "profile-vllm-tiny.csv"
    text = prof.read_text()
    assert FIRST_USE_KEY in text and "decode_periods_s" in text and JITTER_KEY in text
    model = EngineStepModel.from_csv(prof, jitter=True)
    assert model.first_use_s >= 0 and model.decode_fixed > 0
    # The replay's own first-use penalty: the fresh-engine probe run just before it.
    rnd = json.loads((rdir / "round.json").read_text())["replays"]["stock"]
    assert rnd["first_use_penalty_s"] > 0 and rnd["first_use_profiler_s"] > 0
    assert EngineStepModel.from_csv(prof, replay="stock").first_use_s == pytest.approx(
        rnd["first_use_penalty_s"], abs=1e-7)
    real = json.loads((rdir / "real-stock" / "summary.json").read_text())
    sim = json.loads((rdir / "sim-stock" / "summary.json").read_text())
    assert real["num_finished"] == sim["num_finished"] == 30
    table = compare_all(out, systems=("stock",)).set_index("metric")
    # A smoke test at normal priority on a machine other jobs load: only the order of magnitude
    # is checked (a unit or bookkeeping error is off by far more); scripts/fidelity.py checks the
    # fidelity targets at raised priority (docs/profiling.md).
    for key in ("throughput_output_tps", "tbt_p50", "ttft_p50", "iter_latency_mean"):
        ratio = table.loc[key, "sim"] / table.loc[key, "real"]
        assert math.isfinite(ratio) and 0.1 < ratio < 10.0, table.loc[key]
    assert table.loc["num_iterations", "sim"] > 30


def test_cpu_shares_split_the_machine_time_between_two_readings() -> None:
    before = parse_cpu_line("cpu  1000 0 200 5000 10 0 5 100 0 0")
    after = parse_cpu_line("cpu  1300 0 260 5500 30 0 15 200 0 0")
    # deltas: user 300, system 60, idle 500, iowait 20, softirq 10, steal 100 -> total 990
    shares = cpu_shares(before, after)
    assert shares == {"busy": round(370 / 990, 4), "idle": round(520 / 990, 4),
                      "steal": round(100 / 990, 4)}
    assert cpu_shares(None, after) == {} and cpu_shares(before, before) == {}
    with pytest.raises(ValueError, match="all-CPU line"):
        parse_cpu_line("cpu0 1 2 3 4 5 6 7 8")
    now = cpu_ticks()  # Linux: the real counters
    assert now is None or set(now) >= {"user", "idle", "steal"}
