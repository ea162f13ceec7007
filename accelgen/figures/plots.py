"""Small plotting helpers over the pipeline's tidy CSVs (columns ``metric, mean, p5, p95`` plus
labels). Error bars are always the 5th and 95th percentiles around the mean, as in the paper."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from accelgen.figures.catalog import FIGURES
from accelgen.figures.pipeline_outputs import chosen_config, pipeline_outputs, snakemake_command
from accelgen.figures.style import color, linestyle, system_order
from accelgen.figures.style import marker as style_marker

ERRBAR_NOTE = "bars: mean; whiskers: 5th-95th percentile"
# The pipeline config a notebook plots (set by use_config; named in messages).
_config: str | None = None


def setup() -> None:
    """Readable defaults for paper-sized panels; deterministic PDF/PNG output."""
    mpl.rcParams.update({
        "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
        "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.dpi": 100, "savefig.dpi": 150,
        "savefig.bbox": "tight", "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True,
        "pdf.fonttype": 42, "ps.fonttype": 42, "svg.hashsalt": "accelgen",
    })


def chdir_repo_root() -> Path:
    """Run from the repository root whether started there (papermill) or below it (JupyterLab
    runs a notebook in its own directory: notebooks/, or logs/<name>/notebooks/ for the
    pipeline's executed copies); paths in the notebooks are relative to the root."""
    here = Path.cwd()
    root = next((d for d in (here, *here.parents) if (d / "Snakefile").is_file()), None)
    if root is not None and root != here:
        os.chdir(root)
    return Path.cwd()


def use_config(config: str | None = None, figures_dir: str | None = None) -> str:
    """The figures directory a notebook reads and writes: ``figures_dir`` when given (the
    pipeline passes its own), else that of the pipeline config ``config`` (None:
    ``$ACCELGEN_CONFIG``, else config/quick.yaml; accelgen.figures.pipeline_outputs). Messages about
    missing CSVs then name the command with that config."""
    global _config
    _config = chosen_config(config)
    return str(figures_dir) if figures_dir else pipeline_outputs(_config).figures_dir


def wanted(figures: str, fig_id: str) -> bool:
    return fig_id in {f.strip() for f in figures.split(",") if f.strip()}


def load(figures_dir: str, fig_id: str) -> pd.DataFrame | None:
    """A figure's CSV, or None after saying which target makes it."""
    path = Path(figures_dir) / f"{fig_id}.csv"
    if not path.exists():
        target = next((key for key, fid, *_ in FIGURES if fid == fig_id), fig_id)
        print(f"{path}: missing (run `{snakemake_command(_config, target)}` first)")
        return None
    return pd.read_csv(path)


def save(fig: Any, figures_dir: str, fig_id: str) -> list[Path]:
    out = []
    for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None,
                                                          "Producer": None})):
        path = Path(figures_dir) / f"{fig_id}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, metadata=meta)
        out.append(path)
    print("wrote", ", ".join(str(p) for p in out))
    return out


def _unique(df: pd.DataFrame, key: str, label: str | None = None) -> tuple[list[Any], dict]:
    keys = list(dict.fromkeys(df[key]))
    labels = {}
    for k in keys:
        row = df[df[key] == k].iloc[0]
        labels[k] = row[label] if label is not None and label in df else k
    return keys, labels


def bars(ax: Any, df: pd.DataFrame, metric: str | None, *, x: str = "deployment",
         x_label: str | None = "deployment_label", hue: str = "system",
         hue_label: str | None = "system_label", scale: float = 1.0,
         ylabel: str | None = None, title: str | None = None, log: bool = False,
         hue_order: Sequence[str] | None = None, errorbars: bool = True) -> dict[str, Any]:
    """Grouped bars of ``metric`` (mean) with p5/p95 whiskers: groups on ``x``, bars by ``hue``.
    ``metric=None`` plots ``df`` as given (already one row per bar).
    Returns {hue value: (handle, label)} for a shared legend."""
    sub = df[df["metric"] == metric] if metric is not None and "metric" in df else df
    xs, xlabels = _unique(sub, x, x_label)
    hs = list(hue_order) if hue_order is not None else system_order(list(sub[hue]))
    _, hlabels = _unique(sub, hue, hue_label)
    n = max(len(hs), 1)
    width = 0.8 / n
    handles: dict[str, Any] = {}
    for j, h in enumerate(hs):
        rows = sub[sub[hue] == h]
        if not len(rows):
            continue
        pol = rows["policy"].iloc[0] if "policy" in rows else None
        pos, mean, lo, hi = [], [], [], []
        for i, xv in enumerate(xs):
            r = rows[rows[x] == xv]
            if not len(r):
                continue
            m = float(r["mean"].iloc[0]) * scale
            p5 = float(r["p5"].iloc[0]) * scale if "p5" in r else m
            p95 = float(r["p95"].iloc[0]) * scale if "p95" in r else m
            pos.append(i - 0.4 + (j + 0.5) * width)
            mean.append(m)
            lo.append(max(m - p5, 0.0) if np.isfinite(p5) else 0.0)
            hi.append(max(p95 - m, 0.0) if np.isfinite(p95) else 0.0)
        mean_arr = np.nan_to_num(np.asarray(mean, dtype=float))
        cont = ax.bar(pos, mean_arr, width=width * 0.92, color=color(h, pol),
                      edgecolor="black", linewidth=0.4, label=hlabels.get(h, h),
                      yerr=np.array([lo, hi]) if errorbars else None,
                      error_kw={"elinewidth": 0.8, "capsize": 1.5, "ecolor": "#333333"})
        handles[h] = (cont, hlabels.get(h, h))
    ax.set_xticks(range(len(xs)), [str(xlabels[v]) for v in xs])
    if log:
        ax.set_yscale("log")
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return handles


