r"""``accelgen calibrate``: fit the cost model's free terms to measured iteration latencies and
write a deployment file that uses them.

    # the A100 points the package carries (13B class, Vidur's profiles), fit on half of them
    accelgen calibrate --points a100-13b --deployment opt-13b --holdout half \
        --out deployments/opt-13b-calibrated.yaml
    # your own points: a profile CSV (accelgen profile), or typed in
    accelgen calibrate --points my-latencies.csv --deployment llama-13b --out my.yaml
    # a paper's handful of points: the terms they identify are fitted, the rest keep the
    # analytic model's value (or name the terms: --fit decode_token_s,context_token_s)
    accelgen calibrate --points paper.csv --check paper-check.csv --deployment llama-13b \
        --tp 2 --holdout none --out llama13b-tp2.yaml
    # a replay's per-step log, checked on another replay (out of sample)
    accelgen calibrate --points results/replay-a --check results/replay-b \
        --config experiment.yaml --out engine.yaml
    accelgen simulate --config deployments/opt-13b-calibrated.yaml --trace t.parquet ...

Points (``accelgen.costmodel.points``): a CSV with ``prefill_tokens``, ``prefill_seqs``,
``prefill_ctx``, ``decode_seqs``, ``decode_ctx`` (total context of the decodes) and
``latency_s`` or ``latency_ms`` (optional ``tp``, ``pp``: the layout measured, default the
deployment's), or a results directory of a replay or simulation (its busy steps, each with its
period). The model and the fit: ``accelgen.costmodel.calibrated``, ``calibrate``; terms the
points do not identify keep the prior (the deployment's analytic model, or 0), and the output
says which and why; with no identifiable term it exits 2 and says which points would identify
what. Printed: the terms, each point's error (all points up to --show, else the worst), MAPE by
kind for the fitted and the held-out points (and each --check set), and the deployment's
analytic model on the same points beside them. Written: the deployment file (YAML,
``deployment:`` with ``cost_model: calibrated``; comments say what it was fitted on), every
point's error as CSV (--errors) and, with --summary, the MAPE table and the terms as JSON.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from accelgen.cli import collectives as collectives_cli
from accelgen.cli.options import hidden_alias
from accelgen.core.specs import CalibratedTerms, Deployment, kv_cache_gb_arg, load_yaml
from accelgen.costmodel.calibrate import (
    HOLDOUTS,
    LOO_MAX_POINTS,
    Calibration,
    Holdout,
    KindStat,
    calibrate,
    kind_stats,
)
from accelgen.costmodel.calibrated import TERMS
from accelgen.costmodel.calibration_files import (
    BUILTIN_POINTS,
    atomic_write,
    report_text,
    stat_line,
    write_deployment,
    write_errors,
)
from accelgen.costmodel.points import PointSet, read_points


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit the cost model to measured latencies; write a "
                       "deployment file", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", action="append", default=[], metavar="CSV|DIR|NAME",
                   help="measured points: a CSV, a results directory (step log) or a built-in "
                        f"set ({', '.join(BUILTIN_POINTS)}); repeat to pool several")
    collectives_cli.add_option(p)
    p.add_argument("--check", action="append", default=[], metavar="CSV|DIR",
                   help="points to predict out of sample with the fitted model (repeatable)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--deployment", help="a built-in deployment (e.g. opt-13b) to calibrate")
    which.add_argument("--config", type=Path,
                       help="a YAML with a `deployment:` section (an experiment config) to "
                            "calibrate; its other sections are kept")
    for name, kind, what in (("model", str, "model shape"), ("hardware", str, "GPU profile"),
                             ("tp", int, "tensor-parallel degree"),
                             ("pp", int, "pipeline-parallel degree"),
                             ("kv-cache-gb", kv_cache_gb_arg, "KV cache GiB per GPU, or auto"),
                             ("block-size", int, "KV block size"),
                             ("max-model-len", int, "context length")):
        p.add_argument(f"--{name}", type=kind, help=f"deployment override: {what}")
    hidden_alias(p, "--kv-gb", "kv_cache_gb")
    p.add_argument("--holdout", choices=HOLDOUTS,
                   help=f"held-out error: leave-one-out (default up to {LOO_MAX_POINTS} "
                        "points), every other point of each kind (half; default beyond), none")
    p.add_argument("--prior", choices=("analytic", "zero"), default="analytic",
                   help="value of terms the points do not identify: the deployment's analytic "
                        "model (default) or 0")
    p.add_argument("--fit", type=term_list, metavar="TERM,...",
                   help="fit exactly these terms, the others keep the prior (default: every "
                        "term the points identify); terms: " + ", ".join(TERMS))
    p.add_argument("--show", type=int, default=60, metavar="N",
                   help="print every point up to N points, else the N worst (default 60)")
    p.add_argument("--out", type=Path, required=True, help="deployment file to write (YAML)")
    p.add_argument("--errors", type=Path,
                   help="per-point errors CSV (default: beside --out, <name>.errors.csv)")
    p.add_argument("--summary", type=Path,
                   help="also write the MAPE table (fitted and analytic model) and the terms "
                        "as JSON")
    p.set_defaults(func=run)


def term_list(text: str) -> tuple[str, ...]:
    """``--fit``'s value: comma-separated term names."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in TERMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown term(s) {', '.join(unknown) or repr(text)}; "
                                         f"the terms are {', '.join(TERMS)}")
    return names


