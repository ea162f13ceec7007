"""What ``accelgen calibrate`` reads and writes besides its options: the point sets the package
carries, the report it prints, the calibrated deployment file (and reading its terms back, which
the pipeline and ``accelgen pivot`` do), and the per-point errors CSV."""

from __future__ import annotations

import csv
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from accelgen.core.specs import CalibratedTerms, load_yaml
from accelgen.costmodel.calibrate import Calibration, KindStat, PointError
from accelgen.costmodel.calibrated import TERMS

DATA = Path(__file__).parent / "data"
# Point sets the package carries (name -> file; each file's header names its source).
BUILTIN_POINTS = {"a100-13b": DATA / "a100_13b_class.csv"}
TERM_UNITS = {"overhead_s": ("ms", 1e3), "weights_s": ("ms", 1e3),
              "prefill_token_s": ("us/token", 1e6), "prefill_seq_s": ("us/chunk", 1e6),
              "decode_token_s": ("us/seq", 1e6),
              "causal_pair_s": ("ns/pair", 1e9), "context_pair_s": ("ns/pair", 1e9),
              "context_token_s": ("ns/token", 1e9), "comm_token_s": ("ns/token", 1e9)}


def stat_line(k: KindStat) -> str:
    return (f"  {k.set:<24} {k.kind:<7} n {k.n:>5}  MAPE {k.mape:>6.1%}  median "
            f"{k.median_error:>+6.1%}  worst {k.worst:>+7.1%}  "
            f"{k.measured_mean_s * 1e3:.4g} / {k.predicted_mean_s * 1e3:.4g} ms")


def _term_line(name: str, value: float, note: str) -> str:
    if name == "transition_p":
        return f"  {name:<16} {value:>12.4g}            {note}"
    unit, scale = TERM_UNITS[name]
    return f"  {name:<16} {value * scale:>12.4g} {unit:<10} {note}"


