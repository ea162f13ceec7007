"""The fidelity stage of the pipeline: the config section, the Snakemake plan, the report (table,
CSV, figure) and the CLI, all on synthetic runs directories (no engine: the real-engine smoke
test is in tests/test_fidelity.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from accelgen.cli import fidelity as fidelity_cli
from accelgen.fidelity.check_spec import FidelityConfig
from accelgen.fidelity.compare import TARGETS
from accelgen.fidelity.report import write_report
from accelgen.pipeline import config_file as pc
from tests.fidelity_fakes import fake_fidelity_runs
from tests.test_pipeline import QUICK, ROOT, job_counts, quick_dict, snakemake

FIDELITY_RULES = {"fidelity_run", "fidelity_report", "notebook_fidelity", "fidelity"}


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_fidelity_runs(tmp_path_factory.mktemp("fid") / "runs")


# -- the config section ---------------------------------------------------------------------
def test_quick_and_paper_configs_have_the_stage() -> None:
    for path in (QUICK, ROOT / "config" / "paper.yaml"):
        cfg = pc.load_file(path)
        assert cfg.fidelity_on and cfg.fidelity is not None
        # The section maps onto the runner's own config.
        FidelityConfig.model_validate(cfg.fidelity.run_spec())
    quick = pc.load_file(QUICK).fidelity
    assert quick is not None and quick.num_requests <= 300 and quick.rounds <= 4


def test_the_stage_is_off_when_left_out_or_disabled() -> None:
    data = quick_dict()
    data.pop("fidelity")
    assert not pc.load(data).fidelity_on
    data["fidelity"] = {"enabled": False}
    assert not pc.load(data).fidelity_on


BAD = {
    "one round": ({"rounds": 1}, "fidelity.rounds"),
    "no stock": ({"systems": ["accelgen"]}, "fidelity.systems"),
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
        assert (t.loc[(system, "throughput_output_tps"), "rounds"]) == 2  # rounds 1 and 2
        # Arrival-bound throughput matches; step times differ (a 5-10 % slower "real" engine
        # than the one calibrated on), but by far less than 2x.
        assert abs(t.loc[(system, "throughput_output_tps"), "rel_err"]) < TARGETS[
            "throughput_output_tps"]
        assert 0 < abs(t.loc[(system, "iter_latency_mean"), "rel_err"]) < 0.5
    csv = pd.read_csv(tmp_path / "figs" / "fidelity.csv")
    assert set(csv["round"].astype(str)) == {"median", "0", "1", "2"}
    assert not csv.loc[csv["round"].astype(str) == "0", "out_of_sample"].any()
    steps = pd.read_csv(tmp_path / "figs" / "fidelity-steps.csv")
    assert set(steps["replay"]) == {"round-0/real-stock (fit)", "round-0/real-accelgen",
                                    "round-1/real-stock", "round-1/real-accelgen",
                                    "round-2/real-stock", "round-2/real-accelgen"}
    text = rep.text()
    assert "ttft_p50" in text and "tbt_p90" in text and "calibrated terms:" in text
    assert "busy" in text and "steal" in text  # the machine's load during each replay
    assert ("every target met" in text) or ("target(s) missed" in text)


def test_decode_step_costs_read_the_engine_timing(fake_runs: Path, tmp_path: Path) -> None:
    import shutil

    from accelgen.fidelity.compare import decode_step_costs
    from accelgen.results import read_results

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
    assert "throughput_output_tps" in out and "out of sample" in out
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
                           json.dumps({"num_requests": 5, "rounds": 2})])
    msg = str(err.value)
    assert "scripts/setup.sh --vllm" in msg and "enabled: false" in msg
    assert not (tmp_path / "runs").exists()


def test_run_config_takes_the_pipeline_spec() -> None:
    spec = pc.load_file(QUICK).fidelity.run_spec()  # type: ignore[union-attr]
    cfg = fidelity_cli.load_config(None, json.dumps(spec), rounds=4)
    assert cfg.num_requests == spec["num_requests"] and cfg.rounds == 4
    assert isinstance(cfg, FidelityConfig)
    with pytest.raises(ValueError):
        fidelity_cli.load_config(None, json.dumps({"no_such_field": 1}))