def load_points(spec: str, dep: Deployment) -> PointSet:
    path = BUILTIN_POINTS.get(spec, Path(spec))
    return read_points(path, tp=dep.tp, pp=dep.pp)


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment/deployment mapping to calibrate (validated), with the overrides."""
    data: dict[str, Any] = {}
    if args.config is not None:
        data = load_yaml(args.config)
        if "deployment" not in data:
            raise ValueError(f"{args.config}: no `deployment:` section")
    if args.deployment:
        from accelgen.costmodel.datasheets import resolve_deployment

        data["deployment"] = resolve_deployment(args.deployment).model_dump(mode="json")
    dep = dict(data.get("deployment") or {})
    for key, value in (("model", args.model), ("hardware", args.hardware), ("tp", args.tp),
                       ("pp", args.pp), ("kv_cache_gb", args.kv_cache_gb),
                       ("block_size", args.block_size), ("max_model_len", args.max_model_len)):
        if value is not None:
            dep[key] = value
    dep.update(cost_model="analytic", profile_csv=None, calibration=None, collectives=None)
    data["deployment"] = Deployment.model_validate(dep).model_dump(mode="json")
    return data


def prior_for(dep: Deployment, kind: str) -> CalibratedTerms:
    if kind == "zero":
        return CalibratedTerms(source="0 (--prior zero)")
    from accelgen.costmodel.calibrate import prior_terms
    from accelgen.costmodel.datasheets import resolve_hardware, resolve_model

    return prior_terms(resolve_model(dep.model), resolve_hardware(dep.hardware))


def run(args: argparse.Namespace) -> int:
    from accelgen.costmodel.datasheets import resolve_model

    data = base_config(args)
    if args.collectives:
        return collectives_cli.run(args, data)
    if not args.points:
        raise ValueError("calibrate: give --points (iteration latencies) or --collectives "
                         "(nccl-tests output)")
    dep = Deployment.model_validate(data["deployment"])
    layers = resolve_model(dep.model).num_layers
    points = PointSet.concat([load_points(s, dep) for s in args.points])
    checks = {c: read_points(c, tp=dep.tp, pp=dep.pp) for c in args.check}
    holdout: Holdout = args.holdout or ("loo" if len(points) <= LOO_MAX_POINTS else "half")
    prior = prior_for(dep, args.prior)
    cal = calibrate(points, layers, prior, holdout, checks, args.fit)
    analytic = analytic_errors(cal, dep)
    print(report_text(cal, prior, args.show))
    print(analytic_text(analytic, dep))
    dep_out = dep.model_copy(update={"cost_model": "calibrated", "calibration": cal.fit.terms})
    data["deployment"] = Deployment.model_validate(dep_out.model_dump()).model_dump(
        mode="json", exclude_none=True)
    errors = args.errors or args.out.with_name(args.out.stem + ".errors.csv")
    command = "accelgen calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if sys.argv[1:2] == ["calibrate"] else "accelgen calibrate"
    write_deployment(args.out, data, cal, command)
    write_errors(errors, cal)
    if args.summary is not None:
        write_summary(args.summary, cal, analytic, dep, command)
    pf, dec = cal.mape("held-out", "prefill"), cal.mape("held-out", "decode")
    held = ("held-out MAPE " + ", ".join(f"{k} {v:.1%}" for k, v in
                                         (("prefill", pf), ("decode", dec)) if v == v)
            if holdout != "none" else "no held-out points")
    also = f", {errors} and {args.summary}" if args.summary is not None else f" and {errors}"
    print(f"wrote {args.out} ({dep.model} on {dep.tp * dep.pp} x {dep.hardware}, "
          f"{len(points)} points, {len(cal.fit.fitted)} terms fitted, {len(cal.fit.fixed)} "
          f"held; {held}){also}")
    return 0


def analytic_errors(cal: Calibration, dep: Deployment) -> list[KindStat]:
    """The MAPE table (``Calibration.summary``) of the deployment's analytic model (A100-fitted
    efficiencies on the deployment's hardware, ``analytic.py``) on the same sets of points,
    each point at its own layout: the model a calibration replaces."""
    from accelgen.costmodel.factory import make_cost_model

    def predict(ps: PointSet) -> np.ndarray:
        out = np.empty(len(ps))
        for i, shape in enumerate(ps.shapes):
            layout = dep.model_copy(update={"tp": int(ps.tp[i]), "pp": int(ps.pp[i]),
                                            "cost_model": "analytic", "calibration": None})
            out[i] = make_cost_model(layout).iteration_time(shape)
        return out

    try:
        return kind_stats([(name, ps, predict(ps)) for name, ps, _ in cal.groups()])
    except ValueError as exc:  # e.g. a layout the analytic model cannot split the heads over
        print(f"no analytic comparison: {exc}", file=sys.stderr)
        return []


def analytic_text(stats: list[KindStat], dep: Deployment) -> str:
    if not stats:
        return f"the analytic model of {dep.model} on {dep.hardware}: no comparison"
    lines = [f"the analytic model of {dep.model} on {dep.hardware} (not fitted) on the same "
             "points, MAPE by kind:"]
    lines += [stat_line(k) for k in stats]
    return "\n".join(lines)


def summary_data(cal: Calibration, analytic: list[KindStat], dep: Deployment,
                 command: str) -> dict[str, Any]:
    """What ``--summary`` writes: the command, the terms (fitted or held, and why), and the MAPE
    table of the fitted model and of the deployment's analytic model."""
    from dataclasses import asdict

    t = cal.fit.terms
    return {
        "command": command, "points": cal.points.source, "num_points": len(cal.points),
        "holdout": cal.holdout,
        "deployment": {"model": dep.model, "hardware": dep.hardware, "tp": dep.tp, "pp": dep.pp},
        "full_fit": cal.fit.full,
        "terms": {name: {"value": getattr(t, name), "fitted": name in cal.fit.fitted,
                         **({"held": cal.fit.fixed[name]} if name in cal.fit.fixed else {})}
                  for name in TERMS} | {"transition_p": {"value": t.transition_p}},
        "calibrated": [asdict(k) for k in cal.summary()],
        "analytic": [asdict(k) for k in analytic],
    }


def write_summary(path: Path, cal: Calibration, analytic: list[KindStat], dep: Deployment,
                  command: str) -> None:
    import json

    data = summary_data(cal, analytic, dep, command)
    atomic_write(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


