"""The fidelity stage of the pipeline: the runner's cost-model hook, the config section, the
Snakemake plan, the report (table, CSV, figure) and the CLI, all on synthetic runs directories
(no engine: the real-engine smoke test is in tests/test_fidelity.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from accelgen.config import ExperimentConfig, PolicySpec, SimOptions
from accelgen.costmodel.factory import deployment_pivot, make_cost_model
from accelgen.pipeline import config as pc
from accelgen.profiling import fidelity_cli
from accelgen.profiling.fidelity import (
    PLAN_NAME,
    PROFILE_NAME,
    ROUND_NAME,
    TARGETS,
    FidelityConfig,
    make_trace,
    sim_deployment,
    simulate_run,
)
from accelgen.profiling.fidelity_report import write_report
from accelgen.profiling.grid import Shape
from accelgen.profiling.measure import Measurement, write_profile
from accelgen.profiling.vllm_backend import FIRST_USE_KEY, JITTER_KEY, PLUGIN_KEY
from accelgen.sim.runner import simulate
from tests.test_pipeline import QUICK, ROOT, job_counts, quick_dict, snakemake

ENGINE = {"block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048,
          "max_num_seqs": 128}
FIDELITY_RULES = {"fidelity_run", "fidelity_report", "notebook_fidelity", "fidelity"}


# -- synthetic runs directories -------------------------------------------------------------
def _step_time(shape: Shape, scale: float) -> float:
    pairs = sum(n * (shape.prefill_ctx + (n + 1) / 2) for n in shape.chunks())
    return scale * (1.5e-3 + 4e-6 * shape.forward_size + 2e-5 * shape.decode_seqs
                    + 5e-10 * (pairs + shape.decode_ctx))


def synthetic_profile(path: Path, scale: float = 1.0) -> Path:
    """A profile CSV with every metadata line the engine step model reads."""
    shapes = [Shape.prefill(s) for s in (16, 32, 64, 128, 256, 512, 1024, 2048)]
    shapes += [Shape.prefill(128, ctx=512), Shape.prefill(256, seqs=4)]
    shapes += [Shape.decode(b, c) for b in (1, 4, 16, 64) for c in (64, 512)]
    shapes += [Shape.mixed(128, 8, 256)]
    levels = [0.1, 0.5, 0.9]
    meta = {"backend": "synthetic", FIRST_USE_KEY: "0.001",
            PLUGIN_KEY: "0.0003 + 1e-05 x batch_size (synthetic)",
            JITTER_KEY: json.dumps({"levels": levels, "ratios": [0.9, 1.0, 1.2]})}
    meas = [Measurement(s, [_step_time(s, scale)]) for s in shapes]
    return write_profile(path, meas, meta)


def fake_fidelity_runs(out: Path, rounds: int = 2, num_requests: int = 40) -> Path:
    """A runs directory in ``run_fidelity``'s layout whose "real" runs are simulations of a
    slightly slower engine (so errors are small but not zero)."""
    from accelgen.profiling.fidelity import simulate_both

    cfg = FidelityConfig(num_requests=num_requests, rate=30.0, seed=2, rounds=rounds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(cfg.model_dump_json(indent=2))
    trace = make_trace(cfg)
    for k in range(rounds):
        rdir = out / f"round-{k}"
        rdir.mkdir()
        prof = synthetic_profile(rdir / PROFILE_NAME)
        synthetic_profile(rdir / PLAN_NAME)
        real_prof = synthetic_profile(rdir / "real-engine.csv", scale=1.05 + 0.05 * k)
        for system in cfg.systems:
            simulate_run(trace, system, sim_deployment(real_prof, 512, ENGINE), ENGINE,
                         rdir / f"real-{system}")
            simulate_both(trace, system, cfg, prof, 512, rdir, plan_csv=rdir / PLAN_NAME)
        (rdir / ROUND_NAME).write_text(json.dumps({
            "pass_times": [[0.0, 1.0]] * 3, "pass_speeds": [1.0, 0.9, 1.1],
            "replays": {"stock": {"start": 1.0, "end": 2.0, "passes_before": 1},
                        "accelgen": {"start": 3.0, "end": 4.0, "passes_before": 2}}}))
    return out


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_fidelity_runs(tmp_path_factory.mktemp("fid") / "runs")


# -- the runner's cost-model hook -----------------------------------------------------------
def test_simulate_with_the_deployments_own_cost_model_is_unchanged(tmp_path: Path) -> None:
    dep = sim_deployment(synthetic_profile(tmp_path / "p.csv"), 64, ENGINE)
    cfg = ExperimentConfig(deployment=dep, policy=PolicySpec(name="vllm"),
                           sim=SimOptions(progress=False))
    trace = make_trace(FidelityConfig(num_requests=60, rate=40.0, seed=5))
    a = simulate(trace, cfg)
    b = simulate(trace, cfg, cost=make_cost_model(dep))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert a.summary == b.summary
    # A 2x slower cost model: the pivot comes from it (same size, twice the time).
    from accelgen.costmodel.table import ProfileCostModel

    slow = ProfileCostModel.from_csv(synthetic_profile(tmp_path / "slow.csv", scale=2.0))
    c = simulate(trace, cfg, cost=slow)
    pivot = deployment_pivot(dep)
    assert c.summary["s_pf"] == pivot.s_pf
    assert c.summary["t_pf"] == pytest.approx(2 * pivot.t_pf)
    assert c.iterations["latency"].sum() > 1.5 * a.iterations["latency"].sum()


def test_pass_speeds_show_a_slower_pass() -> None:
    from accelgen.profiling.vllm_backend import ProfileSession

    sess = ProfileSession.__new__(ProfileSession)  # no engine: only the bookkeeping
    a, b = Shape.prefill(64), Shape.decode(4, 64)
    # Three passes of two samples per shape; pass 1 runs 1.5x slower.
    sess._samples = {a: [1.0, 1.0, 1.5, 1.5, 1.0, 1.0], b: [2.0, 2.0, 3.0, 3.0, 2.0, 2.0]}
    sess._pass_of = {a: [0, 0, 1, 1, 2, 2], b: [0, 0, 1, 1, 2, 2]}
    sess._passes = 3
    assert sess.pass_speeds() == pytest.approx([1.0, 1.5, 1.0])


def test_first_use_slices_are_kept_and_pooled_by_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelgen.profiling import vllm_backend as vb

    sess = vb.ProfileSession.__new__(vb.ProfileSession)  # no engine: a scripted one
    sess.say, sess.opts, sess.first_use_slices = (lambda _m: None), vb.VllmOptions(), []
    a = Shape.prefill(64)
    sess._samples, sess._seen, sess._pass_of, sess._passes = {a: [1.0]}, {a: [a]}, {a: [0]}, 1
    sess.shapes = [a]
    answers = {"first_use": [[(30, 0.010, 0.004), (40, 0.011, 0.004)],  # +6, +7 ms
                             [(50, 0.005, 0.004), (60, 0.0055, 0.004)]],  # +1, +1.5 ms
               "probe": [([(70, 0.006, 0.004)], [(1, 0.002), (2, 0.0025)],  # +2 ms
                          {"spec": {}, "vllm": "x", "torch": "y", "threads": 1})]}
    monkeypatch.setattr(sess, "_call", lambda msg: answers[msg[0]].pop(0), raising=False)
    first = sess.first_use()
    assert vb.first_use_penalty(first) == pytest.approx(0.0065)
    assert vb.first_use_penalty(first + sess.first_use()) == pytest.approx(0.00375)
    _, meta = sess.finish()
    # The profile-wide penalty pools every slice with the final probe: median of 1..7 ms.
    assert float(meta[FIRST_USE_KEY]) == pytest.approx(0.002)
    slices = json.loads(str(meta["first_use_slices"]))
    assert [s["penalty_s"] for s in slices] == pytest.approx([0.0065, 0.00125])
    with pytest.raises(ValueError):
        vb.first_use_penalty([])


# -- the config section ---------------------------------------------------------------------
def test_quick_and_paper_configs_have_the_stage() -> None:
    for path in (QUICK, ROOT / "config" / "paper.yaml"):
        cfg = pc.load_file(path)
        assert cfg.fidelity_on and cfg.fidelity is not None
        # The section maps onto the runner's own config.
        FidelityConfig.model_validate(cfg.fidelity.run_spec())
    quick = pc.load_file(QUICK).fidelity
    assert quick is not None and quick.num_requests <= 300 and quick.rounds <= 3


def test_the_stage_is_off_when_left_out_or_disabled() -> None:
    data = quick_dict()
    data.pop("fidelity")
    assert not pc.load(data).fidelity_on
    data["fidelity"] = {"enabled": False}
    assert not pc.load(data).fidelity_on


BAD = {
    "zero rounds": ({"rounds": 0}, "fidelity.rounds"),
    "negative rate": ({"rate": -1.0}, "fidelity.rate"),
    "unknown system": ({"systems": ["stock", "sarathi"]}, "fidelity.systems"),
    "system twice": ({"systems": ["stock", "stock"]}, "fidelity.systems"),
    "no systems": ({"systems": []}, "fidelity.systems"),
    "nice out of range": ({"renice": -40}, "fidelity.renice"),
    "typo": ({"num_request": 10}, "fidelity.num_request"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_fidelity_values_name_the_key(case: str) -> None:
    over, key = BAD[case]
    data = pc.deep_merge(quick_dict(), {"fidelity": over})
    with pytest.raises(pc.PipelineConfigError) as err:
        pc.load(data)
    assert key in str(err.value), str(err.value)


# -- the Snakemake plan ---------------------------------------------------------------------
def test_dry_run_plans_the_fidelity_stage() -> None:
    res = snakemake("-n", "--forceall", "fidelity")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    counts = job_counts(res.stdout)
    assert counts == {rule: 1 for rule in FIDELITY_RULES}, res.stdout[-3000:]
    # Engines one at a time (the `engine` resource, limit 1 in profiles/default), both cores.
    block = res.stdout.split("rule fidelity_run:")[1].split("\n[")[0]
    assert "engine=1" in block, block
    assert "InputFunctionException" not in res.stdout + res.stderr  # `aggregate` stays out
    # The default target includes it.
    res = snakemake("-n", "--forceall")
    assert res.returncode == 0
    assert FIDELITY_RULES - {"fidelity"} <= set(job_counts(res.stdout))


def test_dry_run_without_the_stage(tmp_path: Path) -> None:
    cfg = tmp_path / "nofid.yaml"
    cfg.write_text(yaml.safe_dump(pc.deep_merge(quick_dict(), {"fidelity": {"enabled": False}})))
    res = snakemake("-n", "--forceall", "--configfile", str(cfg))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not FIDELITY_RULES & set(job_counts(res.stdout))


# -- report, CSV, figure, CLI ---------------------------------------------------------------
def test_report_writes_the_table_csv_and_figure(fake_runs: Path, tmp_path: Path) -> None:
    rep = write_report(fake_runs, tmp_path / "figs" / "fidelity.csv",
                       tmp_path / "figs" / "fidelity.png")
    for ext in ("csv", "png", "pdf"):
        assert (tmp_path / "figs" / f"fidelity.{ext}").stat().st_size > 500, ext
    t = rep.table.set_index(["system", "metric"])
    for system in ("stock", "accelgen"):
        for metric in (*TARGETS, "num_iterations", "batch_size_mean"):
            assert (system, metric) in t.index
        assert (t.loc[(system, "throughput_output_tps"), "rounds"]) == 2
        # Arrival-bound throughput matches; step times differ (a 5-10 % slower "real" engine,
        # the model's first-use, jitter and plugin terms), but by far less than 2x.
        assert abs(t.loc[(system, "throughput_output_tps"), "rel_err"]) < TARGETS[
            "throughput_output_tps"]
        assert 0 < abs(t.loc[(system, "iter_latency_mean"), "rel_err"]) < 0.5
    assert set(rep.variants) == {"sim-nojitter", "sim-table"}
    csv = pd.read_csv(tmp_path / "figs" / "fidelity.csv")
    assert set(csv["model"]) == {"sim", "sim-nojitter", "sim-table"}
    assert set(csv["round"].astype(str)) == {"median", "0", "1"}
    text = rep.text()
    assert "ttft_p50" in text and "tbt_p90" in text
    assert ("every target met" in text) or ("target(s) missed" in text)


def test_decode_step_costs_read_the_engine_timing(fake_runs: Path, tmp_path: Path) -> None:
    import shutil

    from accelgen.profiling.fidelity import decode_step_costs
    from accelgen.sim.recorder import read_results

    assert decode_step_costs(fake_runs / "round-0").empty  # simulated stand-ins: no exec_time
    rdir = tmp_path / "round"
    for system, sched in (("stock", 1e-4), ("accelgen", 4e-4)):
        real = rdir / f"real-{system}"
        shutil.copytree(fake_runs / "round-0" / f"real-{system}", real)
        _, its, _ = read_results(real)
        pd.DataFrame({"decision_time": np.full(len(its), sched),
                      "exec_time": np.full(len(its), 1e-3)}).to_parquet(real / "timing.parquet")
    c = decode_step_costs(rdir)
    assert not c.empty and c.index.max() <= 8
    extra = c[("schedule", "accelgen")] - c[("schedule", "stock")]
    assert np.allclose(extra, 3e-4)
    assert np.allclose(c[("exec", "stock")], 1e-3)


def test_cli_report_prints_the_table(fake_runs: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert fidelity_cli.main(["report", "--runs", str(fake_runs), "--csv",
                              str(tmp_path / "f.csv")]) == 0
    out = capsys.readouterr().out
    assert "throughput_output_tps" in out and "sim-table" in out
    assert (tmp_path / "f.csv").exists()


def test_accelgen_fidelity_command_is_the_same_cli(fake_runs: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from accelgen.cli import main as accelgen_main

    assert accelgen_main(["fidelity", "report", "--runs", str(fake_runs), "--csv",
                          str(tmp_path / "g.csv")]) == 0
    assert "throughput_output_tps" in capsys.readouterr().out
    assert (tmp_path / "g.csv").exists()
    with pytest.raises(SystemExit):  # run or report is required
        accelgen_main(["fidelity"])


def test_aggregate_claims_only_the_grids_figure_csvs() -> None:
    from accelgen.pipeline.grid import Grid

    ids = Grid(pc.load_file(QUICK)).csv_figure_ids()
    assert "claims" in ids and "fig09_evaluation" in ids and "fidelity" not in ids
    text = (ROOT / "rules" / "figures.smk").read_text()
    assert "csv_figure_ids()" in text
    assert "wildcard_constraints" not in (ROOT / "rules" / "fidelity.smk").read_text()


def test_run_stops_with_a_clear_message_without_vllm(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(SystemExit) as err:
        fidelity_cli.main(["run", "--out", str(tmp_path / "runs"), "--spec",
                           json.dumps({"num_requests": 5, "rounds": 1})])
    msg = str(err.value)
    assert "scripts/setup.sh --vllm" in msg and "enabled: false" in msg
    assert not (tmp_path / "runs").exists()


def test_run_config_takes_the_pipeline_spec() -> None:
    spec = pc.load_file(QUICK).fidelity.run_spec()  # type: ignore[union-attr]
    cfg = fidelity_cli.load_config(None, json.dumps(spec), rounds=1)
    assert cfg.num_requests == spec["num_requests"] and cfg.rounds == 1
    with pytest.raises(ValueError):
        fidelity_cli.load_config(None, json.dumps({"no_such_field": 1}))
