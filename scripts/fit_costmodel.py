#!/usr/bin/env python
"""Fit the analytic cost model's efficiency constants to measured A100 kernel times.

Development-time only: reads the calibration folder (Vidur's published A100 profiles, see its
README), prints the fitted ``Calibration`` to paste into ``accelgen/costmodel/analytic.py`` and
the model's errors against every table of the calibration set. The package never reads that
folder at run time.

    .venv/bin/python scripts/fit_costmodel.py --calibration /work/shared/calibration/a100_13b_class

Every residual is computed through ``AnalyticCostModel.breakdown`` itself (one-layer model
profiles of the profiled shapes), so the fitted constants mean exactly what the model does.

``--write-points FILE`` also writes the whole-iteration points of a 13B-class model (40 layers,
hidden 5120) composed from the same folder, in the points format of ``accelgen calibrate``: the
package carries them as ``accelgen/costmodel/data/a100_13b_class.csv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import ModelProfile
from accelgen.costmodel.analytic import A100_CALIBRATION, AnalyticCostModel, Calibration
from accelgen.costmodel.datasheets import resolve_hardware, resolve_model
from accelgen.costmodel.pivot import find_pivot
from accelgen.costmodel.table import ProfileCostModel, ProfileRow

A100 = resolve_hardware("a100")
MLP_FILES = {  # Vidur profile -> the profiled model's shape
    "internlm/internlm-20b/mlp.csv": "internlm-20b",
    "meta-llama/Llama-2-7b-hf/mlp.csv": "llama-2-7b",
    "codellama/CodeLlama-34b-Instruct-hf/mlp.csv": "codellama-34b",
}
# Ops of one layer's "linear" part as Vidur profiles them (excluding attention and embedding).
LINEAR_OPS = ["input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
              "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]
# Reference values stated in calibration/a100_13b_class/README.md (13B class, A100, TP 1), ms.
README_PREFILL_MS = {64: 21, 128: 28, 256: 35, 512: 72, 768: 107, 1024: 144, 2048: 278, 4096: 595}
README_DECODE_MS = {(1, 0): 18, (32, 512): 27, (32, 1024): 33, (32, 2048): 46,
                    (128, 512): 58, (128, 1024): 85, (128, 2048): 137}
LLAMA2_7B = ModelProfile(name="llama-2-7b", num_layers=1, hidden_size=4096, num_heads=32,
                         num_kv_heads=32, ffn_size=11008, gated_ffn=True, vocab_size=32000)


def one_layer(name: str, row: pd.Series) -> ModelProfile:
    return ModelProfile(name=name, num_layers=1, hidden_size=int(row.n_embd),
                        num_heads=int(row.n_head), num_kv_heads=int(row.n_kv_head),
                        ffn_size=int(row.n_expanded_embd), gated_ffn=bool(row.use_gated_mlp),
                        vocab_size=int(row.vocab_size))


def load_linear(root: Path) -> pd.DataFrame:
    frames = []
    for rel, name in MLP_FILES.items():
        d = pd.read_csv(root / rel)
        d["src"] = name
        d["t"] = sum(d[f"time_stats.{op}.median"] for op in LINEAR_OPS) * 1e-3
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def with_calibration(base: Calibration, **kw: float) -> Calibration:
    return dataclasses.replace(base, **kw)


def linear_pred(cal: Calibration, d: pd.DataFrame) -> np.ndarray:
    out = np.empty(len(d))
    models: dict[tuple[str, int], AnalyticCostModel] = {}
    for i, row in enumerate(d.itertuples()):
        key = (row.src, row.num_tensor_parallel_workers)
        if key not in models:
            models[key] = AnalyticCostModel(one_layer(row.src, row), A100,
                                            tp=row.num_tensor_parallel_workers, calibration=cal)
        b = models[key].breakdown(BatchShape(prefill_tokens=int(row.num_tokens)))
        # 'fixed' holds no communication (that is 'comm'), as Vidur's op times hold none.
        out[i] = b["fixed"] + b["linear"]
    return out


def prefill_attn_pred(cal: Calibration, d: pd.DataFrame) -> np.ndarray:
    m = AnalyticCostModel(LLAMA2_7B, A100, calibration=cal)
    out = []
    for n, ctx in zip(d.chunk, d.kv, strict=True):
        s = BatchShape()
        s.add_prefill(int(n), int(ctx))
        out.append(m.breakdown(s)["prefill_attn"])
    return np.array(out)


def decode_attn_pred(cal: Calibration, d: pd.DataFrame) -> np.ndarray:
    m = AnalyticCostModel(LLAMA2_7B, A100, calibration=cal)
    return np.array([m.breakdown(BatchShape(decode_seqs=int(b), decode_ctx=int(b * kv)))
                     ["decode_attn"] for b, kv in zip(d.batch, d.kv_cache_size, strict=True)])


def fit(names: list[str], x0: list[float], lo: list[float], hi: list[float], scale: list[float],
        pred, data: pd.DataFrame, base: Calibration) -> Calibration:
    """Least squares on relative errors over the named constants (scaled to order 1)."""
    def cal_of(x: np.ndarray) -> Calibration:
        return with_calibration(base, **{k: float(v * s) for k, v, s in
                                         zip(names, x, scale, strict=True)})

    res = least_squares(lambda x: pred(cal_of(x), data) / data.t.to_numpy() - 1, x0,
                        bounds=(lo, hi))
    return cal_of(res.x)


def mape(pred: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / ref - 1)) * 100)


# Fresh prefill sizes taken from the derived table (whole iterations, no prior context).
POINT_PREFILL_SIZES = (8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280,
                       1536, 2048, 2560, 3072, 4096)
LAYERS_13B, HEAD_SCALE = 40, 40 / 32  # 13B class: 40 layers of 40 heads; Vidur's points: 32


def write_points(root: Path, out: Path) -> int:
    """Whole-iteration A100 latencies of a 13B-class model (TP 1) composed from the calibration
    folder: fresh prefills from the derived table; chunks over prior context and decode batches
    as the linear-op time of that many tokens (internlm-20b, 40 layers) plus 40 layers of
    Vidur's Llama-2-7B attention point scaled by 40/32 heads. Returns the number of points."""
    derived = pd.read_csv(root / "derived_cost_13b_class_a100_tp1.csv").set_index("num_tokens")
    lin = load_linear(root)
    lin = lin[(lin.src == "internlm-20b") & (lin.num_tensor_parallel_workers == 1)]
    lin = lin.sort_values("num_tokens")

    def linear_s(tokens: int) -> float:
        return float(np.interp(tokens, lin.num_tokens, lin.t)) * LAYERS_13B

    rows = [("prefill", n, 1, 0, 0, 0, derived.loc[n, "prefill_iter_ms_total"] * 1e-3)
            for n in POINT_PREFILL_SIZES]
    pf = pd.read_csv(root / "attention_points_llama2_7b_tp1.csv")
    for chunk, kv, ms in pf[pf.kv > 0].itertuples(index=False):
        rows.append(("prefill", int(chunk), 1, int(kv), 0, 0,
                     linear_s(int(chunk)) + LAYERS_13B * HEAD_SCALE * ms * 1e-3))
    dec = pd.read_csv(root / "decode_attention_points_llama2_7b_tp1.csv")
    for batch, kv, ms in dec.itertuples(index=False):
        rows.append(("decode", 0, 0, 0, int(batch), int(batch * kv),
                     linear_s(int(batch)) + LAYERS_13B * HEAD_SCALE * ms * 1e-3))
    header = [
        "Whole-iteration latencies of a 13B-class model (40 layers, hidden 5120, 40 heads) on",
        "one A100-80GB, TP 1, composed from Vidur's published A100 profiles (github.com/microsoft/",
        "vidur, data/profiling/compute/a100/, MIT) as collected in calibration/a100_13b_class:",
        "- prefill rows with prefill_ctx 0: its derived table (internlm-20b linear ops x 40 layers",
        "  plus prefill attention scaled to 40 heads), prefill_iter_ms_total;",
        "- prefill rows with prefill_ctx > 0 and decode rows: the internlm-20b linear-op time of",
        "  that many tokens (x 40 layers) plus 40 layers of Vidur's Llama-2-7B attention point",
        "  (chunk, kv) or (batch, kv per sequence), scaled by 40/32 heads.",
        "GPU kernel times only: no engine CPU work, sampling, embedding or LM head.",
        "Written by: python scripts/fit_costmodel.py --calibration <folder> --write-points <file>",
    ]
    with out.open("w") as fh:
        fh.writelines(f"# {line}\n" for line in header)
        fh.write("kind,prefill_tokens,prefill_seqs,prefill_ctx,decode_seqs,decode_ctx,latency_s\n")
        for r in rows:
            fh.write(",".join(str(v) for v in r[:-1]) + f",{r[-1]:.6g}\n")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path, required=True,
                    help="folder with Vidur A100 profiles (calibration/a100_13b_class)")
    ap.add_argument("--linear-tp", default="1",
                    help="comma-separated TP degrees of the linear-op rows to fit on (default 1)")
    ap.add_argument("--write-points", type=Path, metavar="FILE",
                    help="also write the composed whole-iteration points (accelgen calibrate)")
    args = ap.parse_args(argv)
    root: Path = args.calibration
    if args.write_points is not None:
        n = write_points(root, args.write_points)
        print(f"wrote {args.write_points} ({n} points)")
    tps = [int(x) for x in args.linear_tp.split(",")]

    lin = load_linear(root)
    fit_rows = lin[lin.num_tensor_parallel_workers.isin(tps)]
    cal = fit(["linear_compute_eff", "linear_memory_eff", "linear_transition_p",
               "linear_layer_fixed_s"], [0.7, 0.8, 2.0, 50.0], [0.05, 0.05, 1.0, 0.0],
              [1.0, 1.0, 20.0, 500.0], [1, 1, 1, 1e-6], linear_pred, fit_rows, A100_CALIBRATION)

    pf = pd.read_csv(root / "attention_points_llama2_7b_tp1.csv")
    pf["t"] = pf.ms * 1e-3
    cal = fit(["attn_causal_eff", "attn_context_eff", "attn_prefill_fixed_s"],
              [0.2, 0.3, 30.0], [0.01, 0.01, 0.0], [1.0, 1.0, 500.0], [1, 1, 1e-6],
              prefill_attn_pred, pf, cal)

    dec = pd.read_csv(root / "decode_attention_points_llama2_7b_tp1.csv")
    dec["t"] = dec.ms * 1e-3
    # Memory efficiency is capped at 1 (datasheet bandwidth); the per-sequence term takes the
    # rest.
    cal = fit(["attn_decode_mem_eff", "attn_decode_seq_head_s", "attn_decode_fixed_s"],
              [0.8, 30.0, 5.0], [0.05, 0.0, 0.0], [1.0, 1000.0, 500.0], [1, 1e-9, 1e-6],
              decode_attn_pred, dec, cal)

    print("# --- component fits (per layer, Vidur A100 profiles) ---")
    for tp in (1, 2, 4, 8):
        parts = []
        for src in MLP_FILES.values():
            d = lin[(lin.src == src) & (lin.num_tensor_parallel_workers == tp)]
            parts.append(f"{src} {mape(linear_pred(cal, d), d.t.to_numpy()):.1f}%")
        tag = "fitted" if tp in tps else "held out"
        print(f"linear ops TP {tp} ({tag}) MAPE: " + ", ".join(parts))
    print(f"prefill attention MAPE: {mape(prefill_attn_pred(cal, pf), pf.t.to_numpy()):.1f}% "
          f"({len(pf)} points)")
    print(f"decode attention MAPE: {mape(decode_attn_pred(cal, dec), dec.t.to_numpy()):.1f}% "
          f"({len(dec)} points)")

    print("\n# --- whole iterations vs README / derived table (TP 1, A100) ---")
    derived = pd.read_csv(root / "derived_cost_13b_class_a100_tp1.csv")
    for name in ("llama-13b", "opt-13b"):
        m = AnalyticCostModel(resolve_model(name), A100, calibration=cal)
        pre = np.array([m.forward_time(s) for s in README_PREFILL_MS]) * 1e3
        ref = np.array(list(README_PREFILL_MS.values()), dtype=float)
        dec_pred = np.array([m.iteration_time(BatchShape(decode_seqs=b, decode_ctx=b * max(c, 1)))
                             for b, c in README_DECODE_MS]) * 1e3
        dec_ref = np.array(list(README_DECODE_MS.values()), dtype=float)
        full = np.array([m.forward_time(int(s)) for s in derived.num_tokens]) * 1e3
        print(f"{name}: README prefill MAPE {mape(pre, ref):.1f}%  "
              f"decode MAPE {mape(dec_pred, dec_ref):.1f}%  "
              f"derived prefill curve 8..4096 MAPE "
              f"{mape(full, derived.prefill_iter_ms_total.to_numpy()):.1f}%")
        print("  prefill ms:", " ".join(f"{s}:{p:.1f}/{r:.0f}" for s, p, r in
                                         zip(README_PREFILL_MS, pre, ref, strict=True)))
        print("  decode ms: ", " ".join(f"{b}x{c}:{p:.1f}/{r:.0f}" for (b, c), p, r in
                                         zip(README_DECODE_MS, dec_pred, dec_ref, strict=True)))

    print("\n# --- pivot (tolerance 0.03, step 32, sizes up to 4096) ---")
    rows = [ProfileRow("prefill", int(n), 1, 0, 0, 0, ms * 1e-3) for n, ms in
            zip(derived.num_tokens, derived.prefill_iter_ms_total, strict=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # prefill-only table: decode terms unconstrained
        measured = ProfileCostModel(rows, source="derived table")
    for label, cost in (("derived measured curve", measured),
                        ("fitted analytic llama-13b", AnalyticCostModel(
                            resolve_model("llama-13b"), A100, calibration=cal))):
        pv = find_pivot(cost, 0.03, 32, 4096)
        print(f"{label}: S_pf {pv.s_pf}, T_pf {pv.t_pf * 1e3:.1f} ms")

    print("\n# --- paste into accelgen/costmodel/analytic.py ---")
    fields = [f.name for f in dataclasses.fields(Calibration)
              if f.name != "source"]
    for f in fields:
        v = getattr(cal, f)
        print(f"    {f}={v:.4g},")
    return 0


if __name__ == "__main__":
    sys.exit(main())
