"""The engine's noise in the simulator (``sim.noise``, ``accelgen.costmodel.noise``): its
statistics, seeding, the fit on a synthetic replay, and ``none`` leaving the simulator as it was."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import Deployment, ExperimentConfig, NoiseSpec, PolicySpec, SimOptions
from accelgen.costmodel.factory import make_cost_model
from accelgen.costmodel.noise import (
    NoisyCost,
    ReplayRatios,
    StepNoise,
    autocorrelation,
    fit_noise,
    fit_phase,
    fit_replays,
    read_noise,
    sensitivity_noise,
    write_noise,
)

DEP = Deployment(model="opt-13b", hardware="a100", kv_cache_gb=2.0)


def _trace(n: int = 40, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, 1500, n)
    out = rng.integers(20, 200, n)
    ttft, tbt = rng.uniform(0.2, 2.0, n), rng.uniform(0.05, 0.3, n)
    return pd.DataFrame({
        "req_id": np.arange(n), "arrival": np.sort(rng.uniform(0, 10.0, n)),
        "source": "test", "prompt_len": prompt, "prompt_len_natural": prompt,
        "prompt_truncated": False, "output_len": out, "output_len_natural": out,
        "output_capped": False, "ttft_slo": ttft, "tbt_slo": tbt,
        "jct_slo": ttft + tbt * (out - 1), "online": True, "predicted_output_len": 150,
    })


def _run(policy: str, noise: NoiseSpec | None = None, seed: int = 0):
    from accelgen.sim.runner import simulate

    sim = SimOptions(progress=False) if noise is None else SimOptions(progress=False, noise=noise)
    cfg = ExperimentConfig(deployment=DEP, policy=PolicySpec(name=policy), sim=sim, seed=seed)
    return simulate(_trace(), cfg)


def test_lognormal_draws_have_the_spec_statistics() -> None:
    spec = NoiseSpec(kind="lognormal", step_mu=0.05, step_sigma=0.2, run_mu=math.log(1.3))
    noise = StepNoise(spec, seed=4)
    assert noise.run_factor == pytest.approx(1.3)  # run_sigma 0: the factor is exp(run_mu)
    logs = np.log(noise.block(200_000) / 1.3)
    assert logs.mean() == pytest.approx(0.05, abs=0.003)
    assert logs.std() == pytest.approx(0.2, rel=0.01)
    # the sensitivity figure's noise keeps the mean step
    sens = StepNoise(sensitivity_noise(0.2), seed=1).block(200_000)
    assert sens.mean() == pytest.approx(1.0, abs=0.003)
    assert sensitivity_noise(0.0) == NoiseSpec()


def test_empirical_draws_follow_the_quantiles() -> None:
    q = [0.8, 0.9, 1.0, 1.2, 2.0]  # quantiles at 0, .25, .5, .75, 1
    x = StepNoise(NoiseSpec(kind="empirical", step_quantiles=q), seed=0).block(100_000)
    assert x.min() >= 0.8 and x.max() <= 2.0
    assert np.quantile(x, [0.25, 0.5, 0.75]) == pytest.approx([0.9, 1.0, 1.2], abs=0.01)


def _lag_corr(x: np.ndarray, k: int) -> float:
    z = np.log(x)
    return float(np.corrcoef(z[:-k], z[k:])[0, 1])


def test_a_host_phase_keeps_the_distribution_and_makes_runs() -> None:
    """With a phase the errors' quantiles stay the spec's; their scores correlate as
    share x persistence^k, across block boundaries too."""
    q = [0.8, 0.9, 1.0, 1.2, 2.0]
    spec = NoiseSpec(kind="empirical", step_quantiles=q, phase_share=0.8, phase_persistence=0.95)
    noise = StepNoise(spec, seed=4)
    x = np.concatenate([noise.block(1000) for _ in range(1000)])  # the phase carries across
    assert np.quantile(x, [0.25, 0.5, 0.75]) == pytest.approx([0.9, 1.0, 1.2], abs=0.03)
    logn = StepNoise(spec.model_copy(update={"kind": "lognormal", "step_sigma": 0.2}), seed=4)
    y = logn.block(200_000)
    assert np.log(y).std() == pytest.approx(0.2, rel=0.03)
    assert _lag_corr(y, 1) == pytest.approx(0.8 * 0.95, abs=0.02)
    assert _lag_corr(y, 20) == pytest.approx(0.8 * 0.95 ** 20, abs=0.04)
    assert abs(_lag_corr(StepNoise(NoiseSpec(kind="lognormal", step_sigma=0.2), 4)
                         .block(200_000), 1)) < 0.01  # no phase: independent
    acf, _ = autocorrelation([ReplayRatios("x", x, x.size)], (1, 20))
    assert acf[1] == pytest.approx(0.76, abs=0.05)  # (blocks of 1,000 chained)


def test_the_fit_recovers_a_host_phase() -> None:
    truth = NoiseSpec(kind="lognormal", step_sigma=0.2, phase_share=0.85, phase_persistence=0.96)
    reps = [ReplayRatios(f"r{s}", StepNoise(truth, s).block(20_000), 20_000) for s in (1, 2)]
    spec, record = fit_noise(reps, "lognormal")
    assert spec.phase_share == pytest.approx(0.85, abs=0.08)
    assert spec.phase_persistence == pytest.approx(0.96, abs=0.01)
    assert record["phase"]["autocorrelation"]["lag1"] == pytest.approx(0.85 * 0.96, abs=0.03)
    flat, _ = fit_noise(reps, "lognormal", phase=False)
    assert (flat.phase_share, flat.phase_persistence) == (0.0, 0.0)
    iid = [ReplayRatios("i", StepNoise(NoiseSpec(kind="lognormal", step_sigma=0.2), 3)
                        .block(20_000), 20_000)]
    assert fit_noise(iid, "lognormal")[0].phase_share == 0.0  # within the noise floor: none
    short = [ReplayRatios("s", reps[0].ratios[:50], 50)]  # too short to read phases from
    assert fit_noise(short, "lognormal")[0].phase_share == 0.0
    # the rule's edges: a decay faster than an AR(1) is that AR(1); no lag-20 value the same
    assert fit_phase({1: 0.5, 20: 0.0}, 10_000) == (1.0, 0.5)
    assert fit_phase({1: -0.3, 20: 0.1}, 10_000) == (0.0, 0.0)
    share, rho = fit_phase({1: 0.8, 20: 0.9}, 10_000)  # no decay at all: the longest phase
    assert rho == 0.999 and share == pytest.approx(0.8 / 0.999)


def test_stalls_add_seconds_to_a_share_of_the_steps() -> None:
    """A stall is seconds added to the step (the same on a short and a long step), drawn for
    ``stall_prob`` of the steps; the other steps keep the step error's distribution."""
    stalls = [0.005, 0.01, 0.03]  # s, at probabilities 0, .5, 1
    spec = NoiseSpec(kind="empirical", step_quantiles=[0.8, 1.0, 1.2], stall_prob=0.05,
                     stall_quantiles=stalls, run_mu=math.log(1.1))
    factors, added = StepNoise(spec, seed=2).draw(200_000)
    assert added is not None
    hit = added > 0
    assert hit.mean() == pytest.approx(0.05, abs=0.003)
    assert np.median(added[hit]) == pytest.approx(0.01, rel=0.05)
    assert np.all(factors[hit] == pytest.approx(1.1))  # a stalled step: the model's time + stall
    assert np.median(factors[~hit] / 1.1) == pytest.approx(1.0, abs=0.01)
    cost = make_cost_model(DEP)
    short, long = BatchShape(decode_seqs=1, decode_ctx=100), BatchShape(decode_seqs=64,
                                                                        decode_ctx=64_000)
    a, b = NoisyCost(cost, spec, 2), NoisyCost(cost, spec, 2)
    ta = np.array([a.iteration_time(short) for _ in range(2000)])
    tb = np.array([b.iteration_time(long) for _ in range(2000)])
    f, extra = StepNoise(spec, 2).draw()
    assert extra is not None
    assert ta == pytest.approx(cost.iteration_time(short) * f[:2000] + extra[:2000], rel=1e-12)
    assert tb == pytest.approx(cost.iteration_time(long) * f[:2000] + extra[:2000], rel=1e-12)
    with pytest.raises(ValidationError, match="stall_quantiles"):
        NoiseSpec(kind="lognormal", stall_prob=0.1)


