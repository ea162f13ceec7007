"""An engine sweep's numbers (needs only the results directories): attainment per point and SLO
class, capacity per system and repeat in the engine and in the simulator, the simulator's
capacity error, and whether it orders the systems as the engine does.

**Capacity** (SPEC 11): per (source, system, seed), the highest swept rate whose request-level
attainment is >= the target, interpolated (``metrics.sweep_capacity``). Per system: the median
over the repeats with their range. **Error**: simulated median / engine median - 1. **Ordering**:
the systems ranked by median capacity in each source; ``agree`` when the ranks match, where a
pair whose engine ranges (min..max over repeats) overlap counts as tied in the engine, and so
may come in either order in the simulator. Kendall's tau of the two medians is reported too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accelgen import metrics
from accelgen.engine_regime.run import (
    POINT_NAME,
    SPEED_NAME,
    point_dir,
    points,
    rate_name,
    read_config,
    read_plan,
)
from accelgen.engine_regime.traces import tbt_class
from accelgen.results import read_results

# engine: the replays; sim: the simulator's prediction (the calibrated model); sim-speed: the
# simulator charging the model at the host's speed measured during the replays (run.host_speed).
# sim-noise: the simulator charging the engine's noise fitted on the calibration replay.
SOURCES = ("engine", "sim", "sim-speed", "sim-noise")
PREDICTIONS = ("sim", "sim-speed", "sim-noise")
_DIRS = {"engine": "real", "sim": "sim", "sim-speed": "sim-speed", "sim-noise": "sim-noise"}
# Per point, from the summary (metrics.summarize): SPEC 11's attainments and latencies.
POINT_METRICS = ("slo_attainment_request", "slo_attainment_distserve", "ttft_attainment",
                 "tbt_attainment", "jct_attainment", "goodput_rps", "throughput_rps",
                 "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "num_preemptions")


def class_attainment(requests: pd.DataFrame, tbt_base: float, scales: list[float]
                     ) -> dict[str, float]:
    """Request-level attainment per SLO class (``traces.tbt_class``), as ``att_<class>``."""
    pr = metrics.per_request(requests)
    cls = tbt_class(pr["tbt_slo"].to_numpy(), pr["online"].to_numpy(), tbt_base, scales)
    met = pr["slo_met"].to_numpy(dtype=bool)
    out = {}
    for c in [f"tbt{s:g}" for s in sorted(scales)] + ["offline"]:
        mask = cls == c
        out[f"att_{c}"] = float(met[mask].mean()) if mask.any() else math.nan
    return out


def point_rows(runs: Path) -> pd.DataFrame:
    """One row per (source, system, seed, rate): the point metrics, per-class attainment and,
    for the engine, the machine's CPU busy share and the replay's duration."""
    cfg, plan = read_config(runs), read_plan(runs)
    factor = dict(zip(plan["rates"], plan["load_factors"], strict=True))
    speed_path = runs / SPEED_NAME
    ratios = json.loads(speed_path.read_text())["per_replay"] if speed_path.exists() else {}
    rows = []
    for source in SOURCES:
        for system in cfg.systems:
            for seed, rate in points(cfg, plan):
                d = point_dir(runs, _DIRS[source], system, seed, rate)
                if not (d / "summary.json").exists():
                    continue
                reqs, _, summary = read_results(d)
                row: dict[str, Any] = {
                    "source": source, "system": system, "label": plan["labels"][system],
                    "seed": seed, "rate": rate, "load_factor": factor[rate],
                    **{m: float(summary[m]) for m in POINT_METRICS},
                    **class_attainment(reqs, plan["tbt_base"], cfg.tbt_scale_set),
                    "num_served": int(summary["num_finished"]) + int(summary["num_cut"]),
                    "num_requests": int(summary["num_requests"])}
                info = d / POINT_NAME
                if info.exists():
                    p = json.loads(info.read_text())
                    load = p.get("load_before") or [math.nan]
                    row.update(cpu_busy=p.get("cpu_shares", {}).get("busy", math.nan),
                               load_1min=float(load[0]), wall_s=p["end"] - p["start"],
                               step_ratio=ratios.get(f"{system}/seed{seed}/{rate_name(rate)}",
                                                     math.nan))
                rows.append(row)
    return pd.DataFrame(rows)


def capacities(pts: pd.DataFrame, target: float) -> pd.DataFrame:
    """Capacity per (source, system, seed) from request-level attainment."""
    rows = []
    for (source, system, seed), g in pts.groupby(["source", "system", "seed"], sort=False):
        cap, where = metrics.sweep_capacity(g["rate"].to_numpy(float),
                                            g["slo_attainment_request"].to_numpy(float), target)
        rows.append({"source": source, "system": system, "label": g["label"].iloc[0],
                     "seed": seed, "capacity_rps": cap, "where": where})
    return pd.DataFrame(rows)


def capacity_summary(caps: pd.DataFrame) -> pd.DataFrame:
    """Per (source, system): median, min and max capacity over the repeats (``where``: where
    the repeats' capacities lie against the sweep); the simulator's error against the engine's
    median."""
    groups = caps.groupby(["source", "system"], sort=False)
    g = groups["capacity_rps"]
    out = pd.DataFrame({"label": groups["label"].first(), "median": g.median(), "min": g.min(),
                        "max": g.max(), "repeats": g.size(),
                        "where": groups["where"].agg(lambda w: ",".join(sorted(set(w))))}
                       ).reset_index()
    eng = out[out["source"] == "engine"].set_index("system")["median"]
    out["error_vs_engine"] = [
        (r.median / eng[r.system] - 1.0) if (r.source in PREDICTIONS and r.system in eng
                                             and eng[r.system] > 0) else math.nan
        for r in out.itertuples()]
    return out


@dataclass(frozen=True, slots=True)
class Ordering:
    engine: list[str]  # systems, highest median capacity first
    sim: list[str]
    agree: bool  # every pair the engine separates (ranges apart) is ordered alike
    kendall_tau: float
    separated_pairs: int  # pairs whose engine ranges do not overlap
    disagreements: list[tuple[str, str]]


def ordering(summary: pd.DataFrame, source: str = "sim") -> Ordering:
    """Whether the simulator (``source``) orders the systems as the engine does (module
    docstring)."""
    eng = summary[summary["source"] == "engine"].set_index("system")
    sim = summary[summary["source"] == source].set_index("system")
    names = [s for s in eng.index if s in sim.index]
    conc = disc = 0
    separated = 0
    bad = []
    for a, b in combinations(names, 2):
        de = eng.loc[a, "median"] - eng.loc[b, "median"]
        ds = sim.loc[a, "median"] - sim.loc[b, "median"]
        s = np.sign(de) * np.sign(ds)
        conc += int(s > 0)
        disc += int(s < 0)
        apart = (eng.loc[a, "min"] > eng.loc[b, "max"]) or (eng.loc[b, "min"] > eng.loc[a, "max"])
        if apart:
            separated += 1
            if np.sign(de) != np.sign(ds):
                bad.append((a, b))
    n = len(names) * (len(names) - 1) / 2
    tau = (conc - disc) / n if n else math.nan
    return Ordering(sorted(names, key=lambda s: -eng.loc[s, "median"]),
                    sorted(names, key=lambda s: -sim.loc[s, "median"]), not bad, tau,
                    separated, bad)


@dataclass(slots=True)
class Report:
    runs: Path
    plan: dict[str, Any]
    points: pd.DataFrame
    capacity: pd.DataFrame
    summary: pd.DataFrame
    orders: dict[str, Ordering]  # per prediction source
    target: float
    speed: dict[str, Any]  # run.host_speed (empty: not recorded)

    def frame(self) -> pd.DataFrame:
        """The figure's CSV (long format): ``kind`` point | capacity | capacity_summary |
        ordering; regime ``engine``; ``source`` engine | sim."""
        pts = self.points.melt(id_vars=["source", "system", "label", "seed", "rate",
                                        "load_factor"], var_name="metric", value_name="value")
        parts = [pts.assign(kind="point")]
        parts.append(self.capacity.rename(columns={"capacity_rps": "value"})
                     .assign(kind="capacity", metric="capacity_rps"))
        s = self.summary.rename(columns={"median": "value"})
        parts.append(s.assign(kind="capacity_summary", metric="capacity_rps"))
        for source, o in self.orders.items():
            parts.append(pd.DataFrame([
                {"kind": "ordering", "metric": "ordering_agree", "value": float(o.agree)},
                {"kind": "ordering", "metric": "kendall_tau", "value": o.kendall_tau},
                {"kind": "ordering", "metric": "separated_pairs",
                 "value": float(o.separated_pairs)},
            ]).assign(source=source, system="engine: " + " > ".join(o.engine)
                      + f"; {source}: " + " > ".join(o.sim)))
        if self.speed:
            parts.append(pd.DataFrame([{"kind": "host_speed", "metric": "step_ratio",
                                        "value": self.speed["factor"],
                                        "system": self.speed["basis"]}]))
        df = pd.concat(parts, ignore_index=True).assign(regime="engine", target=self.target)
        systems = self.plan.get("systems", {})
        df["runs"] = [systems.get(s, {}).get("runs", "") for s in df["system"]]
        df["policy"] = [systems.get(s, {}).get("policy", "") for s in df["system"]]
        df["async_scheduling"] = bool(self.plan.get("async_scheduling", False))
        lead = ["regime", "kind", "source", "system", "label", "seed", "rate", "load_factor",
                "metric", "value"]
        return df[lead + [c for c in df.columns if c not in lead]]

    def text(self) -> str:
        p = self.plan
        lines = [f"engine sweep {self.runs} (regime engine; async scheduling "
                 f"{'on' if p.get('async_scheduling') else 'off'})",
                 f"engine: S_pf {p['s_pf']}, T_pf {p['t_pf'] * 1e3:.1f} ms; TBT classes "
                 + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in p["tbt_classes"].items())
                 + f"; capacity estimate {p['estimate_rps']:.3g} req/s "
                 f"({p['capacity_bound']['binding']}-bound); tuned budget "
                 f"{p['tuned']['token_budget']} (tight class {p['tuned']['tbt_slo_s'] * 1e3:.0f}"
                 f" ms beside {p['tuned']['num_decodes']} decodes)",
                 "budgets: " + ", ".join(f"{k} {v if v is not None else '(policy)'}"
                                         for k, v in p["budgets"].items()),
                 self.machine_line(), "",
                 self.speed_line(), "",
                 f"capacity (req/s, request-level attainment >= {self.target:g}), median "
                 "[min..max] over repeats; the simulator as calibrated (sim), charged at the"
                 " host's measured speed (sim-speed) and with the engine's noise fitted on the"
                 " calibration replay (sim-noise):",
                 f"{'system':<14} {'engine':>22} {'sim':>22} {'error':>8} {'sim-speed':>22} "
                 f"{'error':>8} {'sim-noise':>22} {'error':>8}"]
        s = self.summary.set_index(["source", "system"])
        for system in dict.fromkeys(self.summary["system"]):
            cells = []
            for source in SOURCES:
                if (source, system) in s.index:
                    r = s.loc[(source, system)]
                    if r["where"] == "below_sweep":  # every repeat below the lowest rate
                        cell = f"< {min(self.plan['rates']):.3g}"
                    else:
                        mark = ">=" if "above_sweep" in r["where"] else ""
                        cell = f"{mark}{r['median']:.3g} [{r['min']:.3g}..{r['max']:.3g}]"
                    if source in PREDICTIONS:
                        err = r["error_vs_engine"]
                        cell += f" {err:>+8.1%}" if math.isfinite(err) else f" {'-':>8}"
                    cells.append(cell)
                else:
                    cells.append("-")
            lines.append(f"{system:<14} " + " ".join(f"{c:>22}" if i == 0 else f"{c:>31}"
                                                     for i, c in enumerate(cells)))
        lines.append("")
        for source, o in self.orders.items():
            lines.append(f"ordering ({source}): engine {' > '.join(o.engine)}; {source} "
                         f"{' > '.join(o.sim)}; Kendall tau {o.kendall_tau:+.2f}; "
                         f"{o.separated_pairs} pair(s) separated in the engine (ranges apart), "
                         + ("all ordered alike" if o.agree else "ordered differently: "
                            + ", ".join(f"{a}/{b}" for a, b in o.disagreements)))
        lines += ["", "request-level attainment per point and class (engine / sim, median over "
                      "repeats):"]
        lines.append(self.class_table())
        return "\n".join(lines)

    def speed_line(self) -> str:
        if not self.speed:
            return "host speed: not recorded"
        eng = self.points[self.points["source"] == "engine"]
        r = eng["step_ratio"] if "step_ratio" in eng else pd.Series(dtype=float)
        return (f"host speed: the replays' steps took {self.speed['factor']:.2f} x the "
                f"calibrated model (median over the {self.speed['basis']}; per replay "
                f"{r.min():.2f}-{r.max():.2f})")

    def machine_line(self) -> str:
        """The machine while the engine replayed: 1-minute load averages before the points and
        the share of CPU time busy during them (every process, not only the engine)."""
        eng = self.points[self.points["source"] == "engine"]
        if "cpu_busy" not in eng or not eng["cpu_busy"].notna().any():
            return "machine: not recorded"
        load = eng["load_1min"] if "load_1min" in eng else pd.Series(dtype=float)
        return (f"machine during the {len(eng)} replays: 1-min load average "
                f"{load.min():.1f}-{load.max():.1f}, CPU busy {eng['cpu_busy'].min():.0%}-"
                f"{eng['cpu_busy'].max():.0%} (all processes)")

    def class_table(self) -> str:
        cols = ["slo_attainment_request"] + [c for c in self.points.columns
                                             if c.startswith("att_")]
        med = self.points.groupby(["system", "rate", "source"], sort=False)[cols].median()
        head = f"{'system':<14} {'rate':>6} " + " ".join(
            f"{c.replace('slo_attainment_request', 'all').replace('att_', ''):>13}"
            for c in cols)
        lines = [head]
        for (system, rate), g in med.groupby(level=[0, 1], sort=False):
            vals = []
            for c in cols:
                e = g.xs("engine", level=2)[c].iloc[0] if "engine" in g.index.get_level_values(2) \
                    else math.nan
                m = g.xs("sim", level=2)[c].iloc[0] if "sim" in g.index.get_level_values(2) \
                    else math.nan
                vals.append(f"{e:>6.2f}/{m:<6.2f}")
            lines.append(f"{system:<14} {rate:>6.3g} " + " ".join(vals))
        return "\n".join(lines)


def build_report(runs: Path | str) -> Report:
    runs = Path(runs)
    cfg, plan = read_config(runs), read_plan(runs)
    pts = point_rows(runs)
    if pts.empty:
        raise FileNotFoundError(f"{runs}: no replayed or simulated points (real/, sim/)")
    caps = capacities(pts, cfg.target)
    summary = capacity_summary(caps)
    sources = set(summary["source"])
    orders = {s: ordering(summary, s) for s in PREDICTIONS if s in sources}
    speed_path = runs / SPEED_NAME
    speed = json.loads(speed_path.read_text()) if speed_path.exists() else {}
    return Report(runs, plan, pts, caps, summary, orders, cfg.target, speed)
