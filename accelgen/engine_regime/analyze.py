"""An engine sweep's numbers (needs only the results directories): attainment per point and SLO
class, capacity per system and repeat in the engine and in the simulator, the simulator's
capacity error, and whether it orders the systems as the engine does.

**Capacity** (SPEC 11, 13): per (source, system, seed), the highest probed rate of that
search (``search``) whose request-level attainment is >= the target, interpolated
(``metrics.sweep_capacity``). Per system: the median
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
    probed_points,
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
    est = float(plan["estimate_rps"])
    speed_path = runs / SPEED_NAME
    ratios = json.loads(speed_path.read_text())["per_replay"] if speed_path.exists() else {}
    rows = []
    for source in SOURCES:
        probed = probed_points(runs, _DIRS[source])
        for system in cfg.systems:
            for seed, rate in sorted({(sd, r) for name, sd, r in probed if name == system}):
                d = point_dir(runs, _DIRS[source], system, seed, rate)
                if not (d / "summary.json").exists():
                    continue
                reqs, _, summary = read_results(d)
                row: dict[str, Any] = {
                    "source": source, "system": system, "label": plan["labels"][system],
                    "seed": seed, "rate": rate, "load_factor": rate / est,
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
    separated: list[tuple[str, str]]  # those pairs, the engine's higher first


def ordering(summary: pd.DataFrame, source: str = "sim") -> Ordering:
    """Whether the simulator (``source``) orders the systems as the engine does (module
    docstring)."""
    eng = summary[summary["source"] == "engine"].set_index("system")
    sim = summary[summary["source"] == source].set_index("system")
    names = [s for s in eng.index if s in sim.index]
    conc = disc = 0
    separated = 0
    bad = []
    pairs: list[tuple[str, str]] = []
    for a, b in combinations(names, 2):
        de = eng.loc[a, "median"] - eng.loc[b, "median"]
        ds = sim.loc[a, "median"] - sim.loc[b, "median"]
        s = np.sign(de) * np.sign(ds)
        conc += int(s > 0)
        disc += int(s < 0)
        apart = (eng.loc[a, "min"] > eng.loc[b, "max"]) or (eng.loc[b, "min"] > eng.loc[a, "max"])
        if apart:
            separated += 1
            pairs.append((a, b) if de > 0 else (b, a))
            if np.sign(de) != np.sign(ds):
                bad.append((a, b))
    n = len(names) * (len(names) - 1) / 2
    tau = (conc - disc) / n if n else math.nan
    return Ordering(sorted(names, key=lambda s: -eng.loc[s, "median"]),
                    sorted(names, key=lambda s: -sim.loc[s, "median"]), not bad, tau,
                    separated, bad, pairs)


def class_capacities(pts: pd.DataFrame, target: float) -> pd.DataFrame:
    """Capacity per SLO class (``metrics.sweep_capacity`` of the class's attainment over the
    probes), per (source, system, seed): the class that limits a system is the one whose
    capacity is lowest, and a gap between two systems shows in the class where it opens. The
    searches place their probes around the request-level knee, so a class met at every probe
    gives a bound (``above_sweep``)."""
    classes = [c for c in pts.columns if c.startswith("att_")]
    rows = []
    for (source, system, seed), g in pts.groupby(["source", "system", "seed"], sort=False):
        for c in classes:
            cap, where = metrics.sweep_capacity(g["rate"].to_numpy(float),
                                                g[c].to_numpy(float), target)
            rows.append({"source": source, "system": system, "label": g["label"].iloc[0],
                         "seed": seed, "slo_class": c.removeprefix("att_"),
                         "capacity_rps": cap, "where": where})
    return pd.DataFrame(rows)


STOCK_PREFIX = "vllm"


def headline(summary: pd.DataFrame, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Each plugin system's engine capacity over the best stock vLLM configuration's (median
    over repeats), and whether their ranges are apart: the issue's acceptance ratio."""
    eng = summary[summary["source"] == "engine"].set_index("system")
    kinds = plan.get("systems", {})
    stock = [s for s in eng.index if kinds.get(s, {}).get("runs") == "stock"]
    plugin = [s for s in eng.index if kinds.get(s, {}).get("runs") == "plugin"]
    if not stock:
        return []
    best = max(stock, key=lambda s: eng.loc[s, "median"])
    out = []
    for p in plugin:
        b = eng.loc[best, "median"]
        ratio = eng.loc[p, "median"] / b if b > 0 else math.nan
        apart = bool(eng.loc[p, "min"] > eng.loc[best, "max"]
                     or eng.loc[best, "min"] > eng.loc[p, "max"])
        out.append({"system": p, "best_stock": best, "ratio": ratio, "separated": apart})
    return out


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
    classes: pd.DataFrame  # class_capacities
    ratios: list[dict[str, Any]]  # headline

    def frame(self) -> pd.DataFrame:
        """The figure's CSV (long format): ``kind`` point | capacity | capacity_summary |
        class_capacity | ordering | separated | ratio | host_speed | jitter; regime
        ``engine``; ``source`` engine | sim | sim-speed | sim-noise."""
        pts = self.points.melt(id_vars=["source", "system", "label", "seed", "rate",
                                        "load_factor"], var_name="metric", value_name="value")
        parts = [pts.assign(kind="point")]
        parts.append(self.capacity.rename(columns={"capacity_rps": "value"})
                     .assign(kind="capacity", metric="capacity_rps"))
        s = self.summary.rename(columns={"median": "value"})
        parts.append(s.assign(kind="capacity_summary", metric="capacity_rps"))
        if not self.classes.empty:
            parts.append(self.classes.rename(columns={"capacity_rps": "value"})
                         .assign(kind="class_capacity",
                                 metric="capacity_" + self.classes["slo_class"]))
        for source, o in self.orders.items():
            parts.append(pd.DataFrame([
                {"kind": "ordering", "metric": "ordering_agree", "value": float(o.agree)},
                {"kind": "ordering", "metric": "kendall_tau", "value": o.kendall_tau},
                {"kind": "ordering", "metric": "separated_pairs",
                 "value": float(o.separated_pairs)},
            ]).assign(source=source, system="engine: " + " > ".join(o.engine)
                      + f"; {source}: " + " > ".join(o.sim)))
        first = next(iter(self.orders.values()), None)
        if first is not None and first.separated:
            parts.append(pd.DataFrame([{"kind": "separated", "source": "engine",
                                        "metric": "separated", "value": 1.0,
                                        "system": f"{a} > {b}"} for a, b in first.separated]))
        if self.ratios:
            parts.append(pd.DataFrame([{
                "kind": "ratio", "source": "engine", "system": r["system"],
                "metric": f"capacity_over_{r['best_stock']}", "value": r["ratio"],
                "separated": r["separated"]} for r in self.ratios]))
        if self.speed:
            parts.append(pd.DataFrame([{"kind": "host_speed", "metric": "step_ratio",
                                        "value": self.speed["factor"],
                                        "system": self.speed["basis"]}]))
        j = self.plan.get("jitter") or {}
        if j.get("steps"):
            parts.append(pd.DataFrame([
                {"kind": "jitter", "metric": m, "value": float(j[k]), "system": j["rule"]}
                for m, k in (("step_p50_s", "p50_s"), ("step_p99_s", "p99_s"),
                             ("jitter_s", "jitter_s"), ("tight_floor_s", "floor_s"))]
                + [{"kind": "jitter", "metric": "tight_tbt_s", "value": min(
                    self.plan["tbt_classes"].values()), "system": j["rule"]}]))
        df = pd.concat(parts, ignore_index=True).assign(regime="engine", target=self.target)
        systems = self.plan.get("systems", {})
        df["runs"] = [systems.get(s, {}).get("runs", "") for s in df["system"]]
        df["policy"] = [systems.get(s, {}).get("policy", "") for s in df["system"]]
        df["async_scheduling"] = bool(self.plan.get("async_scheduling", False))
        lead = ["regime", "kind", "source", "system", "label", "seed", "rate", "load_factor",
                "metric", "value"]
        return df[lead + [c for c in df.columns if c not in lead]]

    def cell(self, source: str, system: str) -> str:
        """``median [min..max]`` of a (source, system)'s capacity, with its bound marks."""
        s = self.summary.set_index(["source", "system"])
        if (source, system) not in s.index:
            return "-"
        r = s.loc[(source, system)]
        if r["where"] == "below_sweep":  # every repeat below the lowest rate probed
            pts = self.points[(self.points["source"] == source)
                              & (self.points["system"] == system)]
            return f"< {pts['rate'].min():.3g}"
        mark = ">=" if "above_sweep" in r["where"] else ""
        return f"{mark}{r['median']:.3g} [{r['min']:.3g}..{r['max']:.3g}]"

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
                 self.jitter_line(),
                 "budgets: " + ", ".join(f"{k} {v if v is not None else '(policy)'}"
                                         for k, v in p["budgets"].items()),
                 self.machine_line(), "",
                 self.speed_line(), "",
                 f"capacity (req/s, request-level attainment >= {self.target:g}; a search per "
                 "system and repeat), median [min..max] over repeats; the simulator as "
                 "calibrated (sim), charged at the host's measured speed (sim-speed) and with "
                 "the engine's noise fitted on the calibration replay (sim-noise):",
                 f"{'system':<20} {'probes':>6} {'engine':>22} {'sim':>22} {'error':>8} "
                 f"{'sim-speed':>22} {'error':>8} {'sim-noise':>22} {'error':>8}"]
        s = self.summary.set_index(["source", "system"])
        eng_pts = self.points[self.points["source"] == "engine"]
        for system in dict.fromkeys(self.summary["system"]):
            cells = []
            for source in SOURCES:
                cell = self.cell(source, system)
                if source in PREDICTIONS:
                    err = (s.loc[(source, system), "error_vs_engine"]
                           if (source, system) in s.index else math.nan)
                    cell = f"{cell:>22} " + (f"{err:>+8.1%}" if math.isfinite(err)
                                             else f"{'-':>8}")
                else:
                    cell = f"{cell:>22}"
                cells.append(cell)
            n = int((eng_pts["system"] == system).sum())
            lines.append(f"{system:<20} {n:>6} " + " ".join(cells))
        lines.append("")
        for source, o in self.orders.items():
            lines.append(f"ordering ({source}): engine {' > '.join(o.engine)}; {source} "
                         f"{' > '.join(o.sim)}; Kendall tau {o.kendall_tau:+.2f}; "
                         f"{o.separated_pairs} pair(s) separated in the engine (ranges apart), "
                         + ("all ordered alike" if o.agree else "ordered differently: "
                            + ", ".join(f"{a}/{b}" for a, b in o.disagreements)))
        first = next(iter(self.orders.values()), None)
        if first is not None:
            n_pairs = len(first.engine) * (len(first.engine) - 1) // 2
            lines.append(f"pairs the engine separates ({len(first.separated)} of {n_pairs}): "
                         + (", ".join(f"{a} > {b}" for a, b in first.separated) or "none"))
        for r in self.ratios:
            lines.append(f"{r['system']} / best stock vLLM ({r['best_stock']}): "
                         f"{r['ratio']:.2f}x (medians; ranges "
                         f"{'apart' if r['separated'] else 'overlap'})")
        lines += ["", "capacity per SLO class (req/s, the class's request-level attainment >= "
                      f"{self.target:g}; median over repeats; engine / sim-noise; >= : met at "
                      "every probe):"]
        lines.append(self.class_table())
        return "\n".join(lines)

    def jitter_line(self) -> str:
        j = self.plan.get("jitter") or {}
        if not j.get("steps"):
            return "host jitter: not measured"
        tight = min(self.plan["tbt_classes"].values())
        auto = tight / self.plan["tbt_base"] * self.plan["tbt_base_auto"]
        return (f"host jitter: {j['steps']} identical {j['prompt_len']}-token steps, p50 "
                f"{j['p50_s'] * 1e3:.2f} ms, p99 {j['p99_s'] * 1e3:.2f} ms (p99 - p50 "
                f"{j['jitter_s'] * 1e3:.2f} ms, {j['relative']:.0%}); rule: {j['rule']} = "
                f"{j['floor_s'] * 1e3:.1f} ms; tightest class {tight * 1e3:.1f} ms"
                + (f" (raised from the auto base's {auto * 1e3:.1f} ms)"
                   if self.plan.get("tbt_base_raised") else " (the auto base's, not raised)"))

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
        if self.classes.empty:
            return "(none)"
        c = self.classes
        classes = list(dict.fromkeys(c["slo_class"]))
        lines = [f"{'system':<20} " + " ".join(f"{k:>17}" for k in classes)]

        def med(source: str, system: str, k: str) -> str:
            g = c[(c["source"] == source) & (c["system"] == system) & (c["slo_class"] == k)]
            if g.empty:
                return "-"
            if (g["where"] == "below_sweep").all():
                return "<"
            mark = ">=" if (g["where"] == "above_sweep").any() else ""
            return f"{mark}{g['capacity_rps'].median():.3g}"

        for system in dict.fromkeys(c["system"]):
            lines.append(f"{system:<20} " + " ".join(
                f"{med('engine', system, k) + ' / ' + med('sim-noise', system, k):>17}"
                for k in classes))
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
    return Report(runs, plan, pts, caps, summary, orders, cfg.target, speed,
                  class_capacities(pts, cfg.target), headline(summary, plan))
