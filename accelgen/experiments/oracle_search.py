"""The CLAIRVOYANT Oracle's schedule search (``accelgen oracle``; also ``accelgen simulate
--policy oracle``).

The Oracle policy (``accelgen.policies.accelgen.oracle.OraclePolicy``) is AccelGen's decision with exact
knowledge of output lengths. The paper's Oracle also "schedules the chunking and batching to
maximize the goodput" knowing every arrival; its authors searched schedules with a simulator. So
does this module: it simulates the Oracle at every point of a grid over its parameters on the real
trace (the choice therefore knows every arrival) and keeps the schedule with the best goodput.

The floor: beside the grid points, the search always runs **AccelGen's own schedule** (policy
``accelgen`` with the Oracle's base parameters that AccelGen has). A clairvoyant scheduler can
always act like AccelGen, so the Oracle's result is never below AccelGen's on the searched trace,
whatever the grid; the floor is last in the table, so it wins only when it is strictly better
than every clairvoyant point (then the Oracle adds nothing on this trace, and the results say
so). ``oracle_search.csv`` lists every schedule tried.

Candidates that cannot win are stopped (searching by goodput, the default): each candidate's
simulation is checked every few thousand iterations against the best goodput so far (the
floor's, when read from AccelGen's run, before any candidate runs) with an upper bound on its
final goodput (``goodput_bound``: requests already lost to a late token cannot come back, and
the span only grows). A candidate stopped there could not have been chosen, so the best run is
the one the full search finds; its row in ``oracle_search.csv`` says ``stopped`` with the bound
and the simulated time it stopped at, and has no other metrics. ``prune=False`` runs every
candidate to its end.

Points that make the same schedule on the trace are simulated once (``same_schedules``): where
ERA never holds (off, or no request of the trace can be a long prompt: Alpaca's and ShareGPT's
traces), points that differ only in ERA's scope decide alike at every step. The later point's
row is the earlier run's, stopped where that run's checks first fall below the later point's bar
(the bound does not depend on the bar): the table its own simulation would give. ``share=False``
simulates every point.

Command line (``accelgen.cli.oracle``; writes the best run as a normal results directory
plus the search table)::

    accelgen oracle --trace T.parquet --deployment opt-13b --out DIR [--grid JSON] [--param K=V]
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelgen.experiments.goodput_bound import (
    CannotWin,
    Checked,
    GoodputBound,
    RemainingWork,
    first_stop,
)
from accelgen.policies.accelgen import AccelGenParams
from accelgen.policies.accelgen.oracle import OracleParams
from accelgen.results import RunOutput, StoredRun, dumps, outcome_counts

if TYPE_CHECKING:
    import pandas as pd

    from accelgen.core.specs import ExperimentConfig

# 12 simulations per trace keep the quick pipeline in minutes; budget_cap, budget_rule,
# long_prompt_threshold, ... can be added through ``grid`` (e.g. {"budget_cap": [1.0, 1.25]}).
DEFAULT_GRID: dict[str, list[Any]] = {
    "kv_plan": ["exact", "none"],
    "gamma": [0.25, 0.75, 1.5],
    "era_scope": ["prefill", "request"],
}
FLOOR_POLICY = "accelgen"  # the floor's schedule: AccelGen itself


@dataclass(slots=True)
class SearchResult:
    """CLAIRVOYANT search outcome: the best schedule, its run, and every schedule's summary."""

    best_params: dict[str, Any]  # the winning grid point (the floor: AccelGen's parameters)
    best: RunOutput | StoredRun  # (StoredRun: the floor, reused from AccelGen's own run)
    table: pd.DataFrame  # one row per schedule: policy, params, summary metrics, best
    metric: str
    floor_won: bool  # no clairvoyant point beat AccelGen's own schedule
    # grid point -> the earlier point whose schedule it is on this trace (``same_schedules``)
    same_as: dict[int, int] = field(default_factory=dict)

    def best_label(self) -> str:
        """Which schedule won, for a closing line."""
        if self.floor_won:
            return "AccelGen's own schedule (the floor: no clairvoyant point beat it)"
        return ", ".join(f"{k}={v}" for k, v in self.best_params.items()) or "base parameters"


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    for k in keys:
        if k not in OracleParams.model_fields:
            raise ValueError(f"oracle grid: unknown parameter {k!r}")
        if not grid[k]:
            raise ValueError(f"oracle grid: no values for {k!r}")
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*grid.values())]