def legend(fig: Any, handles: dict[str, Any], ncol: int | None = None,
           loc: str = "upper center", anchor: tuple[float, float] = (0.5, 1.0),
           title: str | None = None) -> None:
    """One legend for the whole figure (above the panels)."""
    items = list(handles.values())
    if not items:
        return
    fig.legend([h for h, _ in items], [lab for _, lab in items], loc=loc,
               bbox_to_anchor=anchor, ncol=ncol or min(len(items), 7), frameon=False,
               title=title)


def lines(ax: Any, df: pd.DataFrame, metric: str, *, x: str, hue: str = "system",
          hue_label: str | None = "system_label", scale: float = 1.0,
          ylabel: str | None = None, xlabel: str | None = None, title: str | None = None,
          errorbars: bool = True, marker: str | None = None,
          linewidth: float = 1.5) -> dict[str, Any]:
    """``metric`` (mean, p5/p95 whiskers) against numeric column ``x``, one line per ``hue``:
    each system in its colour, marker and line style (``marker`` overrides the marker)."""
    sub = df[df["metric"] == metric] if metric is not None and "metric" in df else df
    hs = system_order(list(sub[hue]))
    _, hlabels = _unique(sub, hue, hue_label)
    handles: dict[str, Any] = {}
    for h in hs:
        r = sub[sub[hue] == h].sort_values(x)
        pol = r["policy"].iloc[0] if "policy" in r else None
        m = r["mean"].to_numpy(float) * scale
        yerr = None
        if errorbars and "p5" in r:
            lo = np.clip(m - r["p5"].to_numpy(float) * scale, 0, None)
            hi = np.clip(r["p95"].to_numpy(float) * scale - m, 0, None)
            yerr = np.nan_to_num(np.array([lo, hi]))
        cont = ax.errorbar(r[x].to_numpy(float), m, yerr=yerr, color=color(h, pol),
                           marker=marker or style_marker(h, pol), markersize=5,
                           linestyle=linestyle(h, pol), linewidth=linewidth, capsize=2,
                           label=hlabels.get(h, h), markerfacecolor="none")
        handles[h] = (cont, hlabels.get(h, h))
    if ylabel:
        ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title)
    return handles


def panel_grid(n: int, ncols: int, width: float = 4.0, height: float = 3.0,
               sharey: bool = False) -> tuple[Any, np.ndarray]:
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, sharey=sharey)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def capacity_text(row: Any, rates: Sequence[float]) -> str:
    """A capacity row of figure 13's CSV (``mean``, ``where``, ``min``/``max`` over seeds) as
    legend text: ``0.31``, ``0.31 [0.28-0.35]``, ``< 0.02`` (below the sweep) or ``>= 1.3``."""
    where = str(row.get("where", ""))
    if "below_sweep" in where and "interpolated" not in where and "above" not in where:
        return f"< {min(rates):.2g}"
    if "above_sweep" in where and "interpolated" not in where and "below" not in where:
        return f">= {max(rates):.2g}"
    text = f"{float(row['mean']):.2g}"
    lo, hi = float(row.get("min", np.nan)), float(row.get("max", np.nan))
    if np.isfinite(lo) and np.isfinite(hi) and f"{lo:.2g}" != f"{hi:.2g}":
        text += f" [{lo:.2g}-{hi:.2g}]"
    return text
