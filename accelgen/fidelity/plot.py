"""The fidelity figure: real (the out-of-sample rounds, pooled) vs simulated TTFT, TBT and
batch-size distributions per system, and the relative errors against their targets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from accelgen.fidelity.compare import TARGETS, distributions

LABELS = {"stock": "stock vLLM", "accelgen": "AccelGen"}
# The error panel: the targeted metrics, then iteration count and batch composition (grey: no
# target).
PANEL = {**{m: m for m in TARGETS}, "throughput_output_tps": "throughput",
         "num_iterations": "iterations", "batch_size_mean": "requests/iteration",
         "prefill_iteration_fraction": "iterations with prefill"}


def _cdf(ax, x: np.ndarray, **kw) -> None:  # type: ignore[no-untyped-def]
    x = np.sort(x[np.isfinite(x)])
    if len(x):
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), **kw)


def plot_fidelity(out_dir: Path | str, table: pd.DataFrame, path: Path | str) -> list[Path]:
    """Write ``path`` (PNG) and the same figure as PDF beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(table["system"]))
    fig, axes = plt.subplots(len(systems), 4, figsize=(15, 3.3 * len(systems)), squeeze=False)
    for row, system in zip(axes, systems, strict=True):
        d = distributions(out_dir, system)
        name = LABELS.get(system, system)
        for ax, key, unit, scale in ((row[0], "ttft", "TTFT (ms)", 1e3),
                                     (row[1], "tbt", "TBT (ms)", 1e3),
                                     (row[2], "batch_size", "requests per iteration", 1.0)):
            _cdf(ax, d["real"][key] * scale, color="black", lw=1.5, label="real vLLM engine")
            _cdf(ax, d["sim"][key] * scale, color="tab:orange", lw=1.5, ls="--",
                 label="simulator (calibrated cost model)")
            ax.set_xlabel(unit)
            ax.set_ylabel("CDF")
            ax.set_title(f"{name}: {key.replace('_', ' ')}", fontsize=9)
            ax.grid(alpha=0.3)
            if key in ("ttft", "tbt"):  # the tail beyond p99 would squeeze the rest
                top = max(float(np.nanpercentile(d[k][key], 99)) for k in ("real", "sim"))
                ax.set_xlim(0, top * scale * 1.05)
        row[0].legend(fontsize=7, loc="lower right")
        sel = table[(table["system"] == system) & table["metric"].isin(PANEL)]
        t = sel.set_index("metric").loc[[m for m in PANEL if m in set(sel["metric"])]]
        ax = row[3]
        y = np.arange(len(t))
        errs = t["rel_err"].to_numpy(float) * 100
        colors = ["tab:grey" if not np.isfinite(tgt) else "tab:green" if met is True else "tab:red"
                  for tgt, met in zip(t["target"].to_numpy(float), t["met"], strict=True)]
        ax.barh(y, errs, color=colors)
        for yi, tgt in zip(y, t["target"].to_numpy(float) * 100, strict=True):
            if np.isfinite(tgt):
                ax.plot([-tgt, -tgt], [yi - 0.4, yi + 0.4], color="grey", lw=1)
                ax.plot([tgt, tgt], [yi - 0.4, yi + 0.4], color="grey", lw=1)
        ax.set_yticks(y, [PANEL[m] for m in t.index], fontsize=8)
        ax.invert_yaxis()  # targets top to bottom in table order
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("simulated vs real (%)")
        ax.set_title(f"{name}: sim vs real; target (ticks)", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    pdf = path.with_suffix(".pdf")
    fig.savefig(pdf)
    plt.close(fig)
    return [path, pdf]
