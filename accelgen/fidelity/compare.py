"""Real replays against the simulation: the compared quantities, per round and over the rounds,
the pooled distributions, and each replay's steps against the calibrated model. Needs only the
results directories (the simulator and the replay write the same format)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from accelgen import metrics
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.points import kind_of, load_step_log
from accelgen.results import read_results

FIT_ROUND = 0  # the round whose stock replay the cost model is fitted on
# Relative-error targets of the fidelity check (a verdict allows the larger of the target and
# the real rounds' own spread: ``compare_all``).
TARGETS: dict[str, float] = {
    "throughput_output_tps": 0.10,
    "ttft_p50": 0.20,
    "tbt_p50": 0.20,
    "ttft_p90": 0.30,
    "tbt_p90": 0.30,
}
# Compared and reported, without a target.
REPORTED = ("throughput_rps", "num_iterations", "makespan_s", "num_preemptions",
            "iter_latency_mean", "forward_size_mean", "batch_size_mean", "batch_size_p90",
            "prefill_tokens_mean", "decode_tokens_mean", "prefill_iteration_fraction", "jct_p50")


def round_dirs(out_dir: Path | str) -> list[Path]:
    """``round-<k>`` directories in order."""
    return sorted(Path(out_dir).glob("round-*"), key=lambda p: int(p.name.split("-")[1]))


def run_stats(out_dir: Path | str) -> dict[str, float]:
    """The compared quantities of one results directory."""
    reqs, its, summary = read_results(out_dir)
    pr = metrics.per_request(reqs)
    fin = pr[pr["status"] == "finished"]
    ttft = fin["ttft"].to_numpy(np.float64)
    tbt = metrics.tbt_samples(fin)
    out: dict[str, float] = {
        "num_finished": float(len(fin)),
        "throughput_output_tps": float(summary["throughput_output_tps"]),
        "throughput_rps": float(summary["throughput_rps"]),
        "makespan_s": float(summary["makespan_s"]),
        "num_iterations": float(len(its)),
        "num_preemptions": float(pr["num_preemptions"].sum()),
        "jct_p50": _pct(fin["jct"].to_numpy(np.float64), 50),
    }
    for name, x in (("ttft", ttft), ("tbt", tbt)):
        out[f"{name}_p50"] = _pct(x, 50)
        out[f"{name}_p90"] = _pct(x, 90)
        out[f"{name}_mean"] = float(np.mean(x)) if len(x) else math.nan
    if len(its):
        out.update({
            "iter_latency_mean": float(its["latency"].mean()),
            "forward_size_mean": float(its["forward_size"].mean()),
            "batch_size_mean": float(its["batch_size"].mean()),
            "batch_size_p90": _pct(its["batch_size"].to_numpy(np.float64), 90),
            "prefill_tokens_mean": float(its["prefill_tokens"].mean()),
            "decode_tokens_mean": float(its["decode_tokens"].mean()),
            "prefill_iteration_fraction": float((its["prefill_tokens"] > 0).mean()),
        })
    return out


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else math.nan


def _err(real: float, sim: float) -> float:
    return sim / real - 1.0 if real and math.isfinite(real) and math.isfinite(sim) else math.nan


def _met(err: float, target: float) -> bool | None:
    return bool(abs(err) <= target) if math.isfinite(target) and math.isfinite(err) else None


def compare(real_dir: Path | str, sim_dir: Path | str, system: str) -> pd.DataFrame:
    """One row per quantity: real, simulated, relative error (sim/real - 1), target, met."""
    real, sim = run_stats(real_dir), run_stats(sim_dir)
    rows = []
    for key in (*TARGETS, *REPORTED, "num_finished"):
        r, s = real.get(key, math.nan), sim.get(key, math.nan)
        err, target = _err(r, s), TARGETS.get(key, math.nan)
        rows.append({"system": system, "metric": key, "real": r, "sim": s, "rel_err": err,
                     "target": target, "met": _met(err, target)})
    return pd.DataFrame(rows)


def compare_rounds(out_dir: Path | str, systems: list[str] | tuple[str, ...] = ("stock",
                                                                               "accelgen"),
                   include_fit_round: bool = False, sim: str = "sim") -> pd.DataFrame:
    """``compare`` of every round's replay with its simulation (``<sim>-<system>``: ``sim``,
    the prediction, or ``sim-speed``, charged at the host's measured speed; column ``round``):
    the round's own (``round-<k>/<sim>-<system>``, out of sample: ``run.predict_round``), else
    the run's (``<sim>-<system>``: round 0's model, in sample for the fit round). Without
    ``include_fit_round`` only the rounds predicted out of sample."""
    out = Path(out_dir)
    parts = []
    for k, rdir in enumerate(round_dirs(out)):
        if k == FIT_ROUND and not include_fit_round:
            continue
        for s in systems:
            sim_dir = sim_dir_of(out, k, s, sim)
            if (rdir / f"real-{s}").exists() and sim_dir.exists():
                parts.append(compare(rdir / f"real-{s}", sim_dir, s).assign(round=k))
    if not parts:
        raise FileNotFoundError(f"{out}: no round-<k>/real-<system> and sim-<system> pairs")
    return pd.concat(parts, ignore_index=True)


def sim_dir_of(out_dir: Path | str, k: int, system: str, sim: str = "sim") -> Path:
    """The simulation round ``k``'s ``system`` replay is compared with: the round's own
    prediction where there is one, else the run's simulation on round 0's model."""
    own = Path(out_dir) / f"round-{k}" / f"{sim}-{system}"
    return own if own.exists() else Path(out_dir) / f"{sim}-{system}"


def spread(real: np.ndarray) -> float:
    """The real values' spread over the rounds: the largest relative distance of a round from
    their median (NaN for fewer than two finite values)."""
    x = np.asarray(real, dtype=np.float64)
    x = x[np.isfinite(x)]
    med = float(np.median(x)) if len(x) else math.nan
    if len(x) < 2 or not med:
        return math.nan
    return float(np.max(np.abs(x / med - 1.0)))


def compare_all(out_dir: Path | str,
                systems: list[str] | tuple[str, ...] = ("stock", "accelgen"),
                sim: str = "sim") -> pd.DataFrame:
    """Over the out-of-sample rounds: the median of the real values, the simulated value, their
    relative error, the target, the rounds' spread (``real_min``..``real_max``, and ``spread``:
    the largest relative distance of a round from the median), the **tolerance** the verdict
    uses and how many single rounds met the target.

    The tolerance is the target, or the rounds' spread where that is larger: the same trace on
    the same engine does not reproduce itself more closely than that, so a smaller error cannot
    be asked of a model of it (``met_by``: ``target`` or ``spread``)."""
    per = compare_rounds(out_dir, systems, sim=sim)
    rows = []
    for (system, metric), g in per.groupby(["system", "metric"], sort=False):
        r, s = float(g["real"].median()), float(g["sim"].median())
        err, target = _err(r, s), float(g["target"].iloc[0])
        sp = spread(g["real"].to_numpy())
        tol = max(target, sp) if math.isfinite(sp) else target
        met = _met(err, tol)
        by = "" if met is None else ("target" if math.isfinite(err) and abs(err) <= target
                                     else "spread" if met else "")
        rows.append({"system": system, "metric": metric, "real": r, "sim": s, "rel_err": err,
                     "target": target, "spread": sp, "tolerance": tol, "met": met,
                     "met_by": by, "rounds": len(g),
                     "real_min": float(g["real"].min()), "real_max": float(g["real"].max()),
                     "rounds_met": int(sum(bool(m) for m in g["met"] if m is not None))})
    return pd.DataFrame(rows)


def distributions(out_dir: Path | str, system: str) -> dict[str, dict[str, np.ndarray]]:
    """TTFT, TBT and per-iteration batch sizes of the real replays and of their predictions,
    each pooled over the rounds predicted out of sample."""
    out = Path(out_dir)
    oos = [k for k in range(len(round_dirs(out))) if k != FIT_ROUND]
    dirs = {"real": [out / f"round-{k}" / f"real-{system}" for k in oos],
            "sim": list(dict.fromkeys(sim_dir_of(out, k, system) for k in oos))}
    res: dict[str, dict[str, np.ndarray]] = {}
    for kind, paths in dirs.items():
        acc: dict[str, list[np.ndarray]] = {"ttft": [], "tbt": [], "batch_size": []}
        for d in paths:
            if not d.exists():
                continue
            reqs, its, _ = read_results(d)
            pr = metrics.per_request(reqs)
            fin = pr[pr["status"] == "finished"]
            acc["ttft"].append(fin["ttft"].to_numpy(np.float64))
            acc["tbt"].append(metrics.tbt_samples(fin))
            acc["batch_size"].append(its["batch_size"].to_numpy(np.float64))
        if acc["ttft"]:
            res[kind] = {k: np.concatenate(v) for k, v in acc.items()}
    return res


def step_residuals(run_dir: Path | str, cost: CostModel) -> pd.DataFrame:
    """Every step of a replay beside ``cost``'s prediction for its composition: ``span`` (from
    the moment the engine had work for it to its end: ``accelgen.costmodel.points``),
    ``predicted``, ``ratio`` (span / predicted), ``kind`` (prefill / decode / mixed),
    ``batch_size``, ``after_idle`` (it woke an idle engine) and ``first_use`` (its token count
    is new in this replay)."""
    log = load_step_log(run_dir)
    its = log.iterations
    pred = np.array([cost.iteration_time(s) for s in log.shapes])
    return pd.DataFrame({
        "start": its["start"].to_numpy(), "span": log.span, "predicted": pred,
        "ratio": log.span / pred, "kind": [kind_of(s) for s in log.shapes],
        "batch_size": its["batch_size"].to_numpy(), "forward_size": its["forward_size"].to_numpy(),
        "after_idle": log.after_idle, "first_use": ~its["forward_size"].duplicated().to_numpy()})


def residual_summary(residuals: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, after idle, first use): steps, median span and prediction (ms), median ratio,
    p10/p90 ratio, and each group's share of the replay's total span and of the prediction."""
    g = residuals.groupby(["kind", "after_idle", "first_use"])
    total = residuals["span"].sum()
    return pd.DataFrame({
        "steps": g.size(),
        "span_ms": g["span"].median() * 1e3,
        "predicted_ms": g["predicted"].median() * 1e3,
        "ratio_p50": g["ratio"].median(),
        "ratio_p10": g["ratio"].quantile(0.1),
        "ratio_p90": g["ratio"].quantile(0.9),
        "span_share": g["span"].sum() / total,
        "predicted_share": g["predicted"].sum() / total,
    })


