"""Results directories -> the CSV each figure plots (one function per figure of SPEC section 8).

Every function takes a figure spec (:meth:`accelgen.pipeline.grid.Figure.spec`: the runs with
their labels, the traces, options) and returns a tidy DataFrame. Metrics come from
:mod:`accelgen.metrics` only.

Error bars follow the paper: mean with 5th and 95th percentiles. The ``basis`` column says over
what the percentiles are taken: ``iterations``, ``requests`` and ``tokens`` (pooled over seeds) or
``seeds`` (one value per seed: throughput, goodput and attainment ratios; with one seed
p5 = p95 = mean).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accelgen import metrics

LABEL_KEYS = ("deployment", "deployment_label", "system", "system_label", "policy")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
@dataclass
class RunData:
    ref: dict[str, Any]
    requests: pd.DataFrame  # metrics.per_request applied
    iterations: pd.DataFrame  # metrics.iteration_metrics applied (+ decision_time)
    summary: dict[str, Any]
    timing: dict[str, Any]


def load_run(ref: dict[str, Any]) -> RunData:
    from accelgen.results import read_results

    reqs, its, summary = read_results(ref["dir"])
    timing_path = Path(ref["dir"]) / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    s_pf = int(summary.get("s_pf") or 1)
    return RunData(ref, metrics.per_request(reqs), metrics.iteration_metrics(its, s_pf),
                   summary, timing)


def stats(values: Iterable[float] | np.ndarray, basis: str) -> dict[str, Any]:
    a = np.asarray(list(values) if not isinstance(values, np.ndarray) else values,
                   dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"mean": math.nan, "p5": math.nan, "p95": math.nan, "n": 0, "basis": basis}
    p5, p95 = np.percentile(a, [5, 95])
    return {"mean": float(a.mean()), "p5": float(p5), "p95": float(p95), "n": int(a.size),
            "basis": basis}


def labels(ref: dict[str, Any], extra: Iterable[str] = ()) -> dict[str, Any]:
    return {k: ref[k] for k in (*LABEL_KEYS, *extra) if k in ref}


def group_refs(runs: list[dict[str, Any]], keys: tuple[str, ...]
               ) -> list[tuple[tuple[Any, ...], list[dict[str, Any]]]]:
    """Runs grouped by ``keys`` (seeds of one configuration together), in first-seen order."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return list(groups.items())


# --------------------------------------------------------------------------------------------
# Metric extraction: name -> (basis, per-run function returning one scalar or an array)
# --------------------------------------------------------------------------------------------
def _online(rd: RunData) -> pd.DataFrame:
    return rd.requests[rd.requests["online"].astype(bool)]


def _iteration_attainment(rd: RunData) -> float:
    on = _online(rd)
    delivered = float(on["num_output_tokens"].sum())
    return float(on["tokens_met"].sum()) / delivered if delivered else math.nan


def _goodput(rd: RunData) -> float:
    """The paper's goodput: requests meeting all their SLOs per second, the mean of 1-s windows
    (per run; its whiskers are over seeds: within a run the 1-s window counts are 0, 1 or 2)."""
    return float(metrics.goodput_series(rd.requests).mean()) if len(rd.requests) else math.nan


def _decision_time(rd: RunData) -> np.ndarray:
    its = rd.iterations
    return its["decision_time"].to_numpy(dtype=np.float64) if "decision_time" in its \
        else np.zeros(0)


def _finished_jct(rd: RunData) -> np.ndarray:
    return rd.requests["jct"].to_numpy(dtype=np.float64)


def _summary(key: str) -> Callable[[RunData], float]:
    def get(rd: RunData) -> float:
        v = rd.summary.get(key)
        return math.nan if v is None else float(v)
    return get


def _its(col: str) -> Callable[[RunData], np.ndarray]:
    def get(rd: RunData) -> np.ndarray:
        return rd.iterations[col].to_numpy(dtype=np.float64) if col in rd.iterations \
            else np.zeros(0)
    return get


def _reqs(col: str) -> Callable[[RunData], np.ndarray]:
    def get(rd: RunData) -> np.ndarray:
        return rd.requests[col].to_numpy(dtype=np.float64)
    return get


def _tbt(rd: RunData) -> np.ndarray:
    return metrics.tbt_samples(rd.requests[metrics.served(rd.requests)])


