"""What one simulation job costs: wall time and peak memory, from full-size runs measured here.

The numbers are ``scripts/bench_sim.py`` runs of the paper trace (20,000 requests, OPT-13B on
A100, 8 req/s: far beyond capacity, ~99,000 simulated seconds, ~4 M iterations) on the
development machine (2 cores; ``MEASURED_ON``), one process per run, as a pipeline job runs.
A job of ``n`` requests is scaled from them linearly (a fixed start-up part plus the rest times
``n / 20,000``): under overload the simulated time, and with it the number of iterations, grows
with the number of requests, and the per-iteration cost of every policy measured here does not
grow with the queue (docs/simulator.md, "Performance"). Requests per job is what varies in a
config; deployments change the per-iteration cost little (the cost model is a formula).

``sim_mem_mb`` and ``sim_runtime_min`` give the pipeline's SLURM resources (rules/simulate.smk)
with headroom for a slower cluster core; ``sim_seconds`` is the runtime estimate's per-job time
(``python -m accelgen.pipeline estimate CONFIG``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelgen.pipeline.grid import Grid, Run

REFERENCE_REQUESTS = 20_000
MEASURED_ON = ("scripts/measure_jobs.py config/paper.yaml --only base --per-system --sample 1 "
               "--systems vllm orca fastgen sarathi fastserve --deployments opt-13b --seeds 0, "
               "and --only measurement --systems sarathi-slack, on build b750252, 2026-11-30, "
               "divided by the session's speed (BASE_HOST_SPEED); accelgen on build 48488e4, "
               "2026-11-28 (the unit of every table); the others from scripts/bench_sim.py "
               "--traces paper bursty, every policy in one session, 2026-11-25, build 74eb80c")
# AccelGen's paper-trace job before and after the baselines' jobs and before and after
# Sarathi-Serve's in slack order (48.7, 48.8, 48.4 and 48.2 CPU s, their mean) over
# its price: the host ran 0.539x the table's time that session.
BASE_HOST_SPEED = 0.539
STARTUP_S = 3.0  # interpreter, imports, trace load: not scaled
BASE_MB = 250.0  # the process before the run (interpreter, numpy, pandas, pyarrow)


@dataclass(frozen=True, slots=True)
class JobCost:
    """One 20K-request paper-trace run: whole-process wall seconds and peak RSS (MB)."""

    seconds: float
    rss_mb: float


# Per policy (a named variant costs what its base policy costs). ``oracle``: one point of its
# search (the Oracle's policy at one parameter setting); a search costs points + 1 of them.
MEASURED: dict[str, JobCost] = {
    # peak RSS in MiB (ru_maxrss)
    # vLLM, Sarathi-Serve, FastGen, FastServe and Orca as the pipeline runs their jobs (the paper
    # workload's 20K-request trace on OPT-13B, seed 0), Sarathi-Serve in slack order on the
    # measurement figures' 20K-request trace (MEASURED_ON): CPU seconds of the whole job as
    # measured over BASE_HOST_SPEED, peak memory as measured. AccelGen (2026-11-28, build
    # 48488e4): the job's CPU seconds net of that day's fixed part (FIXED_S), plus STARTUP_S;
    # this job, measured beside the others' in every session, is what each session's speed is
    # taken from.
    "vllm": JobCost(seconds=9.48 / BASE_HOST_SPEED, rss_mb=875.0),
    "vllm-v0": JobCost(seconds=46.3, rss_mb=920.0),
    "sarathi": JobCost(seconds=8.87 / BASE_HOST_SPEED, rss_mb=872.0),
    # Sarathi-Serve in slack order is asked at every iteration (no after-decodes shortcut).
    "sarathi-slack": JobCost(seconds=46.24 / BASE_HOST_SPEED, rss_mb=912.0),
    "fastgen": JobCost(seconds=11.42 / BASE_HOST_SPEED, rss_mb=910.0),
    "fastserve": JobCost(seconds=62.09 / BASE_HOST_SPEED, rss_mb=950.0),
    "edf": JobCost(seconds=85.5, rss_mb=918.0),  # (2026-11-25)
    "orca": JobCost(seconds=14.41 / BASE_HOST_SPEED, rss_mb=1576.0),  # batches of 8
    "oracle": JobCost(seconds=91.1, rss_mb=1353.0),  # one point of a search (2026-11-25)
    "accelgen": JobCost(seconds=STARTUP_S + 88.96 - 2.0, rss_mb=1358.0),  # (RSS: build 89dd7b0)
    # Not a paper-trace run: vllm's cost (2026-11-25: 45.4 s) scaled by the CPU-time ratio of
    # the two side by side (quick 500-request trace at 8 req/s, three alternating runs each,
    # medians net of the 1.46 s start-up: 3.28 s / 2.86 s = 1.15), peak memory as vllm's; then
    # its after-decodes shortcut, by CPU time side by side on the paper trace (one pair, 39.6 /
    # 79.6 s, issue 42).
    "vllm-priority": JobCost(seconds=3.0 + 1.15 * (45.4 - 3.0) * 39.6 / 79.6, rss_mb=909.0),
}
SCENARIO_REQUESTS = 100  # a fixed scenario (figure 6's ERA case and the like) is this small


# The capacity sweep's jobs (workload ``capacity``, 1,000 requests at a load factor of the
# deployment's capacity estimate, figures 13-16 and 18) cost what the paper trace does not say:
# below capacity a request is served nearly alone, about 830 iterations each (the paper trace,
# overloaded: about 200), and the policy's cost per iteration differs with the batch and the
# token budget. Measured on this build per system (a tuned budget or the envelope's smallest
# apart from its policy's own setting) at the load factors its sample drew, each job as the
# pipeline runs it (the Oracle's 2-point search with its floor read from AccelGen's run), in
# one session with nothing else running. The host's speed changes 1.6-1.9x between sessions, so
# each job's CPU seconds are divided by the session's speed: AccelGen's paper-trace job
# (``MEASURED["accelgen"]``, the same trace and command) measured before and after the sample,
# over its price. Several jobs at one load factor: their mean (they span
# deployments: the same load factor cost 1.3-2x more on one deployment than another).
CAPACITY_MEASURED_ON = (
    "scripts/measure_jobs.py config/paper.yaml --only capacity-rate --per-system --sample 6 "
    "--systems <the 18 capacity systems> sarathi-b64, 2026-11-30, build b750252, nothing "
    "else running; CPU s over the session's speed: AccelGen's paper-trace job before and after "
    "it, 48.6 and 47.9 CPU s against its price of 89.96: 0.536x")
CAPACITY_REQUESTS = 1000
# The fixed part of a job (a 1-request trace: interpreter, imports, the AccelGen kernels' load,
# results written), measured the same way: not scaled by requests. ``FIXED_S``: with the
# paper-trace and workload tables (2026-11-28); ``CAPACITY_FIXED_S``: with the capacity table,
# the same for every policy (AccelGen 0.60-0.64 CPU s, 3 runs, vLLM 0.57-0.58 and EDF
# 0.54-0.56 the same day; its session's speed divided out, as its jobs').
FIXED_S = {"accelgen": 2.0, "other": 1.0}
CAPACITY_FIXED_S = 1.12
ACCELGEN_FAMILY = ("accelgen", "accelgen-closed", "oracle")  # (base policies: they load kernels)
# Under ``accelgen warm`` (a job forked from a server that has imported everything and loaded
# AccelGen's kernels) the fixed part is what the fork itself uses: the same 1-request command,
# 20 forks (accelgen, vllm, sarathi, edf; `accelgen warm --jobs-log`, 2026-11-28, this VM):
# 0.072-0.159 CPU s, median 0.093, for every policy alike.
WARM_FIXED_S = 0.1
# system or policy -> ((load factor, CPU seconds of one job), ...), load factors ascending. A
# system not listed costs its policy's jobs (a named variant its base policy's).
CAPACITY_MEASURED: dict[str, tuple[tuple[float, float], ...]] = {
    # the paper's settings (the ablations and the Oracle's 2-point search under their policies)
    "accelgen": ((0.00390625, 4.63), (0.0625, 4.56), (0.5, 5.30), (2.0, 5.75)),
    "accelgen-closed": ((0.00390625, 5.16), (0.0625, 5.13), (1.0, 6.02)),
    "accelgen/batch": ((0.00390625, 4.80), (0.0625, 4.75), (1.0, 4.76)),
    "accelgen/chunk": ((0.00390625, 4.98), (0.0625, 5.04), (1.0, 3.70)),
    "accelgen/order": ((0.00390625, 5.40), (0.0625, 5.12), (1.0, 5.51)),
    "oracle": ((0.00390625, 8.64), (0.0625, 8.19), (1.0, 9.59)),
    "edf": ((0.00390625, 4.83), (0.0625, 4.66), (1.0, 3.86)),
    "fastgen": ((0.00390625, 2.20), (0.0625, 2.18), (0.5, 1.93), (2.0, 1.96)),
    "fastserve": ((0.00390625, 4.01), (0.0625, 3.82), (1.0, 3.34)),
    "orca": ((0.00390625, 2.10), (0.0625, 2.03), (1.0, 1.72)),
    "sarathi": ((0.00390625, 2.22), (0.0625, 2.06), (0.5, 1.89), (2.0, 1.83)),
    "vllm": ((0.00390625, 2.32), (0.0625, 2.04), (0.5, 1.82), (2.0, 1.80)),
    "vllm-priority": ((0.00390625, 2.16), (0.0625, 2.09), (1.0, 1.89)),
    # as their users run them (a tuned budget: more iterations where it is small), and the
    # envelope's smallest static budget (its larger ones priced as Sarathi-Serve's setting)
    "edf-tuned": ((0.00390625, 5.27), (0.0625, 4.90), (1.0, 8.03)),
    "fastgen-tuned": ((0.00390625, 2.64), (0.0625, 2.26), (1.0, 3.84)),
    "sarathi-tuned": ((0.00390625, 3.29), (0.0625, 3.29), (1.0, 2.60), (2.0, 1.86)),
    "vllm-priority-tuned": ((0.00390625, 2.53), (0.0625, 2.20), (1.0, 3.71)),
    "vllm-tuned": ((0.00390625, 2.44), (0.0625, 2.14), (1.0, 3.44)),
    "sarathi-b64": ((0.00390625, 2.43), (0.0078125, 3.07), (0.125, 2.39), (0.25, 2.08),
                    (0.5, 2.30), (1.0, 2.26)),
}
# The Oracle's jobs above ran this many simulations (its 2-point search, the floor read).
CAPACITY_ORACLE_POINTS = 2

# The Oracle's search on a full-size trace stops the candidates that cannot win
# (``experiments.goodput_bound``, with the work still to do). Whole jobs measured as the pipeline
# runs them (the default 12-point grid, the floor read), each with AccelGen's own job on the same
# trace (its floor) measured beside it, the same day, on the same build: (variant, deployment)
# -> the two. The host's speed changes from day to day (1.6-1.9x between sessions), so a search
# is priced by its CPU time over AccelGen's on the same trace, times AccelGen's priced job on
# that workload (``oracle_search_seconds``). The paper workload's search (2026-11-29, build
# 1dab332, nothing else running: 9 of 12 candidates stopped; AccelGen 156.9 and 158.0 s, run
# before and after it; `accelgen oracle --trace T --config D --seed 0 --floor-run <AccelGen's
# run>`): its variable part over the unpruned price's (``sim_seconds``) prices every search of a
# full-size trace of a workload not measured on its own (``oracle_pruned_fraction``).
# BookCorpus's (the same day and build, beside two capacity samples: `scripts/measure_jobs.py
# config/paper.yaml --only base-only-bookcorpus --per-policy --sample 1 --systems accelgen
# oracle --deployments opt-13b --seeds 0`) prices that workload's searches in place of its
# ``WORKLOAD_MEASURED`` entry (1,292 CPU s on 2026-11-28 beside an AccelGen job of 185.9: 6.95x,
# 5.26x here).


@dataclass(frozen=True, slots=True)
class SearchMeasured:
    """One Oracle search and AccelGen's own job on the same trace, measured side by side: CPU
    seconds of each whole job."""

    search_s: float
    floor_s: float


ORACLE_SEARCH_MEASURED: dict[tuple[str, str], SearchMeasured] = {
    ("base", "opt-13b"): SearchMeasured(search_s=854.4, floor_s=157.4),
    ("base-only-bookcorpus", "opt-13b"): SearchMeasured(search_s=1989.72, floor_s=378.19),
}
ORACLE_SEARCH_POINTS = 12  # (with the floor read: 12 simulations unpruned)


def oracle_search_seconds(variant: str, measured: SearchMeasured) -> float:
    """A search of ``variant``'s trace measured side by side with AccelGen's job on it, priced:
    its CPU time over AccelGen's, times AccelGen's priced full-size job on that workload (its
    ``WORKLOAD_MEASURED`` entry, else the paper trace's)."""
    accelgen = (WORKLOAD_MEASURED.get((variant, "accelgen"))
                or sim_seconds("accelgen", REFERENCE_REQUESTS))
    return measured.search_s / measured.floor_s * accelgen


def _workload_search_seconds(variant: str) -> float | None:
    """The price of a full search of ``variant``'s trace from the searches measured on it
    (their mean), None where none was."""
    prices = [oracle_search_seconds(v, m) for (v, _), m in ORACLE_SEARCH_MEASURED.items()
              if v == variant]
    return sum(prices) / len(prices) if prices else None


def oracle_pruned_fraction() -> float:
    """The measured searches of the paper workload's traces: their variable CPU time
    (``oracle_search_seconds``) over their unpruned price (mean), for a search of a workload
    not measured (``WORKLOAD_MEASURED``)."""
    full = sim_seconds("oracle", REFERENCE_REQUESTS, ORACLE_SEARCH_POINTS) - STARTUP_S
    own_workloads = {w for w, _ in WORKLOAD_MEASURED}
    fractions = [(oracle_search_seconds(v, m) - STARTUP_S) / full
                 for (v, _), m in ORACLE_SEARCH_MEASURED.items() if v not in own_workloads]
    return sum(fractions) / len(fractions)


# A workload variant whose requests differ from the paper trace's mix costs what its own traces
# do: the datasets figure's single-dataset traces (Alpaca's and ShareGPT's requests are short,
# BookCorpus's long). Its 20K-request jobs measured as the pipeline runs them, on OPT-13B, seed
# 0 (the only deployment the datasets figure runs; WORKLOAD_MEASURED_ON), CPU seconds of the job
# (the Oracle: its search, the floor read): (variant, policy) -> seconds.
WORKLOAD_MEASURED_ON = ("scripts/measure_jobs.py config/paper.yaml --only base-only --per-policy "
                        "--sample 3 --systems vllm orca fastgen sarathi fastserve accelgen "
                        "--deployments opt-13b --seeds 0, and --only base-only-VARIANT --systems "
                        "oracle ... --sample 1, 2026-11-28, 2-core development VM, build 48488e4, "
                        "two jobs at a time")
WORKLOAD_MEASURED: dict[tuple[str, str], float] = {
    ("base-only-alpaca", "accelgen"): 16.18,
    ("base-only-alpaca", "fastgen"): 13.52,
    ("base-only-alpaca", "fastserve"): 22.88,
    ("base-only-alpaca", "orca"): 25.87,
    ("base-only-alpaca", "sarathi"): 10.45,
    ("base-only-alpaca", "vllm"): 10.21,
    ("base-only-alpaca", "oracle"): 463.32,  # 6 of its 12 points the schedule of an earlier one
    ("base-only-bookcorpus", "accelgen"): 185.93,
    ("base-only-bookcorpus", "fastgen"): 52.24,
    ("base-only-bookcorpus", "fastserve"): 244.33,
    ("base-only-bookcorpus", "orca"): 107.13,
    ("base-only-bookcorpus", "sarathi"): 46.99,
    ("base-only-bookcorpus", "vllm"): 43.47,
    ("base-only-bookcorpus", "oracle"): 1292.04,
    ("base-only-sharegpt", "accelgen"): 39.51,
    ("base-only-sharegpt", "fastgen"): 14.76,
    ("base-only-sharegpt", "fastserve"): 40.81,
    ("base-only-sharegpt", "orca"): 34.19,
    ("base-only-sharegpt", "sarathi"): 11.24,
    ("base-only-sharegpt", "vllm"): 10.81,
    ("base-only-sharegpt", "oracle"): 160.14,
}


def _workload_ratio(variant: str, policy: str) -> float | None:
    """A policy's variable CPU time on ``variant``'s jobs over its paper-trace price: measured,
    else AccelGen's for AccelGen's family, else the mean of the policies measured there (None:
    none was)."""
    ratios = {p: (t - fixed_seconds(p)) / (sim_seconds(p, REFERENCE_REQUESTS) - STARTUP_S)
              for (v, p), t in WORKLOAD_MEASURED.items() if v == variant and p != "oracle"}
    if not ratios:
        return None
    if policy in ratios:
        return ratios[policy]
    if policy in ACCELGEN_FAMILY and "accelgen" in ratios:
        return ratios["accelgen"]
    return sum(ratios.values()) / len(ratios)


def workload_seconds(variant: str, policy: str, num_requests: int, search_points: int,
                     warm: bool = False) -> float | None:
    """CPU seconds of a job of ``policy`` on workload ``variant`` from the jobs measured on it
    (``WORKLOAD_MEASURED``; a full Oracle search measured beside AccelGen's job,
    ``ORACLE_SEARCH_MEASURED``, in place of its entry): its own, scaled by requests, else its
    paper-trace price (an Oracle search's stopped candidates as ``oracle_pruned_fraction``)
    times ``_workload_ratio``; None where the variant was not measured."""
    base = base_policy(policy)
    ratio = _workload_ratio(variant, base)
    if ratio is None:
        return None
    measured = WORKLOAD_MEASURED.get((variant, base))
    if base == "oracle":  # (measured: a full search only)
        measured = (_workload_search_seconds(variant) or measured
                    if search_points == ORACLE_SEARCH_POINTS else None)
    if measured is not None:
        var = measured - fixed_seconds(policy)
    else:
        var = (sim_seconds(policy, REFERENCE_REQUESTS, search_points) - STARTUP_S) * ratio
        if base == "oracle" and search_points > 1:
            var *= oracle_pruned_fraction()
    return fixed_seconds(policy, warm) + var * num_requests / REFERENCE_REQUESTS


def _interpolated(pts: tuple[tuple[float, float], ...], load_factor: float) -> float:
    """The values of ``pts`` ((load factor, value), ascending) interpolated in log(load
    factor), held at the ends."""
    x = math.log2(max(load_factor, 1e-12))
    xs = [math.log2(lf) for lf, _ in pts]
    ys = [v for _, v in pts]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = next(k for k in range(1, len(xs)) if x <= xs[k])
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


def fixed_seconds(policy: str, warm: bool = False) -> float:
    """The measured fixed part of one job of ``policy`` (AccelGen and its variants load their
    compiled kernels; ``warm``: a job forked by ``accelgen warm``)."""
    if warm:
        return WARM_FIXED_S
    return FIXED_S["accelgen" if base_policy(policy) in ACCELGEN_FAMILY else "other"]


# Under per-step noise (figure 18's systems) AccelGen's jobs cost what noisy jobs measured:
# the closed loop never rests (every step corrects its model and margin), and takes the steps of
# its decided runs in in the compiled run (``loop_step.take_in``); the open loop takes the
# decided runs as without noise. Whole jobs measured as the pipeline runs them, each of the six
# noisy systems (open and closed loop at 5, 10 and 20 %) at the same four (deployment, load
# factor) points, and divided by the session's speed as ``CAPACITY_MEASURED`` (AccelGen's
# paper-trace job before and after: 47.5 and 48.3 CPU s, 0.532x): policy -> ((load factor,
# CPU seconds), ...), the three noise levels' mean. A noisy copy of another system costs what
# that system's jobs do.
NOISY_CAPACITY_MEASURED_ON = ("scripts/measure_jobs.py config/paper.yaml --only capacity-rate "
                              "--per-system --sample 4 --systems accelgen-noise{5,10,20} "
                              "accelgen-closed-noise{5,10,20}, 2026-11-30, build b750252, "
                              "nothing else running")
NOISY_CAPACITY_MEASURED: dict[str, tuple[tuple[float, float], ...]] = {
    "accelgen": ((0.03125, 5.34), (0.0625, 5.45), (0.5, 5.14), (1.0, 4.70)),
    "accelgen-closed": ((0.03125, 6.77), (0.0625, 6.82), (0.5, 5.56), (1.0, 5.73)),
}


def capacity_seconds(policy: str, num_requests: int, load_factor: float,
                     search_points: int = 1, warm: bool = False,
                     noisy: bool = False, system: str | None = None) -> float | None:
    """CPU seconds of one capacity-sweep job of ``policy`` (run as ``system``) at
    ``load_factor`` (None when neither was measured there): the measured jobs of the system,
    else of the policy, interpolated in log(load factor), held at the ends, net of the fixed
    part scaled by requests (and by search points for the Oracle); a ``noisy`` job of a policy
    measured under noise from ``NOISY_CAPACITY_MEASURED``; ``warm``: with the fixed part of a
    job forked by ``accelgen warm``."""
    pts = ((NOISY_CAPACITY_MEASURED.get(policy) if noisy else None)
           or next((CAPACITY_MEASURED[key] for key in (system, policy, base_policy(policy))
                    if key in CAPACITY_MEASURED), None))
    if not pts:
        return None
    var = _interpolated(tuple((lf, max(t - CAPACITY_FIXED_S, 0.0)) for lf, t in pts),
                        load_factor)
    if base_policy(policy) == "oracle":
        var *= search_points / CAPACITY_ORACLE_POINTS
    return (WARM_FIXED_S if warm else CAPACITY_FIXED_S) + var * num_requests / CAPACITY_REQUESTS


def job_seconds(grid: Grid, run: Run, warm: bool = False) -> float:
    """CPU seconds of one simulation job of ``grid``: a capacity-sweep job from the jobs measured
    at its load factor (``capacity_seconds``), any other from the full-size runs
    (``sim_seconds``); ``warm``: forked by ``accelgen warm`` (its fixed part)."""
    policy, n, points = run_job(grid, run.variant, run.system, run.deployment, run.seed)
    lf = grid.load_factor.get(grid.same_as.get(run, run))
    if lf is None and run.variant in grid.rate_sweep:
        # The sensitivity sweep's rates, at or below the highest load factor measured above
        # (its 20K-request jobs at 0.1 req/s run at ~1.2x OPT-13B's estimate, not overloaded).
        workload, rate = grid.rate_sweep[run.variant]
        try:
            est = grid.capacity_bound(workload, run.deployment, run.seed).estimate_rps
        except (ValueError, OSError, KeyError):  # a workload it cannot size: priced as below
            est = math.nan
        if est > 0 and rate / est <= max(lf for pts in CAPACITY_MEASURED.values()
                                         for lf, _ in pts):
            lf = rate / est
    if lf is not None:
        t = capacity_seconds(policy, n, lf, points, warm,
                             noisy=bool(grid.noise_level.get(run.system)),
                             system=_capacity_system(grid, run.system, policy))
        if t is not None:
            return t
    t_workload = workload_seconds(run.variant, policy, n, points, warm)
    if t_workload is not None:
        return t_workload
    t = sim_seconds(policy, n, points, warm)
    if base_policy(policy) == "oracle" and points > 1:  # (a search stops candidates)
        fixed = WARM_FIXED_S if warm else STARTUP_S
        t = fixed + (t - fixed) * oracle_pruned_fraction()
    return t


def _capacity_system(grid: Grid, system: str, policy: str) -> str:
    """The ``CAPACITY_MEASURED`` entry that prices ``system``'s capacity jobs: its own (a noisy
    copy of figure 18: its system's), else for a tuned budget the paper config's tuned system of
    that policy (``vllm-tuned``, ...), else its name (none: its policy's)."""
    system = grid.noise_of.get(system, system)
    if system not in CAPACITY_MEASURED and grid.systems[system].budget == "tuned":
        return f"{base_policy(policy)}-tuned"
    return system


def base_policy(policy: str) -> str:
    """The built-in policy a named variant runs (``accelgen/order``: ``accelgen``)."""
    from accelgen.policies.registry import VARIANTS

    return VARIANTS[policy][0] if policy in VARIANTS else policy


def job_cost(policy: str) -> JobCost:
    """The measured cost of ``policy`` (a named variant measured on its own), else of its base
    policy; a policy not measured costs what the slowest measured one does."""
    return (MEASURED.get(policy) or MEASURED.get(base_policy(policy))
            or max(MEASURED.values(), key=lambda c: c.seconds))


def sim_seconds(policy: str, num_requests: int, search_points: int = 1,
                warm: bool = False) -> float:
    """Wall seconds of one job of ``num_requests`` requests (``search_points``: the Oracle's
    search runs that many simulations; ``warm``: forked by ``accelgen warm``, its start-up
    that of a fork)."""
    cost = job_cost(policy)
    scale = num_requests / REFERENCE_REQUESTS
    return (WARM_FIXED_S if warm else STARTUP_S) + search_points * max(cost.seconds - STARTUP_S, 0.0) * scale


# Peak memory grows with the run's iterations and requests (the iteration log and the
# requests' token times): a workload of longer requests holds more. Measured on OPT-13B's
# 20K-request traces, seed 0 (`scripts/measure_jobs.py ... --only VARIANT --systems accelgen
# --deployments opt-13b --seeds 0 --sample 1`, its rss_mb column, 2026-11-28, build 89dd7b0):
# variant -> the largest of the measured jobs' peak over their paper-workload peak, net of the
# process before the run (BASE_MB): on BookCorpus AccelGen 2,632 MB (1,358 on the paper
# workload: 2.15x), FastServe 1,685 (2.09x), vLLM 1,544 (1.96x). A variant not listed holds
# what the paper workload's jobs do (the single-dataset Alpaca and ShareGPT workloads'
# requests are shorter).
WORKLOAD_MEMORY_SCALE: dict[str, float] = {"base-only-bookcorpus": 2.15}
# An Oracle search holds AccelGen's run of the floor (read back), the best run so far and the
# one running (``oracle_search.search``): up to this many runs' memory at once (the paper
# workload's search on OPT-13B peaked at 3,304 MB, measured as above, where one point's price
# gave it 2,500 MB).
SEARCH_RUNS_HELD = 3


def sim_mem_mb(policy: str, num_requests: int, variant: str | None = None,
               search_points: int = 1) -> int:
    """SLURM ``mem_mb`` of one job: the measured peak scaled to ``num_requests`` (and to
    ``variant``'s requests, ``WORKLOAD_MEMORY_SCALE``; an Oracle search of several points holds
    ``SEARCH_RUNS_HELD`` runs), plus half again, in steps of 500 MB, at least 1000 MB."""
    cost = job_cost(policy)
    runs = SEARCH_RUNS_HELD if base_policy(policy) == "oracle" and search_points > 1 else 1
    scale = num_requests / REFERENCE_REQUESTS * WORKLOAD_MEMORY_SCALE.get(variant or "", 1.0)
    peak = BASE_MB + max(cost.rss_mb - BASE_MB, 0.0) * scale * runs
    return max(1000, math.ceil(1.5 * peak / 500.0) * 500)


def sim_runtime_min(policy: str, num_requests: int, search_points: int = 1) -> int:
    """SLURM ``runtime`` (minutes) of one job: three times the measured time (a cluster core
    may be slower than the one measured here), at least 10 minutes."""
    return max(10, math.ceil(3.0 * sim_seconds(policy, num_requests, search_points) / 60))


def run_job(grid: Grid, variant: str, system: str, deployment: str | None = None,
            seed: int | None = None) -> tuple[str, int, int]:
    """(policy, requests, simulations) of one job of ``grid``: its system's policy, its
    workload variant's request count, and how many simulations it runs (an Oracle search: its
    grid's points plus AccelGen's own schedule, the floor, unless the grid runs that one anyway
    on the same trace: ``Grid.floor_run``, known with ``deployment`` and ``seed``)."""
    from accelgen.experiments.oracle_search import DEFAULT_GRID, grid_points
    from accelgen.pipeline.grid import SCENARIO_PREFIX, Run

    spec = grid.systems[system]
    n = (SCENARIO_REQUESTS if variant.startswith(SCENARIO_PREFIX)
         else int(grid.variants[variant].get("num_requests") or SCENARIO_REQUESTS))
    points = 1
    if spec.search is not None:
        reused = (deployment is not None and seed is not None
                  and grid.floor_run(Run(variant, deployment, system, seed)) is not None)
        points = len(grid_points(spec.search or DEFAULT_GRID)) + (0 if reused else 1)
    return spec.policy, n, points


def job_resources(grid: Grid, variant: str, system: str, deployment: str | None = None,
                  seed: int | None = None) -> dict[str, int]:
    """SLURM resources of one simulation job: ``mem_mb`` and ``runtime`` (minutes; with
    ``deployment`` and ``seed``: three times ``job_seconds``, at least 10)."""
    policy, n, points = run_job(grid, variant, system, deployment, seed)
    runtime = sim_runtime_min(policy, n, points)
    if deployment is not None and seed is not None:
        from accelgen.pipeline.grid import Run

        secs = job_seconds(grid, Run(variant, deployment, system, seed))
        runtime = max(10, math.ceil(3.0 * secs / 60))
    return {"mem_mb": sim_mem_mb(policy, n, variant, points), "runtime": runtime}
