"""Fit the calibrated cost model (``calibrated.py``) to measured points (``points.py``).

Least squares on the relative error (pred / measured - 1: a 2 ms step and a 500 ms one count
alike), every term >= 0. The model is linear in its terms except for the weights floor's
roofline, so the fit starts from the best linear model (non-negative least squares, no floor)
and from that model with a floor (and from the prior's terms), refines each with
``scipy.optimize.least_squares`` and keeps the best.

A term no point constrains is not fitted: it keeps the prior's value (``prior_terms``: the
analytic model of the deployment's model and GPU, or 0), and the fit says so. That is the case
for decode terms given prefill points only, and for the communication term unless the points
span two or more layouts (at one layout it cannot be told from the per-token work, which then
absorbs it).

Held-out error (``calibrate``): ``loo`` refits without each point in turn (the model written is
the fit on all points); ``half`` fits on every other point of each kind, in order of size, and
reports the other half (the model written is that fit); ``none`` reports the fit alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from accelgen.config import CalibratedTerms, HardwareProfile, ModelProfile
from accelgen.costmodel.calibrated import TERMS, Features
from accelgen.costmodel.points import KINDS, PointSet, kind_of

Holdout = Literal["loo", "half", "none"]
HOLDOUTS: tuple[Holdout, ...] = ("loo", "half", "none")
LOO_MAX_POINTS = 400  # leave-one-out refits beyond this would take long; use half


def prior_terms(model: ModelProfile, hardware: HardwareProfile) -> CalibratedTerms:
    """The analytic model's terms (``analytic.py``, A100-fitted efficiencies) in the calibrated
    model's form, for ``model`` on one ``hardware`` GPU: the starting point of a fit and the
    value of every term the points do not constrain."""
    from accelgen.costmodel.analytic import A100_CALIBRATION, AnalyticCostModel
    from accelgen.costmodel.collectives import token_transfer_s

    c = A100_CALIBRATION
    a = AnalyticCostModel(model, hardware, calibration=c)
    layers = model.num_layers
    return CalibratedTerms(
        overhead_s=layers * (c.linear_layer_fixed_s + c.attn_prefill_fixed_s),
        weights_s=a._lin_w + a._lm_w,
        transition_p=c.linear_transition_p,
        prefill_token_s=a._lin_tok,
        prefill_seq_s=0.0,
        decode_token_s=a._lin_tok + a._dec_seq,
        causal_pair_s=a._causal,
        context_pair_s=a._ctx,
        context_token_s=a._dec_ctx,
        comm_token_s=token_transfer_s(hardware, model.hidden_size * model.dtype_bytes),
        source=f"analytic model of {model.name} on {hardware.name} (not fitted)")


@dataclass(slots=True)
class Fit:
    """Fitted terms, which were fitted, and why the others were not."""

    terms: CalibratedTerms
    fitted: list[str]
    fixed: dict[str, str]  # term -> why it was not fitted
    rel_err: np.ndarray  # on the fitted points

    @property
    def rms(self) -> float:
        return float(np.sqrt(np.mean(self.rel_err ** 2)))


def _coef(terms: CalibratedTerms) -> np.ndarray:
    return np.array([getattr(terms, t) for t in TERMS], dtype=np.float64)


def features(points: PointSet, num_layers: int) -> Features:
    return Features.of(points.shapes, points.tp, points.pp, num_layers)


def predict(terms: CalibratedTerms, points: PointSet, num_layers: int) -> np.ndarray:
    return features(points, num_layers).predict(_coef(terms), terms.transition_p)


def _columns(f: Features) -> np.ndarray:
    """The linear model's columns (``TERMS`` order; the weights floor enters as a constant)."""
    ones = np.ones(len(f))
    return np.column_stack([ones, ones * f.inv_tp, f.prefill_tokens * f.inv_tp, f.prefill_seqs,
                            f.decode_seqs * f.inv_tp, f.causal_pairs * f.inv_tp,
                            f.context_pairs * f.inv_tp, f.decode_ctx * f.inv_tp, f.comm])