def test_the_fit_tells_stalls_from_the_step_error() -> None:
    rng = np.random.default_rng(9)
    n = 20_000
    pred = rng.uniform(0.002, 0.004, n)
    span = pred * 1.2 * np.exp(0.1 * rng.standard_normal(n))
    stalled = rng.random(n) < 0.02
    span[stalled] += 0.01  # 10 ms stalls on 2-4 ms steps
    rep = ReplayRatios("r", span / pred, n, pred)
    spec, record = fit_noise([rep], "lognormal")
    assert spec.stall_prob == pytest.approx(0.02, abs=0.003)
    assert record["stalls"]["seconds_p50"] == pytest.approx(0.01, abs=0.001)
    assert math.exp(spec.run_mu) == pytest.approx(1.2, rel=0.02)
    assert spec.step_sigma == pytest.approx(0.1, rel=0.1)  # the body, stalls left out
    plain, rec = fit_noise([rep], "lognormal", stalls=False)
    assert plain.stall_prob == 0.0 and not rec["stalls"]["fitted"]
    assert fit_noise([ReplayRatios("r", rep.ratios, n)])[0].stall_prob == 0.0  # no predictions
    few = ReplayRatios("r", (pred * 1.2)[:500] / pred[:500], 500, pred[:500])
    assert fit_noise([few])[0].stall_prob == 0.0  # fewer than MIN_STALLS: none


