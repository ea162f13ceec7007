"""``accelgen calibrate --collectives``: fit the analytic model's TP/PP communication terms to a
cluster's own ``nccl-tests`` output and write a deployment file that uses them.

    # one node: all_reduce_perf at -g 2, 4 and 8, and sendrecv_perf at -g 2, logs as printed
    accelgen calibrate --collectives ar_g2.log --collectives ar_g4.log --collectives ar_g8.log \\
        --collectives sendrecv_g2.log --deployment llama-3-70b --out deployments/l70-mynode.yaml

Accepted input (``collective_fit.read_collectives``): nccl-tests output (size in bytes and the
out-of-place time in us of each row; the rank count from the ``#  Rank`` lines) or a CSV with
``collective``, ``ranks``, ``size_bytes`` and ``time_us`` / ``time_ms`` / ``time_s``. A collective
the files do not measure keeps the package's fit for the deployment's hardware, and the output
says so. Printed: each fit and its error at the deployment's iteration sizes (N x hidden x 2
bytes, N = 1..8,192 tokens). Written: the deployment (``cost_model: analytic`` with
``collectives:``), comments saying what it was fitted on and how well.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from accelgen.core.specs import CollectiveTerms, Deployment, HardwareProfile
from accelgen.costmodel import collective_fit as cf
from accelgen.costmodel.calibration_files import atomic_write
from accelgen.costmodel.collectives import builtin_collectives, nearest_fit


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collectives", action="append", default=[], metavar="FILE",
                   help="nccl-tests output (all_reduce_perf, sendrecv_perf) or a CSV of "
                        "collective,ranks,size_bytes,time_us: fit the analytic model's TP/PP "
                        "communication to it instead of fitting --points (repeatable)")


def fit_terms(points: cf.CollectivePoints, hardware: HardwareProfile
              ) -> tuple[CollectiveTerms, list[str]]:
    """Terms fitted to ``points``; what the points do not measure keeps the package's fit for
    ``hardware``. Also the lines saying what was kept and why."""
    prior = builtin_collectives(hardware)
    kept: list[str] = []
    ar = [cf.fit_all_reduce(*points.select(cf.ALL_REDUCE, r), r)
          for r in points.rank_counts(cf.ALL_REDUCE)]
    if not ar:
        ar = list(prior.all_reduce)
        kept.append(f"all_reduce: no points; kept {prior.source}")
    if len(points.select(cf.SEND_RECV)[0]):
        p2p = cf.fit_send_recv(*points.select(cf.SEND_RECV))
    else:
        p2p = prior.send_recv
        kept.append(f"send_recv: no points; kept {prior.source}")
    source = f"accelgen calibrate --collectives: {points.source}"
    if kept:
        source += " (" + "; ".join(kept) + ")"
    return CollectiveTerms(all_reduce=ar, send_recv=p2p, source=source), kept


def report_lines(terms: CollectiveTerms, points: cf.CollectivePoints, hardware: HardwareProfile,
                 hidden: int, tp: int) -> tuple[list[str], dict[int, float]]:
    """The fits and their errors at the iteration's sizes; and the median |error| per rank
    count."""
    sizes = cf.iteration_sizes([hidden])
    link = hardware.interconnect_bandwidth
    lines = ["all_reduce of S bytes over n GPUs: max(latency, startup + 2 (n - 1) / n x S / "
             "busbw(S)), busbw growing as S^(1 - exponent) up to the largest size measured",
             f"  {'ranks':>5} {'latency':>9} {'startup':>9} {'busbw GB/s':>10} {'of link':>7} "
             f"{'exponent':>8} {'sizes':>5} {'median |err|':>12} {'p90':>6} "
             f"{'all points':>10}"]
    errors: dict[int, float] = {}
    for f in terms.all_reduce:
        s, t = points.select(cf.ALL_REDUCE, f.ranks)
        if len(s):
            c = cf.check_fit(cf.ALL_REDUCE, f.ranks, s, t,
                             cf.predict_all_reduce(f, f.ranks, s), sizes)
            errors[f.ranks] = c.median_abs
            n = len(c.iteration)
            err = (f"{n:>5} {c.median_abs:>12.1%} "
                   f"{np.percentile(np.abs(c.iteration), 90) if n else np.nan:>6.0%} "
                   f"{np.median(np.abs(c.all_points)) if len(c.all_points) else np.nan:>10.1%}")
        else:
            err = "(not measured here)"
        lines.append(f"  {f.ranks:>5} {f.latency_s * 1e6:>6.1f} us {f.startup_s * 1e6:>6.1f} us "
                     f"{f.bus_bandwidth / 1e9:>10.0f} {f.bus_bandwidth / link:>7.2f} "
                     f"{f.exponent:>8.2f} {err}")
    p = terms.send_recv
    s, t = points.select(cf.SEND_RECV)
    line = (f"send_recv (a pipeline hop): startup {p.startup_s * 1e6:.1f} us, busbw "
            f"{p.bus_bandwidth / 1e9:.0f} GB/s ({p.bus_bandwidth / link:.2f} of the link)")
    if len(s):
        c = cf.check_fit(cf.SEND_RECV, 2, s, t, cf.predict_send_recv(p, s), sizes)
        line += f"; median |error| {c.median_abs:.1%} at {len(c.iteration)} sizes"
    lines.append(line)
    if tp > 1:
        used = nearest_fit(terms, tp).ranks
        lines.append(f"the deployment's TP {tp} uses the fit of {used} ranks"
                     + ("" if used == tp else " (the nearest measured)"))
    lines.append(f"errors: predicted / measured - 1 at the measured sizes nearest to N x {hidden} "
                 "x 2 bytes, N = 1..8192 tokens (the iteration's all-reduces); 'all points': "
                 "every point in that range")
    return lines, errors


def run(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """Fit, print, write the deployment file (``data`` is calibrate's base configuration)."""
    from accelgen.costmodel.datasheets import resolve_hardware, resolve_model

    if args.points:
        raise ValueError("--collectives fits the analytic model's communication terms and "
                         "--points the calibrated model: give one of them")
    dep = Deployment.model_validate(data["deployment"])
    model, hardware = resolve_model(dep.model), resolve_hardware(dep.hardware)
    points = cf.CollectivePoints.concat([cf.read_collectives(p) for p in args.collectives])
    terms, kept = fit_terms(points, hardware)
    ar_ranks = points.rank_counts(cf.ALL_REDUCE)
    print(f"collectives: {points.source}: {len(points)} points (all_reduce over "
          f"{', '.join(map(str, ar_ranks)) or 'no'} ranks, "
          f"{len(points.select(cf.SEND_RECV)[0])} send_recv)")
    if points.note:
        print(f"  {points.note}")
    lines, errors = report_lines(terms, points, hardware, model.hidden_size, dep.tp)
    print("\n".join(lines + [f"not fitted: {k}" for k in kept]))
    dep_out = dep.model_copy(update={"cost_model": "analytic", "collectives": terms})
    data["deployment"] = Deployment.model_validate(dep_out.model_dump()).model_dump(
        mode="json", exclude_none=True)
    command = "accelgen calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if sys.argv[1:2] == ["calibrate"] else "accelgen calibrate --collectives ..."
    summary = ", ".join(f"TP {r} {e:.1%}" for r, e in errors.items())
    head = [f"Communication terms fitted by: {command}", f"points: {points.source}",
            *([points.note] if points.note else []), *[f"not fitted: {k}" for k in kept],
            f"all-reduce median |error| at the iteration's sizes: {summary or '-'}",
            "Use: accelgen simulate --config <this file> --trace ..."]
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    atomic_write(Path(args.out), "".join(f"# {h}\n" for h in head) + body)
    print(f"wrote {args.out} ({dep.model} on {dep.num_gpus} x {dep.hardware}, "
          f"{len(points)} points; all-reduce median |error| at the iteration's sizes: "
          f"{summary or 'no all-reduce points'})")
    return 0
