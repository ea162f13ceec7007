"""Human-readable summary of a trace: what the CLI prints after writing one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from accelgen.workloads.synthetic import BUCKET_LABELS, bucket_shares


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells))

    return [fmt(header), *(fmt(r) for r in rows)]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summarize(df: pd.DataFrame, meta: dict[str, Any]) -> str:
    n = len(df)
    out: list[str] = []
    span = float(df["arrival"].iloc[-1]) if n else 0.0
    rate = f"{n / span:.2f} req/s" if span > 0 else "n/a"
    out.append(f"{n} requests over {span:.1f} s ({rate}), seed {meta.get('seed')}")
    out.append(f"tokenizer: {meta.get('tokenizer')}")
    out.append(f"TTFT SLOs from: {meta.get('prefill_latency')}")
    out.append("")

    rows = []
    src_meta = meta.get("sources", {})
    for name, grp in df.groupby("source", sort=False):
        info = src_meta.get(name, {})
        skipped = ", ".join(f"{k}={v}" for k, v in info.get("skipped", {}).items()) or "-"
        rows.append([str(name), str(len(grp)), _pct(len(grp) / n),
                     f"{grp['prompt_len_natural'].mean():.0f}",
                     f"{grp['output_len_natural'].mean():.0f}", f"{grp['output_len'].mean():.0f}",
                     str(int(grp["predicted_output_len"].iloc[0])), skipped])
    out += _table(["source", "requests", "share", "prompt mean", "output mean", "capped mean",
                   "S_g", "skipped records"], rows)
    out.append("")

    rows = []
    for label, col in (("prompt (natural)", "prompt_len_natural"),
                       ("prompt (served)", "prompt_len"),
                       ("output (natural)", "output_len_natural"),
                       ("output (capped)", "output_len")):
        rows.append([label, *(_pct(s) for s in bucket_shares(df[col].to_numpy()))])
    out += _table(["length buckets", *BUCKET_LABELS], rows)
    out.append("")

    rows = []
    for col in ("prompt_len_natural", "prompt_len", "output_len_natural", "output_len"):
        v = df[col].to_numpy()
        q = np.percentile(v, [50, 90, 99])
        rows.append([col, f"{v.mean():.0f}", *(f"{x:.0f}" for x in q), str(int(v.max()))])
    out += _table(["tokens", "mean", "p50", "p90", "p99", "max"], rows)
    out.append("")

    cfg = meta.get("config", {})
    stats = meta.get("stats", {})
    out.append(f"truncated prompts: {stats.get('prompts_truncated')} "
               f"(max_model_len={cfg.get('max_model_len')}); capped outputs: "
               f"{stats.get('outputs_capped')} (max_tokens={cfg.get('max_tokens')})")
    online = df["online"].to_numpy()
    if online.any():
        on = df[online]
        ttft = on["ttft_slo"]
        out.append(f"online: {int(online.sum())}  TTFT SLO mean {ttft.mean():.3f} s "
                   f"(p5 {ttft.quantile(0.05):.3f}, p95 {ttft.quantile(0.95):.3f})  "
                   f"TBT SLO mean {on['tbt_slo'].mean():.4f} s")
    out.append(f"offline (JCT SLO only): {int((~online).sum())}")
    n_on = max(int(online.sum()), 1)
    mode = stats.get("ttft_reference", "group_mean")
    lref = meta.get("latency_reference", {})
    if mode == "isolated":
        out.append(f"TTFT SLO reference: isolated (own prefill in chunks of S_pf "
                   f"{lref.get('s_pf')} + T_pf {1e3 * float(lref.get('t_pf') or 0):.1f} ms), "
                   f"scale U{list(cfg.get('slo', {}).get('ttft_scale', []))}")
    else:
        out.append(f"TTFT SLO reference: group_mean (mean isolated prefill of the "
                   f"{cfg.get('slo', {}).get('length_group')}-token group), scale "
                   f"U{list(cfg.get('slo', {}).get('ttft_scale', []))}")
    unatt = stats.get("unattainable_ttft", 0)
    out.append(f"TTFT SLO shorter than the isolated prefill (one pass or S_pf chunks; "
               f"unattainable by design): {unatt} "
               f"({_pct(unatt / n_on)} of online)")
    chunked = stats.get("ttft_below_chunked_prefill")
    if chunked is not None:
        out.append(f"TTFT SLO shorter than the prefill chunked at S_pf + T_pf: {chunked} "
                   f"({_pct(chunked / n_on)} of online)")
    below = stats.get("tbt_below_isolated_decode")
    if below is not None:
        raised = stats.get("tbt_raised", 0)
        factor = cfg.get("slo", {}).get("tbt_floor_factor", 1.2)
        if mode == "isolated":
            out.append(f"TBT SLO below one isolated decode iteration, raised to {factor:g}x it: "
                       f"{raised} ({_pct(raised / n_on)} of online)")
        else:
            out.append(f"TBT SLO below one isolated decode iteration (unattainable, not raised): "
                       f"{below} ({_pct(below / n_on)} of online)")
    for name, info in src_meta.items():
        if info.get("prompts_reusing_rows"):
            out.append(f"{name}: {info['prompts_reusing_rows']} prompts longer than the corpus "
                       "reuse rows (corpus too small)")
    return "\n".join(out)
