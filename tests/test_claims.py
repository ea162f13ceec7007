"""The claims table (SPEC 11): the verdict rule, floors (no inf, no ratios of near-zero numbers),
and the Markdown generated from the CSV."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from accelgen.pipeline import claims as C
from accelgen.pipeline.__main__ import main as pipeline_main

RATIO = C.Claim("r", "evaluation", "x better", "1.5-3x", "ratio", "x", lo=1.5, hi=3.0)
POINTS = C.Claim("p", "evaluation", "pp lower", "7-13 pp", "ratio", "pp", lo=7, hi=13)
VALUE = C.Claim("v", "O2", "61 %", "61 %", "value", "pp", lo=0, hi=0, tolerance=10)
BELOW = C.Claim("b", "O1", "low", "low", "below", "", lo=0.9)
DIRECTION = C.Claim("d", "O3", "lower", "lower", "direction", "x")


def m(*values: float, skipped: int = 0) -> C.Measure:
    return C.Measure([(f"p{i}", v) for i, v in enumerate(values)], skipped)


# -- one test per verdict -------------------------------------------------------------------------

def test_reproduced() -> None:
    assert C.regime_verdict(RATIO, m(1.2, 2.0)) == C.REPRODUCED  # all hold, one in the band
    assert C.regime_verdict(POINTS, m(3.0, 9.0)) == C.REPRODUCED
    assert C.regime_verdict(VALUE, m(-9.0, 4.0)) == C.REPRODUCED
    assert C.regime_verdict(BELOW, m(0.1, 0.89)) == C.REPRODUCED
    assert C.regime_verdict(DIRECTION, m(1.06, 4.0)) == C.REPRODUCED


def test_partly() -> None:
    assert C.regime_verdict(RATIO, m(1.2, 0.9)) == C.PARTLY  # one pair fails
    assert C.regime_verdict(RATIO, m(7.0, 9.0)) == C.PARTLY  # all hold, none within [0.75, 6]
    assert C.regime_verdict(VALUE, m(2.0, 25.0)) == C.PARTLY
    assert C.regime_verdict(BELOW, m(0.5, 0.95)) == C.PARTLY
    assert C.regime_verdict(DIRECTION, m(1.2, 1.0)) == C.PARTLY


def test_not_reproduced() -> None:
    assert C.regime_verdict(RATIO, m(1.04, 0.5)) == C.NOT_REPRODUCED  # 4 % is within noise
    assert C.regime_verdict(POINTS, m(0.5, -3.0)) == C.NOT_REPRODUCED
    assert C.regime_verdict(VALUE, m(-30.0)) == C.NOT_REPRODUCED
    assert C.regime_verdict(BELOW, m(0.95, 1.0)) == C.NOT_REPRODUCED
    assert C.regime_verdict(DIRECTION, m(0.8)) == C.NOT_REPRODUCED


def test_not_testable() -> None:
    assert C.regime_verdict(RATIO, None) == C.NOT_TESTABLE  # not run in that regime
    assert C.regime_verdict(RATIO, m(skipped=12)) == C.NOT_TESTABLE  # every pair below floor
    assert C.regime_verdict(VALUE, C.Measure()) == C.NOT_TESTABLE


def test_row_verdict_combines_the_regimes() -> None:
    assert C.combine(C.REPRODUCED, C.REPRODUCED) == C.REPRODUCED
    assert C.combine(C.NOT_TESTABLE, C.NOT_REPRODUCED) == C.NOT_REPRODUCED
    assert C.combine(C.PARTLY, C.NOT_TESTABLE) == C.PARTLY
    assert C.combine(C.REPRODUCED, C.NOT_REPRODUCED) == C.PARTLY
    assert C.combine(C.NOT_TESTABLE, C.NOT_TESTABLE) == C.NOT_TESTABLE


# -- floors: no inf, no ratio of near-zero numbers --------------------------------------------------

def evaluation_csv(goodput: dict[str, float], throughput: dict[str, float]) -> pd.DataFrame:
    rows = []
    for system, policy in (("accelgen", "accelgen"), ("vllm", "vllm"), ("orca", "orca")):
        for metric, table in (("goodput_rps", goodput), ("throughput_rps", throughput)):
            rows.append({"deployment": "opt-13b", "system": system, "policy": policy,
                         "metric": metric, "mean": table[system], "p5": math.nan,
                         "p95": math.nan})
    return pd.DataFrame(rows)


def test_ratios_only_above_their_floors() -> None:
    ev = evaluation_csv(goodput={"accelgen": 0.5, "vllm": 0.0, "orca": 0.004},
                        throughput={"accelgen": 0.2, "vllm": 0.1, "orca": 0.2})
    table = C.claims_table({"fig09_evaluation": ev}).set_index("id")
    good = table.loc["eval_goodput"]
    # vLLM's 0 and Orca's 0.004 req/s are below the 0.01 floor: no ratio, no inf
    assert good["ours_paper"] == "no valid pair; 2 below floor"
    assert good["verdict_paper"] == C.NOT_TESTABLE and math.isnan(good["ours_paper_max"])
    thr = table.loc["eval_throughput_requests"]
    assert thr["ours_paper"] == "1 to 2x (1/2 hold)" and thr["verdict_paper"] == C.PARTLY
    assert thr["ours_capacity"] == "not run in this regime"
    assert thr["verdict"] == C.PARTLY  # capacity not testable: the paper regime decides
    text = table.to_csv()
    assert "inf" not in text.replace("info", "")


def capacity_csv(caps: dict[str, tuple[float, str]]) -> pd.DataFrame:
    rows = []
    for system, (cap, where) in caps.items():
        policy = system if system != "accelgen-no-chunk" else "accelgen/chunk"
        rows.append({"deployment": "opt-13b-auto", "system": system, "policy": policy,
                     "metric": "capacity_rps", "seed": math.nan, "where": where, "mean": cap,
                     "p5": cap, "p95": cap, "rate": math.nan, "load_factor": math.nan})
        for lf, rate, att in ((0.5, 0.1, 0.95), (1.0, 0.2, 0.9 * cap / 0.2 if cap else 0.5)):
            rows.append({"deployment": "opt-13b-auto", "system": system, "policy": policy,
                         "metric": "slo_attainment_request", "seed": math.nan, "where": "",
                         "mean": min(att, 1.0), "p5": math.nan, "p95": math.nan,
                         "rate": rate, "load_factor": lf})
    return pd.DataFrame(rows)


def test_capacity_below_the_sweep_is_no_value() -> None:
    cap = capacity_csv({"accelgen": (0.3, "interpolated"), "vllm": (0.15, "interpolated"),
                        "orca": (0.0, "below_sweep"), "accelgen-no-chunk": (0.1, "interpolated")})
    table = C.claims_table({"fig13_capacity": cap}).set_index("id")
    row = table.loc["eval_throughput_requests"]
    # Orca below the sweep (lowest rate 0.1 req/s): AccelGen's 0.3 over it bounds the ratio
    assert row["ours_capacity"] == ("2 to 3x (2/2 hold; 1 a lower bound (the other system "
                                    "below the lowest swept rate))")
    assert "opt-13b-auto/orca (bound)=3" in row["pairs_capacity"]
    assert row["verdict_capacity"] == C.REPRODUCED and row["verdict"] == C.REPRODUCED
    # AccelGen itself below the sweep: no value, whatever the others'
    low = capacity_csv({"accelgen": (0.0, "below_sweep"), "vllm": (0.0, "below_sweep")})
    row = C.claims_table({"fig13_capacity": low}).set_index("id").loc[
        "eval_throughput_requests"]
    assert row["ours_capacity"] == "no valid pair; 1 below floor"
    only = capacity_csv({"accelgen": (0.3, "interpolated"), "vllm": (0.0, "below_sweep")})
    row = C.claims_table({"fig13_capacity": only}).set_index("id").loc[
        "eval_throughput_requests"]
    assert row["ours_capacity"].startswith(">= 3x (1/1 hold")
    abl = table.loc["ablation_goodput_rps_chunk"]
    assert abl["pairs_capacity"] == "opt-13b-auto/accelgen-no-chunk=66.7"


def test_markdown_is_generated_from_the_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    ev = evaluation_csv(goodput={"accelgen": 0.5, "vllm": 0.2, "orca": 0.1},
                        throughput={"accelgen": 0.2, "vllm": 0.1, "orca": 0.2})
    csv = tmp_path / "claims.csv"
    C.claims_table({"fig09_evaluation": ev}).to_csv(csv, index=False)
    assert pipeline_main(["claims-md", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "| Goodput, AccelGen / each baseline | 1.43-13.71x | 2.5 to 5x (2/2 hold) |" in out
    assert "| evaluation | Goodput" in out and "paper: fig09 ratio per model and baseline" in out
    assert f"Floors: {C.FLOOR_TEXT}." in out
    assert len([ln for ln in out.splitlines() if ln.startswith("| ")]) == len(C.claims()) + 1
    doc = tmp_path / "ARTIFACT.md"
    doc.write_text("intro\n<!-- claims:begin -->\nSTALE TABLE\n<!-- claims:end -->\noutro\n")
    assert pipeline_main(["claims-md", str(csv), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert "STALE TABLE" not in text and "intro" in text and "outro" in text
    assert "2.5 to 5x (2/2 hold)" in text and "do not edit by hand" in text


def test_every_claim_of_spec_11_has_a_row() -> None:
    groups = {c.group for c in C.claims()}
    assert {"O1", "O2", "O3", "O4", "O5", "evaluation", "ablation", "sensitivity", "dataset",
            "oracle"} <= groups
    ids = [c.id for c in C.claims()]
    assert len(ids) == len(set(ids))
    table = C.claims_table({})
    assert set(table["verdict"]) == {C.NOT_TESTABLE} and len(table) == len(ids)


def test_tuned_baselines_are_compared_apart_with_the_strongest() -> None:
    caps = {"accelgen": (0.3, "interpolated"), "vllm": (0.15, "interpolated"),
            "sarathi-tuned": (0.1, "interpolated"), "edf": (0.2, "interpolated"),
            "sarathi-envelope": (0.15, "interpolated"), "sarathi-b256": (0.14, "interpolated")}
    cap = capacity_csv(caps)
    setting = {"sarathi-tuned": "tuned", "sarathi-envelope": "envelope",
               "sarathi-b256": "ladder"}
    cap["setting"] = [setting.get(s, "paper") for s in cap["system"]]
    cap["policy"] = [("sarathi" if s.startswith("sarathi") else p)
                     for s, p in zip(cap["system"], cap["policy"], strict=True)]
    strict = cap[cap["metric"] == "capacity_rps"].assign(metric="capacity_strict_rps")
    strict["mean"] = strict["mean"] / 2
    table = C.claims_table({"fig13_capacity": pd.concat([cap, strict])}).set_index("id")
    # the paper-setting comparison sees vLLM only (edf is not one of the paper's baselines)
    assert table.loc["eval_throughput_requests", "pairs_capacity"] == "opt-13b-auto/vllm=2"
    # the strongest of tuned, envelope, EDF and priority: EDF at 0.2 (not the ladder's budget)
    row = table.loc["tuned_capacity"]
    assert row["pairs_capacity"] == "opt-13b-auto/edf=1.5"
    assert row["verdict_capacity"] == C.REPRODUCED  # >= 1.05, within [1.54 / 2, 2 x 10]
    assert table.loc["tuned_capacity_strict", "pairs_capacity"] == "opt-13b-auto/edf=1.5"
    # at 99 % (halved here) vLLM's 0.075 is below the lowest swept rate (0.1): AccelGen's
    # 0.15 over that rate bounds the ratio
    assert table.loc["eval_capacity_strict", "pairs_capacity"] == "opt-13b-auto/vllm (bound)=1.5"


def test_capacity_markdown_names_the_strongest_and_the_ratios() -> None:
    from accelgen.pipeline.capacity_md import capacity_markdown

    caps = {"accelgen": (0.3, "interpolated"), "vllm": (0.15, "interpolated"),
            "edf": (0.2, "interpolated"), "sarathi-b256": (0.25, "interpolated")}
    cap = capacity_csv(caps)
    cap["setting"] = ["ladder" if s == "sarathi-b256" else "paper" for s in cap["system"]]
    cap["deployment_label"] = "OPT-13B (KV auto)"
    strict = cap[cap["metric"] == "capacity_rps"].assign(metric="capacity_strict_rps",
                                                         mean=0.0, where="below_sweep")
    text = capacity_markdown(pd.concat([cap, strict]))
    assert "sarathi-b256" not in text  # the envelope's ladder is summarised, not listed
    assert "capacity at 90 %: AccelGen 0.3 req/s over the paper-setting baselines' best " \
        "(vllm, 0.15): 2.00x" in text
    assert "over the strongest baseline as users run it (edf, 0.2): 1.50x" in text
    assert "capacity at 99 %: AccelGen 0 req/s" in text and "| < 0.1 |" in text


def test_closed_loop_rows_read_figures_13_and_18() -> None:
    """The closed loop's rows: beside the open loop without noise (figure 13), and under 10 %
    per-step noise against itself without noise and the strongest field baseline (figure 18)."""
    cap = capacity_csv({"accelgen": (0.3, "interpolated"), "accelgen-closed": (0.294, "interpolated"),
                        "vllm": (0.15, "interpolated")})
    rows = []
    for system, policy, setting, caps in (
            ("accelgen", "accelgen", "paper", {0.0: 0.3, 0.1: 0.06}),
            ("accelgen-closed", "accelgen-closed", "paper", {0.0: 0.3, 0.1: 0.27}),
            ("vllm-priority", "vllm-priority", "paper", {0.0: 0.05, 0.1: 0.04}),
            ("vllm-priority-tuned", "vllm-priority", "tuned", {0.0: 0.06, 0.1: 0.0})):
        for level, c in caps.items():
            rows.append({"deployment": "opt-13b-auto", "system": f"{system}-noise{level}",
                         "policy": policy, "setting": setting, "noise": level, "noise_of": system,
                         "metric": "capacity_rps", "seed": math.nan, "mean": c, "rate": math.nan,
                         "where": "below_sweep" if c == 0 else "interpolated"})
    rows.append({"deployment": "opt-13b-auto", "system": "accelgen", "metric": "slo_attainment_request",
                 "rate": 0.01, "noise": 0.0, "noise_of": "accelgen", "mean": 1.0})
    table = C.claims_table({"fig13_capacity": cap,
                            "fig18_capacity_noise": pd.DataFrame(rows)}).set_index("id")
    assert table.loc["closed_vs_open", "pairs_capacity"] == "opt-13b-auto=0.98"
    assert table.loc["closed_vs_open", "verdict_capacity"] == C.REPRODUCED  # >= 0.97
    assert table.loc["closed_noise_kept", "pairs_capacity"] == "opt-13b-auto/noise 0.1=0.9"
    assert table.loc["open_noise_kept", "verdict_capacity"] == C.NOT_REPRODUCED  # 0.2
    # the strongest under noise: vLLM priority (0.04; the tuned one is below the sweep)
    assert table.loc["closed_noise_vs_strongest", "pairs_capacity"] == \
        "opt-13b-auto/vllm-priority=6.75"
    assert table.loc["open_noise_vs_strongest", "pairs_capacity"] == "opt-13b-auto/vllm-priority=1.5"