# basis "seeds": one scalar per run; the others: arrays pooled over the runs' seeds.
METRICS: dict[str, tuple[str, Callable[[RunData], Any], str]] = {
    "throughput_output_tps": ("seeds", _summary("throughput_output_tps"),
                              "throughput (output tokens/s)"),
    "throughput_total_tps": ("seeds", _summary("throughput_total_tps"),
                             "throughput (prompt + output tokens/s)"),
    "throughput_rps": ("seeds", _summary("throughput_rps"), "throughput (requests/s)"),
    "goodput_rps": ("seeds", _goodput, "goodput (requests/s meeting SLOs, mean of 1-s windows)"),
    "slo_attainment_iteration": ("seeds", _iteration_attainment,
                                 "iteration-level SLO attainment (share of tokens on time)"),
    "slo_attainment_request": ("seeds", _summary("slo_attainment_request"),
                               "request-level SLO attainment (every token on time)"),
    "jct_attainment": ("seeds", _summary("jct_attainment"), "JCT SLO attainment"),
    "ttft_attainment": ("seeds", _summary("ttft_attainment"), "TTFT SLO attainment"),
    "jct": ("requests", _finished_jct, "JCT (s)"),
    "ttft": ("requests", _reqs("ttft"), "TTFT (s)"),
    "tbt": ("tokens", _tbt, "time between tokens (s)"),
    "iteration_time": ("iterations", _its("latency"), "iteration time (s)"),
    "gpu_util": ("iterations", _its("gpu_util"), "GPU compute utilization (S_f / S_pf)"),
    "gpu_util_raw": ("iterations", _its("gpu_util_raw"), "S_f / S_pf (uncapped)"),
    "kv_util": ("iterations", _its("kv_util"), "KVC utilization (allocated / total)"),
    "kv_unallocated": ("iterations", _its("kv_unallocated"), "unallocated KVC"),
    "token_budget": ("iterations", _its("info_token_budget"), "token budget S_b"),
    "decision_time": ("iterations", _decision_time, "scheduler time per iteration (s)"),
    "slo_attainment_distserve": ("seeds", _summary("slo_attainment_distserve"),
                                 "request-level attainment, DistServe's rule (TTFT and mean TPOT "
                                 "within SLO)"),
    "tbt_attainment": ("seeds", _summary("tbt_attainment"),
                       "TBT-only attainment (every later token on time)"),
    "ttft_p50": ("seeds", _summary("ttft_p50"), "TTFT p50 (s)"),
    "ttft_p99": ("seeds", _summary("ttft_p99"), "TTFT p99 (s)"),
    "tbt_p50": ("seeds", _summary("tbt_p50"), "time between tokens p50 (s)"),
    "tbt_p99": ("seeds", _summary("tbt_p99"), "time between tokens p99 (s)"),
    "num_rejected": ("seeds", _summary("num_rejected"), "rejected requests"),
    "num_preemptions": ("seeds", _summary("num_preemptions"), "preemptions"),
}
EVAL_METRICS = ("throughput_output_tps", "throughput_total_tps", "throughput_rps", "goodput_rps",
                "slo_attainment_iteration", "slo_attainment_request", "jct_attainment",
                "ttft_attainment", "jct", "ttft", "tbt", "iteration_time", "gpu_util",
                "gpu_util_raw", "kv_util", "kv_unallocated", "decision_time", "num_rejected",
                "num_preemptions")


def metric_rows(runs: list[RunData], names: Iterable[str]) -> list[dict[str, Any]]:
    """One row per metric for a group of runs (the seeds of one configuration)."""
    rows = []
    for name in names:
        basis, fn, desc = METRICS[name]
        vals = [fn(rd) for rd in runs]
        if basis == "seeds":
            st = stats(np.asarray(vals, dtype=np.float64), basis)
        else:
            arrays = [np.asarray(v, dtype=np.float64) for v in vals]
            st = stats(np.concatenate(arrays) if arrays else np.zeros(0), basis)
        rows.append({"metric": name, "description": desc, **st})
    return rows


def grid_metrics(spec: dict[str, Any], names: Iterable[str],
                 keys: tuple[str, ...] = ("deployment", "system"),
                 extra: tuple[str, ...] = ()) -> pd.DataFrame:
    names = list(names)
    out = []
    for _, refs in group_refs(spec["runs"], keys + extra):
        data = [load_run(r) for r in refs]
        lab = labels(refs[0], (*keys, *extra))
        out += [{**lab, **row} for row in metric_rows(data, names)]
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
CDF_POINTS = 201


