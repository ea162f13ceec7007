"""Fit the communication terms to Vidur's NCCL profiles (development only; the package carries
the fitted numbers in ``accelgen/costmodel/collectives.py``, not the data).

    .venv/bin/python scripts/fit_collectives.py --data /work/shared/calibration/network
    .venv/bin/python scripts/fit_collectives.py --data ... --write-sample tests/fixtures

``--data``: a folder with ``a100_dgx/`` and ``h100_dgx/``, each holding Vidur's
``all_reduce.csv`` and ``send_recv.csv`` (github.com/microsoft/vidur,
``data/profiling/network/``, MIT). Prints the fitted constants (as Python, for
``collectives.BUILTIN``), then per node and TP degree the error of the fit, of the package's
current terms and of the old assumed terms (75 % of the NVLink bandwidth per direction, 10 us per
all-reduce) at an iteration's message sizes (N x hidden x 2 bytes, N on ``TOKEN_GRID``, hidden
8192 and 12288: Llama-3-70B and OPT-175B, the multi-GPU models), as a Markdown table; and the
latency of a few iterations of the multi-GPU deployments under the package's terms.
``--write-sample DIR`` writes the points nearest to N x 8192 x 2 bytes (N = 1, 2, 4, ..., 4096)
as ``DIR/nccl_sample_<node>.csv``, the sample the tests check the package's fit on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from accelgen.core.specs import AllReduceFit, CollectiveTerms
from accelgen.costmodel import collective_fit as cf
from accelgen.costmodel.collectives import BUILTIN
from accelgen.costmodel.datasheets import HARDWARE

NODES = {"a100": "a100_dgx", "h100": "h100_dgx"}
HIDDEN = (8192, 12288)  # Llama-3-70B, OPT-175B
SAMPLE_TOKENS = tuple(2 ** i for i in range(13))  # 1..4096 tokens of hidden 8192: 16 KiB..64 MiB
SAMPLE_P2P_TOKENS = tuple(4 ** i for i in range(7))


def old_all_reduce(hw: str, ranks: int, nbytes: np.ndarray) -> np.ndarray:
    """The terms before this fit: ring bytes at 75 % of the per-direction link, plus 10 us."""
    link = HARDWARE[hw].interconnect_bandwidth * 0.75
    return 10e-6 + cf.ring_factor(ranks) * nbytes / link


def load(data: Path, node: str) -> cf.CollectivePoints:
    return cf.CollectivePoints.concat([cf.read_collectives(data / node / f"{op}.csv")
                                       for op in ("all_reduce", "send_recv")])


def fit_node(points: cf.CollectivePoints, hw: str) -> CollectiveTerms:
    ar = [cf.fit_all_reduce(*points.select(cf.ALL_REDUCE, r), r)
          for r in points.rank_counts(cf.ALL_REDUCE)]
    p2p = cf.fit_send_recv(*points.select(cf.SEND_RECV))
    return CollectiveTerms(all_reduce=ar, send_recv=p2p, source=hw)


def python_text(hw: str, t: CollectiveTerms) -> str:
    lines = [f'    "{hw}": CollectiveTerms(', "        all_reduce=["]
    for f in t.all_reduce:
        lines.append(f"            AllReduceFit(ranks={f.ranks}, latency_s={f.latency_s:.3g}, "
                     f"startup_s={f.startup_s:.3g},")
        lines.append(f"                         bus_bandwidth={f.bus_bandwidth:.3g}, "
                     f"exponent={f.exponent:.3g}, ref_bytes={f.ref_bytes!r}),")
    lines.append("        ],")
    p = t.send_recv
    lines.append(f"        send_recv=SendRecvFit(startup_s={p.startup_s:.3g}, "
                 f"bus_bandwidth={p.bus_bandwidth:.3g}),")
    lines.append("        source=...),")
    return "\n".join(lines)


def rounded(f: AllReduceFit) -> AllReduceFit:
    """The fit at the precision the package carries (3 significant digits)."""
    return AllReduceFit.model_validate({k: (float(f"{v:.3g}") if isinstance(v, float)
                                            and k != "ref_bytes" else v)
                                        for k, v in f.model_dump().items()})


def report(points: cf.CollectivePoints, hw: str, fitted: CollectiveTerms) -> list[str]:
    sizes = cf.iteration_sizes(HIDDEN)
    link = HARDWARE[hw].interconnect_bandwidth
    rows = []
    package = BUILTIN.get(hw)
    for f in fitted.all_reduce:
        s, t = points.select(cf.ALL_REDUCE, f.ranks)
        fit = cf.check_fit(cf.ALL_REDUCE, f.ranks, s, t,
                           cf.predict_all_reduce(rounded(f), f.ranks, s), sizes)
        old = cf.check_fit(cf.ALL_REDUCE, f.ranks, s, t, old_all_reduce(hw, f.ranks, s), sizes)
        pkg = "-"
        if package is not None:
            pf = next((g for g in package.all_reduce if g.ranks == f.ranks), None)
            if pf is not None:
                c = cf.check_fit(cf.ALL_REDUCE, f.ranks, s, t,
                                 cf.predict_all_reduce(pf, f.ranks, s), sizes)
                pkg = f"{c.median_abs:.1%}"
        small = np.abs(fit.iteration[fit.iteration_bytes < 2 ** 20])
        large = np.abs(fit.iteration[fit.iteration_bytes >= 2 ** 20])
        rows.append(
            f"| {hw.upper()} | TP {f.ranks} | {f.latency_s * 1e6:.1f} | {f.startup_s * 1e6:.1f} "
            f"| {f.bus_bandwidth / 1e9:.0f} ({f.bus_bandwidth / link:.2f}) | {f.exponent:.2f} "
            f"| {len(fit.iteration)} | **{fit.median_abs:.1%}** | {np.median(small):.1%} / "
            f"{np.median(large):.1%} | {np.percentile(np.abs(fit.iteration), 90):.0%} "
            f"| {np.median(np.abs(fit.all_points)):.1%} ({len(fit.all_points)}) "
            f"| {pkg} | {old.median_abs:.0%} |")
    s, t = points.select(cf.SEND_RECV)
    p = fitted.send_recv
    c = cf.check_fit(cf.SEND_RECV, 2, s, t, cf.predict_send_recv(p, s), sizes)
    old = cf.check_fit(cf.SEND_RECV, 2, s, t, 10e-6 + s / (link * 0.75), sizes)
    rows.append(
        f"| {hw.upper()} | PP hop | - | {p.startup_s * 1e6:.1f} | {p.bus_bandwidth / 1e9:.0f} "
        f"({p.bus_bandwidth / link:.2f}) | 1 | {len(c.iteration)} | **{c.median_abs:.1%}** | - "
        f"| {np.percentile(np.abs(c.iteration), 90):.0%} "
        f"| {np.median(np.abs(c.all_points)):.1%} ({len(c.all_points)}) | - "
        f"| {old.median_abs:.0%} |")
    return rows


def write_sample(points: cf.CollectivePoints, hw: str, node: str, out: Path) -> Path:
    lines = [f"# Sample of Vidur's NCCL profiles, {node} (github.com/microsoft/vidur, "
             f"data/profiling/network/{node}/, commit 7d47513,",
             "# MIT License, Copyright (c) Microsoft Corporation): the measured median kernel "
             "time of the points nearest to",
             "# N x 8192 x 2 bytes (N = 1, 2, 4, ..., 4096; send_recv: N = 1, 4, ..., 4096), "
             "all ranks on one node.",
             "# Written by scripts/fit_collectives.py --write-sample; "
             "tests/test_collectives.py checks the package's fit on it.",
             "collective,ranks,size_bytes,time_ms"]
    for op, ranks_list, tokens in ((cf.ALL_REDUCE, points.rank_counts(cf.ALL_REDUCE),
                                    SAMPLE_TOKENS), (cf.SEND_RECV, [2], SAMPLE_P2P_TOKENS)):
        for r in ranks_list:
            s, t = points.select(op, r)
            idx = cf.nearest_points(s, np.array([n * 8192 * 2.0 for n in tokens]))
            lines += [f"{op},{r},{int(s[i])},{t[i] * 1e3:.6g}" for i in idx]
    path = out / f"nccl_sample_{hw}.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def iteration_lines() -> list[str]:
    """Iterations of the multi-GPU deployments under the package's terms (contexts 2,048)."""
    from accelgen.core.iteration import BatchShape
    from accelgen.costmodel.analytic import AnalyticCostModel
    from accelgen.costmodel.datasheets import resolve_deployment
    from accelgen.costmodel.factory import make_cost_model

    def shape(prefill: int = 0, decodes: int = 0) -> BatchShape:
        s = BatchShape()
        if prefill:
            s.add_prefill(prefill, 0)
        for _ in range(decodes):
            s.add_decode(2048)
        return s

    shapes = [("decode, 1 request", shape(decodes=1)), ("decode, 32 requests", shape(decodes=32)),
              ("prefill, 512 tokens", shape(prefill=512)),
              ("512-token chunk + 32 decodes", shape(prefill=512, decodes=32)),
              ("prefill, 4096 tokens", shape(prefill=4096))]
    out = ["| deployment | iteration (decode contexts 2,048) | latency (ms) | of it TP/PP "
           "communication (ms) |", "|---|---|---|---|"]
    for name in ("llama-3-70b", "opt-175b", "opt-175b-tp2pp4"):
        cost = make_cost_model(resolve_deployment(name))
        assert isinstance(cost, AnalyticCostModel)
        for label, s in shapes:
            out.append(f"| {name} | {label} | {cost.iteration_time(s) * 1e3:.1f} | "
                       f"{cost.breakdown(s)['comm'] * 1e3:.1f} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--write-sample", type=Path, metavar="DIR")
    args = ap.parse_args()
    table = ["| node | collective | latency (us) | startup (us) | bus GB/s at 64 MiB (of NVLink) "
             "| exponent | sizes | median abs. error | < 1 MiB / >= 1 MiB | p90 | all points in "
             "range | package | assumed (old) |", "|" + "---|" * 13]
    written = []
    for hw, node in NODES.items():
        points = load(args.data, node)
        fitted = fit_node(points, hw)
        print(python_text(hw, fitted))
        table += report(points, hw, fitted)
        if args.write_sample is not None:
            written.append(write_sample(points, hw, node, args.write_sample))
    print("\n".join(table))
    print("\n".join(iteration_lines()))
    print(f"fit_collectives: fitted {len(NODES)} nodes"
          + (f"; wrote {', '.join(map(str, written))}" if written else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