def same_schedules(points: Sequence[Mapping[str, Any]], trace: pd.DataFrame) -> dict[int, int]:
    """The grid points (merged with the base parameters) that make an earlier point's schedule
    on ``trace``, by index, each to the first such point: they differ only in ERA's scope where
    ERA never holds, because it is off or because no request of the trace can be a long prompt.
    A prompt counts its generated tokens too when recomputed, so a request is never longer than
    its prompt and output; ERA is taken only by a long prompt, and its scope is read only while
    it is held (``era.holder``): the two decisions are the same at every step, diagnostics
    included."""
    longest = int((trace["prompt_len"] + trace["output_len"]).max()) if len(trace) else 0
    first: dict[str, int] = {}
    same: dict[int, int] = {}
    for j, point in enumerate(points):
        params = OracleParams(**point)
        key = params.model_dump(mode="json")
        if not params.era or longest < params.long_prompt_threshold:
            del key["era_scope"]
        text = dumps(key)
        if text in first:
            same[j] = first[text]
        else:
            first[text] = j
    return same


def base_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """The Oracle parameters the grid overrides (``cfg``'s, when it names the Oracle)."""
    return dict(cfg.policy.params) if cfg.policy.name == "oracle" else {}


def floor_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """AccelGen's parameters for the floor: the Oracle's base parameters that AccelGen has
    (gamma, budget rule, ERA, ...), without the clairvoyant ones (kv_plan, exact_lengths)."""
    return {k: v for k, v in base_params(cfg).items() if k in AccelGenParams.model_fields}


def floor_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment of the floor's simulation: ``cfg`` with AccelGen's own policy."""
    from accelgen.core.specs import PolicySpec

    return cfg.model_copy(update={"policy": PolicySpec(name=FLOOR_POLICY,
                                                       params=floor_params(cfg))})


def read_floor(run_dir: Path | str, cfg: ExperimentConfig,
               trace_path: str | None = None) -> StoredRun:
    """AccelGen's own run of the same trace and experiment (``accelgen simulate --policy
    accelgen`` with the floor's parameters), read back to stand for the floor's simulation: a
    deterministic simulator gives the floor the same results. Raises ValueError when the
    directory holds another experiment or, with ``trace_path``, another trace."""
    import json

    run = StoredRun.read(run_dir)
    want = json.loads(dumps(floor_config(cfg).model_dump(mode="json")))
    if run.config.get("experiment") != want:
        raise ValueError(f"--floor-run {run_dir}: its experiment (config.json) is not the "
                         f"floor's (policy {FLOOR_POLICY} with {floor_params(cfg)}, the "
                         "Oracle's deployment, simulator options and seed)")
    if trace_path is not None and run.config.get("trace") != trace_path:
        raise ValueError(f"--floor-run {run_dir}: a run of trace {run.config.get('trace')!r}, "
                         f"not {trace_path!r}")
    return run


PRUNE_METRIC = "goodput_rps"  # the metric GoodputBound bounds


def remaining_work(trace: pd.DataFrame, cfg: ExperimentConfig) -> RemainingWork | None:
    """What the goodput bound prices the work still to do with on ``trace`` under ``cfg``
    (``goodput_bound.RemainingWork``), or None where a run may end before it serves every
    request it admits (a horizon, an iteration limit) or its iterations may take less than the
    cost model's least (noise). The Oracle rejects no admitted request."""
    from accelgen.core.request import served_output_len
    from accelgen.costmodel.factory import kv_num_blocks, make_cost_model, resolve_model
    from accelgen.workloads.trace import to_requests

    sim = cfg.sim
    if sim.horizon_s is not None or sim.max_iterations is not None or sim.noise.on:
        return None
    dep = cfg.deployment
    max_model_len = dep.max_model_len or resolve_model(dep.model).max_model_len
    requests, output_len = to_requests(trace)
    served = [0] * len(requests)
    prompt = trace["prompt_len"].to_numpy()
    for r, n in zip(requests, served_output_len(prompt, output_len, max_model_len).tolist(),
                    strict=True):
        served[r.req_id] = n
    return RemainingWork.of(requests, served, num_blocks=kv_num_blocks(dep),
                            block_size=dep.block_size, max_model_len=max_model_len,
                            min_token_iteration_s=make_cost_model(dep).min_token_iteration_time())


def _run(args: tuple[pd.DataFrame, ExperimentConfig, str, dict[str, Any]],
         best: float | None = None,
         work: RemainingWork | None = None) -> tuple[RunOutput | CannotWin, list[Checked] | None]:
    """One schedule's simulation; with ``best``, stopped (its ``CannotWin``) once its goodput
    cannot reach it (``work``: the bound's work still to do, ``remaining_work``); and its
    checks (None without ``best``)."""
    from accelgen.core.specs import PolicySpec
    from accelgen.sim.runner import simulate

    trace, cfg, policy, params = args
    run_cfg = cfg.model_copy(update={"policy": PolicySpec(name=policy, params=params)})
    if best is None:
        return simulate(trace, run_cfg), None
    bound = GoodputBound(best, work=work)
    try:
        return simulate(trace, run_cfg, check=bound), bound.checks
    except CannotWin as stop:
        return stop, bound.checks


