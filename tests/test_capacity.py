"""Regime `capacity` (SPEC 11): the analytic bounds, capacity from a sweep, the new summary
metrics, and the rate sweep the grid builds around each deployment's estimate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accelgen import metrics
from accelgen.cli import main
from accelgen.core.specs import Deployment
from accelgen.costmodel.capacity import capacity_bound, kv_token_iterations
from accelgen.costmodel.datasheets import DEPLOYMENTS
from accelgen.costmodel.factory import deployment_pivot, kv_num_blocks
from accelgen.pipeline import config_file as pc
from accelgen.pipeline.grid import REGIMES, Grid

ROOT = Path(__file__).resolve().parents[1]


# -- bounds -------------------------------------------------------------------------------------

def brute_force_kv_time(p: int, o: int, s_pf: int, b: int) -> tuple[int, int]:
    """Iterations and block-rounded KV tokens held, one iteration at a time."""
    iters, held, done = 0, 0, 0
    while done < p:
        done = min(done + s_pf, p)
        iters += 1
        held += -(-done // b) * b
    for j in range(1, o):
        iters += 1
        held += -(-(p + j) // b) * b
    return iters, held


@pytest.mark.parametrize(("p", "o"), [(1, 1), (31, 1), (32, 2), (100, 50), (1300, 700),
                                      (4096, 1), (777, 2048)])
def test_kv_token_iterations_match_a_step_by_step_count(p: int, o: int) -> None:
    iters, held = kv_token_iterations(np.array([p]), np.array([o]), 512, 32)
    assert (int(iters[0]), int(held[0])) == brute_force_kv_time(p, o, 512, 32)


def test_bounds_follow_littles_law() -> None:
    dep = DEPLOYMENTS["opt-13b"]
    pivot = deployment_pivot(dep)
    prompt, output = np.array([1000, 200, 3000]), np.array([500, 100, 50])
    b = capacity_bound(dep, prompt, output)
    _, held = kv_token_iterations(prompt, output, pivot.s_pf, 32)
    kv_tokens = kv_num_blocks(dep) * 32
    assert b.kv_tokens == kv_tokens
    assert b.kv_bound_rps == pytest.approx(kv_tokens / (held.mean() * pivot.t_pf))
    # the same as KV tokens / (mean resident tokens x mean residence)
    assert b.kv_bound_rps == pytest.approx(kv_tokens / (b.mean_resident_tokens
                                                        * b.mean_residence_s))
    forward = (prompt + output - 1).mean()
    assert b.compute_bound_rps == pytest.approx(pivot.s_pf / pivot.t_pf / forward)
    assert b.estimate_rps == min(b.kv_bound_rps, b.compute_bound_rps)
    # more KV: the KV bound grows in proportion, the compute bound does not move
    auto = capacity_bound(dep.model_copy(update={"kv_cache_gb": "auto"}), prompt, output)
    assert auto.kv_bound_rps / b.kv_bound_rps == pytest.approx(auto.kv_tokens / kv_tokens)
    assert auto.compute_bound_rps == b.compute_bound_rps


def test_capacity_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.parquet"
    assert main(["trace", "--num-requests", "100", "--deployment", "opt-13b", "--out",
                 str(trace), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["capacity", "--deployment", "opt-13b", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    df = pd.read_parquet(trace)
    b = capacity_bound(DEPLOYMENTS["opt-13b"], df["prompt_len"].to_numpy(),
                       df["output_len"].to_numpy())
    assert f"KV/Little bound {b.kv_bound_rps:.3g} req/s" in out
    assert f"compute bound {b.compute_bound_rps:.3g} req/s" in out
    assert "KV-bound" in out and "offered 8" in out
    assert out.strip().splitlines()[-1].startswith("capacity: 1 trace(s) on opt-13b")
    assert main(["capacity", "--deployment", "opt-13b", "--kv-cache-gb", "auto",
                 "--trace", str(trace)]) == 0
    assert f"KV {kv_num_blocks(Deployment(kv_cache_gb='auto')) * 32:,} tokens" in \
        capsys.readouterr().out
    assert main(["capacity", "--deployment", "opt-13b"]) == 2  # no trace: a clear error


# -- capacity from a sweep ---------------------------------------------------------------------------

def test_sweep_capacity_interpolates_the_last_crossing() -> None:
    rates = np.array([0.1, 0.2, 0.4, 0.8])
    cap, where = metrics.sweep_capacity(rates, np.array([1.0, 0.95, 0.85, 0.2]))
    assert where == "interpolated" and cap == pytest.approx(0.2 + 0.05 / 0.10 * 0.2)
    # a dip below and back above the target: the highest rate that meets it counts
    cap, where = metrics.sweep_capacity(rates, np.array([1.0, 0.85, 0.92, 0.2]))
    assert cap == pytest.approx(0.4 + 0.02 / 0.72 * 0.4)
    assert metrics.sweep_capacity(rates, np.array([0.95, 0.93, 0.92, 0.91])) == \
        (0.8, "above_sweep")
    assert metrics.sweep_capacity(rates, np.array([0.8, 0.7, 0.5, 0.1])) == (0.0, "below_sweep")
    # order of the points does not matter; NaN points are ignored
    cap2, _ = metrics.sweep_capacity(rates[::-1], np.array([0.2, 0.85, 0.95, 1.0]))
    assert cap2 == pytest.approx(0.3)
    assert metrics.sweep_capacity(np.array([0.1]), np.array([math.nan]))[1] == "no_data"


def test_distserve_and_tbt_only_attainment() -> None:
    """Request 0 meets everything; 1 misses one gap but its mean TPOT is fine (DistServe's rule
    passes, request-level and TBT-only fail); 2 is late for its first token; 3 is rejected."""
    reqs = pd.DataFrame({
        "req_id": [0, 1, 2, 3], "arrival": [0.0, 0.0, 0.0, 0.0], "source": ["t"] * 4,
        "online": [True] * 4, "prompt_len": [10] * 4, "output_len": [4] * 4,
        "ttft_slo": [1.0] * 4, "tbt_slo": [0.1] * 4, "jct_slo": [math.inf] * 4,
        "status": ["finished", "finished", "finished", "rejected"],
        "reject_reason": ["", "", "", "x"], "num_output_tokens": [4, 4, 4, 0],
        "first_scheduled_time": [0.0] * 4, "first_token_time": [0.5, 0.5, 1.5, math.nan],
        "finish_time": [0.65, 0.75, 1.65, math.nan], "num_preemptions": [0] * 4,
        "token_times": [[0.5, 0.55, 0.6, 0.65], [0.5, 0.55, 0.6, 0.75],
                        [1.5, 1.55, 1.6, 1.65], []]})
    pr = metrics.per_request(reqs)
    assert list(pr["slo_met"]) == [True, False, False, False]
    assert list(pr["distserve_met"]) == [True, True, False, False]
    assert list(pr["tbt_met"]) == [True, False, True, False]
    assert list(pr["ttft_met"]) == [True, True, False, False]
    its = pd.DataFrame({"start": [0.0], "latency": [0.1], "forward_size": [1],
                        "kv_used_blocks": [1], "kv_total_blocks": [2]})
    s = metrics.summarize(reqs, its, s_pf=1)
    assert (s["slo_attainment_request"], s["slo_attainment_distserve"], s["tbt_attainment"],
            s["ttft_attainment"]) == (0.25, 0.5, 0.5, 0.5)


# -- the grid ----------------------------------------------------------------------------------------

def test_quick_sweep_is_placed_by_the_estimate_and_labels_its_regime() -> None:
    grid = Grid(pc.load_file(ROOT / "config" / "quick.yaml"))
    cap = grid.cfg.experiments.capacity
    assert cap is not None and grid.cfg.workload_dict(cap.workload)["slo"][
        "ttft_reference"] == "isolated"
    fig = grid.figures["fig13"]
    (bound,) = fig.options["bounds"]
    assert bound["deployment"] == "opt-13b-auto"
    # the estimate is `accelgen capacity` on the sweep's seed-0 trace for that deployment
    est = grid.capacity_bound(cap.workload, "opt-13b-auto", 0).estimate_rps
    assert bound["estimate_rps"] == est
    rates = sorted({r["x"] for r in fig.runs})
    assert rates == sorted(float(f"{f * est:.3g}") for f in cap.load_factors)
    assert {r["system"] for r in fig.runs if r["setting"] != "ladder"} == set(cap.systems)
    assert {r["variant"] for r in fig.runs} == {f"capacity-rate{r:g}" for r in rates}
    assert all(REGIMES[key] for key in grid.figures)  # every figure states its regime
    assert REGIMES["fig13"] == REGIMES["fig14"] == REGIMES["fig15"] == REGIMES["fig16"] == \
        "capacity"
    assert grid.figures["fig16"].runs == fig.runs
    assert REGIMES["fig09"] == "paper"


def test_paper_config_has_both_regimes_with_three_seeds() -> None:
    cfg = pc.load_file(ROOT / "config" / "paper.yaml")
    cap = cfg.experiments.capacity
    assert cap is not None and len(cfg.seeds_of(cap)) == 3
    assert {"opt-13b-auto", "opt-175b-auto", "llama-13b-auto", "llama-3-70b-auto"} <= \
        set(cap.deployments)
    policies = {cfg.systems[s].policy for s in cap.systems}
    assert {"vllm", "orca", "fastgen", "sarathi", "fastserve", "accelgen", "oracle",
            "accelgen/order", "accelgen/chunk", "accelgen/batch", "edf",
            "vllm-priority"} <= policies
    # every budgeted baseline also tuned (SPEC 12), and the best-static-budget envelope
    tuned = {cfg.systems[s].policy for s in cap.systems if cfg.systems[s].budget == "tuned"}
    assert tuned == {"vllm", "sarathi", "fastgen", "edf", "vllm-priority"}
    assert cap.envelope is not None and cap.envelope.budgets == [64, 128, 256, 512, 1024, 2048]
    assert cap.strict_target == 0.99
    assert cfg.experiments.evaluation is not None  # regime paper beside it


def test_capacity_experiment_names_unknown_systems() -> None:
    import yaml

    data = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())
    data["experiments"]["capacity"]["slo_scale"]["systems"] = ["vllm", "nope"]
    with pytest.raises(pc.PipelineConfigError,
                       match=r"experiments\.capacity\.slo_scale\.systems\[1\]: unknown system"):
        pc.load(data)
    data["experiments"]["capacity"]["slo_scale"]["systems"] = ["vllm"]
    data["experiments"]["capacity"]["load_factors"] = [1, 1]
    with pytest.raises(pc.PipelineConfigError, match="load_factors"):
        pc.load(data)


# -- baselines as their users run them (SPEC 12) -------------------------------------------------

def test_tuned_systems_get_the_rules_budget_on_every_run() -> None:
    from accelgen.pipeline.capacity import workload_tuned_budget

    grid = Grid(pc.load_file(ROOT / "config" / "quick.yaml"))
    cfg = grid.cfg
    dep = cfg.deployment("opt-13b-auto")
    want = workload_tuned_budget(cfg.workload_dict("capacity"), dep, 0, 8191, 128).token_budget
    tuned = [r for r in grid.figures["fig13"].runs if r["system"] == "sarathi-tuned"]
    assert len(tuned) == len(cfg.experiments.capacity.load_factors)  # type: ignore[union-attr]
    for r in tuned:
        assert r["setting"] == "tuned" and r["token_budget"] == want
        args = grid.system_args("sarathi-tuned", r["variant"], r["deployment"])
        assert args[args.index("--param") + 1] == f"token_budget={want}"
    # shown beside the figure: one row per tuned system and deployment
    rows = grid.figures["fig13"].options["tuned_budgets"]
    assert {(b["system"], b["token_budget"]) for b in rows} == {
        (s, want) for s in ("sarathi-tuned", "edf-tuned", "vllm-priority-tuned")}
    # paper-setting systems keep their params; a tuned one needs its run
    assert "--param" not in grid.system_args("sarathi")
    with pytest.raises(ValueError, match="tuned per run"):
        grid.system_args("sarathi-tuned")


def test_envelope_runs_the_ladder_on_every_rate() -> None:
    grid = Grid(pc.load_file(ROOT / "config" / "quick.yaml"))
    env = grid.cfg.experiments.capacity.envelope  # type: ignore[union-attr]
    assert env is not None and env.budgets == [64, 128, 256, 512, 1024, 2048]
    ladder = [r for r in grid.figures["fig13"].runs if r["setting"] == "ladder"]
    assert {r["token_budget"] for r in ladder} == set(env.budgets)
    assert {r["envelope"] for r in ladder} == {"sarathi-envelope"}
    for r in ladder:
        args = grid.system_args(r["system"], r["variant"], r["deployment"])
        assert f"token_budget={r['token_budget']}" in args


def test_with_envelopes_picks_the_best_budget_per_rate_and_seed(tmp_path: Path) -> None:
    import json

    from accelgen.pipeline.aggregate import with_envelopes

    runs = []
    for x, atts in ((0.1, {64: 0.9, 128: 0.95, 256: 0.95}), (0.2, {64: 0.5, 128: 0.4, 256: 0.7})):
        for b, att in atts.items():
            d = tmp_path / f"{x}-{b}"
            d.mkdir()
            (d / "summary.json").write_text(json.dumps({"slo_attainment_request": att}))
            runs.append({"dir": str(d), "deployment": "d", "system": f"s-b{b}", "x": x,
                         "seed": 0, "token_budget": b, "setting": "ladder",
                         "envelope": "s-envelope", "envelope_label": "S best"})
    out = [r for r in with_envelopes(runs) if r["system"] == "s-envelope"]
    assert [(r["x"], r["token_budget"], r["setting"]) for r in out] == [
        (0.1, 128, "envelope"), (0.2, 256, "envelope")]  # ties: the smaller budget


def test_budget_settings_are_checked() -> None:
    import copy

    import yaml

    base = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())
    data = copy.deepcopy(base)
    data["systems"]["orca-tuned"] = {"policy": "orca", "budget": "tuned"}
    with pytest.raises(pc.PipelineConfigError, match=r"systems\.orca-tuned: policy 'orca' has "
                       "no token_budget"):
        pc.load(data)
    data = copy.deepcopy(base)
    data["systems"]["sarathi-tuned"]["params"] = {"token_budget": 256}
    with pytest.raises(pc.PipelineConfigError, match=r"systems\.sarathi-tuned: params set "
                       "token_budget"):
        pc.load(data)
    data = copy.deepcopy(base)
    data["experiments"]["capacity"]["envelope"]["system"] = "orca"
    with pytest.raises(pc.PipelineConfigError, match=r"envelope\.system: policy 'orca'"):
        pc.load(data)
    data = copy.deepcopy(base)
    data["experiments"]["capacity"]["envelope"]["deployments"] = ["opt-13b"]
    with pytest.raises(pc.PipelineConfigError, match=r"envelope\.deployments\[0\]"):
        pc.load(data)
    data = copy.deepcopy(base)
    data["systems"]["vllm-priority"]["vllm_scheduler"] = "stock"
    grid = Grid(pc.load(data))
    assert grid.replay_args("vllm-priority") == ["--system", "stock", "--scheduling-policy",
                                                 "priority"]


def test_slo_classes_in_the_summary() -> None:
    reqs = pd.DataFrame({
        "req_id": [0, 1, 2, 3], "arrival": [0.0] * 4, "source": ["t"] * 4,
        "online": [True, True, True, False], "prompt_len": [10] * 4, "output_len": [3] * 4,
        "ttft_slo": [1.0] * 4, "tbt_slo": [0.046875, 0.046875, 0.375, 0.375],
        "jct_slo": [10.0] * 4, "status": ["finished"] * 4, "reject_reason": [""] * 4,
        "num_output_tokens": [3] * 4, "first_scheduled_time": [0.0] * 4,
        "first_token_time": [0.5] * 4, "finish_time": [0.7, 0.58, 0.7, 0.7],
        "num_preemptions": [0] * 4,
        "token_times": [[0.5, 0.6, 0.7], [0.5, 0.54, 0.58], [0.5, 0.6, 0.7], [0.5, 0.6, 0.7]]})
    its = pd.DataFrame({"start": [0.0], "latency": [0.1], "forward_size": [1],
                        "kv_used_blocks": [1], "kv_total_blocks": [2]})
    classes = metrics.summarize(reqs, its, s_pf=1)["slo_classes"]
    assert list(classes) == ["tbt_47ms", "tbt_375ms", "offline"]
    assert classes["tbt_47ms"]["num_requests"] == 2
    assert classes["tbt_47ms"]["slo_attainment_request"] == 0.5  # 0.1 s gaps miss 47 ms
    assert classes["tbt_375ms"]["slo_attainment_request"] == 1.0
    assert classes["offline"]["slo_attainment_request"] == 1.0  # JCT 0.7 <= 10
    # a continuous TBT range (regime paper) has no classes to report
    many = reqs.assign(tbt_slo=[0.1, 0.2, 0.3, 0.4], online=True)
    many = pd.concat([many] * 3, ignore_index=True).assign(
        req_id=range(12), tbt_slo=[0.1 + 0.01 * i for i in range(12)])
    assert metrics.summarize(many, its, s_pf=1)["slo_classes"] == {}


def test_aggregate_reads_a_spec_past_the_argument_limit_from_stdin(tmp_path: Path) -> None:
    """The aggregate rule pipes its spec (figure 13 of the paper config is ~1.3 MB; Linux
    refuses one argument over 128 KiB)."""
    import json
    import subprocess
    import sys

    spec = json.dumps({"figure": "claims", "inputs": {}, "accelgen": "accelgen",
                       "padding": "x" * 200_000})
    out = tmp_path / "claims.csv"
    subprocess.run([sys.executable, "-m", "accelgen.pipeline", "aggregate", "--spec", "@-",
                    "--out", str(out)], input=spec, text=True, check=True, capture_output=True)
    assert len(pd.read_csv(out)) > 0
    rule = (ROOT / "rules" / "figures.smk").read_text()
    assert "printf '%s' {{params.spec:q}} |" in rule and "--spec @-" in rule


# -- capacity against the engine's noise (SPEC 13, figure 18) ----------------------------------

def test_noise_figure_runs_each_system_at_each_level() -> None:
    import json

    grid = Grid(pc.load_file(ROOT / "config" / "quick.yaml"))
    noise = grid.cfg.experiments.capacity.noise  # type: ignore[union-attr]
    assert noise is not None and noise.levels == [0.0, 0.05, 0.1, 0.2]
    assert REGIMES["fig18"] == "capacity"
    fig = grid.figures["fig18"]
    base = {r["dir"] for r in grid.figures["fig13"].runs}
    rates = {r["x"] for r in grid.figures["fig13"].runs}
    for r in fig.runs:
        assert r["noise_of"] in noise.systems and r["x"] in rates
        args = grid.system_args(r["system"], r["variant"], r["deployment"])
        if r["noise"] == 0:  # the capacity sweep's own run, no noise option
            assert r["dir"] in base and r["system"] == r["noise_of"] and "--noise" not in args
            continue
        assert r["system"] == f"{r['noise_of']}-noise{r['noise'] * 100:g}"
        spec = json.loads(args[args.index("--noise") + 1])
        assert spec["kind"] == "lognormal" and spec["step_sigma"] == r["noise"]
        if grid.systems[r["noise_of"]].budget == "tuned":  # the same budget as without noise
            want = grid.tuned_budget(r["variant"], r["deployment"], r["noise_of"]).token_budget
            assert args[args.index("--param") + 1] == f"token_budget={want}"
    factors = noise.load_factors or grid.cfg.experiments.capacity.load_factors  # type: ignore[union-attr]
    assert {r["load_factor"] for r in fig.runs} == set(factors)
    assert len(fig.runs) == len(noise.levels) * len(noise.systems) * len(factors)
    # a system outside `systems:` is named
    import yaml

    data = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())
    data["experiments"]["capacity"]["noise"]["systems"] = ["accelgen", "accelgen-closed?"]
    with pytest.raises(pc.PipelineConfigError,
                       match=r"experiments\.capacity\.noise\.systems\[1\]: unknown system"):
        pc.load(data)
