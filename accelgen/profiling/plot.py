"""Throughput (and latency) vs forward size, with the pivot marked."""

from __future__ import annotations

from pathlib import Path

from accelgen.costmodel.table import ProfileCostModel, ProfileRow
from accelgen.profiling.measure import PivotReport


def plot_profile(rows: list[ProfileRow], report: PivotReport, path: Path | str,
                 title: str = "") -> list[Path]:
    """Write ``path`` (and a PDF beside a PNG); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cost = ProfileCostModel(rows, source="<plot>")
    sizes = list(range(report.step, report.max_size + 1, report.step))
    times = [cost.forward_time(s) for s in sizes]
    pts = report.curve
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(sizes, [s / t for s, t in zip(sizes, times, strict=True)], "-", lw=1,
             color="tab:blue", label="interpolated table (simulator)")
    ax1.plot([p.size for p in pts], [p.throughput for p in pts], "o", ms=4, color="tab:blue",
             label="measured (median)")
    best = max(s / t for s, t in zip(sizes, times, strict=True))
    ax1.axhline(best / (1 + report.tolerance), color="grey", ls=":", lw=1,
                label=f"plateau / (1 + {report.tolerance:g})")
    piv = report.model
    ax1.axvline(piv.s_pf, color="tab:red", ls="--", lw=1)
    ax1.plot([piv.s_pf], [piv.s_pf / piv.t_pf], "*", ms=12, color="tab:red",
             label=f"S_pf = {piv.s_pf}")
    ax1.set_xlabel("forward size (tokens, one fresh prompt)")
    ax1.set_ylabel("throughput (tokens/s)")
    ax1.legend(fontsize=8, loc="lower right")
    ax1.grid(alpha=0.3)
    ax2.plot(sizes, [t * 1e3 for t in times], "-", lw=1, color="tab:green")
    ax2.plot([p.size for p in pts], [p.time_s * 1e3 for p in pts], "o", ms=4, color="tab:green")
    ax2.axvline(piv.s_pf, color="tab:red", ls="--", lw=1)
    ax2.plot([piv.s_pf], [piv.t_pf * 1e3], "*", ms=12, color="tab:red",
             label=f"T_pf = {piv.t_pf * 1e3:.1f} ms")
    ax2.set_xlabel("forward size (tokens)")
    ax2.set_ylabel("iteration latency (ms)")
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = [path]
    fig.savefig(path, dpi=130)
    if path.suffix.lower() == ".png":
        pdf = path.with_suffix(".pdf")
        fig.savefig(pdf)
        out.append(pdf)
    plt.close(fig)
    return out
