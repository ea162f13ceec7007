"""The fidelity report of a runs directory (``run.run_fidelity``): what the cost model was
fitted on, the real-vs-simulated comparison of the rounds predicted out of sample, every replay's
steps against the calibrated model, and the machine's load during each replay; as text, one CSV
and the figure (``plot``). Needs only the results directories, not vLLM."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from accelgen.costmodel.calibrated import CalibratedCostModel
from accelgen.fidelity.compare import (
    FIT_ROUND,
    TARGETS,
    compare_all,
    compare_rounds,
    residual_summary,
    round_dirs,
    step_residuals,
)
from accelgen.fidelity.run import (
    CALIBRATION_DIR,
    LEVEL_NAME,
    MACHINE_NAME,
    NOISE_PREFIX,
    PREDICT_DIR,
    ROUND_NAME,
    SPEED_NAME,
    SPEED_PREFIX,
    read_deployment,
    read_round_deployment,
)


@dataclass(slots=True)
class Report:
    runs: Path
    table: pd.DataFrame  # medians over the out-of-sample rounds
    per_round: pd.DataFrame  # every round (the fit round too), column ``out_of_sample``
    steps: pd.DataFrame  # per replay and kind: the calibrated model's per-step residuals
    load: pd.DataFrame  # per replay: duration, load averages, CPU shares
    # The same comparison with the simulations charged at each round's measured speed
    # (run.host_speed; None: not recorded) and those speeds.
    table_speed: pd.DataFrame | None = None
    speed: dict = field(default_factory=dict)
    # The prediction charged with the engine's noise fitted on the same replays as the model
    # (round-<k>/sim-noise-*; None: not made).
    table_noise: pd.DataFrame | None = None
    files: list[Path] = field(default_factory=list)  # what was written

    @property
    def missed(self) -> pd.DataFrame:
        """Rows whose target was missed (``met`` is True, False, or None without a target): the
        verdict, on the prediction (the simulations as calibrated)."""
        return _missed(self.table)

    def text(self) -> str:
        rounds = sorted(set(self.per_round.loc[self.per_round["out_of_sample"], "round"]))
        out = [f"fidelity run {self.runs}: the AccelGen plugin planned with the cost model "
               f"fitted on round {FIT_ROUND}'s stock replay; rounds "
               f"{', '.join(map(str, rounds))} predicted out of sample, each by the model "
               "fitted on the other rounds' replays",
               _calibration_line(self.runs), *_prediction_lines(self.runs, rounds),
               f"machine: {machine_line(self.runs)}", "",
               "the machine during each replay (load averages 1/5/15 min; CPU time shares):",
               format_load(self.load), "",
               "real (median over the out-of-sample rounds) vs simulated:",
               format_table(self.table), "", "relative error per round (* = the fit round):",
               format_rounds(self.per_round), "",
               "every replay's steps vs the calibrated model (ratio: span / predicted; span: "
               "from the moment the engine had work for the step to its end):",
               format_steps(self.steps), ""]
        if self.table_speed is not None:
            fast = _missed(self.table_speed)
            out += [f"diagnosis: the host ran the out-of-sample replays' steps at "
                    f"{self.speed['factor']:.2f} x the model that predicts each round (median "
                    f"over the rounds' {self.speed['basis']}); the simulations charged at each "
                    "round's speed (the policies planning with round 0's model, as the plugin "
                    "did):",
                    format_table(self.table_speed),
                    "at the host's measured speed: " + (
                        f"{len(fast)} target(s) missed: " + ", ".join(
                            f"{r.system}/{r.metric}" for r in fast.itertuples()) if len(fast)
                        else "every target met"), ""]
        if self.table_noise is not None:
            noisy_missed = _missed(self.table_noise)
            out += ["the prediction with the engine's noise (each round's model charged with "
                    "the step errors of the replays it was fitted on, round-<k>/predict/"
                    "noise.yaml):",
                    format_table(self.table_noise),
                    "verdict with the noise: " + (
                        f"{len(noisy_missed)} target(s) missed: " + ", ".join(
                            f"{r.system}/{r.metric}" for r in noisy_missed.itertuples())
                        if len(noisy_missed) else "every target met"), ""]
        missed = self.missed
        if len(missed):
            out.append(f"verdict: {len(missed)} target(s) missed: "
                       + ", ".join(f"{r.system}/{r.metric}" for r in missed.itertuples()))
        else:
            out.append("verdict: every target met")
        noisy = self.table[self.table["met_by"] == "spread"]
        if len(noisy):
            out.append(f"{len(noisy)} met only within the rounds' own spread (the engine did "
                       "not reproduce itself within the target): "
                       + ", ".join(f"{r.system}/{r.metric} {r.rel_err:+.0%} (spread "
                                   f"{r.spread:.0%})" for r in noisy.itertuples()))
        return "\n".join(out)


def _missed(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["met"].map(lambda m: m is False)]


def _calibration_line(runs: Path) -> str:
    dep = read_deployment(runs)
    t = dep.calibration
    assert t is not None
    return (f"calibrated terms: overhead {t.overhead_s * 1e3:.3f} ms, weights floor "
            f"{t.weights_s * 1e3:.3f} ms, prefill {t.prefill_token_s * 1e6:.2f} us/token, "
            f"decode {t.decode_token_s * 1e6:.2f} us/seq, pairs {t.causal_pair_s * 1e9:.3f} / "
            f"{t.context_pair_s * 1e9:.3f} ns (causal / context), decode context "
            f"{t.context_token_s * 1e9:.2f} ns/token ({runs / CALIBRATION_DIR}/)")


def _prediction_lines(runs: Path, rounds: list[int]) -> list[str]:
    """One line per out-of-sample round: the replays its model was fitted on, its level factor
    (``run.step_level``) and its main terms."""
    lines = []
    for k in rounds:
        path = runs / f"round-{k}" / PREDICT_DIR / LEVEL_NAME
        if not path.exists():
            continue
        level = json.loads(path.read_text())
        t = read_round_deployment(runs, k).calibration
        assert t is not None
        lines.append(f"round {k} predicted by the fit on {', '.join(level['fit_replays'])} "
                     f"(x {level['level']:.3f} to the median step of their stock replays): "
                     f"overhead {t.overhead_s * 1e3:.3f} ms, weights floor {t.weights_s * 1e3:.3f} ms, "
                     f"decode {t.decode_token_s * 1e6:.2f} us/seq")
    return lines


def format_table(table: pd.DataFrame) -> str:
    """One line per (system, metric): real median and simulated value, error, target, the
    rounds' spread and how many single rounds met the target."""
    lines = [f"{'system':<9} {'metric':<27} {'real':>10} {'sim':>10} {'error':>8} "
             f"{'target':>7} {'spread':>7} {'met':>10}  {'real (rounds)':>21}  "
             f"{'rounds met':>10}"]
    for r in table.itertuples(index=False):
        tgt = f"{r.target:.0%}" if r.target == r.target else ""
        sp = f"{r.spread:.0%}" if r.spread == r.spread else ""
        met = "" if r.met is None else ("NO" if not r.met else
                                        "yes" if r.met_by == "target" else "in spread")
        rounds_met = f"{r.rounds_met}/{r.rounds}" if tgt else ""
        lines.append(f"{r.system:<9} {r.metric:<27} {r.real:>10.4g} {r.sim:>10.4g} "
                     f"{r.rel_err:>+8.1%} {tgt:>7} {sp:>7} {met:>10}  "
                     f"{r.real_min:>10.4g}..{r.real_max:<10.4g}  {rounds_met:>10}")
    return "\n".join(lines)