def decode_step_costs(round_dir: Path | str,
                      systems: tuple[str, ...] = ("stock", "accelgen")) -> pd.DataFrame:
    """Decode-only steps of the real replays of one round, by batch size (capped at 8): median
    ``period`` (to the next step's start), ``schedule`` (the whole ``schedule()`` call) and
    ``exec`` (from its end to ``update_from_output``: model execution), from ``timing.parquet``;
    columns ``(quantity, system)``: what the plugin adds to a step at equal batch size. Empty
    when the replays did not record the engine's timing (simulated stand-ins)."""
    rdir = Path(round_dir)
    parts = {}
    for system in systems:
        d = rdir / f"real-{system}"
        tpath = d / "timing.parquet"
        if not tpath.exists():
            continue
        timing = pd.read_parquet(tpath)
        if "exec_time" not in timing:
            continue
        _, its, _ = read_results(d)
        df = its[["start", "prefill_tokens", "batch_size"]].reset_index(drop=True)
        df["period"] = df["start"].shift(-1) - df["start"]
        df["schedule"] = timing["decision_time"].to_numpy()
        df["exec"] = timing["exec_time"].to_numpy()
        df = df[df["prefill_tokens"] == 0].dropna(subset=["period"])
        g = df.groupby(df["batch_size"].clip(upper=8))
        parts[system] = g[["period", "schedule", "exec"]].median().assign(steps=g.size())
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, axis=1).swaplevel(axis=1).sort_index(axis=1)
    out.index.name = "batch_size"
    return out
