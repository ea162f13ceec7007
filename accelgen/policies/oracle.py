"""The Oracle: CLAIRVOYANT AccelGen (an upper reference, not a deployable scheduler).

It reads what no real scheduler can know: every request's true output length and the arrival
times of the whole trace (``clairvoyant = True`` makes the simulator fill
``view.true_output_len`` and ``view.next_arrivals``; the vLLM backend grants neither, so the Oracle
refuses to run there). Two parts, as in the paper ("knows the remaining time for job completion,
the arrival times and output lengths of all requests, and schedules the chunking and batching to
maximize the goodput"; the authors searched schedules with the Vidur simulator):

1. ``OraclePolicy``: AccelGen's decision (slack order, dynamic chunking, multi-resource batching,
   ERA; the same compiled decision, ``accelgen_decision``) with exact knowledge as its inputs:
   - exact KV planning (``kv_plan: exact``): a request is admitted only if its *final* KV
     (prompt + true output - 1 tokens, the last sampled token is never fed back) fits in the free
     KV not already promised to the final KV of every running request. Running requests can
     therefore always grow to completion: no preemption is ever needed, and none is made;
   - exact JCT estimates: the offline JCT plan uses the true output length as S_g instead of the
     dataset mean.
2. ``search``: runs the simulator once per point of a grid over AccelGen's parameters (by
   default gamma, ERA scope and whether to plan KV exactly; any other parameter such as the
   budget cap or budget rule can be added) on the real trace, i.e.
   knowing every arrival, and keeps the schedule with the best goodput. The default grid contains
   AccelGen's own defaults with ``kv_plan: none`` (identical to AccelGen on online-only traces,
   tested), so the Oracle's goodput is at least AccelGen's by construction; the interesting
   outputs are the margin and which point wins (written to ``oracle_search.csv``).

Command line (writes the best run as a normal results directory plus the search table)::

    python -m accelgen.policies.oracle --trace T.parquet --deployment opt-13b --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from accelgen.policies.accelgen import AccelGenParams, AccelGenPolicy
from accelgen.policies.accelgen_workspace import Outcome, Workspace
from accelgen.policies.base import Decision, PolicyParams, SchedulerView
from accelgen.request import Request

if TYPE_CHECKING:
    import pandas as pd

    from accelgen.config import ExperimentConfig
    from accelgen.sim.runner import RunOutput


class OracleParams(AccelGenParams):
    kv_plan: Literal["exact", "none"] = "exact"  # none: AccelGen's own KV rule (may preempt)
    exact_lengths: bool = True  # offline JCT plan with the true output length as S_g


class OraclePolicy(AccelGenPolicy):
    """CLAIRVOYANT: AccelGen's decision with the true output lengths as inputs (see the module
    docstring): in the table (``true_out``, and as S_g with ``exact_lengths``) and, with
    ``kv_plan: exact``, the decision's exact KV plan (``exact_kv``)."""

    name = "oracle"
    Params = OracleParams
    params: OracleParams
    clairvoyant = True

    def __init__(self, params: PolicyParams | None = None, **overrides: object) -> None:
        super().__init__(params, **overrides)
        self._true: dict[int, int] | None = None

    def on_arrival(self, req: Request, now: float) -> None:
        super().on_arrival(req, now)
        if self._true is not None:
            self._patch([self._table.slot_of[req.req_id]])

    def _patch(self, slots: Iterable[int]) -> None:
        """Store the true output lengths in the table (and, with ``exact_lengths``, where
        AccelGen keeps its predicted one, S_g, so its offline JCT plan becomes exact)."""
        t, true = self._table, self._true
        assert true is not None
        for s in slots:
            t.true_out[s] = true[t.objs[s].req_id]
            if self.params.exact_lengths:
                t.pred_out[s] = t.true_out[s]

    def _exact_kv(self) -> bool:
        return self.params.kv_plan == "exact"

    def schedule(self, view: SchedulerView) -> Decision:
        if view.true_output_len is None:
            raise RuntimeError("the Oracle is clairvoyant: it needs a backend that grants "
                               "view.true_output_len (the simulator does; vLLM does not)")
        t = self._table
        if self._true is None:
            self._true = view.true_output_len
            self._patch(range(t.n))
        if len(view.waiting) + len(view.running) != t.n:
            self._sync(view)  # rebuilt from the request objects: the true lengths again
            self._patch(range(t.n))
        return super().schedule(view)

    def _decision(self, ws: Workspace, out: Outcome) -> Decision:
        if out.n_preempted and self._exact_kv():
            # never: the exact plan has no victims; a violation is a bug, not a choice
            raise AssertionError("Oracle preempted under an exact KV plan")
        d = super()._decision(ws, out)
        d.info["clairvoyant"] = 1.0
        d.info["oracle_reforms"] = float(out.oracle_reforms)
        d.info["oracle_excluded"] = float(out.oracle_excluded)
        if self._exact_kv():
            d.info["oracle_admissible"] = float(out.oracle_admissible)
        return d