def test_seeded_and_deterministic() -> None:
    spec = NoiseSpec(kind="lognormal", step_sigma=0.1, run_sigma=0.2)
    a, b, c = StepNoise(spec, 7), StepNoise(spec, 7), StepNoise(spec, 8)
    assert a.run_factor == b.run_factor != c.run_factor
    assert np.array_equal(a.block(1000), b.block(1000))
    fixed = spec.model_copy(update={"seed": 11})  # the spec's own seed wins over the run's
    assert np.array_equal(StepNoise(fixed, 1).block(50), StepNoise(fixed, 2).block(50))
    # one factor per charged iteration, in order, across blocks
    cost = make_cost_model(DEP)
    noisy = NoisyCost(cost, spec, 7)
    shape = BatchShape(decode_seqs=8, decode_ctx=8000)
    times = [noisy.iteration_time(shape) for _ in range(70_000)]
    first = StepNoise(spec, 7)
    ref = np.concatenate([first.block(), first.block()])[:70_000] * cost.iteration_time(shape)
    assert np.allclose(times, ref, rtol=1e-12)
    assert noisy.forward_time(512) == cost.forward_time(512)  # planning never sees noise


def test_spec_validation() -> None:
    with pytest.raises(ValidationError, match="step_quantiles"):
        NoiseSpec(kind="empirical")
    with pytest.raises(ValidationError, match="must not decrease"):
        NoiseSpec(kind="empirical", step_quantiles=[1.0, 0.9])
    with pytest.raises(ValidationError):
        NoiseSpec(kind="lognormal", step_sigma=-0.1)
    with pytest.raises(ValidationError, match="phase_persistence"):
        NoiseSpec(kind="lognormal", phase_share=0.5, phase_persistence=1.0)
    with pytest.raises(ValidationError, match="phase_share"):
        NoiseSpec(kind="lognormal", phase_share=1.5)
    with pytest.raises(ValueError, match="lognormal or empirical"):
        fit_noise([ReplayRatios("x", np.ones(3), 3)], "gamma")
    with pytest.raises(ValueError, match="no steps"):
        fit_noise([ReplayRatios("x", np.array([]), 0)])


def test_none_is_the_deterministic_simulator() -> None:
    plain, none = _run("sarathi"), _run("sarathi", NoiseSpec(kind="none", step_sigma=0.3))
    pd.testing.assert_frame_equal(plain.requests, none.requests)
    pd.testing.assert_frame_equal(plain.iterations, none.iterations)
    assert plain.summary == none.summary
    assert "noise" not in plain.config["resolved"]
    # described as a build without noise: the config's dump has no noise section
    assert "noise" not in plain.config["experiment"]["sim"]
    assert plain.config == none.config


