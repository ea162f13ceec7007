"""Fit the calibrated cost model (``calibrated.py``) to measured points (``points.py``).

Least squares on the relative error (pred / measured - 1: a 2 ms step and a 500 ms one count
alike), every term >= 0. The model is linear in its terms except for the weights floor's
roofline, so the fit starts from the best linear model (non-negative least squares, no floor)
and from that model with a floor (and from the prior's terms), refines each with
``scipy.optimize.least_squares`` and keeps the best.

Which terms are fitted (``identify``). A term no point constrains is not fitted: it keeps the
prior's value (``prior_terms``: the analytic model of the deployment's model and GPU, or 0), and
the fit says so. That is the case for decode terms given prefill points only, and for the
communication term unless the points span two or more layouts (at one layout it cannot be told
from the per-token work, which then absorbs it). When there are at least as many points as
constrained terms and the linear model's columns (relative error, the weights floor aside) have
full rank, every constrained term is fitted, the weights floor and its bend included: the full
fit. Otherwise (a paper's handful of points) the fit is partial: it takes the terms in the order
of ``PRIORITY`` that add to the rank of those taken before; each other term keeps the prior and
the fit names the terms it cannot be told from, and the weights floor and its bend keep the
prior's. Points of rank below 2 (one point, or points of one shape) identify nothing, not even
the fixed cost against the work: ``NotIdentifiable``, with what would identify each term.
``only`` (``--fit``) fits exactly the named terms, if the points identify them.

Held-out error (``calibrate``): ``loo`` refits without each point in turn (the model written is
the fit on all points); ``half`` fits on every other point of each kind, in order of size, and
reports the other half (the model written is that fit); ``none`` reports the fit alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from accelgen.core.specs import CalibratedTerms, HardwareProfile, ModelProfile
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
    fixed: dict[str, str]  # term -> why it was not fitted (it keeps the prior's value)
    rel_err: np.ndarray  # on the fitted points
    full: bool = True  # every constrained term fitted (False: a partial fit, or --fit)
    rank: int = 0  # of the design over the constrained terms, weights floor aside

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


# The order in which a partial fit takes terms (the points fit fewer terms than there are, or
# cannot tell some apart): the fixed cost, then the per-token and per-sequence work a reader
# calibrates a deployment for, then the finer terms. The weights floor comes last: only a full
# fit takes it (its bend needs every other term determined).
PRIORITY = ("overhead_s", "prefill_token_s", "decode_token_s", "causal_pair_s",
            "context_token_s", "context_pair_s", "prefill_seq_s", "comm_token_s")
# A term is told apart from the terms already taken when its column (relative error, unit norm)
# keeps more than this share of its length outside their span.
RANK_TOL = 1e-3
# What points identify each term (the messages of a partial fit and of a refusal).
NEEDS = {
    "overhead_s": "points of two or more sizes (the fixed cost against the per-token work)",
    "weights_s": "enough points to determine every other term, from small batches (weight "
                 "streaming) to large ones (compute), or points at two TP degrees",
    "prefill_token_s": "prefill points (prefill_tokens > 0) of two or more sizes",
    "prefill_seq_s": "batches of several prefill chunks (prefill_seqs > 1), or prefill points "
                     "beside decode points",
    "decode_token_s": "decode points (decode_seqs > 0) of two or more batch sizes",
    "causal_pair_s": "prefill points of three or more sizes (the attention's quadratic term)",
    "context_pair_s": "prefill chunks over prior context (prefill_ctx > 0)",
    "context_token_s": "decode points with different contexts per sequence (decode_ctx / "
                       "decode_seqs)",
    "comm_token_s": "points on two or more layouts (tp, pp)",
}


class NotIdentifiable(ValueError):
    """The points identify no term (or not the terms ``--fit`` asks for); the message says which
    points would identify what."""


@dataclass(frozen=True, slots=True)
class Identified:
    """Which terms a fit takes (``free``, ``TERMS`` order), why each other term keeps the prior
    (``held``), and whether it is the full fit (every term the points constrain, weights floor
    and bend included) or a partial one."""

    free: list[str]
    held: dict[str, str]
    full: bool
    rank: int  # of the design over the constrained terms (weights floor aside)


def _candidates(points: PointSet, num_layers: int) -> tuple[list[str], dict[str, str]]:
    """Terms some point constrains, and why each other term is not fitted."""
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


def _unit_columns(points: PointSet, num_layers: int) -> dict[str, np.ndarray]:
    """Each term's column of the linear model in relative-error units, scaled to unit length
    (the weights floor as the constant it is under compute: 1 / tp)."""
    a = _columns(features(points, num_layers)) / points.latency_s[:, None]
    out = {}
    for i, t in enumerate(TERMS):
        norm = float(np.linalg.norm(a[:, i]))
        out[t] = a[:, i] / norm if norm > 0 else a[:, i]
    return out


def _take(cols: dict[str, np.ndarray], order: list[str]
          ) -> tuple[list[str], dict[str, list[str]]]:
    """Greedy rank: the terms of ``order`` whose columns add to the span of those taken before
    (never more than there are points), and for each other term the taken terms it cannot be
    told from."""
    taken: list[str] = []
    basis: list[np.ndarray] = []
    same: dict[str, list[str]] = {}
    for t in order:
        c = cols[t]
        r = c - sum(((b @ c) * b for b in basis), np.zeros_like(c))
        if float(np.linalg.norm(r)) > RANK_TOL:
            taken.append(t)
            basis.append(r / np.linalg.norm(r))
            continue
        m = np.column_stack([cols[u] for u in taken])
        coef, *_ = np.linalg.lstsq(m, c, rcond=None)
        same[t] = [u for u, k in zip(taken, coef, strict=True) if abs(k) > 1e-6]
    return taken, same


def identify(points: PointSet, num_layers: int = 1,
             only: tuple[str, ...] | None = None) -> Identified:
    """The terms a fit on ``points`` takes (module docstring). ``only``: exactly these terms
    (``accelgen calibrate --fit``; ``weights_s`` brings the bend ``transition_p`` with it).
    Raises ``NotIdentifiable`` when the points identify no term, or not those of ``only``."""
    n = len(points)
    cands, held = _candidates(points, num_layers)
    cols = _unit_columns(points, num_layers)
    linear = [t for t in cands if t != "weights_s"]
    if only is not None:
        return _identify_only(points, only, cands, held, cols)
    rank = len(_take(cols, linear)[0])
    if n >= len(cands) and rank == len(linear):
        return Identified(cands, held, True, rank)
    if rank < 2:
        raise NotIdentifiable(_refusal(points, held))
    taken, same = _take(cols, [t for t in PRIORITY if t in linear])
    for t, like in same.items():
        held[t] = (f"cannot be told from {', '.join(like)} with these points (rank {rank} of "
                   f"{len(linear)}); needs {NEEDS[t]}")
    if "weights_s" in cands:
        held["weights_s"] = ("a partial fit keeps the weights floor and its bend (transition_p) "
                             f"at the prior; needs {NEEDS['weights_s']}")
    return Identified([t for t in TERMS if t in taken], held, False, rank)


def _identify_only(points: PointSet, only: tuple[str, ...], cands: list[str],
                   held: dict[str, str], cols: dict[str, np.ndarray]) -> Identified:
    unknown = [t for t in only if t not in TERMS]
    if unknown:
        raise ValueError(f"--fit: unknown term(s) {', '.join(unknown)}; the terms are "
                         f"{', '.join(TERMS)}")
    for t in only:
        if t not in cands:
            raise NotIdentifiable(f"{points.source}: --fit {t}: {held[t]}; needs {NEEDS[t]}")
    linear = [t for t in TERMS if t in only and t != "weights_s"]
    taken, same = _take(cols, linear)
    for t in linear:
        if t in same:
            raise NotIdentifiable(f"{points.source}: --fit {t}: cannot be told from "
                                  f"{', '.join(same[t])} with these points; needs {NEEDS[t]}")
    if len(points) < len(only):
        raise NotIdentifiable(f"{points.source}: {len(points)} points cannot determine the "
                              f"{len(only)} terms of --fit ({', '.join(only)})")
    free = [t for t in TERMS if t in only]
    out = {t: held.get(t, "not in --fit") for t in TERMS if t not in free}
    return Identified(free, out, False, len(taken))


def _refusal(points: PointSet, held: dict[str, str]) -> str:
    kinds = points.kinds
    have = ", ".join(f"{(kinds == k).sum()} {k}" for k in KINDS if (kinds == k).any())
    lines = [f"{points.source}: {len(points)} point(s) ({have}) identify no term: the fixed "
             "cost and the work of a batch are told apart only by points of two or more sizes. "
             "What identifies each term:"]
    for t in TERMS:
        note = f" (now: {held[t]})" if t in held else ""
        lines.append(f"  {t}: {NEEDS[t]}{note}")
    return "\n".join(lines)


def free_terms(points: PointSet, num_layers: int) -> tuple[list[str], dict[str, str]]:
    """Terms a fit on ``points`` takes, and why each other term keeps the prior."""
    ident = identify(points, num_layers)
    return ident.free, ident.held


def fit_terms(points: PointSet, num_layers: int = 1, prior: CalibratedTerms | None = None,
              only: tuple[str, ...] | None = None) -> Fit:
    """Least-squares terms for ``points`` (module docstring); ``prior`` supplies the terms the
    points do not identify (default: 0) and one starting point; ``only``: fit exactly these
    terms (``identify``)."""
    from scipy.optimize import least_squares, nnls

    prior = prior or CalibratedTerms()
    ident = identify(points, num_layers, only)
    free, fixed = ident.free, ident.held
    f = features(points, num_layers)
    y = points.latency_s
    base = _coef(prior)
    is_free = np.array([t in free for t in TERMS])
    fit_p = "weights_s" in free  # the bend is fitted with the floor

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
    k = len(free_idx)

    def unpack(x: np.ndarray) -> tuple[np.ndarray, float]:
        coef = base.copy()
        coef[free_idx] = x[:k] * scale[free_idx]
        return coef, float(x[-1]) if fit_p else prior.transition_p

    lower, upper = np.zeros(k), np.full(k, np.inf)
    if fit_p:
        lower, upper = np.append(lower, 1.0), np.append(upper, 16.0)
    best: tuple[float, np.ndarray, float] | None = None
    for coef0, p0 in candidates:
        coef0 = np.where(is_free, coef0, base)
        # A floor (fitted, or held at the prior's) makes the model nonlinear: refine.
        if coef0[1] > 0:
            x0 = coef0[free_idx] / scale[free_idx]
            if fit_p:
                x0 = np.append(x0, p0)
            res = least_squares(lambda x: residual(*unpack(x)), x0, bounds=(lower, upper),
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
    return Fit(terms, free, fixed, residual(_coef(terms), terms.transition_p), ident.full,
               ident.rank)


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
        return kind_stats(self.groups())

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


def kind_stats(groups: list[tuple[str, PointSet, np.ndarray]]) -> list[KindStat]:
    """MAPE, median and worst error of each (name, points, predictions) by kind (``all``: every
    kind)."""
    out = []
    for name, ps, pred in groups:
        err = pred / ps.latency_s - 1
        kinds = ps.kinds
        for kind in (*KINDS, "all"):
            sel = np.ones(len(ps), dtype=bool) if kind == "all" else kinds == kind
            if sel.any():
                out.append(_stat(name, kind, err[sel], ps.latency_s[sel], pred[sel]))
    return out


def _stat(group: str, kind: str, err: np.ndarray, y: np.ndarray, pred: np.ndarray) -> KindStat:
    return KindStat(group, kind, len(err), float(np.mean(np.abs(err))), float(np.median(err)),
                    float(err[np.argmax(np.abs(err))]), float(np.mean(y)), float(np.mean(pred)))


def calibrate(points: PointSet, num_layers: int = 1, prior: CalibratedTerms | None = None,
              holdout: Holdout = "loo",
              checks: dict[str, PointSet] | None = None,
              only: tuple[str, ...] | None = None) -> Calibration:
    """Fit (``only``: exactly these terms), with held-out errors by ``holdout`` (module
    docstring), and the fitted model's errors on each ``checks`` set (points measured
    elsewhere: out of sample)."""
    if holdout not in HOLDOUTS:
        raise ValueError(f"holdout must be one of {', '.join(HOLDOUTS)}, got {holdout!r}")
    n = len(points)
    held_pred = np.full(n, math.nan)
    in_fit = np.ones(n, dtype=bool)
    if holdout == "half":
        fit_idx, held_idx = split_half(points)
        if not len(held_idx):
            raise ValueError(f"{points.source}: {n} point(s) cannot be split in two")
        fit = fit_terms(points.take(fit_idx), num_layers, prior, only)
        in_fit[held_idx] = False
        held_pred[held_idx] = predict(fit.terms, points.take(held_idx), num_layers)
    else:
        fit = fit_terms(points, num_layers, prior, only)
        if holdout == "loo":
            if n > LOO_MAX_POINTS:
                raise ValueError(f"{points.source}: {n} points; leave-one-out refits at most "
                                 f"{LOO_MAX_POINTS} (use --holdout half)")
            for i in range(n):
                rest = points.take(np.delete(np.arange(n), i))
                try:
                    t = fit_terms(rest, num_layers, prior, only).terms
                except ValueError:
                    continue  # too few points left for the terms
                held_pred[i] = predict(t, points.take([i]), num_layers)[0]
    out = Calibration(fit, points, holdout, in_fit, predict(fit.terms, points, num_layers),
                      held_pred)
    for name, ps in (checks or {}).items():
        out.checks[name] = (ps, predict(fit.terms, ps, num_layers))
    return out