def report_text(cal: Calibration, prior: CalibratedTerms, show: int = 60) -> str:
    """What ``accelgen calibrate`` prints: points, terms, per-point errors, summary."""
    ps = cal.points
    kinds = ps.kinds
    counts = ", ".join(f"{(kinds == k).sum()} {k}" for k in ("prefill", "decode", "mixed")
                       if (kinds == k).any())
    lines = [f"points: {ps.source}: {len(ps)} ({counts})"]
    if ps.note:
        lines.append(f"  {ps.note}")
    lines.append(f"held-out: {cal.holdout}"
                 + {"loo": " (each point predicted by a fit on all the others; the written "
                            "model is the fit on all points)",
                    "half": " (fit on every other point of each kind, in order of size; the "
                            "written model is that fit)",
                    "none": ""}[cal.holdout])
    fit = cal.fit
    if fit.full:
        how = "every term the points constrain"
    elif any(v == "not in --fit" for v in fit.fixed.values()):
        how = "the terms of --fit"
    else:
        how = (f"partial: the {len(fit.fitted)} terms the points identify (rank {fit.rank}); "
               "the others keep the prior")
    lines.append(f"fitted: {len(fit.fitted)} of {len(TERMS)} terms ({how}); held at the prior: "
                 f"{', '.join(fit.fixed) or 'none'}")
    lines.append("terms (for the whole model on one GPU; the deployment's TP divides the work "
                 "terms):")
    t = fit.terms
    for name in TERMS:
        note = ("fitted" if name in fit.fitted else
                f"held ({fit.fixed[name]}): {prior.source or 'prior'}")
        lines.append(_term_line(name, getattr(t, name), note))
    bend = ("fitted" if "weights_s" in fit.fitted else
            "held with the weights floor" if t.weights_s > 0 else "no weights floor")
    lines.append(_term_line("transition_p", t.transition_p, bend))
    own = [r for r in cal.rows() if not r.set.startswith("check:")]
    shown = own if len(own) <= show else sorted(
        own, key=lambda r: -abs(r.held_out_error if math.isfinite(r.held_out_error)
                                else r.error))[:show]
    title = "every point" if len(own) <= show else f"the {len(shown)} worst of {len(own)} points"
    lines.append(f"{title} (ms; error = predicted / measured - 1; held-out: by a model fitted "
                 "without the point):")
    lines.append(f"  {'set':<8} {'kind':<7} {'prefill':>7} {'chunks':>6} {'pf ctx':>7} "
                 f"{'decodes':>7} {'dec ctx':>8} {'tp':>2} {'pp':>2} {'measured':>9} "
                 f"{'predicted':>9} {'error':>7} {'held-out':>8}")
    for r in shown:
        held = f"{r.held_out_error:>+8.1%}" if math.isfinite(r.held_out_error) else ""
        lines.append(f"  {r.set:<8} {r.kind:<7} {r.prefill_tokens:>7} {r.prefill_seqs:>6} "
                     f"{r.prefill_ctx:>7} {r.decode_seqs:>7} {r.decode_ctx:>8} {r.tp:>2} "
                     f"{r.pp:>2} {r.measured_s * 1e3:>9.4g} {r.predicted_s * 1e3:>9.4g} "
                     f"{r.error:>+7.1%} {held:>8}")
    lines.append("MAPE by kind (mean |error|; median and worst error; mean latency measured / "
                 "predicted):")
    lines += [stat_line(k) for k in cal.summary()]
    return "\n".join(lines)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename,
    so that a failure leaves no half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def deployment_text(data: dict[str, Any], cal: Calibration, command: str) -> str:
    """The deployment file: comments (what it was fitted on and how well), then the YAML."""
    ps = cal.points
    head = [f"Calibrated cost model written by: {command}",
            f"points: {ps.source} ({len(ps)} points)"]
    if ps.note:
        head.append(ps.note)
    head.append(f"terms fitted: {', '.join(cal.fit.fitted)}")
    head += [f"held at the prior: {k} ({v})" for k, v in cal.fit.fixed.items()]
    head += [f"{k.set} {k.kind}: n {k.n}, MAPE {k.mape:.1%}, worst {k.worst:+.1%}"
             for k in cal.summary()]
    head.append("Use: accelgen simulate --config <this file> --trace ... (or a pipeline "
                "deployment's calibration_file)")
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" for line in head) + body


def write_deployment(path: Path, data: dict[str, Any], cal: Calibration, command: str) -> None:
    atomic_write(path, deployment_text(data, cal, command))


class CalibrationFileError(ValueError):
    """A deployment file without usable calibrated terms; the message names the file and key."""


def read_calibration(path: Path | str) -> CalibratedTerms:
    """The calibrated terms of a deployment file ``accelgen calibrate`` wrote
    (``deployment.calibration``)."""
    from pydantic import ValidationError

    path = Path(path)
    try:
        data = load_yaml(path)
    except ValueError as exc:
        raise CalibrationFileError(str(exc)) from None
    dep = data.get("deployment")
    terms = dep.get("calibration") if isinstance(dep, dict) else None
    if not isinstance(terms, dict):
        raise CalibrationFileError(f"{path}: no `deployment.calibration` mapping (write the file "
                                   "with `accelgen calibrate`)")
    try:
        return CalibratedTerms.model_validate(terms)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        raise CalibrationFileError(f"{path}: deployment.calibration.{key}: {err['msg']}") from None


def write_errors(path: Path, cal: Calibration) -> None:
    """Every point's error (``PointError``'s fields) as CSV."""
    from dataclasses import fields
    from io import StringIO

    names = [f.name for f in fields(PointError)]
    buf = StringIO()
    w = csv.writer(buf)
    w.writerow(names)
    for r in cal.rows():
        w.writerow([f"{v:.6g}" if isinstance(v, float) else v
                    for v in (getattr(r, n) for n in names)])
    atomic_write(path, buf.getvalue())