def test_noisy_runs_repeat_per_seed_and_charge_the_noise() -> None:
    spec = NoiseSpec(kind="lognormal", step_sigma=0.1, run_mu=math.log(1.2))
    a, b, c = _run("vllm", spec, 1), _run("vllm", spec, 1), _run("vllm", spec, 2)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert not a.iterations["latency"].equals(c.iterations["latency"])
    assert a.config["resolved"]["noise"]["factors_drawn"] == len(a.iterations)
    assert a.summary["makespan_s"] > _run("vllm").summary["makespan_s"]  # 1.2x slower steps


def test_fit_recovers_a_synthetic_replay(tmp_path: Path) -> None:
    """A simulated run charged with known noise is a replay whose noise the fit recovers."""
    cost = make_cost_model(DEP)
    truth = NoiseSpec(kind="lognormal", step_mu=0.0, step_sigma=0.15, run_mu=math.log(1.25))
    dirs = []
    for seed in (1, 2):
        run = _run("vllm", truth, seed)
        run.write(tmp_path / f"r{seed}")
        dirs.append(tmp_path / f"r{seed}")
    spec, record = fit_replays(dirs, cost, "lognormal")
    assert math.exp(spec.run_mu) == pytest.approx(1.25, rel=0.03)
    assert spec.step_sigma == pytest.approx(0.15, rel=0.15)
    assert spec.step_mu == pytest.approx(0.0, abs=0.02)
    emp, _ = fit_replays(dirs, cost, "empirical")
    assert emp.step_quantiles is not None and len(emp.step_quantiles) == 201
    assert emp.step_quantiles[100] == pytest.approx(1.0, abs=0.02)  # median error 1
    write_noise(tmp_path / "noise.yaml", emp, record, "test")
    assert read_noise(tmp_path / "noise.yaml") == emp
    assert read_noise('{"kind": "lognormal", "step_sigma": 0.1}').step_sigma == 0.1


def test_engine_regime_fits_the_calibration_replays_noise(tmp_path: Path) -> None:
    """Regime engine: the noise of the calibration replay, run factor held at its median."""
    from accelgen.engine_regime.run import CALIBRATION_DIR, NOISE_NAME, fit_calibration_noise

    assert fit_calibration_noise(tmp_path, DEP) is None  # no calibration replay: no noise
    truth = NoiseSpec(kind="lognormal", step_sigma=0.2, run_mu=math.log(1.1))
    _run("vllm", truth, 3).write(tmp_path / CALIBRATION_DIR / "real-stock")
    spec = fit_calibration_noise(tmp_path, DEP)
    assert spec is not None and spec.kind == "empirical" and spec.run_sigma == 0.0
    assert math.exp(spec.run_mu) == pytest.approx(1.1, rel=0.03)
    q = np.asarray(spec.step_quantiles)
    assert np.log(q[[25, 175]]) == pytest.approx([-0.2 * 1.15, 0.2 * 1.15], abs=0.06)  # p12.5/87.5
    assert read_noise(tmp_path / CALIBRATION_DIR / NOISE_NAME) == spec