def free_terms(points: PointSet, num_layers: int) -> tuple[list[str], dict[str, str]]:
    """Terms the points constrain, and why each other term is not fitted."""
    f = features(points, num_layers)
    fixed: dict[str, str] = {}
    used = {"prefill_token_s": f.prefill_tokens, "prefill_seq_s": f.prefill_seqs,
            "decode_token_s": f.decode_seqs,
            "causal_pair_s": f.causal_pairs, "context_pair_s": f.context_pairs,
            "context_token_s": f.decode_ctx}
    why = {"prefill_token_s": "no point has prefill tokens",
           "prefill_seq_s": "no point has prefill tokens",
           "decode_token_s": "no point has decodes",
           "causal_pair_s": "no point has prefill tokens",
           "context_pair_s": "no prefill chunk over prior context",
           "context_token_s": "no point has decodes"}
    for name, col in used.items():
        if not (col > 0).any():
            fixed[name] = why[name]
    layouts = sorted({(int(a), int(b)) for a, b in zip(points.tp, points.pp, strict=True)})
    vol = {round(float(v), 9) for v in f.comm / np.maximum(f.prefill_tokens + f.decode_seqs, 1)}
    if len(vol) < 2:
        tp, pp = layouts[0]
        fixed["comm_token_s"] = (f"every point is on one layout (tp {tp}, pp {pp}): transfers "
                                 "cannot be told from per-token work")
    return [t for t in TERMS if t not in fixed], fixed


def fit_terms(points: PointSet, num_layers: int = 1,
              prior: CalibratedTerms | None = None) -> Fit:
    """Least-squares terms for ``points`` (module docstring); ``prior`` supplies the terms the
    points do not constrain (default: 0) and one starting point."""
    from scipy.optimize import least_squares, nnls

    prior = prior or CalibratedTerms()
    free, fixed = free_terms(points, num_layers)
    if len(points) < len(free):
        raise ValueError(f"{points.source}: {len(points)} points cannot determine the "
                         f"{len(free)} terms {', '.join(free)}; give more points")
    f = features(points, num_layers)
    y = points.latency_s
    base = _coef(prior)
    is_free = np.array([t in free for t in TERMS])

    def residual(coef: np.ndarray, p: float) -> np.ndarray:
        return f.predict(coef, p) / y - 1.0

    # 1. The linear model (no weights floor): non-negative least squares on relative error.
    a = _columns(f) / y[:, None]
    lin_free = is_free & (np.array(TERMS) != "weights_s")
    fixed_part = a[:, ~is_free] @ base[~is_free]
    rhs = 1.0 - fixed_part
    cols = a[:, lin_free]
    norms = np.linalg.norm(cols, axis=0)
    norms[norms == 0] = 1.0
    sol, _ = nnls(cols / norms, rhs)
    start = base.copy()
    start[lin_free] = sol / norms
    start[TERMS.index("weights_s")] = 0.0 if "weights_s" in free else base[1]
    candidates = [(start, prior.transition_p)]
    # 2. With a weights floor: from the linear fit with a floor of half the fastest point, and
    # from the prior.
    if "weights_s" in free:
        floor = start.copy()
        floor[1] = 0.5 * float(y.min())
        floor[0] *= 0.5
        candidates += [(floor, max(prior.transition_p, 1.5)), (base, prior.transition_p)]
    # Scale every free term to order 1: the value that alone would give the median latency.
    med = float(np.median(y))
    scale = np.ones(len(TERMS))
    cmat = _columns(f)
    for i in range(len(TERMS)):
        col = cmat[:, i]
        nz = col[col > 0]
        scale[i] = med / float(np.median(nz)) if len(nz) else 1.0
    free_idx = np.flatnonzero(is_free)

    def unpack(x: np.ndarray) -> tuple[np.ndarray, float]:
        coef = base.copy()
        coef[free_idx] = x[:-1] * scale[free_idx]
        return coef, float(x[-1])

    best: tuple[float, np.ndarray, float] | None = None
    for coef0, p0 in candidates:
        coef0 = np.where(is_free, coef0, base)
        if "weights_s" in free and coef0[1] > 0:
            x0 = np.append(coef0[free_idx] / scale[free_idx], p0)
            res = least_squares(lambda x: residual(*unpack(x)), x0,
                                bounds=(np.append(np.zeros(len(free_idx)), 1.0),
                                        np.append(np.full(len(free_idx), np.inf), 16.0)),
                                method="trf")
            coef, p = unpack(res.x)
        else:
            coef, p = coef0, p0
        cost = float(np.sum(residual(coef, p) ** 2))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, coef, p)
    assert best is not None
    _, coef, p = best
    # A term whose share of the median point is below a billionth is 0 (solver round-off).
    coef[coef / scale < 1e-9] = 0.0
    coef = np.where(is_free, coef, base)
    if coef[1] == 0:
        p = prior.transition_p  # no floor: the bend does not exist
    terms = CalibratedTerms(**{t: float(max(v, 0.0)) for t, v in zip(TERMS, coef, strict=True)},
                            transition_p=float(min(max(p, 1.0), 16.0)),
                            source=f"accelgen calibrate on {points.source}")
    return Fit(terms, free, fixed, residual(_coef(terms), terms.transition_p))


