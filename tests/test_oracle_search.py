"""The CLAIRVOYANT Oracle's schedule search: it keeps the best schedule, AccelGen's own schedule
is always among those tried (so the Oracle is never below AccelGen), and both commands that run
the Oracle (`accelgen oracle`, `accelgen simulate --policy oracle`) search and say which
schedule won."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from accelgen.cli import main
from accelgen.core.specs import Deployment, ExperimentConfig, PolicySpec, SimOptions
from accelgen.experiments import oracle_search
from accelgen.experiments.oracle_search import grid_points, search
from accelgen.results import RunOutput, read_results
from accelgen.sim.runner import simulate
from accelgen.workloads.trace import write_trace


def _tiny_trace(n: int = 16, seed: int = 3, prompt_hi: int = 800, out_hi: int = 80,
                span: float = 4.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, prompt_hi, n)
    out = rng.integers(5, out_hi, n)
    ttft, tbt = rng.uniform(0.1, 1.0, n), rng.uniform(0.05, 0.3, n)
    return pd.DataFrame({
        "req_id": np.arange(n), "arrival": np.sort(rng.uniform(0, span, n)),
        "source": "test", "prompt_len": prompt, "prompt_len_natural": prompt,
        "prompt_truncated": False, "output_len": out, "output_len_natural": out,
        "output_capped": False, "ttft_slo": ttft, "tbt_slo": tbt,
        "jct_slo": ttft + tbt * (out - 1), "online": True, "predicted_output_len": 150,
    })


# A trace on which the Oracle's exact KV plan (conservative: it admits a request only when its
# final KV is sure to fit) serves fewer requests on time than AccelGen itself.
def _exact_plan_loses() -> pd.DataFrame:
    return _tiny_trace(24, 1, prompt_hi=1500, out_hi=300, span=2.0)


def _cfg(**policy: object) -> ExperimentConfig:
    return ExperimentConfig(deployment=Deployment(model="opt-13b", hardware="a100",
                                                  kv_cache_gb=1.0),
                            sim=SimOptions(progress=False), **policy)  # type: ignore[arg-type]


def test_search_keeps_the_best_schedule() -> None:
    grid = {"kv_plan": ["exact", "none"], "gamma": [0.25, 1.5]}
    assert len(grid_points(grid)) == 4
    res = search(_tiny_trace(), _cfg(), grid)
    t = res.table
    assert len(t) == 5 and t["best"].sum() == 1  # 4 grid points + AccelGen's own schedule
    assert t["policy"].tolist() == ["oracle"] * 4 + ["accelgen"]
    best = t[t["best"]].iloc[0]
    assert best["goodput_rps"] == t["goodput_rps"].max()
    assert res.best.summary["goodput_rps"] == best["goodput_rps"]
    if not res.floor_won:
        assert {"kv_plan": best["param_kv_plan"], "gamma": best["param_gamma"]} == \
            res.best_params
    exact = t[t["param_kv_plan"] == "exact"]
    assert (exact["num_preemptions"] == 0).all()
    with pytest.raises(ValueError, match="unknown parameter"):
        grid_points({"gama": [1.0]})


def test_search_holds_only_the_best_run_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule's run is dropped once a better one is known (a search holding all its runs
    needs that many runs' memory: ~1 GB each on the paper trace); ties go to the earlier one.
    The floor runs first (its goodput is the bar from the first candidate on) and is held."""
    goodputs = iter([0.5, 1.0, 3.0, 2.0, 3.0])  # the floor, then the 4 grid points
    live, most = [0], [0]

    class _Run(RunOutput):
        def __del__(self) -> None:
            live[0] -= 1

    def fake_run(args: object, best: float | None = None,
                 work: object = None) -> tuple[RunOutput, None]:
        live[0] += 1
        most[0] = max(most[0], live[0])
        summary = {"goodput_rps": next(goodputs), "slo_attainment_request": 0.5}
        return _Run(pd.DataFrame(), pd.DataFrame(), summary, pd.DataFrame(), {}, {}), None

    monkeypatch.setattr(oracle_search, "_run", fake_run)
    grid = {"kv_plan": ["exact", "none"], "gamma": [0.25, 1.5]}
    res = search(_tiny_trace(), _cfg(), grid)
    assert most[0] == 3  # the floor, the best so far and the one just run
    assert res.table["best"].tolist() == [False, True, False, False, False]
    assert res.best_params == grid_points(grid)[1] and res.best.summary["goodput_rps"] == 3.0
    assert res.table["goodput_rps"].tolist() == [1.0, 3.0, 2.0, 3.0, 0.5]


def test_the_floor_is_accelgens_own_schedule_and_wins_when_the_oracle_loses() -> None:
    trace = _exact_plan_loses()
    accel = simulate(trace, _cfg(policy=PolicySpec(name="accelgen")))
    res = search(trace, _cfg(), {"kv_plan": ["exact"]})
    floor = res.table[res.table["policy"] == "accelgen"].iloc[0]
    oracle = res.table[res.table["policy"] == "oracle"].iloc[0]
    assert floor["goodput_rps"] == accel.summary["goodput_rps"]
    assert oracle["goodput_rps"] < accel.summary["goodput_rps"], "scenario must make exact lose"
    assert res.floor_won and res.best_label().startswith("AccelGen's own schedule")
    # The winner is AccelGen's run itself, request for request.
    pd.testing.assert_frame_equal(res.best.requests, accel.requests)
    # The Oracle's base parameters reach the floor where AccelGen has them.
    res = search(trace, _cfg(policy=PolicySpec(name="oracle", params={"gamma": 0.25,
                                                                      "kv_plan": "none"})),
                 {"era_scope": ["request"]})
    assert res.table["param_era_scope"].tolist() == ["request", "prefill"]
    accel = simulate(trace, _cfg(policy=PolicySpec(name="accelgen", params={"gamma": 0.25})))
    assert res.table["goodput_rps"].iloc[1] == accel.summary["goodput_rps"]


