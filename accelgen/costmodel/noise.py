"""The engine's noise around its cost model: charging the simulator's iterations with it, and
fitting it to real replays (SPEC 13, docs/simulator.md *Noise*).

A real engine's step takes ``predicted x run factor x step error``: the run factor is how fast
the host ran this whole run against the calibration (measured 0.76-1.41 between replays of the
CPU engine), the step error what is left step by step. :class:`NoisyCost` charges a simulation
that way (``accelgen.core.specs.NoiseSpec``); the policy keeps planning with the plain model, as
the plugin inside the engine does. :func:`fit_noise` fits the two parts to replays' steps:
``ratio = measured span / predicted`` per step (``accelgen.costmodel.points``), a replay's run
factor is the median of its ratios, and the step errors are the ratios over it, pooled. A real
host's slow steps come in runs (its phases: clocks, neighbours, the client beside the engine);
the fit reads how much of the step error carries over between steps from the errors'
autocorrelation and the simulator draws the errors with that much of a phase
(``NoiseSpec.phase_share``, ``phase_persistence``). A step that took more than ``STALL_RATIO``
times the model at its run's level is a stall: fitted and charged as seconds added to the step
(``stall_prob``, ``stall_quantiles``), not as a factor, since the engine's stalls (22-33 ms on
2.7 ms decode steps of the CPU engine) do not grow with the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import NoiseSpec
from accelgen.costmodel.base import CostModel

BLOCK = 65_536  # step errors drawn at a time (a fixed size: the same draws for a seed)
QUANTILES = 201  # an empirical fit's step-error quantiles (every 0.5 %)
# The phase's persistence is read off the autocorrelation at lag 1 and at this lag: a host's
# phases last tens of steps (CPU engine: lag-1 0.6-0.9, lag-20 0.0-0.7 in one sweep's replays).
PHASE_LAG = 20
PHASE_MIN_STEPS = 5 * PHASE_LAG  # a replay shorter than this says nothing of its phases
MAX_PERSISTENCE = 0.999  # (a phase that never changes is the run factor's job)
STALL_RATIO = 2.0  # a step over this many times the model (at its run's level) is a stall
MIN_STALLS = 5  # fewer stalls than this in the replays: no stall distribution fitted
STALL_QUANTILES = 101  # the stalls' quantiles (every 1 %)


# exp by range reduction and a polynomial, in numpy's elementwise + and x only: numpy's own
# float64 exp has an AVX-512 implementation whose last bits differ from the one other hosts run,
# and a step error one bit apart can change a schedule, so draws would depend on the host.
_LN2_HI = 6.93147180369123816490e-01  # (ln 2 split so that k x _LN2_HI is exact)
_LN2_LO = 1.90821492927058770002e-10
_EXP_TERMS = tuple(1.0 / math.factorial(i) for i in range(14))  # |r| <= ln2 / 2: < 1e-17


def portable_exp(x: np.ndarray | float) -> np.ndarray:
    """``exp(x)`` within about an ulp, bit for bit the same on every host (no SIMD libm)."""
    x = np.asarray(x, dtype=np.float64)
    k = np.rint(x / math.log(2.0))
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, _EXP_TERMS[-1])
    for c in _EXP_TERMS[-2::-1]:
        p = p * r + c
    return np.ldexp(p, k.astype(np.int64))


def _generator(seed: int) -> np.random.Generator:
    # A stream of its own: never the one a policy or a workload draws from with the same seed.
    return np.random.default_rng([seed, 0x4E015E])


class StepNoise:
    """The factors ``run factor x step error`` of one run, in the order iterations draw them."""

    __slots__ = ("_phase", "_probs", "_q", "_rng", "_stall_probs", "_stall_q", "run_factor",
                 "spec")

    def __init__(self, spec: NoiseSpec, seed: int) -> None:
        if not spec.on:
            raise ValueError("noise kind 'none' draws nothing")
        self.spec = spec
        self._rng = _generator(spec.seed if spec.seed is not None else seed)
        self.run_factor = float(portable_exp(spec.run_mu + spec.run_sigma
                                             * float(self._rng.standard_normal())))
        # The phase before the first step: a draw from its stationary law, N(0, 1). (Nothing is
        # drawn without a phase: the independent draws stay those of a spec without one.)
        self._phase = float(self._rng.standard_normal()) if spec.phase_share > 0 else 0.0
        if spec.kind == "empirical":
            q = np.asarray(spec.step_quantiles, dtype=np.float64)
            self._q = q
            self._probs = np.linspace(0.0, 1.0, len(q))
        if spec.stall_prob > 0:
            sq = np.asarray(spec.stall_quantiles, dtype=np.float64)
            self._stall_q = sq
            self._stall_probs = np.linspace(0.0, 1.0, len(sq))

    def block(self, n: int = BLOCK) -> np.ndarray:
        """The next ``n`` factors (a spec with stalls: ``draw``)."""
        return self.draw(n)[0]

    def draw(self, n: int = BLOCK) -> tuple[np.ndarray, np.ndarray | None]:
        """The next ``n`` factors and, with stalls, the seconds each step adds (else None)."""
        spec = self.spec
        if spec.stall_prob > 0:
            return self._with_stalls(n)
        if spec.phase_share > 0:
            from scipy.special import ndtr

            z = self._scores(n)
            err = (portable_exp(spec.step_mu + spec.step_sigma * z) if spec.kind == "lognormal"
                   else np.interp(ndtr(z), self._probs, self._q))
        elif spec.kind == "lognormal":
            err = portable_exp(spec.step_mu + spec.step_sigma * self._rng.standard_normal(n))
        else:
            err = np.interp(self._rng.random(n), self._probs, self._q)
        return err * self.run_factor, None

    def _with_stalls(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Factors and stalls: the scores above ``1 - stall_prob`` are stalls (the model's time
        x the run factor, plus a stall from its quantiles); the others the step error, read
        off the rest of the scores."""
        from scipy.special import ndtr, ndtri

        spec = self.spec
        p = spec.stall_prob
        u = ndtr(self._scores(n)) if spec.phase_share > 0 else self._rng.random(n)
        stalled = u >= 1.0 - p
        body = np.minimum(u / (1.0 - p), 1.0)
        if spec.kind == "lognormal":
            err = portable_exp(spec.step_mu + spec.step_sigma
                               * ndtri(np.clip(body, 1e-12, 1.0 - 1e-12)))
        else:
            err = np.interp(body, self._probs, self._q)
        err[stalled] = 1.0
        stall = np.zeros(n)
        stall[stalled] = np.interp((u[stalled] - (1.0 - p)) / p, self._stall_probs, self._stall_q)
        return err * self.run_factor, stall

    def _scores(self, n: int) -> np.ndarray:
        """The next ``n`` standard normal scores: ``phase_share`` of the variance the phase's
        (an AR(1) process, continued from the last block), the rest drawn for each step."""
        from scipy.signal import lfilter

        share, rho = self.spec.phase_share, self.spec.phase_persistence
        shocks = self._rng.standard_normal(n)
        phase = lfilter([math.sqrt(1.0 - rho * rho)], [1.0, -rho], shocks,
                        zi=[rho * self._phase])[0]
        self._phase = float(phase[-1])
        fresh = self._rng.standard_normal(n)
        return math.sqrt(share) * phase + math.sqrt(1.0 - share) * fresh