# -- the parameter search ----------------------------------------------------------------------

# AccelGen's defaults (gamma 0.75, cap 1.0, ERA on prefill, paper rule) with kv_plan none are in
# the grid, so the search can never do worse than AccelGen itself. 12 simulations per trace keep
# the quick pipeline in minutes; budget_cap, budget_rule, long_prompt_threshold, ... can be added
# through ``grid`` (e.g. {"budget_cap": [1.0, 1.25]}).
DEFAULT_GRID: dict[str, list[Any]] = {
    "kv_plan": ["exact", "none"],
    "gamma": [0.25, 0.75, 1.5],
    "era_scope": ["prefill", "request"],
}


@dataclass(slots=True)
class SearchResult:
    """CLAIRVOYANT search outcome: the best point, its run, and every point's summary."""

    best_params: dict[str, Any]
    best: RunOutput
    table: pd.DataFrame  # one row per grid point: its params and summary metrics
    metric: str


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    for k in keys:
        if k not in OracleParams.model_fields:
            raise ValueError(f"oracle grid: unknown parameter {k!r}")
        if not grid[k]:
            raise ValueError(f"oracle grid: no values for {k!r}")
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*grid.values())]


def _run_point(args: tuple[pd.DataFrame, ExperimentConfig, dict[str, Any]]) -> RunOutput:
    from accelgen.config import PolicySpec
    from accelgen.sim.runner import simulate

    trace, cfg, point = args
    base = dict(cfg.policy.params) if cfg.policy.name == "oracle" else {}
    cfg = cfg.model_copy(update={"policy": PolicySpec(name="oracle", params={**base, **point})})
    return simulate(trace, cfg)


def search(trace: pd.DataFrame, cfg: ExperimentConfig,
           grid: Mapping[str, Sequence[Any]] | None = None, *, metric: str = "goodput_rps",
           processes: int = 1) -> SearchResult:
    """CLAIRVOYANT: simulate the Oracle at every grid point on ``trace`` (so the choice knows every
    arrival) and keep the best ``metric`` (ties: higher request-level SLO attainment, then the
    earlier grid point). ``cfg`` gives the deployment and simulator options; policy params in
    ``cfg`` (if it names the oracle) are the base the grid overrides."""
    import pandas as pd

    points = grid_points(DEFAULT_GRID if grid is None else grid)
    jobs = [(trace, cfg, pt) for pt in points]
    if processes > 1 and len(points) > 1:
        with ProcessPoolExecutor(min(processes, len(points))) as ex:
            runs = list(ex.map(_run_point, jobs))
    else:
        runs = [_run_point(j) for j in jobs]
    rows = []
    for pt, run in zip(points, runs, strict=True):
        row = {f"param_{k}": v for k, v in pt.items()}
        row.update({k: v for k, v in run.summary.items() if isinstance(v, int | float | str)})
        rows.append(row)
    table = pd.DataFrame(rows)

    def score(i: int) -> tuple[float, float, int]:
        s = runs[i].summary
        m, att = s.get(metric, math.nan), s.get("slo_attainment_request", math.nan)
        return (m if m == m else -math.inf, att if att == att else -math.inf, -i)

    best = max(range(len(runs)), key=score)
    table["best"] = [i == best for i in range(len(runs))]
    return SearchResult(points[best], runs[best], table, metric)