def split_half(points: PointSet) -> tuple[np.ndarray, np.ndarray]:
    """Indices of every other point of each kind in order of size (fit), and the rest."""
    kinds = points.kinds
    fit_idx: list[int] = []
    held: list[int] = []
    for kind in KINDS:
        idx = [i for i in range(len(points)) if kinds[i] == kind]
        idx.sort(key=lambda i: (points.shapes[i].prefill_tokens, points.shapes[i].prefill_attn,
                                points.shapes[i].decode_seqs, points.shapes[i].decode_ctx,
                                int(points.tp[i]), int(points.pp[i]), i))
        fit_idx += idx[0::2]
        held += idx[1::2]
    return np.array(sorted(fit_idx), dtype=np.int64), np.array(sorted(held), dtype=np.int64)


@dataclass(slots=True)
class Calibration:
    """A fit with its per-point errors. ``in_fit[i]``: point i is one the written model was
    fitted on; ``pred``: the written model's predictions; ``held_pred``: each held-out point's
    prediction by a model fitted without it (NaN where there is none); ``checks``: the written
    model's predictions of other point sets (out of sample)."""

    fit: Fit
    points: PointSet
    holdout: Holdout
    in_fit: np.ndarray
    pred: np.ndarray
    held_pred: np.ndarray
    checks: dict[str, tuple[PointSet, np.ndarray]] = field(default_factory=dict)

    def rows(self) -> list[PointError]:
        """One row per point (``errors.csv``): the calibration points, then every check set."""
        out = [_row(self.points, i, "fit" if self.in_fit[i] else "held-out", self.pred[i],
                    self.held_pred[i]) for i in range(len(self.points))]
        for name, (ps, pred) in self.checks.items():
            out += [_row(ps, i, f"check:{name}", pred[i], pred[i]) for i in range(len(ps))]
        return out

    def groups(self) -> list[tuple[str, PointSet, np.ndarray]]:
        """(name, points, predictions) of every reported set: ``fit`` (the points the written
        model was fitted on, in sample), ``held-out`` (each by a model fitted without it) and
        ``check:<name>``."""
        out = [("fit", self.points.take(np.flatnonzero(self.in_fit)), self.pred[self.in_fit])]
        held = np.isfinite(self.held_pred)
        if held.any():
            out.append(("held-out", self.points.take(np.flatnonzero(held)),
                        self.held_pred[held]))
        out += [(f"check:{name}", ps, pred) for name, (ps, pred) in self.checks.items()]
        return out

    def summary(self) -> list[KindStat]:
        """MAPE, median and worst error by set and kind (``all``: every kind)."""
        out = []
        for name, ps, pred in self.groups():
            err = pred / ps.latency_s - 1
            kinds = ps.kinds
            for kind in (*KINDS, "all"):
                sel = np.ones(len(ps), dtype=bool) if kind == "all" else kinds == kind
                if sel.any():
                    out.append(_stat(name, kind, err[sel], ps.latency_s[sel], pred[sel]))
        return out

    def mape(self, group: str, kind: str) -> float:
        for r in self.summary():
            if r.set == group and r.kind == kind:
                return r.mape
        return math.nan