def fig_iteration_time_cdf(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 1: CDF of iteration time per (deployment, system), with the share of iterations
    within the reading speed (0.1875 s)."""
    reading = float(spec["options"].get("reading_speed", 0.1875))
    out = []
    q = np.linspace(0.0, 1.0, CDF_POINTS)
    for _, refs in group_refs(spec["runs"], ("deployment", "system")):
        lat = np.concatenate([load_run(r).iterations["latency"].to_numpy(dtype=np.float64)
                              for r in refs])
        if lat.size == 0:
            continue
        within = float(np.mean(lat <= reading))
        xs = np.quantile(lat, q)
        for p, x in zip(q, xs, strict=True):
            out.append({**labels(refs[0]), "cdf": float(p), "iteration_time": float(x),
                        "frac_within_reading_speed": within, "reading_speed": reading,
                        "num_iterations": int(lat.size)})
    return pd.DataFrame(out)


def fig_gpu_utilization(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 2: GPU compute utilization per iteration (S_f / S_pf), mean with p5/p95."""
    return grid_metrics(spec, ["gpu_util", "gpu_util_raw", "token_budget"])


def fig_kvc_utilization(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 3: KVC utilization per iteration (allocated / total blocks)."""
    return grid_metrics(spec, ["kv_util", "kv_unallocated"])


def fig_slo_attainment(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 4: iteration-level SLO attainment (request-level and TTFT beside it)."""
    return grid_metrics(spec, ["slo_attainment_iteration", "slo_attainment_request",
                               "ttft_attainment", "jct_attainment"])


def fig_system_slo(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 5: SLO attainment and GPU utilization vs the system-wide SLO."""
    return grid_metrics(spec, ["slo_attainment_iteration", "slo_attainment_request", "gpu_util",
                               "token_budget", "throughput_output_tps"],
                        keys=("deployment", "system"), extra=("system_slo",))


def fig_era(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 6: total JCT (first arrival to last completion) and each long prompt's JCT."""
    long_prompts = [int(x) for x in spec["options"].get("long_prompts", [])]
    threshold = min(long_prompts) if long_prompts else 4096
    out = []
    for _, refs in group_refs(spec["runs"], ("deployment", "system")):
        per_job: dict[str, list[float]] = defaultdict(list)
        for r in refs:
            rd = load_run(r)
            req = rd.requests.sort_values(["arrival", "req_id"])
            finish = req["finish_time"].to_numpy(dtype=np.float64)
            per_job["total (all requests)"].append(
                float(np.nanmax(finish) - req["arrival"].min()) if np.isfinite(finish).any()
                else math.nan)
            per_job["mean JCT (all requests)"].append(float(np.nanmean(req["jct"])))
            short = req[req["prompt_len"] < threshold]
            per_job["mean JCT (short requests)"].append(
                float(np.nanmean(short["jct"])) if len(short) else math.nan)
            longs = req[req["prompt_len"] >= threshold]
            for i, (_, row) in enumerate(longs.iterrows(), start=1):
                per_job[f"long prompt {i} ({int(row['prompt_len']):,} tokens)"].append(
                    float(row["jct"]))
            per_job["rejected requests"].append(float((req["status"] == "rejected").sum()))
        for job, vals in per_job.items():
            out.append({**labels(refs[0]), "job": job, **stats(vals, "seeds")})
    return pd.DataFrame(out)


def fig_ordering(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 7: FIFO vs slack ordering in Sarathi-Serve."""
    return grid_metrics(spec, ["slo_attainment_iteration", "slo_attainment_request", "gpu_util",
                               "kv_util", "throughput_output_tps"])


LENGTH_RANGES = ((10, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 8192),
                 (8192, 16384), (16384, 1 << 20))


def fig_workload_features(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 8: input/output length densities (log-spaced bins) per dataset and overall, and
    output length per input-length range (mean, p5, p95). Natural lengths (before truncation and
    the output cap) describe the dataset; served lengths are given beside them."""
    from accelgen.workloads.trace import load_trace

    out = []
    for t in spec["traces"]:
        df = load_trace(t["path"])
        edges = np.unique(np.round(np.logspace(0, 5.2, 53)).astype(np.int64))
        subsets = [("all", df)] + [(str(s), g) for s, g in df.groupby("source", sort=True)]
        for dataset, g in subsets:
            for panel, col in (("input_density", "prompt_len_natural"),
                               ("output_density", "output_len_natural"),
                               ("input_density_served", "prompt_len"),
                               ("output_density_served", "output_len")):
                x = g[col].to_numpy(dtype=np.float64)
                hist, _ = np.histogram(x, bins=edges)
                dens = hist / max(len(x), 1)
                for lo, hi, d in zip(edges[:-1], edges[1:], dens, strict=True):
                    out.append({"panel": panel, "dataset": dataset, "x_lo": int(lo),
                                "x_hi": int(hi), "value": float(d), "p5": math.nan,
                                "p95": math.nan, "n": len(x)})
            for panel, col in (("output_by_input", "output_len_natural"),
                               ("output_by_input_served", "output_len")):
                for lo, hi in LENGTH_RANGES:
                    sel = g[(g["prompt_len_natural"] >= lo) & (g["prompt_len_natural"] < hi)]
                    st = stats(sel[col].to_numpy(dtype=np.float64), "requests")
                    out.append({"panel": panel, "dataset": dataset, "x_lo": lo, "x_hi": hi,
                                "value": st["mean"], "p5": st["p5"], "p95": st["p95"],
                                "n": st["n"]})
            lens = g["prompt_len_natural"].to_numpy()
            outs = g["output_len_natural"].to_numpy()
            for panel, arr in (("prompt_bucket_share", lens), ("output_bucket_share", outs)):
                for lo, hi in ((10, 512), (512, 4096), (4096, 1 << 30)):
                    out.append({"panel": panel, "dataset": dataset, "x_lo": lo, "x_hi": hi,
                                "value": float(np.mean((arr >= lo) & (arr < hi))) if len(arr)
                                else math.nan, "p5": math.nan, "p95": math.nan,
                                "n": len(arr)})
            out.append({"panel": "share_of_requests", "dataset": dataset, "x_lo": 0, "x_hi": 0,
                        "value": len(g) / max(len(df), 1), "p5": math.nan, "p95": math.nan,
                        "n": len(g)})
    return pd.DataFrame(out)


def fig_evaluation(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 9: the evaluation metrics per (deployment, system)."""
    return grid_metrics(spec, EVAL_METRICS)


def fig_ablation(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 10: the same metrics for AccelGen and its ablations."""
    return grid_metrics(spec, EVAL_METRICS)


def fig_sensitivity(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 11: goodput (and attainment, throughput) vs long-prompt share and arrival rate."""
    return grid_metrics(spec, ["goodput_rps", "slo_attainment_iteration",
                               "slo_attainment_request", "throughput_output_tps",
                               "throughput_rps"],
                        keys=("sweep", "x", "deployment", "system"))


def fig_capacity(spec: dict[str, Any]) -> pd.DataFrame:
    """Extra: request-level attainment vs arrival rate and DistServe-style capacity."""
    target = float(spec["options"].get("target", 0.9))
    df = grid_metrics(spec, ["slo_attainment_request", "slo_attainment_iteration"],
                      keys=("x", "deployment", "system"))
    df = df.rename(columns={"x": "rate"})
    rows = []
    att = df[df["metric"] == "slo_attainment_request"]
    for _, g in att.groupby(["deployment", "system"], sort=False):
        cap = metrics.capacity(g["rate"].to_numpy(float), g["mean"].to_numpy(float), target)
        first = g.iloc[0]
        rows.append({**{k: first[k] for k in LABEL_KEYS if k in first}, "rate": math.nan,
                     "metric": f"capacity_rps_at_{target:g}", "description":
                     f"highest rate with request-level attainment >= {target:g}",
                     "mean": cap, "p5": math.nan, "p95": math.nan, "n": len(g),
                     "basis": "rates"})
    return pd.concat([df, pd.DataFrame(rows)], ignore_index=True)


def fig_datasets(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 12: goodput (and attainment, throughput) on each dataset alone."""
    return grid_metrics(spec, ["goodput_rps", "slo_attainment_iteration",
                               "slo_attainment_request", "throughput_output_tps"],
                        keys=("dataset", "deployment", "system"))


def fig_chunking(spec: dict[str, Any]) -> pd.DataFrame:
    """Extra (paper figure 2): per-iteration forward size and latency around the long prompt."""
    long_prompt = int(spec["options"].get("long_prompt", 8192))
    out = []
    for r in spec["runs"]:
        rd = load_run(r)
        req = rd.requests
        longs = req[req["prompt_len"] >= long_prompt]
        if not len(longs):
            continue
        lr = longs.iloc[0]
        its = rd.iterations.reset_index(drop=True)
        start = its["start"].to_numpy(dtype=np.float64)
        first = int(np.searchsorted(start, float(lr["arrival"])))
        done = float(lr["first_token_time"]) if np.isfinite(lr["first_token_time"]) \
            else float(start[-1])
        last = int(np.searchsorted(start, done, side="right"))
        lo, hi = max(0, first - 3), min(len(its), last + 8)
        others = req[req.index != lr.name]
        tbt = metrics.tbt_samples(others[metrics.served(others)])
        for i in range(lo, hi):
            row = its.iloc[i]
            out.append({**labels(r), "iteration": i - first, "start": float(row["start"]),
                        "latency": float(row["latency"]),
                        "forward_size": int(row["forward_size"]),
                        "prefill_tokens": int(row["prefill_tokens"]),
                        "decode_tokens": int(row["decode_tokens"]),
                        "long_prompt_ttft": float(lr["ttft"]),
                        "long_prompt_jct": float(lr["jct"]),
                        "others_tbt_max": float(tbt.max()) if tbt.size else math.nan,
                        "others_tbt_mean": float(tbt.mean()) if tbt.size else math.nan})
    return pd.DataFrame(out)


def fig_pivots(spec: dict[str, Any]) -> pd.DataFrame:
    """Extra: throughput vs forward size of each deployment's cost model, with S_pf marked
    (computed) beside the paper's value where the paper gives one."""
    from accelgen.core.specs import Deployment
    from accelgen.costmodel.datasheets import kv_num_blocks
    from accelgen.costmodel.factory import deployment_pivot, make_cost_model
    from accelgen.costmodel.pivot import PAPER_PIVOTS, sweep

    out = []
    seen: set[str] = set()
    for row in spec["options"]["deployments"]:
        data = {k: v for k, v in row.items() if k not in ("deployment", "label")}
        dep = Deployment.model_validate(data)
        key = dep.model_dump_json(exclude={"max_model_len"})
        if key in seen:
            continue  # same cost model and pivot as an earlier entry (e.g. a longer context)
        seen.add(key)
        piv = deployment_pivot(dep)
        cost = make_cost_model(dep)
        for p in sweep(cost, step=dep.block_size, max_size=4096):
            out.append({"deployment": row["deployment"], "deployment_label": row["label"],
                        "model": dep.model, "hardware": dep.hardware, "tp": dep.tp, "pp": dep.pp,
                        "kv_blocks": kv_num_blocks(dep), "forward_size": p.size,
                        "time_s": p.time_s, "throughput_tps": p.throughput, "s_pf": piv.s_pf,
                        "t_pf_s": piv.t_pf,
                        "paper_s_pf": PAPER_PIVOTS.get(row["deployment"], math.nan)})
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------
# Regime `capacity` (SPEC section 11): figures 13-15 and the capacity bounds
# --------------------------------------------------------------------------------------------
ATTAINMENTS = ("slo_attainment_request", "slo_attainment_distserve", "ttft_attainment",
               "tbt_attainment")
# capacity metric -> (the attainment it thresholds, the option naming its target)
CAPACITIES = {"capacity_rps": ("slo_attainment_request", "target"),
              "capacity_distserve_rps": ("slo_attainment_distserve", "target"),
              "capacity_strict_rps": ("slo_attainment_request", "strict_target")}
TARGET_DEFAULTS = {"target": 0.9, "strict_target": 0.99}
BOUND_COLUMNS = ("kv_tokens", "s_pf", "t_pf", "mean_prompt", "mean_output", "mean_residence_s",
                 "mean_resident_tokens", "kv_bound_rps", "compute_bound_rps", "estimate_rps",
                 "binding")
# A run's budget setting (SPEC 12), carried from the grid into the capacity figures' rows.
SETTING_KEYS = ("setting",)
TUNED_COLUMNS = ("tbt_slo", "decode_seqs", "decode_context", "predicted_s", "next_budget",
                 "next_predicted_s", "meets")


def _bound_rows(bounds: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    return [{"deployment": b["deployment"], "deployment_label": b["deployment_label"],
             "metric": "capacity_bound_rps",
             "description": "analytic capacity estimate: min(KV/Little, compute) bound at S_pf",
             "mean": b["estimate_rps"], "p5": math.nan, "p95": math.nan, "n": 1,
             "basis": "bound", **{k: b[k] for k in BOUND_COLUMNS}, **extra} for b in bounds]


def _tuned_rows(budgets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The token budget each ``budget: tuned`` system runs with per deployment (Sarathi-Serve's
    rule, accelgen.costmodel.budget) and the numbers behind it."""
    return [{**{k: b[k] for k in LABEL_KEYS}, "setting": "tuned", "metric": "tuned_token_budget",
             "description": "token budget by Sarathi-Serve's rule: the largest whose predicted "
                            "iteration beside the knee's decode batch meets the tightest TBT SLO",
             "mean": b["token_budget"], "p5": math.nan, "p95": math.nan, "n": 1,
             "basis": "cost model", "token_budget": str(b["token_budget"]),
             **{k: b[k] for k in TUNED_COLUMNS}} for b in budgets]


def with_envelopes(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` plus, for every envelope (runs with an ``envelope`` key: one system over a budget
    ladder), one run per (deployment, rate, seed): the member with the highest request-level
    attainment there (the smallest budget among ties), relabelled as the envelope. The winner's
    budget is its ``token_budget``."""
    out = list(runs)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("envelope"):
            groups.setdefault((r["envelope"], r["deployment"], r["x"], r["seed"]), []).append(r)
    for (name, *_), members in groups.items():
        scored = []
        for r in sorted(members, key=lambda m: int(m["token_budget"])):
            summary = json.loads((Path(r["dir"]) / "summary.json").read_text())
            att = summary.get("slo_attainment_request")
            scored.append((-math.inf if att is None else float(att), r))
        best = max(scored, key=lambda t: t[0])[1]  # first maximum: the smallest budget
        out.append({**best, "system": name, "system_label": best["envelope_label"],
                    "setting": "envelope", "envelope": "", "envelope_of": best["system"]})
    return out


def _budgets(refs: list[dict[str, Any]]) -> str:
    """The token budgets of a group of runs (one per seed, in seed order) as text, '' if none."""
    vals = [str(r["token_budget"]) for r in sorted(refs, key=lambda r: r["seed"])
            if r.get("token_budget") is not None]
    return ";".join(dict.fromkeys(vals)) if len(set(vals)) == 1 else ";".join(vals)


def _targets(options: dict[str, Any]) -> dict[str, float]:
    return {k: float(options.get(k, v)) for k, v in TARGET_DEFAULTS.items()}


def capacity_rows(refs: list[dict[str, Any]], targets: dict[str, float],
                  attainment: dict[tuple[str, str, int, float], dict[str, float]]
                  ) -> list[dict[str, Any]]:
    """Capacity per (deployment, system) and seed, and over seeds (mean with p5/p95, min, max):
    for each capacity metric, the highest swept rate whose attainment is >= its target."""
    out = []
    for _, group in group_refs(refs, ("deployment", "system")):
        lab = labels(group[0], SETTING_KEYS)
        seeds = sorted({r["seed"] for r in group})
        for metric, (att_name, target_key) in CAPACITIES.items():
            target = targets[target_key]
            per_seed, wheres = [], []
            for seed in seeds:
                pts = sorted((r["x"], attainment[(r["deployment"], r["system"], seed, r["x"])]
                              [att_name]) for r in group if r["seed"] == seed)
                cap, where = metrics.sweep_capacity(np.array([p[0] for p in pts]),
                                                    np.array([p[1] for p in pts]), target)
                per_seed.append(cap)
                wheres.append(where)
                out.append({**lab, "metric": metric, "seed": seed, "where": where,
                            "target": target,
                            "description": f"highest rate with {att_name} >= {target:g}",
                            "mean": cap, "p5": math.nan, "p95": math.nan, "n": 1,
                            "basis": "sweep"})
            st = stats(per_seed, "seeds")
            finite = [c for c in per_seed if math.isfinite(c)]
            where = ",".join(sorted(set(wheres)))
            out.append({**lab, "metric": metric, "where": where, "target": target,
                        "description": f"highest rate with {att_name} >= {target:g}, over seeds",
                        **st, "min": min(finite) if finite else math.nan,
                        "max": max(finite) if finite else math.nan})
    return out


def fig_capacity_regime(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 13: attainment (request-level, DistServe's, TTFT-only, TBT-only), goodput and
    throughput vs arrival rate per (deployment, system); capacity per system and seed at the
    target (90 %) and the strict target (99 %); each deployment's analytic bound; the budget of
    every tuned system; the envelope's winning budget per rate (``token_budget``)."""
    opts = spec["options"]
    targets = _targets(opts)
    names = [*ATTAINMENTS, "jct_attainment", "goodput_rps", "throughput_rps",
             "throughput_output_tps"]
    runs = with_envelopes(spec["runs"])
    rows: list[dict[str, Any]] = []
    attainment: dict[tuple[str, str, int, float], dict[str, float]] = {}
    for _, refs in group_refs(runs, ("deployment", "system", "x")):
        data = [load_run(r) for r in refs]
        _note_attainment(attainment, data)
        lab = labels(refs[0], SETTING_KEYS)
        budget = _budgets(refs)
        for row in metric_rows(data, names):
            rows.append({**lab, "rate": refs[0]["x"], "load_factor": refs[0]["load_factor"],
                         "token_budget": budget, **row})
    rows += capacity_rows(runs, targets, attainment)
    rows += _bound_rows(opts.get("bounds", []), target=targets["target"])
    rows += _tuned_rows(opts.get("tuned_budgets", []))
    return pd.DataFrame(rows)


def _note_attainment(attainment: dict[tuple[str, str, int, float], dict[str, float]],
                     data: list[Any]) -> None:
    """Each run's attainments that capacities are read from, keyed by (deployment, system,
    seed, rate)."""
    for rd in data:
        ref = rd.ref
        attainment[(ref["deployment"], ref["system"], ref["seed"], ref["x"])] = {
            a: METRICS[a][1](rd) for a, _ in CAPACITIES.values()}


def fig_capacity_noise(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 18 (SPEC 13): capacity at the target (90 %) and the strict target (99 %) per
    (deployment, system, noise level), the simulator charging every iteration the cost model's
    prediction times a per-step error (lognormal, mean 1, log standard deviation ``noise``);
    with the request-level attainment per rate behind it. ``noise_of``: the system without
    noise, ``system``: the run's own (``<system>-noise<percent>``)."""
    opts = spec["options"]
    targets = _targets(opts)
    runs = spec["runs"]
    noise_keys = ("noise", "noise_of", "noise_of_label")
    attainment: dict[tuple[str, str, int, float], dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    for _, refs in group_refs(runs, ("deployment", "system", "x")):
        data = [load_run(r) for r in refs]
        _note_attainment(attainment, data)
        lab = labels(refs[0], (*SETTING_KEYS, *noise_keys))
        for row in metric_rows(data, ["slo_attainment_request"]):
            rows.append({**lab, "rate": refs[0]["x"], "load_factor": refs[0]["load_factor"],
                         "token_budget": _budgets(refs), **row})
    first = {r["system"]: r for r in runs}
    for row in capacity_rows(runs, targets, attainment):
        if row["metric"] == "capacity_distserve_rps":
            continue
        ref = first[row["system"]]
        rows.append({**row, **{k: ref[k] for k in noise_keys}})
    return pd.DataFrame(rows)


def fig_classes(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 16: attainment per SLO class (``summary.json``'s ``slo_classes``: online requests
    by TBT SLO, offline apart) vs arrival rate per (deployment, system): which classes a system
    gives up near its knee. Mean and p5/p95 over seeds; ``num_requests`` summed over them."""
    runs = with_envelopes(spec["runs"])
    out = []
    for _, refs in group_refs(runs, ("deployment", "system", "x")):
        per_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in refs:
            summary = json.loads((Path(r["dir"]) / "summary.json").read_text())
            for c, vals in (summary.get("slo_classes") or {}).items():
                per_class[c].append(vals)
        lab = labels(refs[0], SETTING_KEYS)
        for c, vals in per_class.items():
            tbt = vals[0].get("tbt_slo")
            for metric in ("slo_attainment_request", "ttft_attainment", "tbt_attainment"):
                xs = [math.nan if v.get(metric) is None else float(v[metric]) for v in vals]
                out.append({**lab, "rate": refs[0]["x"], "load_factor": refs[0]["load_factor"],
                            "token_budget": _budgets(refs), "slo_class": c,
                            "tbt_slo": math.nan if tbt is None else float(tbt),
                            "num_requests": int(sum(int(v["num_requests"]) for v in vals)),
                            "metric": metric, **stats(xs, "seeds")})
    return pd.DataFrame(out)


def fig_slo_scale(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 14: attainment vs the TTFT SLO scale s at one rate per deployment."""
    df = grid_metrics(spec, [*ATTAINMENTS, "goodput_rps"],
                      keys=("deployment", "system", "x"), extra=("rate", "load_factor"))
    return df.rename(columns={"x": "ttft_scale"})


def fig_latency(spec: dict[str, Any]) -> pd.DataFrame:
    """Figure 15: TTFT and TBT p50/p99 vs arrival rate (per seed from summary.json; mean and
    p5/p95 over seeds)."""
    spec = {**spec, "runs": with_envelopes(spec["runs"])}
    df = grid_metrics(spec, ["ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99"],
                      keys=("deployment", "system", "x"), extra=("load_factor", "setting"))
    return df.rename(columns={"x": "rate"})


def fig_capacity_bounds(spec: dict[str, Any]) -> pd.DataFrame:
    """Extra (beside figure 9): each deployment's KV/Little and compute bounds on its evaluation
    trace, and the offered rate (regime `paper`: 8 req/s) as a multiple of the estimate."""
    from accelgen.core.specs import Deployment
    from accelgen.costmodel.capacity import trace_bound
    from accelgen.workloads.trace import load_trace

    rows = []
    for t in spec["traces"]:
        bound = trace_bound(Deployment.model_validate(t["spec"]), load_trace(t["path"]))
        b = bound.as_dict()
        offered = float(t["offered_rps"])
        rows.append({"deployment": t["deployment"], "deployment_label": t["deployment_label"],
                     "offered_rps": offered,
                     "offered_over_estimate": offered / b["estimate_rps"]
                     if b["estimate_rps"] > 0 else math.nan,
                     **{k: b[k] for k in BOUND_COLUMNS}, "num_requests": b["num_requests"]})
    return pd.DataFrame(rows)


AGGREGATORS: dict[str, Callable[[dict[str, Any]], pd.DataFrame]] = {
    "fig01_iteration_time_cdf": fig_iteration_time_cdf,
    "fig02_gpu_utilization": fig_gpu_utilization,
    "fig03_kvc_utilization": fig_kvc_utilization,
    "fig04_slo_attainment": fig_slo_attainment,
    "fig05_system_slo": fig_system_slo,
    "fig06_era": fig_era,
    "fig07_ordering": fig_ordering,
    "fig08_workload_features": fig_workload_features,
    "fig09_evaluation": fig_evaluation,
    "fig10_ablation": fig_ablation,
    "fig11_sensitivity": fig_sensitivity,
    "fig12_datasets": fig_datasets,
    "extra_chunking": fig_chunking,
    "extra_capacity": fig_capacity,
    "extra_pivots": fig_pivots,
    "extra_capacity_bounds": fig_capacity_bounds,
    "fig13_capacity": fig_capacity_regime,
    "fig14_slo_scale": fig_slo_scale,
    "fig15_latency": fig_latency,
    "fig16_classes": fig_classes,
    "fig18_capacity_noise": fig_capacity_noise,
}


# --------------------------------------------------------------------------------------------
def write_csv(df: pd.DataFrame, out: Path | str) -> Path:
    """Write a CSV atomically, with a fixed float format so equal numbers give equal bytes."""
    import os

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    df.to_csv(tmp, index=False, float_format="%.6g")
    os.replace(tmp, out)
    return out


def aggregate(spec: dict[str, Any]) -> pd.DataFrame:
    fig = spec["figure"]
    if fig == "claims":
        from accelgen.pipeline.claims import claims_table

        figs = {fid: pd.read_csv(path) for fid, path in spec.get("inputs", {}).items()}
        return claims_table(figs, {"accelgen": spec.get("accelgen", "accelgen")})
    try:
        fn = AGGREGATORS[fig]
    except KeyError:
        raise ValueError(f"no aggregation for figure {fig!r}; known: "
                         f"{', '.join(AGGREGATORS)}") from None
    return fn(spec)