def search_to_dir(trace: pd.DataFrame, cfg: ExperimentConfig, out: Path | str,
                  grid: Mapping[str, Sequence[Any]] | None = None, *,
                  metric: str = "goodput_rps", processes: int = 1,
                  trace_path: str | None = None) -> SearchResult:
    """Run ``search`` and write the best run like ``accelgen simulate`` does, plus
    ``oracle_search.csv`` (every grid point) in the same directory."""
    from accelgen.sim.recorder import write_results

    res = search(trace, cfg, grid, metric=metric, processes=processes)
    run = res.best
    run.summary["policy"] = "oracle"
    run.summary["clairvoyant"] = True
    run.config["oracle_search"] = {"clairvoyant": True, "metric": metric,
                                   "grid": {k: list(v) for k, v in (grid or DEFAULT_GRID).items()},
                                   "best_params": res.best_params}
    if trace_path is not None:
        run.config["trace"] = trace_path
    out = Path(write_results(out, run.requests, run.iterations, run.summary, run.config,
                             run.timing, run.timing_summary))
    res.table.to_csv(out / "oracle_search.csv", index=False)
    return res


def _configure(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--trace", required=True, type=Path, help="trace file (.parquet or .csv)")
    ap.add_argument("--out", required=True, type=Path, help="results directory (best run)")
    ap.add_argument("--config", type=Path, help="experiment YAML (deployment/policy/sim/seed)")
    ap.add_argument("--deployment", help="a built-in deployment, e.g. opt-13b")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--grid", help='JSON object of parameter lists, e.g. \'{"gamma": [0.5, 1]}\'')
    ap.add_argument("--param", action="append", metavar="KEY=VALUE", help="fixed oracle parameter")
    ap.add_argument("--metric", default="goodput_rps", help="summary metric to maximise")
    ap.add_argument("--processes", type=int, default=1, help="grid points simulated in parallel")
    ap.set_defaults(func=run)
    return ap


_DESCRIPTION = ("CLAIRVOYANT Oracle: simulate AccelGen with true output lengths over a grid of its "
                "parameters and keep the best goodput.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``accelgen oracle ...`` (for ``accelgen.cli.COMMANDS``)."""
    _configure(sub.add_parser("oracle", help="clairvoyant Oracle search", description=_DESCRIPTION))


def run(a: argparse.Namespace) -> int:
    from accelgen.sim.cli import build_config
    from accelgen.workloads.trace import load_trace

    ns = argparse.Namespace(config=a.config, deployment=a.deployment, model=None, hardware=None,
                            tp=None, pp=None, kv_gb=None, profile_csv=None, policy="oracle",
                            param=a.param, no_progress=True, seed=a.seed)
    cfg = build_config(ns)
    grid = json.loads(a.grid) if a.grid else None
    res = search_to_dir(load_trace(a.trace), cfg, a.out, grid, metric=a.metric,
                        processes=a.processes, trace_path=str(a.trace))
    s = res.best.summary
    print(f"oracle (CLAIRVOYANT) best of {len(res.table)} points by {a.metric}: {res.best_params}")
    print(f"  goodput {s['goodput_rps']:.3f} req/s; SLO attainment request "
          f"{s['slo_attainment_request']:.3f}; preemptions {s['num_preemptions']}")
    print(f"  results: {a.out} (search table: {a.out / 'oracle_search.csv'})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = _configure(argparse.ArgumentParser(prog="python -m accelgen.policies.oracle",
                                            description=_DESCRIPTION))
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