class NoisyCost(CostModel):
    """``base``'s iteration time times the run's noise factor, one factor per call of
    ``iteration_time`` (the simulator calls it once per iteration it charges). Everything else
    (``forward_time``, the pivot, a policy's plan) is ``base``'s, without noise."""

    def __init__(self, base: CostModel, spec: NoiseSpec, seed: int) -> None:
        self.base = base
        self.name = f"{base.name}+noise-{spec.kind}"
        self.noise = StepNoise(spec, seed)
        self._time = base.iteration_time
        self._buf: list[float] = []
        self._stalls: list[float] | None = None  # seconds added per step (a spec with stalls)
        # The same draws as arrays (``decode_times`` slices them; a list's slice is a copy).
        self._arr: np.ndarray = np.zeros(0)
        self._stall_arr: np.ndarray | None = None
        self._i = 0
        self.drawn = 0  # factors used so far

    @property
    def run_factor(self) -> float:
        return self.noise.run_factor

    def iteration_time(self, shape: BatchShape) -> float:
        i = self._i
        buf = self._buf
        if i == len(buf):
            factors, stalls = self.noise.draw()
            buf = self._buf = factors.tolist()
            self._arr, self._stall_arr = factors, stalls
            self._stalls = None if stalls is None else stalls.tolist()
            i = 0
        self._i = i + 1
        self.drawn += 1
        if self._stalls is None:
            return self._time(shape) * buf[i]
        return self._time(shape) * buf[i] + self._stalls[i]

    def decode_times(self, decode_seqs: int, decode_ctx: np.ndarray) -> np.ndarray | None:
        """The next ``len(decode_ctx)`` iterations' times, as ``iteration_time`` would charge
        them in turn (the same products and sums, elementwise), without using their factors:
        the caller says how many ran (``took_decode_run``)."""
        base = self.base.decode_times(decode_seqs, decode_ctx)
        if base is None:
            return None
        k = len(base)
        while len(self._buf) - self._i < k:  # (the next blocks of draws, in the same order)
            factors, stalls = self.noise.draw()
            i = self._i
            self._buf = self._buf[i:] + factors.tolist()
            self._arr = np.concatenate((self._arr[i:], factors))
            if stalls is not None:
                self._stalls = (self._stalls or [])[i:] + stalls.tolist()
                held = self._stall_arr[i:] if self._stall_arr is not None else np.zeros(0)
                self._stall_arr = np.concatenate((held, stalls))
            self._i = 0
        i = self._i
        out = base * self._arr[i:i + k]
        if self._stall_arr is not None:
            out = out + self._stall_arr[i:i + k]
        return out

    def took_decode_run(self, iterations: int) -> None:
        self._i += iterations
        self.drawn += iterations

    def forward_time(self, forward_size: int) -> float:
        return self.base.forward_time(forward_size)

    def prefill_time(self, prompt_len: int) -> float:
        return self.base.prefill_time(prompt_len)