def test_fit_noise_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from accelgen.cli import main

    _run("vllm", NoiseSpec(kind="lognormal", step_sigma=0.1), 4).write(tmp_path / "replay")
    (tmp_path / "dep.yaml").write_text(yaml.safe_dump(
        {"deployment": DEP.model_dump(mode="json", exclude_none=True)}))
    out = tmp_path / "noise.yaml"
    assert main(["fit-noise", "--runs", str(tmp_path / "replay"), "--deployment",
                 str(tmp_path / "dep.yaml"), "--kind", "lognormal", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"wrote {out}: lognormal noise from ") and last.endswith("of 1 replay")
    assert read_noise(out).step_sigma == pytest.approx(0.1, rel=0.2)
    # a directory that is no replay: a clear error, nothing written
    bad = tmp_path / "bad.yaml"
    assert main(["fit-noise", "--runs", str(tmp_path), "--deployment",
                 str(tmp_path / "dep.yaml"), "--out", str(bad)]) == 2
    assert "no iterations.parquet" in capsys.readouterr().err and not bad.exists()


def test_fit_noise_command_fits_phase_and_stalls_unless_told_not_to(tmp_path: Path) -> None:
    """A replay whose steps come in runs and stall: fitted with both by default, with neither
    under --independent --no-stalls."""
    import yaml

    from accelgen.cli import main

    truth = NoiseSpec(kind="lognormal", step_sigma=0.1, phase_share=0.9, phase_persistence=0.97,
                      stall_prob=0.05, stall_quantiles=[0.05, 0.1])
    _run("vllm", truth, 4).write(tmp_path / "replay")
    (tmp_path / "dep.yaml").write_text(yaml.safe_dump(
        {"deployment": DEP.model_dump(mode="json", exclude_none=True)}))
    base = ["fit-noise", "--runs", str(tmp_path / "replay"), "--deployment",
            str(tmp_path / "dep.yaml"), "--kind", "lognormal", "--out"]
    assert main([*base, str(tmp_path / "both.yaml")]) == 0
    both = read_noise(tmp_path / "both.yaml")
    # (how close the fit comes is test_the_fit_recovers_a_host_phase's and
    # test_the_fit_tells_stalls_from_the_step_error's: here the phase clusters the stalls)
    assert both.phase_share > 0.5 and both.stall_prob > 0.01
    assert main([*base, str(tmp_path / "none.yaml"), "--independent", "--no-stalls"]) == 0
    none = read_noise(tmp_path / "none.yaml")
    assert (none.phase_share, none.stall_prob) == (0.0, 0.0)


# Golden digests of noisy runs (``tests/accelgen_golden.results_digest``: every column of
# requests.parquet and iterations.parquet): a change of the noise's draws or of how they are
# charged changes them. Recorded on this build; vLLM and Sarathi-Serve, whose decisions no
# change of AccelGen's moves.
NOISE_GOLDEN = {
    "vllm/lognormal": "80d0a4362da81cba1bd3503f8e3ea77ca3023b56949b6ab445a32fe7b90ff5d4",
    "sarathi/empirical": "5d7969f62bb010fe2995770654b9c8d27a8785579695044442d2a2434b2e050b",
}


def test_portable_exp_is_exp_within_an_ulp_with_ieee_arithmetic_only() -> None:
    """The step errors' exp (``portable_exp``) is within about an ulp of libm's over the range a
    lognormal draw reaches and beyond, exact at 0, and uses no SIMD libm (the golden digests above
    hold on AVX-512 hosts and others alike)."""
    import inspect

    from accelgen.costmodel import noise

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0.0, 0.3, 20_000), rng.uniform(-700.0, 700.0, 20_000),
                        [0.0, -0.0, 1e-300, math.log(2.0), -math.log(2.0) / 2]])
    got = noise.portable_exp(x)
    want = np.array([math.exp(v) for v in x])
    assert np.all(np.abs(got / want - 1.0) <= 2.5 * np.finfo(np.float64).eps)
    assert float(noise.portable_exp(0.0)) == 1.0
    body = inspect.getsource(noise.portable_exp) + inspect.getsource(noise.StepNoise)
    assert "np.exp" not in body and "math.exp" not in body


def _golden_run(name: str, out: Path) -> str:
    from tests.accelgen_golden import results_digest

    policy, kind = name.split("/")
    spec = (NoiseSpec(kind="lognormal", step_sigma=0.1, step_mu=-0.005, run_sigma=0.1)
            if kind == "lognormal" else
            NoiseSpec(kind="empirical", step_quantiles=[0.7, 0.95, 1.0, 1.05, 1.2, 3.0],
                      run_mu=0.05))
    _run(policy, spec, 3).write(out)
    return results_digest(out)


@pytest.mark.parametrize("name", sorted(NOISE_GOLDEN))
def test_noisy_runs_match_their_golden_digests(name: str, tmp_path: Path) -> None:
    assert _golden_run(name, tmp_path / "run") == NOISE_GOLDEN[name]
