"""The fidelity report: the comparison table of a fidelity run (``fidelity.compare_all``), as text
and as one CSV (medians over the rounds, every round, and the simulator variants), plus the
figure (``fidelity_plot``). Needs only the results directories, not vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from accelgen.profiling.fidelity import TARGETS, VARIANTS, compare_all, compare_rounds


@dataclass(slots=True)
class Report:
    table: pd.DataFrame  # the reported variant (engine step model), medians over the rounds
    variants: dict[str, pd.DataFrame] = field(default_factory=dict)  # the other variants
    files: list[Path] = field(default_factory=list)  # what was written

    @property
    def missed(self) -> pd.DataFrame:
        """Rows whose target was missed (``met`` is True, False, or None without a target)."""
        return self.table[self.table["met"].map(lambda m: m is False)]

    def text(self) -> str:
        out = [format_table(self.table)]
        for variant, t in self.variants.items():
            out.append(f"\nthe same with the {VARIANTS[variant]} ({variant}):")
            out.append(format_table(t[t["metric"].isin([*TARGETS, "iter_latency_mean"])]))
        missed = self.missed
        if len(missed):
            out.append(f"{len(missed)} target(s) missed: "
                       + ", ".join(f"{r.system}/{r.metric}" for r in missed.itertuples()))
        else:
            out.append("every target met")
        return "\n".join(out)


def format_table(table: pd.DataFrame) -> str:
    """One line per (system, metric): real and simulated medians, error, target, the rounds'
    spread."""
    lines = [f"{'system':<9} {'metric':<27} {'real':>10} {'sim':>10} {'error':>8} "
             f"{'target':>7} {'met':>4}  {'real (rounds)':>21}  {'sim (rounds)':>21}"]
    for r in table.itertuples(index=False):
        tgt = f"{r.target:.0%}" if r.target == r.target else ""
        met = "" if r.met is None else ("yes" if r.met else "NO")
        spread = (f"{r.real_min:>10.4g}..{r.real_max:<10.4g}  {r.sim_min:>10.4g}..{r.sim_max:<10.4g}"
                  if hasattr(r, "real_min") else "")
        lines.append(f"{r.system:<9} {r.metric:<27} {r.real:>10.4g} {r.sim:>10.4g} "
                     f"{r.rel_err:>+8.1%} {tgt:>7} {met:>4}  {spread}")
    return "\n".join(lines)


def report_frame(runs: Path | str, rep: Report) -> pd.DataFrame:
    """The CSV's rows: ``model`` = simulator variant, ``round`` = ``median`` (over the rounds)
    or the round's index (reported variant only)."""
    parts = [rep.table.assign(model="sim", round="median"),
             compare_rounds(runs).assign(model="sim")]
    parts += [t.assign(model=v, round="median") for v, t in rep.variants.items()]
    return pd.concat(parts, ignore_index=True)


def write_report(runs: Path | str, csv: Path | str | None = None,
                 figure: Path | str | None = None) -> Report:
    """Compare a fidelity run directory; write the CSV and the figure (PNG + PDF) if asked."""
    rep = Report(compare_all(runs))
    for variant in VARIANTS:
        if variant == "sim":
            continue
        try:
            rep.variants[variant] = compare_all(runs, sim=variant)
        except FileNotFoundError:  # a run without that variant
            continue
    if csv is not None:
        csv = Path(csv)
        csv.parent.mkdir(parents=True, exist_ok=True)
        report_frame(runs, rep).to_csv(csv, index=False, float_format="%.6g")
        rep.files.append(csv)
    if figure is not None:
        from accelgen.profiling.fidelity_plot import plot_fidelity

        rep.files += plot_fidelity(runs, rep.table, figure)
    return rep