def format_rounds(per: pd.DataFrame) -> str:
    keys = [*TARGETS, "num_iterations", "iter_latency_mean"]
    sel = per[per["metric"].isin(keys)]
    wide = sel.pivot_table(index=["system", "round"], columns="metric", values="rel_err",
                           sort=False)[keys]
    lines = [f"{'system':<9} {'round':>5}  " + " ".join(f"{k[:14]:>14}" for k in keys)]
    for (system, k), row in wide.iterrows():
        mark = "*" if k == FIT_ROUND else " "
        lines.append(f"{system:<9} {k:>4}{mark}  "
                     + " ".join(f"{v:>+14.1%}" for v in row.to_numpy()))
    return "\n".join(lines)


def format_steps(steps: pd.DataFrame) -> str:
    lines = [f"{'replay':<24} {'kind':<8} {'after idle':>10} {'first use':>9} {'steps':>6} "
             f"{'span ms':>8} {'pred ms':>8} {'ratio p10':>9} {'p50':>6} {'p90':>6} "
             f"{'share of time, real/pred':>24}"]
    for r in steps.itertuples(index=False):
        lines.append(f"{r.replay:<24} {r.kind:<8} {'yes' if r.after_idle else 'no':>10} "
                     f"{'yes' if r.first_use else 'no':>9} {r.steps:>6} {r.span_ms:>8.3f} "
                     f"{r.predicted_ms:>8.3f} {r.ratio_p10:>9.2f} {r.ratio_p50:>6.2f} "
                     f"{r.ratio_p90:>6.2f} {r.span_share:>12.1%}/{r.predicted_share:<11.1%}")
    return "\n".join(lines)


