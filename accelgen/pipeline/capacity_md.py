"""Figure 13's capacities as a Markdown table (docs/ARTIFACT.md, regime ``capacity``):
``python -m accelgen.pipeline capacity-md FIG13.csv``.

One row per deployment and system (the envelope's individual budgets left out): its budget
setting, its capacity at 90 % and at 99 % request-level attainment and by DistServe's rule (mean
over seeds, [min-max] when the seeds differ; ``< x`` below the lowest swept rate on every seed),
its request-level attainment at a few swept rates, and its highest goodput. Under each
deployment: AccelGen's capacity over the paper-setting baselines' best and over the strongest
baseline as users run it (tuned budgets, the best static budget, Sarathi-EDF, vLLM priority).
"""

from __future__ import annotations

import math

import pandas as pd

from accelgen.pipeline.claims import BASELINE_POLICIES, _field_systems

# Policies with a static token budget (S_pf at the paper's setting).
BUDGETED = ("vllm", "sarathi", "fastgen", "edf", "vllm-priority")
LOAD_FACTORS = (0.03125, 1.0, 2.0, 4.0)  # the attainment columns (x the capacity estimate)
CAPS = (("capacity_rps", "90 %"), ("capacity_strict_rps", "99 %"),
        ("capacity_distserve_rps", "DistServe's rule, 90 %"))


def _cap_text(row: pd.Series, lowest: float) -> str:
    mean = float(row["mean"])
    lo, hi = float(row.get("min", math.nan)), float(row.get("max", math.nan))
    if mean < lowest:  # below the lowest swept rate on every seed, or on average
        return f"< {lowest:.3g}" + (f" (seeds up to {hi:.2g})" if hi >= lowest else "")
    text = f"{mean:.3g}"
    if math.isfinite(lo) and math.isfinite(hi) and f"{lo:.2g}" != f"{hi:.2g}":
        text += f" [{lo:.2g}-{hi:.2g}]"
    if lo < lowest:
        text += " (a seed below the sweep)"
    return text


def capacity_markdown(df: pd.DataFrame, accelgen: str = "accelgen") -> str:
    setting = df["setting"].astype(str) if "setting" in df else pd.Series("paper", df.index)
    df = df[setting != "ladder"]
    caps = df[df["metric"].isin([m for m, _ in CAPS]) & df["seed"].isna()]
    att = df[df["metric"] == "slo_attainment_request"]
    good = df[df["metric"] == "goodput_rps"]
    lines: list[str] = []
    for dep, d in caps.groupby("deployment", sort=False):
        a = att[att["deployment"] == dep]
        rates = {lf: float(g["rate"].iloc[0]) for lf, g in a.groupby("load_factor")}
        shown = [lf for lf in LOAD_FACTORS if lf in rates]
        lowest = min(rates.values()) if rates else math.nan
        label = str(d["deployment_label"].iloc[0]) if "deployment_label" in d else str(dep)
        lines += [f"**{label}** (`{dep}`)", "",
                  "| system | setting | token budget | " + " | ".join(
                      f"capacity, {name} (req/s)" for _, name in CAPS) + " | attainment at "
                  + " / ".join(f"{rates[lf]:.3g}" for lf in shown)
                  + " req/s | highest goodput (req/s) |",
                  "|---|---|---|" + "---|" * len(CAPS) + "---|---|"]
        systems = list(dict.fromkeys(d["system"]))
        for s in systems:
            rows = d[d["system"] == s]
            first = rows.iloc[0]
            cells = []
            for metric, _ in CAPS:
                r = rows[rows["metric"] == metric]
                cells.append(_cap_text(r.iloc[0], lowest) if len(r) else "-")
            curve = a[a["system"] == s].set_index("load_factor")["mean"]
            atts = " / ".join(f"{float(curve[lf]):.3f}" if lf in curve.index else "-"
                              for lf in shown)
            budget = _budget_text(a[a["system"] == s], str(first.get("policy", "")))
            g = good[(good["deployment"] == dep) & (good["system"] == s)]["mean"]
            goodput = f"{float(g.max()):.3f}" if len(g) else "-"
            lines.append(f"| {first.get('system_label', s)} | {first.get('setting', 'paper')} | "
                         f"{budget} | " + " | ".join(cells) + f" | {atts} | {goodput} |")
        lines += ["", *_ratios(d, accelgen, lowest), ""]
    return "\n".join(lines) + "\n"


def _budget_text(curve: pd.DataFrame, policy: str) -> str:
    if "token_budget" not in curve or curve["token_budget"].isna().all():
        if policy in BUDGETED:
            return "S_pf"
        return "its own rule" if policy.startswith("accelgen") else "-"
    vals = {int(float(b)) for v in curve["token_budget"].dropna()
            for b in str(v).split(";")}
    return (str(vals.pop()) if len(vals) == 1 else
            ", ".join(map(str, sorted(vals))) + " (the best per rate and seed)")


def _ratios(d: pd.DataFrame, accelgen: str, lowest: float) -> list[str]:
    out = []
    paper = d[d["policy"].isin(list(BASELINE_POLICIES))
              & (d["setting"].astype(str).isin(["paper", "nan"]) if "setting" in d else True)]
    field = d[d["system"].isin(_field_systems(d))]
    for metric, name in CAPS[:2]:
        a = d[(d["system"] == accelgen) & (d["metric"] == metric)]["mean"]
        if not len(a):
            continue
        acc = float(a.iloc[0])
        for who, rivals in (("the paper-setting baselines' best", paper),
                            ("the strongest baseline as users run it", field)):
            r = rivals[rivals["metric"] == metric]
            if not len(r):
                continue
            best = r.loc[r["mean"].astype(float).idxmax()]
            b = float(best["mean"])
            if b < lowest:
                b = 0.0  # below the sweep (on average): no value
            if b > 0 and acc >= lowest:
                text = f"({best['system']}, {b:.3g}): {acc / b:.2f}x"
            elif acc > 0:
                text = "(every one below the sweep): no ratio"
            else:
                text = f"({best['system']}, {b:.3g}): no ratio, AccelGen's is below the sweep"
            out.append(f"- capacity at {name}: AccelGen {acc:.3g} req/s over {who} {text}")
    return out
