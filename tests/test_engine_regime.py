"""Regime `engine` (SPEC 12): the sweep's budgets, traces, systems and analysis on synthetic runs
directories (no engine), the pipeline stage's plan, the claims row, and one reduced sweep on the
real vLLM CPU engine (marked ``vllm``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accelgen.costmodel.calibrated import CalibratedCostModel
from accelgen.engine_regime import systems as sysmod
from accelgen.engine_regime.analyze import build_report, ordering
from accelgen.engine_regime.sweep_spec import EngineSweepConfig, SystemSpec
from accelgen.engine_regime.traces import latency_reference, sweep_trace, tbt_class
from accelgen.fidelity.check_spec import engine_deployment
from accelgen.pipeline import claims as C
from accelgen.pipeline import config_file as pc
from accelgen.vllm_integration.replay import ReplayConfig, engine_token_limit
from tests.engine_fakes import ENGINE, ENGINE_TERMS, KV_BLOCKS, fake_cfg, fake_engine_runs
from tests.test_pipeline import QUICK, ROOT, job_counts, quick_dict, snakemake

ENGINE_RULES = {"engine_run", "engine_report", "notebook_engine", "fig17"}


@pytest.fixture(scope="module")
def dep():
    return engine_deployment(ENGINE, KV_BLOCKS, ENGINE_TERMS)


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_engine_runs(tmp_path_factory.mktemp("engine") / "runs")


# -- budgets ---------------------------------------------------------------------------------
def test_tuned_budget_is_the_pipelines_rule_on_the_engines_model(dep) -> None:
    from accelgen.costmodel.budget import knee_decodes, predicted_iteration, prefill_pairs_per_token

    cost = CalibratedCostModel(ENGINE_TERMS, 2)
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(16, 1024, 60), rng.integers(16, 97, 60)
    for slo in (0.03, 0.06, 0.12):
        t = sysmod.tune(cost, slo, 4.0, prompt, output, 32, 2048, 128)
        knee = knee_decodes(prompt, output, rate=4.0, t_iteration=slo, max_num_seqs=128)
        assert t.token_budget % 32 == 0 and t.num_decodes == knee.num_seqs
        assert t.meets and t.predicted_s <= slo
        nxt = t.token_budget + 32
        assert predicted_iteration(cost, nxt, prefill_pairs_per_token(prompt, nxt), knee) > slo
    # A looser class allows larger chunks; none fits: one block, marked.
    assert sysmod.tune(cost, 0.12, 4.0, prompt, output, 32, 2048, 128).token_budget > \
        sysmod.tune(cost, 0.06, 4.0, prompt, output, 32, 2048, 128).token_budget
    low = sysmod.tune(cost, 1e-4, 4.0, prompt, output, 32, 2048, 128)
    assert low.token_budget == 32 and not low.meets


def test_tbt_base_keeps_the_papers_proportion_to_the_pivot() -> None:
    ratio = sysmod.paper_tbt_ratio()
    assert 2.0 < ratio < 3.5  # 0.1875 s over OPT-13B's T_pf of about 70 ms on an A100
    cfg = EngineSweepConfig()
    assert sysmod.tbt_base(cfg, 0.1) == pytest.approx(0.1 * ratio)
    assert sysmod.tbt_base(cfg.model_copy(update={"tbt_base": 0.2}), 0.1) == 0.2


# -- systems ---------------------------------------------------------------------------------
def test_each_system_runs_the_same_scheduler_in_the_engine_and_the_simulator(dep) -> None:
    cfg = fake_cfg(async_scheduling=True)
    stock = SystemSpec(runs="stock", budget="tuned")
    rc = sysmod.replay_config(cfg, stock, 192, dep, "/tmp/m")
    assert rc["system"] == "stock" and rc["engine"]["max_num_batched_tokens"] == 192
    assert rc["scheduling_policy"] == "fcfs"
    assert rc["engine"]["async_scheduling"] is True  # the engine spec's mode, recorded per run
    pol = sysmod.sim_policy(stock, 192, 128)
    assert pol.name == "vllm" and pol.params == {"token_budget": 192, "max_num_seqs": 128}
    # vLLM's priority mode (SLO classes): the engine's queue mode, the simulator's policy.
    pri = SystemSpec(runs="stock", policy="vllm-priority", budget="tuned")
    rc = sysmod.replay_config(cfg, pri, 192, dep, "/tmp/m")
    assert rc["system"] == "stock" and rc["scheduling_policy"] == "priority"
    assert rc["engine"]["max_num_batched_tokens"] == 192
    ReplayConfig.model_validate(rc)  # the replay accepts it
    pol = sysmod.sim_policy(pri, 192, 128)
    assert pol.name == "vllm-priority" and pol.params == {"token_budget": 192,
                                                          "max_num_seqs": 128}
    plug = SystemSpec(runs="plugin", policy="sarathi", budget="tuned")
    rc = sysmod.replay_config(cfg, plug, 192, dep, "/tmp/m")
    assert rc["system"] == "accelgen" and "max_num_batched_tokens" not in rc["engine"]
    assert rc["adapter"]["policy"] == {"name": "sarathi", "params": {"token_budget": 192}}
    # The plugin's engine limit: the policy's largest budget (Sarathi's: its budget or one decode
    # per running request, at most max_num_seqs), or the one the sweep's engine sets, which caps
    # the policy.
    limit = engine_token_limit(ReplayConfig.model_validate(rc))
    assert (limit.tokens, limit.largest_budget, limit.user_set) == (192, 192, False)
    ours = sysmod.replay_config(cfg, SystemSpec(runs="plugin", policy="accelgen"), None, dep,
                                "/tmp/m")
    limit = engine_token_limit(ReplayConfig.model_validate(ours))
    assert limit.largest_budget is not None and not limit.user_set
    assert limit.tokens == max(limit.largest_budget, ENGINE["max_num_seqs"])
    small = {**ENGINE, "max_num_batched_tokens": 64, "max_num_seqs": 16}
    capped = sysmod.replay_config(fake_cfg(engine=small),
                                  SystemSpec(runs="plugin", policy="accelgen"), None, dep, "/tmp/m")
    limit = engine_token_limit(ReplayConfig.model_validate(capped))
    assert limit.tokens == 64 and limit.user_set and "caps the policy" in limit.describe()
    assert rc["adapter"]["cost"]["deployment"]["cost_model"] == "calibrated"
    assert sysmod.budget_of(plug, 448, 192) == 192
    assert sysmod.budget_of(SystemSpec(runs="stock", budget="paper"), 448, 192) == 448
    assert sysmod.budget_of(SystemSpec(runs="plugin", policy="accelgen"), 448, 192) is None


@pytest.mark.parametrize("bad,key", [
    ({"runs": "stock"}, "budget"),
    ({"runs": "plugin", "policy": "oracle"}, "clairvoyant"),
    ({"runs": "plugin", "policy": "no-such-policy"}, "unknown policy"),
    ({"runs": "stock", "budget": "paper", "policy": "edf"}, "vLLM's own scheduler"),
    ({"runs": "stock", "budget": "paper", "policy": "vllm-priority", "params": {"x": 1}},
     "vLLM's own scheduler"),
    ({"runs": "plugin", "budget": "best"}, "budget"),
])
def test_bad_systems_say_what_is_wrong(bad: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SystemSpec.model_validate(bad)


# -- traces ----------------------------------------------------------------------------------
def test_every_rate_of_a_seed_serves_the_same_requests(dep) -> None:
    cfg = fake_cfg()
    ref = latency_reference(dep)
    a = sweep_trace(cfg, 0, 2.0, ref, 0.25)
    b = sweep_trace(cfg, 0, 8.0, ref, 0.25)
    for col in ("prompt_len", "output_len", "ttft_slo", "tbt_slo", "jct_slo", "online"):
        assert a[col].equals(b[col]), col
    np.testing.assert_allclose(a["arrival"].to_numpy(), 4.0 * b["arrival"].to_numpy())
    assert not a["prompt_len"].equals(sweep_trace(cfg, 1, 2.0, ref, 0.25)["prompt_len"])
    # The `isolated` rule: every online TTFT SLO at least the request's chunked prefill + T_pf.
    online = a[a["online"]]
    floor = np.array([ref.chunked_prefill(p) for p in online["prompt_len"]]) + ref.t_pf
    assert (online["ttft_slo"].to_numpy() >= floor * (1 - 1e-9)).all()
    assert set(tbt_class(a["tbt_slo"].to_numpy(), a["online"].to_numpy(), 0.25,
                         cfg.tbt_scale_set)) <= {"tbt0.25", "tbt0.5", "tbt1", "tbt2", "offline"}


def test_tbt_classes_map_raised_slos_to_the_class_above() -> None:
    got = tbt_class(np.array([0.05, 0.1, 0.06, 0.4, 1.0, np.inf]),
                    np.array([True] * 5 + [False]), 0.2, [0.25, 0.5, 1.0, 2.0])
    assert list(got) == ["tbt0.25", "tbt0.5", "tbt0.5", "tbt2", "tbt2", "offline"]


# -- analysis on a synthetic sweep -------------------------------------------------------------
def test_report_on_a_synthetic_sweep(fake_runs: Path) -> None:
    from accelgen.engine_regime.run import read_searches

    rep = build_report(fake_runs)
    cfg = fake_cfg()
    # Every probe of every search is a point: each (source, system, seed) has its own rates.
    for source, d in (("engine", "real"), ("sim", "sim"), ("sim-speed", "sim-speed")):
        searches = read_searches(fake_runs, d)
        assert set(searches) == set(cfg.systems)
        for system, per in searches.items():
            assert sorted(per) == cfg.seeds
            for seed, s in per.items():
                got = rep.points[(rep.points["source"] == source)
                                 & (rep.points["system"] == system)
                                 & (rep.points["seed"] == seed)]
                assert sorted(got["rate"]) == sorted({p["rate"] for p in s["probes"]})
                assert 1 <= len(s["probes"]) <= cfg.search.max_probes
                cap = rep.capacity.set_index(["source", "system", "seed"]).loc[
                    (source, system, seed), "capacity_rps"]
                assert cap == pytest.approx(s["capacity_rps"], nan_ok=True)
    assert set(rep.capacity["source"]) == {"engine", "sim", "sim-speed"}
    # The host's speed is measured on the stock replays: their "engine" ran 5 % (seed 0) and
    # 10 % (seed 1) slower than the calibrated model.
    assert rep.speed["basis"] == "stock replays"
    assert 1.03 < rep.speed["factor"] < 1.12
    eng = rep.points[rep.points["source"] == "engine"].set_index(["system", "seed"])
    assert eng.loc[("vllm", 0), "step_ratio"].between(1.0, 1.1).all()
    assert eng.loc[("vllm", 1), "step_ratio"].between(1.05, 1.15).all()
    s = rep.summary.set_index(["source", "system"])
    for system in cfg.systems:
        eng, sim = s.loc[("engine", system)], s.loc[("sim", system)]
        assert eng["min"] <= eng["median"] <= eng["max"]
        assert eng["median"] > 0 and sim["median"] > 0, system
        assert math.isfinite(sim["error_vs_engine"]) and math.isnan(eng["error_vs_engine"])
    # Stock vLLM at a fixed budget on a 5-10 % slower "engine": the simulator, charging the
    # faster model, cannot predict a lower capacity (up to the searches' resolution).
    tol = cfg.search.tolerance
    assert s.loc[("sim", "vllm"), "error_vs_engine"] >= -tol
    classes = [c for c in rep.points.columns if c.startswith("att_")]
    assert classes == ["att_tbt0.25", "att_tbt0.5", "att_tbt1", "att_tbt2", "att_offline"]
    frame = rep.frame()
    assert {"point", "capacity", "capacity_summary", "class_capacity", "ordering", "ratio",
            "host_speed"} <= set(frame["kind"])
    ratios = frame[frame["kind"] == "ratio"].set_index("system")
    assert set(ratios.index) == {"accelgen", "accelgen-closed"}
    eng = rep.summary[rep.summary["source"] == "engine"].set_index("system")["median"]
    best = eng[["vllm", "vllm-tuned", "vllm-priority-tuned"]].max()
    assert ratios.loc["accelgen", "value"] == pytest.approx(eng["accelgen"] / best)
    assert (frame["regime"] == "engine").all()
    assert set(frame.loc[frame["kind"] == "capacity_summary", "runs"]) == {"stock", "plugin"}
    text = rep.text()
    assert "capacity (req/s" in text and "ordering (sim):" in text and "host speed" in text
    assert "pairs the engine separates" in text and "best stock vLLM" in text
    assert "capacity per SLO class" in text
    # Charged at the measured speed, the stock systems' simulations come closer to the "engine"
    # (up to the searches' resolution).
    s = rep.summary.set_index(["source", "system"])
    for system in ("vllm", "vllm-tuned"):
        assert abs(s.loc[("sim-speed", system), "error_vs_engine"]) <= \
            abs(s.loc[("sim", system), "error_vs_engine"]) + tol, system


def test_ordering_ignores_pairs_the_engine_cannot_separate() -> None:
    def summary(eng: dict[str, tuple[float, float, float]], sim: dict[str, float]):
        rows = [{"source": "engine", "system": k, "median": m, "min": lo, "max": hi}
                for k, (m, lo, hi) in eng.items()]
        rows += [{"source": "sim", "system": k, "median": v, "min": v, "max": v}
                 for k, v in sim.items()]
        return pd.DataFrame(rows)

    apart = {"a": (10.0, 9.0, 11.0), "b": (5.0, 4.0, 6.0), "c": (5.5, 4.5, 6.5)}
    o = ordering(summary(apart, {"a": 9.0, "b": 6.0, "c": 5.0}))
    assert o.agree and o.separated_pairs == 2 and o.engine[0] == "a"
    assert sorted(o.separated) == [("a", "b"), ("a", "c")]
    assert o.kendall_tau == pytest.approx(1 / 3)  # b/c swapped, inside the engine's noise
    o = ordering(summary(apart, {"a": 4.0, "b": 6.0, "c": 5.0}))
    assert not o.agree and ("a", "b") in o.disagreements


def test_report_command_writes_the_csv(fake_runs: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from accelgen.cli import main

    out = tmp_path / "fig17_engine_capacity.csv"
    assert main(["engine-sweep", "report", "--runs", str(fake_runs), "--csv", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    df = pd.read_csv(out)
    assert {"regime", "kind", "source", "system", "rate", "metric", "value"} <= set(df.columns)


def test_report_of_an_empty_directory_names_it(tmp_path: Path) -> None:
    cfg = fake_cfg()
    (tmp_path / "engine_sweep.json").write_text(cfg.model_dump_json())
    (tmp_path / "plan.json").write_text(json.dumps({"estimate_rps": 1.0, "labels": {},
                                                     "tbt_base": 0.1}))
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        build_report(tmp_path)


def test_notebook_draws_figure_17(fake_runs: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    figs = tmp_path / "figs"
    figs.mkdir()
    build_report(fake_runs).frame().to_csv(figs / "fig17_engine_capacity.csv", index=False)
    res = subprocess.run(
        [sys.executable, "-m", "papermill", "-k", "python3", "--no-progress-bar",
         str(ROOT / "notebooks" / "engine.ipynb"), str(tmp_path / "out.ipynb"),
         "-p", "figures_dir", str(figs)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    for ext in ("png", "pdf"):
        assert (figs / f"fig17_engine_capacity.{ext}").stat().st_size > 1000, ext


# -- the claims row ----------------------------------------------------------------------------
def test_claims_row_compares_the_plugin_with_each_stock_vllm(fake_runs: Path) -> None:
    frame = build_report(fake_runs).frame()
    table = C.claims_table({"fig17_engine_capacity": frame}).set_index("id")
    row = table.loc["engine_vs_vllm"]
    assert row["ours_paper"] == row["ours_capacity"] == "not run in this regime"
    caps = frame[(frame["kind"] == "capacity_summary") & (frame["source"] == "engine")]
    caps = caps.set_index("system")["value"]
    pairs = dict(p.split("=") for p in row["pairs_engine"].split("; ") if p)
    assert {"vllm", "vllm-tuned", "vllm-priority-tuned"} <= set(pairs) | {
        k for k in caps.index if caps[k] <= 0}
    for stock in ("vllm", "vllm-tuned", "vllm-priority-tuned"):
        if caps[stock] > 0:
            assert float(pairs[stock]) == pytest.approx(caps["accelgen"] / caps[stock], rel=1e-2)
    assert row["verdict"] == row["verdict_engine"]
    # Without figure 17 the row is not testable, and the others keep their verdicts.
    assert C.claims_table({}).set_index("id").loc["engine_vs_vllm", "verdict"] == \
        C.NOT_TESTABLE


# -- the pipeline stage ------------------------------------------------------------------------
def test_quick_config_keeps_the_engine_sweep_a_separate_target() -> None:
    cfg = pc.load_file(QUICK)
    assert cfg.engine_on and cfg.engine is not None and not cfg.engine.in_default_target
    sweep = EngineSweepConfig.model_validate(cfg.engine.run_spec())
    # SPEC 13: at least 100 requests per point and 3 repeats.
    assert sweep.num_requests >= 100 and sweep.repeats >= 3
    paper = pc.load_file(ROOT / "config" / "paper.yaml")
    assert paper.engine is not None and paper.engine.in_default_target


def test_dry_run_plans_fig17_and_the_default_target_leaves_it_out() -> None:
    res = snakemake("-n", "--forceall", "fig17")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert job_counts(res.stdout) == {rule: 1 for rule in ENGINE_RULES}, res.stdout[-3000:]
    block = res.stdout.split("rule engine_run:")[1].split("\n[")[0]
    assert "engine=1" in block, block
    res = snakemake("-n", "--forceall")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "engine_run" not in job_counts(res.stdout)


@pytest.mark.parametrize("over,key", [
    ({"search": {"coarse_factor": 1.0}}, "engine.search.coarse_factor"),
    ({"jitter": {"multiple": 0}}, "engine.jitter.multiple"),
    ({"repeats": 0}, "engine.repeats"),
    ({"systems": {"x": {"runs": "stock"}}}, "engine.systems.x"),
    ({"num_request": 10}, "engine.num_request"),
    ({"renice": -40}, "engine.renice"),
])
def test_bad_engine_values_name_the_key(over: dict, key: str) -> None:
    data = pc.deep_merge(quick_dict(), {"engine": over})
    with pytest.raises(pc.PipelineConfigError) as err:
        pc.load(data)
    assert key in str(err.value), str(err.value)


# -- the real engine (CI's reduced sweep) ------------------------------------------------------
@pytest.mark.vllm
@pytest.mark.slow
def test_reduced_sweep_on_the_vllm_cpu_engine(tmp_path: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    """CI's reduced sweep: the calibration replay (stock vLLM), the host's jitter (20 steps),
    and a search of the AccelGen plugin cut to two probes of 12 requests, one repeat, on the
    tiny model (two engine processes; the quick sweep's engine takes minutes): every probe is
    replayed, each prediction searches on its own, and the report reads it."""
    pytest.importorskip("vllm")
    from accelgen.engine_regime.run import read_plan, run_sweep

    cfg = EngineSweepConfig.model_validate({
        "model": {}, "num_requests": 12, "repeats": 1,
        "search": {"max_probes": 2}, "jitter": {"steps": 20},
        "calibration": {"num_requests": 40, "rate": 30.0}, "warmup_trace_requests": 4,
        "output_range": [4, 16], "prompt_buckets": [[16, 128, 0.5], [128, 512, 0.5]],
        "engine": {**ENGINE, "num_gpu_blocks": 64, "max_model_len": 1024},
        "systems": {"accelgen": {"runs": "plugin", "policy": "accelgen"}}})
    with capfd.disabled():
        out = run_sweep(cfg, tmp_path / "engine")
    plan = read_plan(out)
    assert plan["async_scheduling"] is False
    assert plan["jitter"]["steps"] == 20 and plan["jitter"]["p99_s"] >= plan["jitter"]["p50_s"]
    assert min(plan["tbt_classes"].values()) >= plan["jitter"]["floor_s"] - 1e-12
    rep = build_report(out)
    n = rep.points.groupby("source").size()
    assert set(n.index) == {"engine", "sim", "sim-speed", "sim-noise"} and (n <= 2).all()
    served = rep.points.groupby("source")["num_served"].sum()
    assert (served == 12 * n).all()  # every request of every probe accounted for
    assert (out / "calibration" / "noise.yaml").exists()  # fitted on the calibration replay
    # No stock system in the sweep: the host's speed is measured on every replay.
    assert rep.speed["factor"] > 0 and rep.speed["basis"] == "replays"
    busy = rep.points.loc[rep.points["source"] == "engine", "cpu_busy"]
    assert busy.between(0, 1).all()
    cal = json.loads((out / "calibration" / "summary.json").read_text())
    assert cal  # the fit's per-kind errors
    shutil.rmtree(out / "model", ignore_errors=True)