def format_load(load: pd.DataFrame) -> str:
    lines = [f"{'replay':<22} {'seconds':>7} {'load before':>16} {'load after':>16} "
             f"{'busy':>6} {'idle':>6} {'steal':>6}"]
    for r in load.itertuples(index=False):
        lines.append(f"{r.replay:<22} {r.seconds:>7.0f} {r.load_before:>16} {r.load_after:>16} "
                     f"{r.busy:>6.1%} {r.idle:>6.1%} {r.steal:>6.1%}")
    return "\n".join(lines)


def replay_steps(runs: Path | str) -> pd.DataFrame:
    """``residual_summary`` of every replay against the calibrated model (column ``replay``)."""
    runs = Path(runs)
    dep = read_deployment(runs)
    assert dep.calibration is not None
    cost = CalibratedCostModel(dep.calibration, 2)
    parts = []
    for k, rdir in enumerate(round_dirs(runs)):
        for d in sorted(rdir.glob("real-*")):
            name = f"round-{k}/{d.name}" + (" (fit)" if k == FIT_ROUND and
                                            d.name == "real-stock" else "")
            s = residual_summary(step_residuals(d, cost)).reset_index()
            parts.append(s.assign(replay=name))
    return pd.concat(parts, ignore_index=True)[["replay", *[c for c in parts[0].columns
                                                            if c != "replay"]]]


def replay_load(runs: Path | str) -> pd.DataFrame:
    """Per replay: its duration, the load averages before and after, and the CPU time shares
    (``round.json``)."""
    rows = []
    for k, rdir in enumerate(round_dirs(runs)):
        path = rdir / ROUND_NAME
        if not path.exists():
            continue
        for system, r in json.loads(path.read_text())["replays"].items():
            shares = r.get("cpu_shares", {})
            rows.append({"replay": f"round-{k}/real-{system}",
                         "seconds": r["end"] - r["start"],
                         "load_before": " ".join(f"{x:.2f}" for x in r.get("load_before", [])),
                         "load_after": " ".join(f"{x:.2f}" for x in r.get("load_after", [])),
                         **{key: shares.get(key, math.nan) for key in ("busy", "idle",
                                                                        "steal")}})
    return pd.DataFrame(rows, columns=["replay", "seconds", "load_before", "load_after", "busy",
                                       "idle", "steal"])


def build_report(runs: Path | str) -> Report:
    runs = Path(runs)
    per = pd.concat([compare_rounds(runs, include_fit_round=True)], ignore_index=True)
    per["out_of_sample"] = per["round"] != FIT_ROUND
    speed_path = runs / SPEED_NAME
    speed = json.loads(speed_path.read_text()) if speed_path.exists() else {}
    table_speed = compare_all(runs, sim=SPEED_PREFIX) if speed else None
    noisy = any(runs.glob(f"round-*/{NOISE_PREFIX}-*"))
    table_noise = compare_all(runs, sim=NOISE_PREFIX) if noisy else None
    return Report(runs, compare_all(runs), per, replay_steps(runs), replay_load(runs),
                  table_speed, speed, table_noise)


def report_frame(rep: Report) -> pd.DataFrame:
    """The CSV's rows: ``round`` = ``median`` (over the out-of-sample rounds) or the round."""
    parts = [rep.table.assign(round="median", out_of_sample=True, comparison="prediction"),
             rep.per_round.assign(comparison="prediction")]
    if rep.table_speed is not None:
        parts.insert(1, rep.table_speed.assign(round="median", out_of_sample=True,
                                               comparison="at_host_speed",
                                               host_speed=rep.speed["factor"]))
    if rep.table_noise is not None:
        parts.insert(1, rep.table_noise.assign(round="median", out_of_sample=True,
                                               comparison="with_noise"))
    return pd.concat(parts, ignore_index=True)


def write_report(runs: Path | str, csv: Path | str | None = None,
                 figure: Path | str | None = None) -> Report:
    """Compare a fidelity runs directory; write the CSV and the figure (PNG + PDF) if asked."""
    rep = build_report(runs)
    if csv is not None:
        csv = Path(csv)
        csv.parent.mkdir(parents=True, exist_ok=True)
        report_frame(rep).to_csv(csv, index=False, float_format="%.6g")
        rep.files.append(csv)
        steps = csv.with_name(csv.stem + "-steps.csv")
        rep.steps.to_csv(steps, index=False, float_format="%.6g")
        rep.files.append(steps)
    if figure is not None:
        from accelgen.fidelity.plot import plot_fidelity

        rep.files += plot_fidelity(runs, rep.table, figure)
    return rep


def machine_line(runs: Path | str) -> str:
    path = Path(runs) / MACHINE_NAME
    if not path.exists():
        return ""
    m = json.loads(path.read_text())
    return f"{m.get('cores')} cores ({m.get('cpu')}), nice {m.get('nice')}"