def search(trace: pd.DataFrame, cfg: ExperimentConfig,
           grid: Mapping[str, Sequence[Any]] | None = None, *, metric: str = "goodput_rps",
           processes: int = 1, progress: bool = False,
           floor_run: StoredRun | None = None, prune: bool = True,
           share: bool = True) -> SearchResult:
    """CLAIRVOYANT: simulate the Oracle at every grid point on ``trace`` (so the choice knows every
    arrival), and AccelGen's own schedule (the floor), and keep the best ``metric`` (ties: higher
    request-level SLO attainment, then the earlier schedule, the floor last). ``cfg`` gives the
    deployment and simulator options; policy params in ``cfg`` (if it names the oracle) are the
    base the grid overrides. ``progress``: a bar over the schedules. ``floor_run``: AccelGen's
    own run of ``trace`` (``read_floor``), which stands for the floor instead of simulating it
    again. ``prune`` (with ``metric`` goodput): stop a schedule once its goodput cannot reach
    the best so far (module docstring); with ``processes`` > 1 the bar is the floor's.
    ``share``: a point whose schedule is an earlier point's on ``trace`` (``same_schedules``) is
    not simulated again; its row is that point's, stopped where that run's checks first fall
    below the bar this point would have been checked against (the same row as its own run)."""
    import pandas as pd

    points = grid_points(DEFAULT_GRID if grid is None else grid)
    base, floor = base_params(cfg), floor_params(cfg)
    jobs = [(trace, cfg, "oracle", {**base, **pt}) for pt in points]
    jobs.append((trace, cfg, FLOOR_POLICY, floor))
    to_run = jobs[:-1]
    same = same_schedules([job[3] for job in to_run], trace) if share else {}
    bar = _progress(len(jobs) if floor_run is None else len(to_run)) if progress else None
    floor_out: RunOutput | StoredRun | None = floor_run
    if floor_out is None:
        # The floor first (never stopped: it is the search's fallback), so that its goodput is
        # the bar from the first candidate on, as when it is read from AccelGen's own run: the
        # same schedules stopped, the same table. Its row stays last.
        first, _ = _run(jobs[-1])
        assert not isinstance(first, CannotWin)
        floor_out = first
        if bar is not None:
            bar.update()
    # Only the floor and the best run so far are kept (with their tables: ~1 GB each on the
    # paper trace), the others' summaries: a search holding all 13 runs would need 13 times
    # one run's memory.
    summaries: list[dict[str, Any]] = []
    stops: list[CannotWin | None] = []  # per schedule: why it was stopped (None: it ran out)
    best, best_run = -1, None
    prune = prune and metric == PRUNE_METRIC
    work = remaining_work(trace, cfg) if prune else None

    def score(i: int) -> tuple[float, float, int]:
        s = summaries[i]
        m, att = s.get(metric), s.get("slo_attainment_request")
        # (a summary read back from JSON has None where the run's had NaN)
        return (m if m is not None and m == m else -math.inf,
                att if att is not None and att == att else -math.inf, -i)

    def keep(run: RunOutput | StoredRun | CannotWin) -> None:
        nonlocal best, best_run
        if isinstance(run, CannotWin):
            summaries.append({})
            stops.append(run)
            return
        summaries.append(run.summary)
        stops.append(None)
        if best < 0 or score(len(summaries) - 1) > score(best):
            best, best_run = len(summaries) - 1, run

    def bar_to_beat() -> float | None:
        """The goodput a schedule must reach to be chosen (None: no bound, or none yet)."""
        values = [s.get(metric) for s in summaries] + [floor_out.summary.get(metric)]
        known = [float(m) for m in values if m is not None and m == m]
        return max(known) if prune and known else None

    checks: dict[int, list[Checked] | None] = {}  # per schedule simulated

    def shared(j: int, best_bar: float | None) -> bool:
        """Keep schedule ``j``'s row from the earlier run of its schedule, checked against
        ``best_bar`` as its own run would be; False where those checks cannot say (that run
        was not checked)."""
        i = same[j]
        if best_bar is None:  # (then no earlier bar either: that run went to its end)
            stop = None
        else:
            earlier = checks.get(i)
            if earlier is None:
                return False
            stop = first_stop(earlier, best_bar)
        if stop is not None:
            summaries.append({})
            stops.append(stop)
        else:
            # (ran to its end against a lower bar: it does then against this one, and an equal
            # score at a later index never wins)
            assert stops[i] is None
            summaries.append(dict(summaries[i]))
            stops.append(None)
        return True

    with (ProcessPoolExecutor(min(processes, len(to_run))) if processes > 1
          else contextlib.nullcontext()) as ex:
        fixed_bar = bar_to_beat()
        runs: Any = None
        if ex is not None:
            runs = ex.map(_run, [job for j, job in enumerate(to_run) if j not in same],
                          itertools.repeat(fixed_bar), itertools.repeat(work))
        for j, job in enumerate(to_run):
            best_bar = fixed_bar if ex is not None else bar_to_beat()
            if not (j in same and shared(j, best_bar)):
                # (a shared point its row cannot come from was not handed to the processes)
                submitted = runs is not None and j not in same
                run, checks[j] = next(runs) if submitted else _run(job, best_bar, work)
                keep(run)
                del run  # (not held while the next one runs)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    keep(floor_out)
    # The floor's row shows AccelGen's own value of each grid parameter it has.
    accel = AccelGenParams(**floor)
    floor_row = {k: getattr(accel, k) for k in points[0] if k in AccelGenParams.model_fields}
    rows = []
    for (*_, policy, _params), pt, summary in zip(jobs, [*points, floor_row], summaries,
                                                   strict=True):
        row: dict[str, Any] = {"policy": policy}
        row.update({f"param_{k}": v for k, v in pt.items()})
        row.update({k: v for k, v in summary.items() if isinstance(v, int | float | str)})
        rows.append(row)
    table = pd.DataFrame(rows)
    # Last, whatever the first schedule was: stopped or not, and a stopped one's bound.
    table["stopped"] = [stop is not None for stop in stops]
    table["goodput_bound"] = [math.nan if stop is None else stop.bound for stop in stops]
    table["stopped_at_s"] = [math.nan if stop is None else stop.now for stop in stops]
    table["requests_lost"] = [pd.NA if stop is None else stop.lost for stop in stops]
    table["best"] = [i == best for i in range(len(summaries))]
    floor_won = best == len(points)
    assert best_run is not None
    return SearchResult(floor if floor_won else points[best], best_run, table, metric,
                        floor_won, {j: i for j, i in same.items() if j not in checks})


