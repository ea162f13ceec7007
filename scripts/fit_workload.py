#!/usr/bin/env python
"""Fit the embedded synthetic workload's within-bucket length shapes to real traces.

Development tool only: it reads the real traces (by default ``/work/shared/traces``) and the A100
calibration table, and writes ``accelgen/workloads/fitted.py`` with the fitted parameters as
literals. The package itself never reads those files.

    python scripts/fit_workload.py --traces /work/shared/traces \
        --calibration /work/shared/calibration/a100_13b_class \
        --out accelgen/workloads/fitted.py

What is fitted (the bucket *shares* come from SPEC section 6, not from here):

- per (dataset, prompt|output, length bucket) where a real trace covers the bucket: an empirical
  quantile table (41 quantiles, ``inverted_cdf`` so every entry is an observed token count) of the
  trace's lengths inside the bucket's range;
- BookCorpus >= 4K prompts and >= 4K natural outputs, which no trace here covers: a truncated
  power law p(x) ~ x^-(alpha+1), alpha fitted by maximum likelihood to the ShareGPT trace's prompt
  tail in [4096, 7168) (above 7168 the trace's 8K filter bends the density down);
- a fallback isolated-prefill latency t(n) = a + b n + c n^2 (seconds) fitted to the A100 13B-class
  calibration table, used for TTFT SLOs only when the project's cost model is not available.

``--alpaca alpaca_data.json`` replaces the borrowed Alpaca shapes (see below) with tables measured
on a real Alpaca file, tokenized with ``--tokenizer`` (default opt).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SHAREGPT = "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
BWB = "bwb_stats_llama2_tokenizer_filtered_v2.csv"
CALIBRATION = "derived_cost_13b_class_a100_tp1.csv"
N_QUANTILES = 41
TAIL_FIT_RANGE = (4096, 7168)
PROMPT_TAIL_RANGE = (4096, 102_400)  # paper: BookCorpus prompts up to 100K tokens
OUTPUT_TAIL_RANGE = (4096, 16_384)  # assumption: no source bounds natural outputs; capped at 2048

# (table key, trace file, column, [lo, hi) range). Alpaca has no length trace here, so its
# short-bucket shapes borrow ShareGPT's short bucket unless --alpaca is given.
TABLES: list[tuple[str, str, str, tuple[int, int]]] = [
    ("alpaca.prompt.0", SHAREGPT, "num_prefill_tokens", (10, 512)),
    ("alpaca.output.0", SHAREGPT, "num_decode_tokens", (10, 512)),
    ("sharegpt.prompt.0", SHAREGPT, "num_prefill_tokens", (10, 512)),
    ("sharegpt.prompt.1", SHAREGPT, "num_prefill_tokens", (512, 2049)),
    ("sharegpt.output.0", SHAREGPT, "num_decode_tokens", (10, 512)),
    ("sharegpt.output.1", SHAREGPT, "num_decode_tokens", (512, 4096)),
    ("bookcorpus.prompt.1", BWB, "num_prefill_tokens", (512, 4096)),
    ("bookcorpus.output.0", BWB, "num_decode_tokens", (10, 512)),
    ("bookcorpus.output.1", BWB, "num_decode_tokens", (512, 4096)),
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quantile_table(values: np.ndarray, lo: int, hi: int) -> tuple[list[int], int]:
    inside = np.sort(values[(values >= lo) & (values < hi)])
    if inside.size < 50:
        raise SystemExit(f"only {inside.size} values in [{lo}, {hi}); too few for a table")
    probs = np.linspace(0.0, 1.0, N_QUANTILES)
    q = np.quantile(inside, probs, method="inverted_cdf")
    q[0], q[-1] = inside[0], inside[-1]  # keep the observed range exactly
    return [int(v) for v in q], int(inside.size)


def powerlaw_nll(alpha: float, x: np.ndarray, a: float, b: float) -> float:
    """Negative log-likelihood of p(x) = C x^-(alpha+1) truncated to [a, b]."""
    logs = np.log(x)
    if abs(alpha) < 1e-9:
        log_c = -math.log(math.log(b / a))
    else:
        log_c = math.log(abs(alpha)) - math.log(abs(a**-alpha - b**-alpha))
    return -(x.size * log_c - (alpha + 1.0) * logs.sum())


def fit_tail_alpha(values: np.ndarray) -> tuple[float, int]:
    from scipy.optimize import minimize_scalar  # dev-only dependency

    a, b = TAIL_FIT_RANGE
    x = values[(values >= a) & (values < b)].astype(float)
    res = minimize_scalar(powerlaw_nll, bounds=(-3.0, 5.0), args=(x, a, b), method="bounded")
    return float(res.x), int(x.size)


def fit_prefill(calibration: Path) -> tuple[tuple[float, float, float], float]:
    df = pd.read_csv(calibration)
    n = df["num_tokens"].to_numpy(float)
    t = df["prefill_iter_ms_total"].to_numpy(float) / 1e3
    design = np.stack([np.ones_like(n), n, n * n], axis=1)
    w = 1.0 / t  # relative-error least squares: short prompts matter as much as long ones
    coef, *_ = np.linalg.lstsq(design * w[:, None], t * w, rcond=None)
    mape = float(np.mean(np.abs(design @ coef - t) / t))
    return (float(coef[0]), float(coef[1]), float(coef[2])), mape


def alpaca_lengths(path: Path, tokenizer: str) -> tuple[np.ndarray, np.ndarray]:
    from accelgen.workloads.loaders import load_alpaca
    from accelgen.workloads.tokenizer import get_tokenizer

    rec = load_alpaca(path, get_tokenizer(tokenizer))
    return rec.prompt_len, rec.output_len


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--calibration", type=Path,
                    default=Path("/work/shared/calibration/a100_13b_class"))
    ap.add_argument("--alpaca", type=Path, default=None, help="a real alpaca_data.json")
    ap.add_argument("--tokenizer", default="opt")
    ap.add_argument("--out", type=Path, default=None, help="write the module here (else stdout)")
    args = ap.parse_args(argv)

    frames = {name: pd.read_csv(args.traces / name) for name in (SHAREGPT, BWB)}
    digests = {name: sha256(args.traces / name) for name in frames}
    cal_path = args.calibration / CALIBRATION
    digests[CALIBRATION] = sha256(cal_path)

    alpaca = alpaca_lengths(args.alpaca, args.tokenizer) if args.alpaca else None
    tables: dict[str, tuple[list[int], str]] = {}
    for key, fname, column, (lo, hi) in TABLES:
        if alpaca is not None and key.startswith("alpaca."):
            values = alpaca[0] if ".prompt." in key else alpaca[1]
            origin = f"{args.alpaca.name} ({args.tokenizer} tokens)"
        else:
            values = frames[fname][column].to_numpy()
            origin = f"{fname} {column}"
        q, n = quantile_table(values, lo, hi)
        tables[key] = (q, f"{origin} in [{lo}, {hi}), n={n}")

    alpha, n_tail = fit_tail_alpha(frames[SHAREGPT]["num_prefill_tokens"].to_numpy())
    prefill, mape = fit_prefill(cal_path)

    # One option per line so the regeneration command stays within the line-length limit.
    raw = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)]
    parts = ["python scripts/fit_workload.py"]
    for arg in raw:
        if parts[-1].startswith("--") and " " not in parts[-1] and not arg.startswith("--"):
            parts[-1] += " " + arg
        else:
            parts.append(arg)
    cmd = " \\\n        ".join(parts)
    lines = [
        'r"""Fitted length shapes and fallback constants for the embedded workload.',
        "",
        "GENERATED by scripts/fit_workload.py; do not edit by hand. Regenerate with:",
        "",
        f"    {cmd}",
        "",
        "Sources (development data, not shipped; sha256 of the files used):",
    ]
    for name, digest in sorted(digests.items()):
        lines += [f"    {name}", f"        {digest}"]
    lines += [
        "",
        "The ShareGPT and BWB traces are Vidur's processed traces (github.com/microsoft/vidur,",
        "data/processed_traces/, MIT), Llama-2 tokenizer; the calibration table derives from",
        "Vidur's A100 profiles (see docs/workloads.md).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        f"# Quantile levels of every table: {N_QUANTILES} evenly spaced probabilities in [0, 1].",
        f"N_QUANTILES = {N_QUANTILES}",
        "",
        "# key = '<dataset>.<prompt|output>.<bucket index>' (0: [10, 512), 1: [512, 4096)).",
        "QUANTILE_TABLES: dict[str, tuple[int, ...]] = {",
    ]
    for key, (q, origin) in tables.items():
        lines.append(f"    # {origin}")
        lines.append(f'    "{key}": (')
        for i in range(0, len(q), 10):
            lines.append("        " + ", ".join(str(v) for v in q[i : i + 10]) + ",")
        lines.append("    ),")
    lines += [
        "}",
        "",
        "# Truncated power law p(x) ~ x^-(alpha+1) for the buckets no trace covers; alpha is the",
        f"# MLE on {SHAREGPT} num_prefill_tokens in [{TAIL_FIT_RANGE[0]}, {TAIL_FIT_RANGE[1]}),",
        f"# n={n_tail}. Range bounds are assumptions (docs/workloads.md).",
        f"TAIL_ALPHA = {alpha:.6f}",
        "POWER_LAW_TAILS: dict[str, tuple[int, int]] = {",
        f'    "bookcorpus.prompt.2": {PROMPT_TAIL_RANGE},',
        f'    "bookcorpus.output.2": {OUTPUT_TAIL_RANGE},',
        "}",
        "",
        "# Fallback isolated prefill latency (s) = a + b*n + c*n^2, least squares (relative",
        f"# error) on {CALIBRATION} prefill_iter_ms_total, n = 8..4096;",
        f"# MAPE {mape * 100:.1f} %.",
        f"FALLBACK_PREFILL_COEFFS = ({prefill[0]:.6e}, {prefill[1]:.6e}, {prefill[2]:.6e})",
        "",
    ]
    text = "\n".join(lines)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    print(f"tail alpha={alpha:.4f} (n={n_tail}); prefill fit MAPE={mape * 100:.2f} %",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