def charging_cost(base: CostModel, spec: NoiseSpec, seed: int) -> CostModel:
    """The model that charges a run's iterations: ``base`` itself without noise."""
    return NoisyCost(base, spec, seed) if spec.on else base


def sensitivity_noise(level: float, seed: int | None = None) -> NoiseSpec:
    """Per-step lognormal noise of ``level`` (the step error's log standard deviation, about its
    coefficient of variation) with mean 1, no run factor: the sensitivity figure's noise, which
    moves no step's expected time. ``level`` 0: none."""
    if not (level >= 0 and math.isfinite(level)):
        raise ValueError(f"noise level must be >= 0, got {level}")
    if level == 0:
        return NoiseSpec()
    return NoiseSpec(kind="lognormal", step_mu=-level * level / 2, step_sigma=level, seed=seed,
                     source=f"sensitivity: per-step lognormal, sigma {level:g}, mean 1")


# ----------------------------------------------------------------------------------- fitting
@dataclass(frozen=True, slots=True)
class ReplayRatios:
    """One replay's steps against the model: measured span / predicted, per step."""

    name: str
    ratios: np.ndarray
    steps: int  # steps in the replay (before dropping the ones woken from idle)
    predicted: np.ndarray | None = None  # the model's time of each step (s), for the stalls


def replay_ratios(run_dir: Path | str, cost: CostModel, *,
                  after_idle: bool = False) -> ReplayRatios:
    """Every step of a replay (a results directory) as span / ``cost``'s prediction. Steps that
    woke an idle engine are left out unless ``after_idle``: their extra 1-2 ms is the engine
    waking (docs/profiling.md 3.2), not noise of a busy step, and the simulator charges idle
    time as idle."""
    from accelgen.costmodel.points import load_step_log

    log = load_step_log(run_dir)
    pred = np.array([cost.iteration_time(s) for s in log.shapes], dtype=np.float64)
    ratio = np.asarray(log.span, dtype=np.float64) / pred
    keep = np.isfinite(ratio) & (ratio > 0)
    if not after_idle:
        keep &= ~np.asarray(log.after_idle, dtype=bool)
    return ReplayRatios(str(run_dir), ratio[keep], len(ratio), pred[keep])