def test_cli_oracle_writes_best_run_and_search_table(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(_tiny_trace(), {}, trace)
    out = tmp_path / "oracle"
    assert main(["oracle", "--trace", str(trace), "--deployment", "opt-13b", "--out", str(out),
                 "--grid", '{"gamma": [0.25, 1.5]}']) == 0
    text = capsys.readouterr().out
    assert "CLAIRVOYANT" in text and "best of 3 schedules" in text
    table = pd.read_csv(out / "oracle_search.csv")
    assert table["param_gamma"].tolist() == [0.25, 1.5, 0.75] and table["best"].sum() == 1
    _, its, summary = read_results(out)
    assert summary["policy"] == "oracle" and summary["clairvoyant"] is True
    config = json.loads((out / "config.json").read_text())
    search_cfg = config["oracle_search"]
    assert search_cfg["floor"] == {"policy": "accelgen", "params": {}}
    if not search_cfg["floor_won"]:
        assert search_cfg["best_params"]["gamma"] in (0.25, 1.5)
        assert (its["info_clairvoyant"] == 1.0).all()
    # ERA's scope on a trace without long prompts: one schedule, simulated once unless asked
    grid = '{"era_scope": ["prefill", "request"]}'
    for flag, shared in (([], 1), (["--no-share"], 0)):
        to = tmp_path / f"era{shared}"
        assert main(["oracle", "--trace", str(trace), "--deployment", "opt-13b", "--out",
                     str(to), "--grid", grid, *flag]) == 0
        assert f"{shared} the schedule of one before them" in capsys.readouterr().out
    assert (tmp_path / "era1" / "oracle_search.csv").read_bytes() == \
        (tmp_path / "era0" / "oracle_search.csv").read_bytes()


def test_cli_simulate_oracle_searches_and_is_never_below_accelgen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(_exact_plan_loses(), {}, trace)
    common = ["--trace", str(trace), "--deployment", "opt-13b", "--kv-cache-gb", "1", "--no-progress"]
    assert main(["simulate", "--policy", "accelgen", *common, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(["simulate", "--policy", "oracle", *common, "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "o" / "oracle_search.csv")
    assert len(table) == len(grid_points({"kv_plan": [0, 1], "gamma": [0, 1, 2],
                                          "era_scope": [0, 1]})) + 1  # the default grid + floor
    best = table[table["best"]].iloc[0]
    winner = ("AccelGen's own schedule" if best["policy"] == "accelgen"
              else f"kv_plan={best['param_kv_plan']}, gamma={best['param_gamma']}, "
                   f"era_scope={best['param_era_scope']}")
    assert f"best of {len(table)} schedules by goodput_rps: {winner}" in text
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    o = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert o["goodput_rps"] >= a["goodput_rps"]


@pytest.mark.parametrize("trace_of", [_exact_plan_loses, _tiny_trace],
                         ids=["floor-wins", "a-point-wins"])
def test_cli_oracle_reads_accelgens_own_run_as_the_floor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], trace_of: Any) -> None:
    """``--floor-run``: AccelGen's own run stands for the floor, and the Oracle's results files
    are byte for byte those of the search that simulates the floor (floor or a point winning)."""
    trace = tmp_path / "t.parquet"
    write_trace(trace_of(), {}, trace)
    dep = tmp_path / "dep.yaml"
    dep.write_text("deployment: {model: opt-13b, hardware: a100, kv_cache_gb: 1.0}\n")
    common = ["--trace", str(trace), "--config", str(dep), "--seed", "0"]
    grid = ["--grid", '{"kv_plan": ["exact"], "gamma": [0.25, 1.5]}', "--no-progress"]
    assert main(["simulate", "--policy", "accelgen", *common, "--no-progress",
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["oracle", *common, *grid, "--out", str(tmp_path / "o")]) == 0
    assert main(["oracle", *common, *grid, "--floor-run", str(tmp_path / "a"),
                 "--out", str(tmp_path / "f")]) == 0
    for name in ("requests.parquet", "iterations.parquet", "summary.json", "config.json",
                 "oracle_search.csv"):
        assert (tmp_path / "o" / name).read_bytes() == (tmp_path / "f" / name).read_bytes(), name
    # Another experiment's run (a seed the Oracle does not run) is refused, naming the flag.
    assert main(["simulate", "--policy", "accelgen", *common[:-1], "1", "--no-progress",
                 "--out", str(tmp_path / "s1")]) == 0
    capsys.readouterr()
    assert main(["oracle", *common, *grid, "--floor-run", str(tmp_path / "s1"),
                 "--out", str(tmp_path / "x")]) != 0
    assert f"--floor-run {tmp_path / 's1'}: its experiment" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