@dataclass(frozen=True, slots=True)
class PointError:
    """One point's error (a row of ``errors.csv``)."""

    where: str
    set: str  # fit, held-out or check:<name>
    kind: str
    prefill_tokens: int
    prefill_seqs: int
    prefill_attn: float
    decode_seqs: int
    decode_ctx: int
    tp: int
    pp: int
    measured_s: float
    predicted_s: float
    error: float  # predicted / measured - 1, by the written model
    held_out_error: float  # by a model fitted without the point (NaN: none)

    @property
    def prefill_ctx(self) -> int:
        """The chunks' prior context (equal chunks, as the points format has them)."""
        n, k = self.prefill_tokens, self.prefill_seqs
        return round(self.prefill_attn / n - (n / k + 1) / 2) if n else 0


@dataclass(frozen=True, slots=True)
class KindStat:
    """Errors of one set of points of one kind."""

    set: str
    kind: str
    n: int
    mape: float
    median_error: float
    worst: float  # the error of largest magnitude
    measured_mean_s: float
    predicted_mean_s: float


def _row(ps: PointSet, i: int, role: str, pred: float, held: float) -> PointError:
    s = ps.shapes[i]
    y = float(ps.latency_s[i])
    return PointError(ps.where[i], role, kind_of(s), s.prefill_tokens, s.prefill_seqs,
                      s.prefill_attn, s.decode_seqs, s.decode_ctx, int(ps.tp[i]), int(ps.pp[i]),
                      y, float(pred), float(pred) / y - 1,
                      float(held) / y - 1 if math.isfinite(held) else math.nan)


def _stat(group: str, kind: str, err: np.ndarray, y: np.ndarray, pred: np.ndarray) -> KindStat:
    return KindStat(group, kind, len(err), float(np.mean(np.abs(err))), float(np.median(err)),
                    float(err[np.argmax(np.abs(err))]), float(np.mean(y)), float(np.mean(pred)))


def calibrate(points: PointSet, num_layers: int = 1, prior: CalibratedTerms | None = None,
              holdout: Holdout = "loo",
              checks: dict[str, PointSet] | None = None) -> Calibration:
    """Fit, with held-out errors by ``holdout`` (module docstring), and the fitted model's
    errors on each ``checks`` set (points measured elsewhere: out of sample)."""
    if holdout not in HOLDOUTS:
        raise ValueError(f"holdout must be one of {', '.join(HOLDOUTS)}, got {holdout!r}")
    n = len(points)
    held_pred = np.full(n, math.nan)
    in_fit = np.ones(n, dtype=bool)
    if holdout == "half":
        fit_idx, held_idx = split_half(points)
        if not len(held_idx):
            raise ValueError(f"{points.source}: {n} point(s) cannot be split in two")
        fit = fit_terms(points.take(fit_idx), num_layers, prior)
        in_fit[held_idx] = False
        held_pred[held_idx] = predict(fit.terms, points.take(held_idx), num_layers)
    else:
        fit = fit_terms(points, num_layers, prior)
        if holdout == "loo":
            if n > LOO_MAX_POINTS:
                raise ValueError(f"{points.source}: {n} points; leave-one-out refits at most "
                                 f"{LOO_MAX_POINTS} (use --holdout half)")
            for i in range(n):
                rest = points.take(np.delete(np.arange(n), i))
                try:
                    t = fit_terms(rest, num_layers, prior).terms
                except ValueError:
                    continue  # too few points left for the terms
                held_pred[i] = predict(t, points.take([i]), num_layers)[0]
    out = Calibration(fit, points, holdout, in_fit, predict(fit.terms, points, num_layers),
                      held_pred)
    for name, ps in (checks or {}).items():
        out.checks[name] = (ps, predict(fit.terms, ps, num_layers))
    return out