def search_to_dir(trace: pd.DataFrame, cfg: ExperimentConfig, out: Path | str,
                  grid: Mapping[str, Sequence[Any]] | None = None, *,
                  metric: str = "goodput_rps", processes: int = 1,
                  trace_path: str | None = None, progress: bool = False,
                  floor_run: Path | str | None = None, prune: bool = True,
                  share: bool = True) -> SearchResult:
    """Run ``search`` and write the best run like ``accelgen simulate`` does, plus
    ``oracle_search.csv`` (every schedule tried) in the same directory. ``floor_run``: the
    results directory of AccelGen's own run of the trace (``read_floor``; the same results as
    simulating the floor)."""
    floor = None if floor_run is None else read_floor(floor_run, cfg, trace_path)
    res = search(trace, cfg, grid, metric=metric, processes=processes, progress=progress,
                 floor_run=floor, prune=prune, share=share)
    run = res.best
    run.summary["policy"] = "oracle"
    run.summary["clairvoyant"] = True
    run.config["oracle_search"] = {
        "clairvoyant": True, "metric": metric,
        "grid": {k: list(v) for k, v in (DEFAULT_GRID if grid is None else grid).items()},
        "best_params": res.best_params, "floor_won": res.floor_won,
        "floor": {"policy": FLOOR_POLICY, "params": floor_params(cfg)}}
    if trace_path is not None:
        run.config["trace"] = trace_path
    out = run.write(out)
    res.table.to_csv(out / "oracle_search.csv", index=False)
    return res


def closing_lines(res: SearchResult, out: Path | str) -> list[str]:
    """What ``accelgen oracle`` and ``accelgen simulate --policy oracle`` print."""
    s, t = res.best.summary, res.table
    floor = t[t["policy"] == FLOOR_POLICY].iloc[0]
    return [f"oracle (CLAIRVOYANT): best of {len(t)} schedules by {res.metric}: "
            f"{res.best_label()}",
            f"  goodput {s['goodput_rps']:.4g} req/s (AccelGen's own schedule: "
            f"{floor['goodput_rps']:.4g}); SLO attainment request "
            f"{s['slo_attainment_request']:.3f}; preemptions {s['num_preemptions']}",
            f"  results: {out} ({outcome_counts(s)}; every schedule in oracle_search.csv, "
            f"{int(t['stopped'].sum())} stopped once they could not win, {len(res.same_as)} "
            "the schedule of one before them on this trace, not simulated again)"]


def _progress(total: int) -> Any:  # pragma: no cover - cosmetic
    from tqdm import tqdm

    return tqdm(total=total, unit="schedule", desc="oracle search", mininterval=1.0)
