"""Every metric of the artifact, defined once (SPEC section 7).

Inputs are the results tables of ``accelgen.results`` (written alike by the simulator and the vLLM
replay runner): ``requests`` (one row per request, ``token_times`` list column) and
``iterations``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from accelgen.core.specs import HardwareProfile, ModelProfile

PCTS = (5, 50, 95, 99)

# Requests that were served to their end: ``finished``, or ``cut`` (the engine stopped the output
# at max_model_len, as vLLM's ``finish_reason: length`` does). Both count as served in every
# metric (their tokens were delivered on the times recorded); ``summary`` counts them apart.
SERVED_STATUSES = ("finished", "cut")


def served(requests: pd.DataFrame) -> np.ndarray:
    """Mask of the requests served to their end (``SERVED_STATUSES``)."""
    return requests["status"].isin(SERVED_STATUSES).to_numpy()


def _stats(x: np.ndarray | pd.Series, prefix: str, *, scratch: bool = False
           ) -> dict[str, float]:
    """Mean and percentiles of the finite values. ``scratch``: ``x`` is the caller's to discard,
    so the percentiles may reorder it instead of a copy (135 MB on 17 M iterations)."""
    a = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(a)
    own = not finite.all()  # (a copy of the finite values: the percentiles may reorder it)
    if own:
        a = a[finite]
    del finite
    if a.size == 0:
        return {f"{prefix}_mean": math.nan, **{f"{prefix}_p{p}": math.nan for p in PCTS}}
    out = {f"{prefix}_mean": float(a.mean())}
    qs = np.percentile(a, PCTS, overwrite_input=own or scratch)
    out.update({f"{prefix}_p{p}": float(q) for p, q in zip(PCTS, qs, strict=True)})
    return out


def per_request(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request latencies and SLO outcomes.

    Adds: ttft, jct, tpot, norm_latency, tokens_met (tokens that met their deadline: first token
    vs TTFT SLO, later tokens vs TBT SLO after the previous token), tbt_max, slo_met (online: every
    token met; offline: JCT met), jct_met (against ``jct_slo``), ttft_met (first token within the
    TTFT SLO), tbt_met (every later token within the TBT SLO), distserve_met (DistServe's
    looser request-level rule: TTFT and mean TPOT within their SLOs).
    Rejected requests miss every SLO; cut ones are judged on the tokens they were served.
    """
    df = requests.copy()
    done = served(df)
    df["ttft"] = df["first_token_time"] - df["arrival"]
    df["jct"] = df["finish_time"] - df["arrival"]
    df.loc[~done, "jct"] = np.nan
    n_out = df["num_output_tokens"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        df["tpot"] = np.where(n_out > 1, (df["finish_time"] - df["first_token_time"]) / (n_out - 1),
                              np.nan)
        df["norm_latency"] = np.where(n_out > 0, df["jct"] / n_out, np.nan)
    tokens_met = np.zeros(len(df), dtype=np.int64)
    tbt_max = np.full(len(df), np.nan)
    ttft = df["ttft"].to_numpy()
    ttft_slo = df["ttft_slo"].to_numpy(dtype=np.float64)
    tbt_slo = df["tbt_slo"].to_numpy(dtype=np.float64)
    for i, times in enumerate(df["token_times"].to_numpy()):
        t = np.asarray(times, dtype=np.float64)
        if t.size == 0:
            continue
        met = int(ttft[i] <= ttft_slo[i])
        if t.size > 1:
            gaps = np.diff(t)
            met += int(np.count_nonzero(gaps <= tbt_slo[i]))
            tbt_max[i] = gaps.max()
        tokens_met[i] = met
    df["tokens_met"] = tokens_met
    df["tbt_max"] = tbt_max
    df["jct_met"] = done & (df["jct"].to_numpy() <= df["jct_slo"].to_numpy())
    online = df["online"].to_numpy(dtype=bool)
    all_tokens = done & (tokens_met == n_out)
    df["slo_met"] = np.where(online, all_tokens, df["jct_met"].to_numpy())
    ttft_met = ttft <= ttft_slo  # NaN (never started) compares False
    df["ttft_met"] = ttft_met
    df["tbt_met"] = done & (tokens_met - ttft_met.astype(np.int64) == np.maximum(n_out - 1, 0))
    tpot = df["tpot"].to_numpy(dtype=np.float64)
    df["distserve_met"] = done & ttft_met & ((n_out <= 1) | (tpot <= tbt_slo))
    return df


def tbt_samples(requests: pd.DataFrame) -> np.ndarray:
    """The gaps between consecutive tokens of each request, request after request (written
    into one array: the gaps as a list of arrays and then joined would be held twice)."""
    times = [np.asarray(t, dtype=np.float64) for t in requests["token_times"] if len(t) > 1]
    out = np.empty(sum(t.size - 1 for t in times), dtype=np.float64)
    at = 0
    for t in times:
        np.subtract(t[1:], t[:-1], out=out[at:at + t.size - 1])  # np.diff(t)
        at += t.size - 1
    return out


def span(requests: pd.DataFrame) -> tuple[float, float]:
    """First arrival to last completion of a served request (rejections do not extend it)."""
    start = float(requests["arrival"].min())
    done = requests.loc[served(requests), "finish_time"].to_numpy(np.float64)
    end = float(done.max()) if done.size else start
    return start, end


GOODPUT_WINDOW_S = 1.0  # the window of every run's summary goodput (``summarize``)


def goodput_windows(start: float, end: float, window: float = GOODPUT_WINDOW_S) -> int:
    """How many windows of ``window`` s a span from ``start`` to ``end`` counts (at least 1)."""
    return max(1, math.ceil((end - start) / window))


def goodput_series(pr: pd.DataFrame, window: float = GOODPUT_WINDOW_S) -> np.ndarray:
    """Requests that met their SLOs, per second, in windows of ``window`` s (by completion time)."""
    start, end = span(pr)
    n_win = goodput_windows(start, end, window)
    good = pr.loc[pr["slo_met"], "finish_time"].to_numpy(dtype=np.float64)
    idx = np.minimum(((good - start) // window).astype(np.int64), n_win - 1)
    return np.bincount(idx, minlength=n_win) / window


def iteration_metrics(its: pd.DataFrame, s_pf: int, model: ModelProfile | None = None,
                      hardware: HardwareProfile | None = None, num_gpus: int = 1) -> pd.DataFrame:
    """Adds per-iteration utilisation columns: gpu_util (S_f/S_pf capped at 1), gpu_util_raw,
    kv_util (allocated/total blocks), kv_unallocated, kv_used_frac (used tokens / allocated
    slots), mfu (when model and hardware are given)."""
    df = its.copy()
    for name, values in _utilisation(its, s_pf, model, hardware, num_gpus):
        df[name] = values
    return df


def _utilisation(its: pd.DataFrame, s_pf: int, model: ModelProfile | None,
                 hardware: HardwareProfile | None, num_gpus: int) -> Iterator[tuple[str, Any]]:
    """The utilisation columns of ``iteration_metrics``, one at a time, each a new float64
    array no other refers to (``summarize`` takes each one's statistics, reordering it, and
    drops it: 17 M rows, 135 MB a column, for Orca in the paper's setting)."""
    forward_size = its["forward_size"].to_numpy()
    yield "gpu_util_raw", np.divide(forward_size, s_pf, dtype=np.float64)
    gpu_util = np.divide(forward_size, s_pf, dtype=np.float64)
    yield "gpu_util", np.minimum(gpu_util, 1.0, out=gpu_util)
    del gpu_util
    with np.errstate(divide="ignore", invalid="ignore"):  # (no blocks: NaN, as pandas gives)
        yield "kv_util", np.divide(its["kv_used_blocks"].to_numpy(),
                                   its["kv_total_blocks"].to_numpy(), dtype=np.float64)
        kv_unallocated = np.divide(its["kv_used_blocks"].to_numpy(),
                                   its["kv_total_blocks"].to_numpy(), dtype=np.float64)
    yield "kv_unallocated", np.subtract(1.0, kv_unallocated, out=kv_unallocated)
    del kv_unallocated
    if model is not None and hardware is not None:
        dense = 2.0 * (model.num_params - model.vocab_size * model.hidden_size)
        attn = 4.0 * model.num_layers * model.hidden_size
        peak = hardware.peak_flops * num_gpus
        # dense * S_f + attn * (prefill pairs + decode context), over peak * latency, computed
        # in place, the products of other columns a slice at a time (each operation as the
        # plain expression does it, so the same values): a temporary per operation would be
        # 135 MB each on Orca's 17 M iterations.
        flops = its["prefill_attn"].to_numpy(np.float64, copy=True)
        flops += its["decode_ctx"].to_numpy()
        flops *= attn
        latency = its["latency"].to_numpy()
        for part in _slices(len(flops)):
            flops[part] += np.multiply(forward_size[part], dense, dtype=np.float64)
            flops[part] /= np.multiply(latency[part], peak, dtype=np.float64)
        yield "mfu", flops


def _slices(n: int, size: int = 1 << 20) -> Iterator[slice]:
    return (slice(a, a + size) for a in range(0, n, size))


def summarize(requests: pd.DataFrame, iterations: pd.DataFrame, *, s_pf: int,
              model: ModelProfile | None = None, hardware: HardwareProfile | None = None,
              num_gpus: int = 1, goodput_window: float = GOODPUT_WINDOW_S) -> dict[str, Any]:
    pr = per_request(requests)
    its = iterations
    fin = pr[served(pr)]
    n = len(pr)
    status = pr["status"]
    out: dict[str, Any] = {
        "num_requests": n,
        # Every request ends in exactly one of these (unfinished: none yet, e.g. a horizon).
        "num_finished": int((status == "finished").sum()),
        "num_cut": int((status == "cut").sum()),
        "num_rejected": int((status == "rejected").sum()),
        "num_unfinished": int((status == "unfinished").sum()),
        "num_iterations": len(its),
        "num_preemptions": int(pr["num_preemptions"].sum()),
    }
    start, end = span(pr) if n else (0.0, 0.0)
    makespan = max(end - start, 1e-9)
    out_tokens = float(fin["num_output_tokens"].sum())
    out.update({
        "makespan_s": makespan,
        "throughput_rps": len(fin) / makespan,
        "throughput_output_tps": out_tokens / makespan,
        "throughput_total_tps": (out_tokens + float(fin["prompt_len"].sum())) / makespan,
    })
    online = pr[pr["online"]]
    delivered = float(online["num_output_tokens"].sum())
    out["slo_attainment_iteration"] = (float(online["tokens_met"].sum()) / delivered
                                       if delivered else math.nan)
    out["slo_attainment_request"] = float(pr["slo_met"].mean()) if n else math.nan
    out["jct_attainment"] = float(pr["jct_met"].mean()) if n else math.nan
    out["ttft_attainment"] = (float((online["ttft"] <= online["ttft_slo"]).mean())
                              if len(online) else math.nan)
    # SPEC 11: TBT-only attainment and DistServe's request-level variant (online requests).
    out["tbt_attainment"] = float(online["tbt_met"].mean()) if len(online) else math.nan
    out["slo_attainment_distserve"] = (float(online["distserve_met"].mean()) if len(online)
                                       else math.nan)
    gp = goodput_series(pr, goodput_window) if n else np.zeros(1)
    out["goodput_rps"] = float(gp.mean())
    out["slo_classes"] = class_attainment(pr)
    out.update(_stats(pr["ttft"], "ttft"))
    out.update(_stats(tbt_samples(fin), "tbt", scratch=True))
    out.update(_stats(pr["jct"], "jct"))
    out.update(_stats(pr["norm_latency"], "norm_latency"))
    if len(its):
        out.update(_stats(its["latency"], "iteration_time"))
        for name, values in _utilisation(its, s_pf, model, hardware, num_gpus):
            out.update(_stats(values, name, scratch=True))
            del values  # (before the next one is computed)
        if "info_token_budget" in its:
            out.update(_stats(its["info_token_budget"], "token_budget"))
        if "info_planned_overrun" in its:
            # AccelGen's exact plan: iterations its own cost model prices above the SLO they
            # were planned within (none in a deterministic simulation).
            out["num_planned_overruns"] = int((its["info_planned_overrun"] > 0).sum())
    return out


# SLO classes (SPEC 12): online requests by their TBT SLO (whole milliseconds), offline apart. A
# workload with more distinct TBT SLOs than this (a continuous range, regime `paper`) has no
# classes to report.
MAX_SLO_CLASSES = 8
OFFLINE_CLASS = "offline"


def slo_class_of(online: bool, tbt_slo: float) -> str:
    """The SLO class of a request: ``tbt_<ms>ms`` for an online one, ``offline`` otherwise."""
    if not online:
        return OFFLINE_CLASS
    return f"tbt_{round(tbt_slo * 1000)}ms" if math.isfinite(tbt_slo) else "tbt_none"


def class_attainment(pr: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Attainment per SLO class (``per_request`` applied): for each class, its request count,
    TBT SLO (s; NaN offline), request-level, TTFT-only, TBT-only and JCT attainment; online
    classes by ascending TBT SLO, then ``offline``. Empty when the online requests have more
    than ``MAX_SLO_CLASSES`` distinct TBT SLOs (in whole milliseconds)."""
    if not len(pr):
        return {}
    online = pr["online"].to_numpy(dtype=bool)
    tbt = pr["tbt_slo"].to_numpy(dtype=np.float64)
    ms = np.where(np.isfinite(tbt), np.round(tbt * 1000.0), np.inf)
    if len(np.unique(ms[online])) > MAX_SLO_CLASSES:
        return {}
    labels = np.array([slo_class_of(bool(o), float(t)) for o, t in zip(online, tbt, strict=True)])
    order = sorted(set(labels.tolist()),
                   key=lambda c: (c == OFFLINE_CLASS, float(ms[labels == c][0])
                                  if c != OFFLINE_CLASS else 0.0))
    out: dict[str, dict[str, float]] = {}
    for c in order:
        sel = pr[labels == c]
        on = c != OFFLINE_CLASS
        out[c] = {
            "num_requests": len(sel),
            "tbt_slo": float(sel["tbt_slo"].min()) if on else math.nan,
            "slo_attainment_request": float(sel["slo_met"].mean()),
            "ttft_attainment": float(sel["ttft_met"].mean()) if on else math.nan,
            "tbt_attainment": float(sel["tbt_met"].mean()) if on else math.nan,
            "jct_attainment": float(sel["jct_met"].mean()),
        }
    return out


def timing_summary(decision_time: np.ndarray, makespan_s: float) -> dict[str, float]:
    """Scheduler time overhead: decision wall time per iteration (measured, not simulated)."""
    d = np.asarray(decision_time, dtype=np.float64)
    out = _stats(d, "decision_time")
    out["decision_time_total_s"] = float(d.sum())
    out["overhead_fraction"] = float(d.sum() / makespan_s) if makespan_s > 0 else math.nan
    return out


def capacity(rates: np.ndarray, attainment: np.ndarray, target: float = 0.9) -> float:
    """DistServe-style capacity: highest swept rate whose request-level attainment >= target,
    linearly interpolated at the first crossing below the target."""
    order = np.argsort(rates)
    r, a = np.asarray(rates, float)[order], np.asarray(attainment, float)[order]
    if a.size == 0 or a[0] < target:
        return 0.0
    for i in range(1, len(r)):
        if a[i] < target:
            return float(r[i - 1] + (a[i - 1] - target) / (a[i - 1] - a[i]) * (r[i] - r[i - 1]))
    return float(r[-1])


def sweep_capacity(rates: np.ndarray, attainment: np.ndarray,
                   target: float = 0.9) -> tuple[float, str]:
    """Capacity from one rate sweep (SPEC 11): the highest rate with attainment >= ``target``,
    interpolated linearly towards the next swept rate (where attainment fell below it).

    Returns ``(rate, where)``: ``where`` is ``"interpolated"``; ``"above_sweep"`` when even the
    highest swept rate meets the target (the rate is then that rate: a lower bound);
    ``"below_sweep"`` when even the lowest does not (rate 0: below the sweep). NaN attainments
    (no requests) are ignored.
    """
    r = np.asarray(rates, dtype=np.float64)
    a = np.asarray(attainment, dtype=np.float64)
    keep = np.isfinite(r) & np.isfinite(a)
    r, a = r[keep], a[keep]
    if r.size == 0:
        return math.nan, "no_data"
    order = np.argsort(r, kind="stable")
    r, a = r[order], a[order]
    ok = np.flatnonzero(a >= target)
    if ok.size == 0:
        return 0.0, "below_sweep"
    i = int(ok[-1])
    if i == r.size - 1:
        return float(r[i]), "above_sweep"
    frac = (a[i] - target) / (a[i] - a[i + 1])
    return float(r[i] + frac * (r[i + 1] - r[i])), "interpolated"