def autocorrelation(replays: Sequence[ReplayRatios],
                    lags: Sequence[int]) -> tuple[dict[int, float], int]:
    """The step errors' autocorrelation at ``lags``: of their normal scores (ranks within each
    replay through the normal quantile, so a stall of tens of times the model counts as one
    high score), pooled over the replays of at least ``PHASE_MIN_STEPS`` steps (weighted by
    their pairs). Consecutive kept steps count as neighbours (a step left out breaks no pair).
    Returns the autocorrelations (empty without such a replay) and the pairs at the first lag."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    sums = dict.fromkeys(lags, 0.0)
    pairs = dict.fromkeys(lags, 0)
    for r in replays:
        n = r.ratios.size
        if n < PHASE_MIN_STEPS:
            continue
        z = ndtri((rankdata(r.ratios) - 0.5) / n)
        z = (z - z.mean()) / z.std()
        for k in lags:
            sums[k] += float(np.dot(z[:-k], z[k:]))
            pairs[k] += n - k
    return {k: sums[k] / pairs[k] for k in lags if pairs[k]}, pairs[lags[0]]


def fit_phase(acf: dict[int, float], pairs: int) -> tuple[float, float]:
    """``(phase_share, phase_persistence)`` whose autocorrelation ``share x persistence^k``
    matches ``acf`` at lag 1 and ``PHASE_LAG``, ``pairs`` the lag-1 pairs it was read on. An
    autocorrelation within two standard errors of 0 (2 / sqrt(pairs)) counts as 0: no phase at
    lag 1; at ``PHASE_LAG``, or any decay faster than a pure AR(1) of lag-1 ``acf[1]``, that
    AR(1) (share 1)."""
    noise_floor = 2.0 / math.sqrt(pairs) if pairs else math.inf
    a1, a_l = acf.get(1, 0.0), acf.get(PHASE_LAG, 0.0)
    if a1 <= noise_floor:
        return 0.0, 0.0
    if a_l <= noise_floor:
        a_l = 0.0
    a1 = min(a1, MAX_PERSISTENCE)
    if a_l <= a1 ** PHASE_LAG:
        return 1.0, a1
    rho = min((a_l / a1) ** (1.0 / (PHASE_LAG - 1)), MAX_PERSISTENCE)
    return min(a1 / rho, 1.0), rho


@dataclass(frozen=True, slots=True)
class Stalls:
    prob: float  # the share of steps that stalled
    quantiles: list[float]  # the seconds a stall added, at evenly spaced probabilities
    count: int


def fit_stalls(replays: Sequence[ReplayRatios], factors: np.ndarray) -> Stalls | None:
    """The steps of ``replays`` over ``STALL_RATIO`` times the model at their replay's level
    (``factors``): their share and the seconds each took beyond that level (span - factor x
    predicted). None without predicted times or with fewer than ``MIN_STALLS`` of them."""
    if any(r.predicted is None for r in replays):
        return None
    extra, n = [], 0
    for r, f in zip(replays, factors, strict=True):
        assert r.predicted is not None
        stalled = r.ratios / f > STALL_RATIO
        extra.append((r.ratios[stalled] - f) * r.predicted[stalled])
        n += r.ratios.size
    seconds = np.concatenate(extra)
    if seconds.size < MIN_STALLS:
        return None
    q = np.quantile(seconds, np.linspace(0.0, 1.0, STALL_QUANTILES))
    return Stalls(seconds.size / n, [float(x) for x in q], int(seconds.size))


def fit_noise(replays: Sequence[ReplayRatios], kind: str = "empirical", *,
              quantiles: int = QUANTILES, source: str = "",
              phase: bool = True, stalls: bool = True) -> tuple[NoiseSpec, dict[str, Any]]:
    """The noise of ``replays``: each replay's run factor is the median of its ratios, the
    step errors its ratios over that factor, pooled over the replays. ``lognormal``: step_mu /
    step_sigma the median and the robust standard deviation (interquartile range / 1.349) of
    the errors' logs (stalls of tens of times the model would blow up a plain standard
    deviation); ``empirical``: ``quantiles`` quantiles of the errors. The run factor's log mean
    and standard deviation over the replays (sigma 0 from one replay). With ``phase``, the
    phase from the errors' autocorrelation (``fit_phase``), else every step independent.
    With ``stalls`` (and every replay's predicted times), the steps over ``STALL_RATIO`` are
    stalls if there are at least ``MIN_STALLS``: their share and the seconds each took beyond
    the model at its run's level (``fit_stalls``), the step error fitted on the other steps.
    Returns the spec and a record of the fit (per replay: steps, run factor, step-error
    p10/p50/p90; the autocorrelation and the phase; the stalls)."""
    if kind not in ("lognormal", "empirical"):
        raise ValueError(f"noise kind must be lognormal or empirical, got {kind!r}")
    if quantiles < 2:
        raise ValueError(f"quantiles must be at least 2, got {quantiles}")
    used = [r for r in replays if r.ratios.size]
    if not used:
        raise ValueError("no steps to fit the noise on: "
                         + (", ".join(r.name for r in replays) or "no replays given"))
    factors = np.array([float(np.median(r.ratios)) for r in used])
    errors = np.concatenate([r.ratios / f for r, f in zip(used, factors, strict=True)])
    log_f = np.log(factors)
    run_mu = float(log_f.mean())
    run_sigma = float(log_f.std(ddof=1)) if len(used) > 1 else 0.0
    stall = fit_stalls(used, factors) if stalls else None
    body = errors if stall is None else errors[errors <= STALL_RATIO]
    logs = np.log(body)
    q25, q50, q75 = np.quantile(logs, [0.25, 0.5, 0.75])
    acf, pairs = autocorrelation(used, (1, PHASE_LAG)) if phase else ({}, 0)
    share, persistence = fit_phase(acf, pairs)
    both: dict[str, Any] = {"run_mu": run_mu, "run_sigma": run_sigma, "phase_share": share,
                            "phase_persistence": persistence, "source": source}
    if stall is not None:
        both |= {"stall_prob": stall.prob, "stall_quantiles": stall.quantiles}
    if kind == "lognormal":
        spec = NoiseSpec(kind="lognormal", step_mu=float(q50),
                         step_sigma=float((q75 - q25) / 1.349), **both)
    else:
        q = np.quantile(body, np.linspace(0.0, 1.0, quantiles))
        spec = NoiseSpec(kind="empirical", step_quantiles=[float(x) for x in q], **both)
    record = {
        "kind": kind, "steps": int(errors.size),
        "step_error": {f"p{p}": float(v) for p, v in
                       zip((1, 10, 50, 90, 99), np.quantile(errors, [.01, .1, .5, .9, .99]),
                           strict=True)},
        "step_error_log_sigma_robust": float((q75 - q25) / 1.349),
        "step_error_mean": float(errors.mean()),
        "run_factor_median": float(np.median(factors)),
        "phase": {"fitted": phase, "share": share, "persistence": persistence,
                  "autocorrelation": {f"lag{k}": v for k, v in acf.items()}},
        "stalls": {"fitted": stall is not None, "over_ratio": STALL_RATIO,
                   "share": 0.0 if stall is None else stall.prob,
                   "count": 0 if stall is None else stall.count,
                   **({} if stall is None else
                      {f"seconds_p{p}": float(np.interp(p / 100, np.linspace(0, 1, len(
                          stall.quantiles)), stall.quantiles)) for p in (10, 50, 90)})},
        "replays": [{"replay": r.name, "steps": r.steps, "fitted_steps": int(r.ratios.size),
                     "run_factor": float(f),
                     **{f"step_error_p{p}": float(v) for p, v in
                        zip((10, 50, 90), np.quantile(r.ratios / f, [.1, .5, .9]),
                            strict=True)}}
                    for r, f in zip(used, factors, strict=True)],
        "left_out": [r.name for r in replays if not r.ratios.size],
    }
    return spec, record


def fixed_run(spec: NoiseSpec) -> NoiseSpec:
    """``spec`` with its run factor held at its median (sigma 0): a prediction of one run
    cannot know that run's speed, only the step noise around it."""
    return spec.model_copy(update={"run_sigma": 0.0})


def read_noise(path_or_json: str | Path) -> NoiseSpec:
    """A noise spec from a JSON text, or from a YAML/JSON file (``accelgen fit-noise``'s: its
    ``noise`` key, or the spec itself)."""
    import json

    text = str(path_or_json)
    if text.lstrip().startswith("{"):
        data = json.loads(text)
    else:
        from accelgen.core.specs import load_yaml

        data = load_yaml(path_or_json)
    if isinstance(data, dict) and "noise" in data and isinstance(data["noise"], dict):
        data = data["noise"]
    return NoiseSpec.model_validate(data)


def noise_text(spec: NoiseSpec, record: dict[str, Any], command: str = "") -> str:
    """The file ``accelgen fit-noise`` writes: ``noise:`` (the spec ``accelgen simulate
    --noise`` and ``sim.noise`` take) and ``fit:`` (what it was fitted on, per replay)."""
    import yaml

    head = "# The engine's noise around its cost model (accelgen.costmodel.noise.fit_noise)\n"
    if command:
        head += f"# {command}\n"
    body = yaml.safe_dump({"noise": spec.model_dump(mode="json"), "fit": record},
                          sort_keys=False, default_flow_style=None, width=100)
    return head + body


def write_noise(path: Path | str, spec: NoiseSpec, record: dict[str, Any],
                command: str = "") -> None:
    """``noise_text`` written atomically (all or nothing)."""
    from accelgen.costmodel.calibration_files import atomic_write

    atomic_write(Path(path), noise_text(spec, record, command))


def fit_replays(run_dirs: Sequence[Path | str], cost: CostModel, kind: str = "empirical", *,
                after_idle: bool = False, source: str = "",
                phase: bool = True, stalls: bool = True) -> tuple[NoiseSpec, dict[str, Any]]:
    """``fit_noise`` on the steps of results directories against ``cost``."""
    reps = [replay_ratios(d, cost, after_idle=after_idle) for d in run_dirs]
    spec, record = fit_noise(reps, kind, source=source or ", ".join(str(d) for d in run_dirs),
                             phase=phase, stalls=stalls)
    record["after_idle_included"] = after_idle
    return spec, record
