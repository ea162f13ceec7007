"""Experiment-grid expansion: the pipeline config -> workload variants, traces, runs, figures.

The Snakefile and the aggregation jobs both call :class:`Grid`, so the files a rule asks for and
the runs a figure reads are the same by construction.

File layout (``<name>`` is the config's ``name``, ``<figures>`` its ``figures_dir``)::

    data/<name>/workloads/<variant>.yaml              # `workload:` of one variant
    data/<name>/scenarios/<scenario>.csv              # hand-built traces (figures 2, 6)
    data/<name>/traces/<variant>/<deployment>/seed<s>.parquet
    results/<name>/deployments/<deployment>.yaml      # experiment config: deployment + sim
    results/<name>/runs/<variant>/<deployment>/<system>/seed<s>/   # one simulation
    <figures>/<figure>.csv|.png|.pdf
    logs/<name>/...  benchmarks/<name>/...

Policy names may contain ``/`` (``accelgen/order``); paths use the config's system names, which
are path-safe (``accelgen-no-order``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelgen.figures.catalog import FIGURES, GROUPS
from accelgen.pipeline.config_file import (
    BASE_VARIANT,
    PipelineConfig,
    PipelineConfigError,
    SystemSpec,
    deep_merge,
    invalid_config_message,
)

SCENARIO_PREFIX = "scenario-"
CLAIMS = "claims"  # <figures_dir>/claims.csv: the paper's claims beside ours (SPEC 11)
ENGINE_FIGURE = "fig17_engine_capacity"  # regime `engine`'s CSV (rules/engine.smk)
LONG_PROMPT = 4096  # the paper's long-prompt threshold (>= 4K tokens)


@dataclass(frozen=True, order=True)
class Run:
    variant: str
    deployment: str
    system: str
    seed: int


@dataclass(frozen=True)
class Figure:
    """One figure of SPEC section 8: its runs (with labels) and what else it reads."""

    key: str  # Snakemake target rule, e.g. "fig01"
    id: str  # file stem, e.g. "fig01_iteration_time_cdf"
    group: str  # notebook (notebooks/<group>.ipynb)
    title: str
    experiment: str
    runs: tuple[dict[str, Any], ...] = ()
    traces: tuple[dict[str, Any], ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        return {"figure": self.id, "title": self.title, "runs": list(self.runs),
                "traces": list(self.traces), "options": self.options}

    def spec_json(self) -> str:
        return json.dumps(self.spec(), sort_keys=True, separators=(",", ":"))


# SPEC section 11: the regime of each figure (`-`: no load setting: a scenario, a trace, the
# cost model). Both regimes are in the quick and the paper configs.
REGIMES: dict[str, str] = {
    **{f"fig{i:02d}": "paper" for i in (1, 2, 3, 4, 5, 7, 9, 10, 11, 12)},
    "fig06": "-", "fig08": "-", "extra_chunking": "-", "extra_pivots": "-",
    "extra_capacity": "paper", "extra_bounds": "paper",
    "fig13": "capacity", "fig14": "capacity", "fig15": "capacity", "fig16": "capacity",
    "fig18": "capacity",
}
# A system's budget setting (the ``setting`` of its runs; the claims table compares AccelGen
# with the paper-setting baselines and, apart, with the strongest tuned one, SPEC 12).
# ``ladder``: one budget of the envelope's ladder; ``envelope``: the best of them per rate.
PAPER_SETTING, TUNED_SETTING, LADDER_SETTING, ENVELOPE_SETTING = (
    "paper", "tuned", "ladder", "envelope")


def _default_param(policy: str, name: str) -> Any:
    """A policy parameter's default (e.g. ``max_num_seqs``)."""
    from accelgen.policies.registry import policy_class

    return policy_class(policy).Params.model_fields[name].default


def fmt_num(x: float) -> str:
    """A number as a path-friendly token: 8.0 -> '8', 0.25 -> '0.25'."""
    return f"{x:g}"


class Grid:
    """The expanded experiment grid of a validated config (``accelgen.pipeline.config_file.load``).
    Building it checks what only the expansion shows (derived workloads: rates, long-prompt
    shares, datasets) and raises ``PipelineConfigError`` naming the key, as ``load`` does."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.data_root = f"data/{cfg.name}"
        self.results_root = f"results/{cfg.name}"
        self.logs_root = f"logs/{cfg.name}"
        self.bench_root = f"benchmarks/{cfg.name}"
        self.figures_dir = cfg.figures_dir
        self.variants: dict[str, dict[str, Any]] = {}
        self.scenarios: dict[str, dict[str, Any]] = {}  # scenario -> generator spec
        self.variant_scenario: dict[str, str] = {}
        self.systems: dict[str, SystemSpec] = dict(cfg.systems)
        self.system_labels: dict[str, str] = {k: cfg.system_label(k) for k in cfg.systems}
        # (variant, deployment, system) -> the token budget of a `budget: tuned` system there.
        self.tuned: dict[tuple[str, str, str], Any] = {}
        # A system of figure 18 charged with per-step noise -> its level (the others: none).
        self.noise_level: dict[str, float] = {}
        self.noise_of: dict[str, str] = {}  # a noisy system -> the system it charges with noise
        self.figures: dict[str, Figure] = {}
        # A run -> the run whose results directory it reads (itself, or the same simulation
        # under another system name: ``_share_identical``).
        self.same_as: dict[Run, Run] = {}
        self._by_command: dict[tuple[Any, ...], Run] = {}
        # A run of the capacity sweep -> its load factor (its rate over the capacity estimate).
        self.load_factor: dict[Run, float] = {}
        # A variant of the sensitivity sweep's rates -> (its workload, its rate): the runtime
        # estimate prices it by its load (``accelgen.pipeline.resources.job_seconds``).
        self.rate_sweep: dict[str, tuple[str, float]] = {}
        try:
            self._build()
            self.check_workloads()
        except PipelineConfigError as exc:
            raise PipelineConfigError(invalid_config_message([str(exc)])) from None

    # ------------------------------------------------------------------ paths
    def workload_yaml(self, variant: str) -> str:
        return f"{self.data_root}/workloads/{variant}.yaml"

    def scenario_csv(self, scenario: str) -> str:
        return f"{self.data_root}/scenarios/{scenario}.csv"

    def trace_path(self, variant: str, deployment: str, seed: int) -> str:
        return f"{self.data_root}/traces/{variant}/{deployment}/seed{seed}.parquet"

    def deployment_yaml(self, deployment: str) -> str:
        return f"{self.results_root}/deployments/{deployment}.yaml"

    def run_dir(self, run: Run) -> str:
        return (f"{self.results_root}/runs/{run.variant}/{run.deployment}/{run.system}/"
                f"seed{run.seed}")

    def run_summary(self, run: Run) -> str:
        return f"{self.run_dir(run)}/summary.json"

    def figure_file(self, fig_id: str, ext: str) -> str:
        return f"{self.figures_dir}/{fig_id}.{ext}"

    # ------------------------------------------------------------------ variants
    def _variant(self, name: str, data: dict[str, Any]) -> str:
        """Register a derived workload; one equal to an existing workload reuses that one."""
        for existing, wl in self.variants.items():
            if wl == data:
                return existing
        self.variants[name] = data
        return name

    def _base_variant(self, variant: str) -> str:
        """A named variant (or ``base``) keeps its name, even if it equals another."""
        self.variants.setdefault(variant, self.cfg.workload_dict(variant))
        return variant

    def _derived(self, parent: str, name: str, data: dict[str, Any]) -> str:
        if data == self.cfg.workload_dict(parent):
            return self._base_variant(parent)
        return self._variant(name, data)

    def _rate_variant(self, variant: str, rate: float) -> str:
        data = self.cfg.workload_dict(variant)
        return self._derived(variant, f"{variant}-rate{fmt_num(rate)}",
                             deep_merge(data, {"arrival": {"rate": rate}}))

    def _dataset_variant(self, variant: str, dataset: str) -> str:
        data = self.cfg.workload_dict(variant)
        if data.get("kind") == "mix":
            sources = data.get("sources", {})
            if dataset not in sources:
                raise PipelineConfigError(f"experiments.datasets.datasets: the workload has no "
                                          f"source named {dataset!r}")
            over: dict[str, dict[str, Any]] = {
                "sources": {k: {"share": 1.0 if k == dataset else 0.0} for k in sources}}
        else:
            over = {"mix": {k: (1.0 if k == dataset else 0.0) for k in data.get("mix", {})}}
            over["mix"][dataset] = 1.0
        return self._derived(variant, f"{variant}-only-{dataset}", deep_merge(data, over))

    def long_share(self, data: dict[str, Any]) -> float:
        """Share of prompts >= 4K tokens of a synthetic workload (before truncation)."""
        from accelgen.workloads.synthetic import PROMPT_BUCKET_PROBS

        buckets = {**PROMPT_BUCKET_PROBS, **{k: tuple(v) for k, v in
                                             (data.get("prompt_buckets") or {}).items()}}
        return sum(share * buckets[ds][2] for ds, share in data.get("mix", {}).items())

    def _long_variant(self, variant: str, frac: float) -> str:
        """Reshape BookCorpus's prompt buckets (mid <-> long) so that ``frac`` of all prompts
        are >= 4K tokens; other datasets and every output distribution stay as they are."""
        from accelgen.workloads.synthetic import PROMPT_BUCKET_PROBS

        data = self.cfg.workload_dict(variant)
        if data.get("kind") != "synthetic":
            raise PipelineConfigError("experiments.sensitivity.long_fractions: needs a synthetic "
                                      f"workload (variant {variant!r} is {data.get('kind')!r})")
        if abs(self.long_share(data) - frac) < 1e-9:
            return self._base_variant(variant)
        mix = data.get("mix", {})
        buckets = {**PROMPT_BUCKET_PROBS, **{k: tuple(v) for k, v in
                                             (data.get("prompt_buckets") or {}).items()}}
        bc = float(mix.get("bookcorpus", 0.0))
        others = sum(s * buckets[ds][2] for ds, s in mix.items() if ds != "bookcorpus")
        b0 = buckets["bookcorpus"][0]
        q = (frac - others) / bc if bc > 0 else -1.0
        if not (-1e-12 <= q <= 1 - b0 + 1e-12):
            raise PipelineConfigError(
                f"experiments.sensitivity.long_fractions: {frac} is not reachable by reshaping "
                f"BookCorpus prompts (BookCorpus share {bc}, other datasets' long share {others})")
        q = min(max(q, 0.0), 1 - b0)
        over = {"prompt_buckets": {"bookcorpus": [b0, round(1 - b0 - q, 12), round(q, 12)]}}
        return self._derived(variant, f"{variant}-long{fmt_num(round(frac * 100, 6))}",
                             deep_merge(data, over))

    def _sized_variant(self, variant: str, n: int) -> str:
        data = self.cfg.workload_dict(variant)
        return self._derived(variant, f"{variant}-n{n}", deep_merge(data, {"num_requests": n}))

    def _scenario_variant(self, scenario: str, spec: dict[str, Any]) -> str:
        """A hand-built trace replayed through the workload module (SLOs assigned as usual)."""
        name = f"{SCENARIO_PREFIX}{scenario}"
        base = self.cfg.workload_dict(BASE_VARIANT)
        data = {
            "kind": "vidur_csv", "path": self.scenario_csv(scenario), "sampling": "sequential",
            "num_requests": None, "seed": base.get("seed", 0),
            "max_model_len": base.get("max_model_len"), "max_tokens": base.get("max_tokens"),
            "source_name": scenario, "arrival": {"kind": "replay"},
            "slo": base.get("slo", {}),
        }
        self.variants[name] = data
        self.scenarios[scenario] = spec
        self.variant_scenario[name] = scenario
        return name

    # ------------------------------------------------------------------ systems
    def _system_with(self, system: str, param: str, value: float) -> str:
        spec = self.cfg.systems[system]
        name = f"{system}-{param.replace('_', '')}{fmt_num(value)}"
        label = f"{self.system_labels[system]} ({param.replace('_', ' ')} {fmt_num(value)} s)"
        self.systems[name] = SystemSpec(policy=spec.policy, params={**spec.params, param: value},
                                        label=label)
        self.system_labels[name] = label
        return name

    def _envelope_systems(self, system: str, budgets: list[int]) -> tuple[str, list[str]]:
        """The budget ladder of the best-static-budget envelope: one system per budget; returns
        (the envelope's name, the members' names)."""
        spec = self.cfg.systems[system]
        label = self.system_labels[system]
        members = []
        for b in budgets:
            name = f"{system}-b{b}"
            self.systems[name] = SystemSpec(policy=spec.policy,
                                            params={**spec.params, "token_budget": b},
                                            label=f"{label} (budget {b})")
            self.system_labels[name] = f"{label} (budget {b})"
            members.append(name)
        envelope = f"{system}-envelope"
        self.system_labels[envelope] = f"{label}, best static budget (clairvoyant)"
        return envelope, members

    def tuned_budget(self, variant: str, deployment: str, system: str) -> Any:
        """The resolved token budget (``accelgen.costmodel.budget.TunedBudget``) of a
        ``budget: tuned`` system on a run of the grid."""
        try:
            return self.tuned[(variant, deployment, system)]
        except KeyError:
            raise KeyError(f"no tuned budget for system {system!r} on {deployment} / "
                           f"{variant}: not a tuned system of the grid") from None

    def _resolve_tuned(self, variant: str, budget_variant: str, deployment: str, system: str,
                       seed: int) -> Any:
        """Sarathi-Serve's budget of a tuned system (:mod:`accelgen.pipeline.capacity`), from
        ``budget_variant``'s trace (a rate sweep uses its base workload: rates do not change
        lengths or SLOs)."""
        from accelgen.costmodel.factory import effective_max_model_len
        from accelgen.pipeline.capacity import workload_tuned_budget

        key = (variant, deployment, system)
        if key not in self.tuned:
            dep = self.cfg.deployment(deployment)
            mml = max(1, effective_max_model_len(dep) - self.cfg.truncate_margin)
            seqs = int(self.systems[system].params.get(
                "max_num_seqs", _default_param(self.systems[system].policy, "max_num_seqs")))
            data = self.variants.get(budget_variant) or self.cfg.workload_dict(budget_variant)
            try:
                self.tuned[key] = workload_tuned_budget(data, dep, seed, mml, seqs)
            except ValueError as exc:
                raise PipelineConfigError(f"systems.{system}.budget: {exc}") from None
        return self.tuned[key]

    # ------------------------------------------------------------------ figures
    def _run_ref(self, run: Run, **extra: Any) -> dict[str, Any]:
        return {"dir": self.run_dir(run), "variant": run.variant, "deployment": run.deployment,
                "deployment_label": self.cfg.deployment_label(run.deployment),
                "system": run.system, "system_label": self.system_labels[run.system],
                "policy": self.systems[run.system].policy, "seed": run.seed, **extra}

    def _grid_refs(self, variant: str, deployments: Iterable[str], systems: Iterable[str],
                   seeds: Iterable[int], *, budget_variant: str | None = None,
                   **extra: Any) -> list[dict[str, Any]]:
        seeds = list(seeds)
        out = []
        for d in deployments:
            for s in systems:
                more: dict[str, Any] = {"setting": self.systems[s].budget}
                if self.systems[s].budget == TUNED_SETTING:
                    tb = self._resolve_tuned(variant, budget_variant or variant, d, s, seeds[0])
                    more = {"setting": TUNED_SETTING, "token_budget": tb.token_budget}
                out += [self._run_ref(Run(variant, d, s, seed), **extra, **more)
                        for seed in seeds]
        return out

    def _build(self) -> None:
        cfg, ex = self.cfg, self.cfg.experiments
        figs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]] = {}

        m = ex.measurement
        if m is not None and m.enabled:
            v = self._base_variant(m.workload)
            refs = self._grid_refs(v, m.deployments, m.systems, cfg.seeds_of(m))
            for key in ("fig01", "fig02", "fig03", "fig04"):
                figs[key] = (refs, [], {"reading_speed": m.reading_speed})

        s = ex.system_slo
        if s is not None and s.enabled:
            v = self._base_variant(s.workload)
            refs = []
            for slo in s.slos:
                sysname = self._system_with(s.system, s.param, slo)
                refs += self._grid_refs(v, s.deployments, [sysname], cfg.seeds_of(s),
                                        system_slo=slo)
            figs["fig05"] = (refs, [], {})

        e = ex.era
        if e is not None and e.enabled:
            v = self._scenario_variant("era", {"kind": "era", **e.model_dump(
                include={"long_prompts", "num_short", "short_range", "output_range",
                         "long_output", "interval"})})
            figs["fig06"] = (self._grid_refs(v, e.deployments, e.systems, cfg.seeds_of(e)), [],
                             {"long_prompts": list(e.long_prompts)})

        o = ex.ordering
        if o is not None and o.enabled:
            v = self._base_variant(o.workload)
            figs["fig07"] = (self._grid_refs(v, o.deployments, o.systems, cfg.seeds_of(o)), [],
                             {})

        f = ex.features
        if f is not None and f.enabled:
            v = self._sized_variant(f.workload, f.num_requests)
            seed = cfg.seeds_of(f)[0]
            traces = [{"path": self.trace_path(v, f.deployment, seed), "variant": v,
                       "deployment": f.deployment, "seed": seed}]
            figs["fig08"] = ([], traces, {"long_threshold": LONG_PROMPT})

        ev = ex.evaluation
        if ev is not None and ev.enabled:
            v = self._base_variant(ev.workload)
            figs["fig09"] = (self._grid_refs(v, ev.deployments, ev.systems, cfg.seeds_of(ev)),
                             [], {})

        ab = ex.ablation
        if ab is not None and ab.enabled:
            v = self._base_variant(ab.workload)
            figs["fig10"] = (self._grid_refs(v, ab.deployments, ab.systems, cfg.seeds_of(ab)),
                             [], {})

        se = ex.sensitivity
        if se is not None and se.enabled:
            refs_long: list[dict[str, Any]] = []
            refs_rate: list[dict[str, Any]] = []
            for frac in se.long_fractions:
                v = self._long_variant(se.workload, frac)
                refs_long += self._grid_refs(v, se.deployments, se.systems, cfg.seeds_of(se),
                                             sweep="long_fraction", x=frac)
            for rate in se.rates:
                v = self._rate_variant(se.workload, rate)
                refs_rate += self._grid_refs(v, se.deployments, se.systems, cfg.seeds_of(se),
                                             sweep="rate", x=rate)
                self.rate_sweep[v] = (se.workload, rate)
            figs["fig11"] = (refs_long + refs_rate, [], {})
            figs["extra_capacity"] = (refs_rate, [], {"target": 0.9})

        ds = ex.datasets
        if ds is not None and ds.enabled:
            refs = []
            for dataset in ds.datasets:
                v = self._dataset_variant(ds.workload, dataset)
                refs += self._grid_refs(v, ds.deployments, ds.systems, cfg.seeds_of(ds),
                                        dataset=dataset)
            figs["fig12"] = (refs, [], {})

        ch = ex.chunking
        if ch is not None and ch.enabled:
            v = self._scenario_variant("chunking", {"kind": "chunking", **ch.model_dump(
                include={"long_prompt", "long_output", "num_others", "other_prompt_range",
                         "other_output_range", "long_arrival"})})
            figs["extra_chunking"] = (self._grid_refs(v, [ch.deployment], ch.systems,
                                                      cfg.seeds_of(ch)[:1]), [],
                                      {"long_prompt": ch.long_prompt})

        if ev is not None and ev.enabled:
            v = self._base_variant(ev.workload)
            seed = cfg.seeds_of(ev)[0]
            rate = float(self.variants[v].get("arrival", {}).get("rate", math.nan))
            traces = [{"path": self.trace_path(v, d, seed), "variant": v, "deployment": d,
                       "deployment_label": cfg.deployment_label(d), "seed": seed,
                       "offered_rps": rate,
                       "spec": cfg.deployment(d).model_dump(mode="json")}
                      for d in ev.deployments]
            figs["extra_bounds"] = ([], traces, {"regime": "paper"})

        cap = ex.capacity
        if cap is not None and cap.enabled:
            self._capacity_figures(cap, figs)

        dep_rows = []
        for dname in cfg.deployments:
            dep = cfg.deployment(dname)
            dep_rows.append({"deployment": dname, "label": cfg.deployment_label(dname),
                             **dep.model_dump(mode="json")})
        figs["extra_pivots"] = ([], [], {"deployments": dep_rows})

        self._share_identical(figs)
        for key, fid, group, title, exp in FIGURES:
            if key in figs:
                runs, traces, opts = figs[key]
                self.figures[key] = Figure(key, fid, group, title, exp, tuple(runs),
                                           tuple(traces), opts)

    def _share_identical(self, figs: dict[str, Any]) -> None:
        """Runs that are one simulation under two system names (the same command on the same
        trace, e.g. a tuned budget equal to one of the envelope's ladder; with ``backend: vllm``
        the same replay command) run once: every ref's
        ``dir`` is the results directory of the first name in sorted order (``same_as``)."""
        first: dict[tuple[Any, ...], Run] = {}
        key_of: dict[Run, tuple[Any, ...]] = {}
        for refs, _, _ in figs.values():
            for r in refs:
                run = Run(r["variant"], r["deployment"], r["system"], r["seed"])
                # The real engine's command: one policy's model may be two engine runs (stock
                # vLLM and the plugin hosting the same policy).
                command = self.replay_args if self.cfg.backend == "vllm" else self.system_args
                key = (tuple(command(run.system, run.variant, run.deployment)),
                       run.variant, run.deployment, run.seed)
                if key not in first or run < first[key]:
                    first[key] = run
                key_of[run] = key
        self.same_as = {run: first[key] for run, key in key_of.items()}
        self._by_command = first
        for refs, _, _ in figs.values():
            for r in refs:
                if "load_factor" in r:
                    self.load_factor[self.same_as[Run(r["variant"], r["deployment"], r["system"],
                                                      r["seed"])]] = float(r["load_factor"])
        for fig, (refs, traces, opts) in figs.items():
            figs[fig] = ([{**r, "dir": self.run_dir(self.same_as[
                Run(r["variant"], r["deployment"], r["system"], r["seed"])])} for r in refs],
                traces, opts)

    def capacity_bound(self, variant: str, deployment: str, seed: int) -> Any:
        """The capacity estimate of a deployment on a workload variant's trace
        (:mod:`accelgen.pipeline.capacity`)."""
        from accelgen.costmodel.factory import effective_max_model_len
        from accelgen.pipeline.capacity import workload_bound

        dep = self.cfg.deployment(deployment)
        mml = max(1, effective_max_model_len(dep) - self.cfg.truncate_margin)
        return workload_bound(self.cfg.workload_dict(variant), dep, seed, mml)

    def _ttft_scale_variant(self, variant: str, scale: float) -> str:
        data = self.variants[variant]
        return self._variant(f"{variant}-ttft{fmt_num(scale)}",
                             deep_merge(data, {"slo": {"ttft_scale": [scale, scale]}}))

    def _capacity_figures(self, cap: Any, figs: dict[str, Any]) -> None:
        """Figures 13-15: a rate sweep of ``load_factors`` x each deployment's estimate."""
        from accelgen.pipeline.capacity import sweep_rate

        cfg = self.cfg
        seeds = cfg.seeds_of(cap)
        self._base_variant(cap.workload)
        refs: list[dict[str, Any]] = []
        scale_refs: list[dict[str, Any]] = []
        bounds = []
        envelope = None
        if cap.envelope is not None:
            envelope = self._envelope_systems(cap.envelope.system, cap.envelope.budgets)
        budgets = []
        for d in cap.deployments:
            bound = self.capacity_bound(cap.workload, d, seeds[0])
            est = bound.estimate_rps
            bounds.append({"deployment": d, "deployment_label": cfg.deployment_label(d),
                           **bound.as_dict()})
            for factor in cap.load_factors:
                rate = sweep_rate(factor, est)
                v = self._rate_variant(cap.workload, rate)
                refs += self._grid_refs(v, [d], cap.systems, seeds, sweep="rate", x=rate,
                                        load_factor=factor, budget_variant=cap.workload)
                if envelope is not None and d in (cap.envelope.deployments or [d]):
                    name, members = envelope
                    refs += [{**r, "setting": LADDER_SETTING,
                              "token_budget": self.systems[r["system"]].params["token_budget"],
                              "envelope": name, "envelope_label": self.system_labels[name]}
                             for r in self._grid_refs(v, [d], members, seeds, sweep="rate",
                                                      x=rate, load_factor=factor)]
            for s in cap.systems:
                if self.systems[s].budget == TUNED_SETTING:
                    v = self._rate_variant(cap.workload, sweep_rate(cap.load_factors[0], est))
                    tb = self.tuned_budget(v, d, s)
                    budgets.append({"deployment": d, "deployment_label": cfg.deployment_label(d),
                                    "system": s, "system_label": self.system_labels[s],
                                    "policy": self.systems[s].policy, **tb.as_dict()})
            ss = cap.slo_scale
            if ss is not None:
                rate = sweep_rate(ss.load_factor, est)
                v_rate = self._rate_variant(cap.workload, rate)
                for scale in ss.ttft_scales:
                    v = self._ttft_scale_variant(v_rate, scale)
                    scale_refs += self._grid_refs(v, [d], ss.systems, seeds, sweep="ttft_scale",
                                                  x=scale, rate=rate,
                                                  load_factor=ss.load_factor)
        opts = {"target": cap.target, "strict_target": cap.strict_target, "bounds": bounds,
                "tuned_budgets": budgets, "regime": "capacity"}
        if cap.noise is not None:
            figs["fig18"] = (self._noise_refs(cap), [], {**opts, "levels": cap.noise.levels})
        figs["fig13"] = (refs, [], opts)
        if scale_refs:
            figs["fig14"] = (scale_refs, [], opts)
        figs["fig15"] = (refs, [], opts)
        figs["fig16"] = (refs, [], opts)

    def _noise_system(self, system: str, level: float) -> str:
        """``system`` charged with per-step noise of ``level`` (figure 18): a system of its own
        (its runs' directories), the same policy, parameters and budget setting."""
        if level == 0:
            return system
        name = f"{system}-noise{fmt_num(round(level * 100, 6))}"
        self.systems[name] = self.systems[system]
        self.system_labels[name] = f"{self.system_labels[system]} (noise {level:.0%})"
        self.noise_level[name] = level
        self.noise_of[name] = system
        return name

    def _noise_refs(self, cap: Any) -> list[dict[str, Any]]:
        """Figure 18's runs: every (level, system, deployment, rate, seed); level 0 is the
        capacity sweep's own run."""
        from accelgen.pipeline.capacity import sweep_rate

        noise = cap.noise
        seeds = self.cfg.seeds_of(cap)
        refs: list[dict[str, Any]] = []
        for d in noise.deployments or cap.deployments:
            est = self.capacity_bound(cap.workload, d, seeds[0]).estimate_rps
            for factor in noise.load_factors or cap.load_factors:
                rate = sweep_rate(factor, est)
                v = self._rate_variant(cap.workload, rate)
                for level in noise.levels:
                    for s in noise.systems:
                        name = self._noise_system(s, level)
                        refs += [{**r, "noise": level, "noise_of": s,
                                  "noise_of_label": self.system_labels[s]}
                                 for r in self._grid_refs(v, [d], [name], seeds, sweep="rate",
                                                          x=rate, load_factor=factor,
                                                          budget_variant=cap.workload)]
        return refs

    def noise_args(self, system: str) -> list[str]:
        """``accelgen simulate --noise JSON`` of a system of figure 18 ([] for the others)."""
        level = self.noise_level.get(system)
        if level is None:
            return []
        from accelgen.costmodel.noise import sensitivity_noise

        spec = sensitivity_noise(level).model_dump(mode="json", exclude_defaults=True)
        return ["--noise", json.dumps(spec, sort_keys=True, separators=(",", ":"))]

    # ------------------------------------------------------------------ queries
    def check_workloads(self) -> None:
        """Every derived workload validates (raises PipelineConfigError naming the variant)."""
        from pydantic import ValidationError

        from accelgen.pipeline.config_file import _format_errors
        from accelgen.workloads.workload_spec import WorkloadConfig

        problems = []
        for name, data in self.variants.items():
            if name.startswith(SCENARIO_PREFIX):
                continue  # its input file is written by the pipeline itself
            try:
                WorkloadConfig.model_validate(data)
            except ValidationError as exc:
                problems += _format_errors(exc, f"(derived workload {name})")
        if problems:
            raise PipelineConfigError("\n  ".join(problems))

    def runs(self) -> list[Run]:
        """Every simulation the figures read, once (a run under two names: its ``same_as``)."""
        out = set()
        for fig in self.figures.values():
            for r in fig.runs:
                out.add(self.same_as[Run(r["variant"], r["deployment"], r["system"], r["seed"])])
        return sorted(out)

    def trace_jobs(self) -> list[tuple[str, str, int]]:
        """(variant, deployment, seed) of every trace the figures need."""
        jobs = {(r.variant, r.deployment, r.seed) for r in self.runs()}
        for fig in self.figures.values():
            jobs.update((t["variant"], t["deployment"], t["seed"]) for t in fig.traces)
        return sorted(jobs)

    def traces(self) -> list[str]:
        paths = {self.trace_path(r.variant, r.deployment, r.seed) for r in self.runs()}
        for fig in self.figures.values():
            paths.update(t["path"] for t in fig.traces)
        return sorted(paths)

    def run_summaries(self) -> list[str]:
        return [self.run_summary(r) for r in self.runs()]

    def group_figures(self, group: str) -> list[Figure]:
        return [f for f in self.figures.values() if f.group == group]

    def groups(self) -> list[str]:
        return [g for g in GROUPS if self.group_figures(g)]

    def figure_outputs(self, fig: Figure) -> list[str]:
        return [self.figure_file(fig.id, ext) for ext in ("png", "pdf")]

    def all_targets(self) -> list[str]:
        out = []
        for fig in self.figures.values():
            out += [self.figure_file(fig.id, "csv"), *self.figure_outputs(fig)]
        out.append(self.figure_file(CLAIMS, "csv"))
        return out

    def csv_figure_ids(self) -> list[str]:
        """Every ``<figures_dir>/<id>.csv`` the ``aggregate`` rule writes: the grid's figures and
        the claims table (other stages' CSVs in that directory, e.g. fidelity.csv, are not)."""
        return sorted({fig.id for fig in self.figures.values()} | {CLAIMS})

    def figure_by_id(self, fig_id: str) -> Figure:
        for fig in self.figures.values():
            if fig.id == fig_id:
                return fig
        raise KeyError(fig_id)

    def claims_inputs(self) -> dict[str, str]:
        """Figure id -> CSV of the figures the claims table reads (those the grid has)."""
        from accelgen.pipeline.claims import CLAIM_FIGURES

        ids = {fig.id for fig in self.figures.values()}
        out = {f: self.figure_file(f, "csv") for f in CLAIM_FIGURES if f in ids}
        # Regime `engine` (rules/engine.smk): an input when the default target makes it.
        if self.cfg.engine_on and self.cfg.engine is not None and \
                self.cfg.engine.in_default_target:
            out[ENGINE_FIGURE] = self.figure_file(ENGINE_FIGURE, "csv")
        return out

    def claims_spec(self) -> dict[str, Any]:
        """The claims job's spec: its inputs, and figure 17's CSV when a separate `fig17` run
        has written it (read, not an input: the default target never starts the engine
        sweep; the CSV's digest makes the claims job re-run when it changes)."""
        inputs = self.claims_inputs()
        spec: dict[str, Any] = {"figure": CLAIMS, "inputs": inputs, "accelgen": "accelgen"}
        path = Path(self.figure_file(ENGINE_FIGURE, "csv"))
        if self.cfg.engine_on and ENGINE_FIGURE not in inputs and path.exists():
            import hashlib

            spec["inputs"] = {**inputs, ENGINE_FIGURE: str(path)}
            spec["read_if_present"] = {ENGINE_FIGURE: hashlib.sha256(
                path.read_bytes()).hexdigest()[:16]}
        return spec

    def figure_inputs(self, fig_id: str) -> list[str]:
        if fig_id == CLAIMS:
            return list(self.claims_inputs().values())
        fig = self.figure_by_id(fig_id)
        paths = [f"{r['dir']}/summary.json" for r in fig.runs]
        paths += [t["path"] for t in fig.traces]
        if fig.key == "extra_pivots":  # the pivots of profiled deployments come from their tables
            paths += [self.profile_csv(d) for d in self.profiled()]
        return paths

    def figure_spec_json(self, fig_id: str) -> str:
        if fig_id == CLAIMS:
            return json.dumps(self.claims_spec(), sort_keys=True, separators=(",", ":"))
        return self.figure_by_id(fig_id).spec_json()

    # ------------------------------------------------------------------ per-job parameters
    def workload_spec_json(self, variant: str) -> str:
        return json.dumps({"workload": self.variants[variant]}, sort_keys=True,
                          separators=(",", ":"))

    def scenario_spec_json(self, scenario: str) -> str:
        return json.dumps(self.scenarios[scenario], sort_keys=True, separators=(",", ":"))

    def deployment_spec_json(self, deployment: str) -> str:
        dep = self.cfg.deployment(deployment)
        data = {"deployment": dep.model_dump(mode="json", exclude_none=True),
                "sim": self.cfg.sim.model_dump(mode="json")}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def trace_args(self, variant: str, deployment: str) -> list[str]:
        """``accelgen trace`` options of one deployment: the TTFT cost model and truncation."""
        from accelgen.costmodel.factory import effective_max_model_len

        dep = self.cfg.deployment(deployment)
        mml = max(1, effective_max_model_len(dep) - self.cfg.truncate_margin)
        args = ["--model", dep.model, "--hardware", dep.hardware, "--tp", str(dep.tp),
                "--pp", str(dep.pp), "--max-model-len", str(mml)]
        if deployment in self.profiled():
            args += ["--profile-csv", self.profile_csv(deployment)]
        return args

    # ------------------------------------------------------------------ download and profile
    def raw_inputs(self, variant: str) -> list[str]:
        """The downloaded files a workload variant reads (``kind: datasets``)."""
        data = self.variants.get(variant) or self.cfg.workload_dict(variant)
        if data.get("kind") != "datasets":
            return []
        from accelgen.workloads.workload_spec import WorkloadConfig

        wl = WorkloadConfig.model_validate(data)
        return sorted(str(src.path) for src in wl.resolved_sources().values())

    def downloads(self) -> dict[str, str]:
        """``{file path: dataset name}`` of every file a trace of the grid reads."""
        from accelgen.workloads.datasets import CATALOGUE

        names = {str(self.cfg.download_config().path(n)): n for n in CATALOGUE}
        wanted = {p for v, _, _ in self.trace_jobs() for p in self.raw_inputs(v)}
        unknown = wanted - set(names)
        if unknown:  # guarded by the config check (workload path == download dir)
            raise PipelineConfigError(f"files outside the download directory: {sorted(unknown)}")
        return {p: names[p] for p in sorted(wanted)}

    def download_spec_json(self, name: str) -> str:
        """The ``download:`` section as one dataset's job sees it: only its own source, so that
        changing another dataset's URL does not re-run (and re-fetch) this one."""
        data = self.cfg.download_config().model_dump(mode="json")
        data["datasets"] = {name: data["datasets"][name]}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def profiled(self) -> list[str]:
        """Deployments with a profile stage."""
        return [d for d, spec in self.cfg.deployments.items() if spec.profile is not None]

    def profile_csv(self, deployment: str) -> str:
        return str(self.cfg.profile_csv(deployment))

    def deployment_inputs(self, deployment: str) -> list[str]:
        """Files a deployment's cost model reads (its profile stage's table)."""
        return [self.profile_csv(deployment)] if deployment in self.profiled() else []

    def gpus(self, deployment: str) -> int:
        """GPUs a real-engine job of the deployment takes (0: the CPU engine)."""
        spec = self.cfg.deployments[deployment]
        on_gpu = (spec.engine is not None and spec.engine.model is not None) or (
            spec.profile is not None and spec.profile.backend == "torch")
        return self.cfg.deployment(deployment).num_gpus if on_gpu else 0

    def engine_json(self, deployment: str) -> str:
        """The deployment's engine settings for ``accelgen replay/profile --engine`` ('' none)."""
        spec = self.cfg.deployments[deployment]
        if spec.engine is None:
            return ""
        dep = self.cfg.deployment(deployment)
        data = spec.engine.spec(dep.tp, dep.pp)
        return json.dumps(data, sort_keys=True, separators=(",", ":")) if data else ""

    def profile_args(self, deployment: str) -> list[str]:
        """``accelgen profile`` options of a deployment's stage (without --out/--plot)."""
        from accelgen.costmodel.factory import effective_max_model_len

        spec = self.cfg.deployments[deployment]
        stage = spec.profile
        assert stage is not None
        dep = self.cfg.deployment(deployment)
        mml = effective_max_model_len(dep)
        args = ["--backend", stage.backend, "--grid", stage.grid, "--repeats", str(stage.repeats),
                "--warmup", str(stage.warmup), "--block-size", str(dep.block_size),
                "--tolerance", f"{dep.pivot_tolerance:g}"]
        if stage.backend == "torch":
            args += ["--model", dep.model, "--max-tokens", str(min(mml, 8192))]
        else:
            engine = spec.engine.model if spec.engine is not None else None
            budget = stage.max_num_batched_tokens or max(min(mml, 8192), 2048)
            # As many sequences per step as the replays' engine (EngineSpec's default 256).
            seqs = (spec.engine.settings.get("max_num_seqs", 256) if spec.engine is not None
                    else 256)
            args += ["--model", engine or "tiny", "--tp", str(dep.tp), "--max-model-len",
                     str(mml), "--max-num-batched-tokens", str(budget), "--max-num-seqs",
                     str(seqs)]
            engine_json = self.engine_json(deployment)
            if engine_json:
                args += ["--engine", engine_json]
        if stage.quick:
            args.append("--quick")
        if stage.threads is not None:
            args += ["--threads", str(stage.threads)]
        return args

    def run_params(self, system: str, variant: str | None = None,
                   deployment: str | None = None) -> dict[str, Any]:
        """A system's policy parameters on one run: its params, and for a ``budget: tuned``
        system the budget resolved for that variant and deployment."""
        spec = self.systems[system]
        params = dict(spec.params)
        if spec.budget == TUNED_SETTING:
            if variant is None or deployment is None:
                raise ValueError(f"system {system!r} is tuned per run: give its variant and "
                                 "deployment")
            params["token_budget"] = self.tuned_budget(variant, deployment, system).token_budget
        return params

    def replay_args(self, system: str, variant: str | None = None,
                    deployment: str | None = None) -> list[str]:
        """``accelgen replay`` options of a system (the real engine runs no search)."""
        spec = self.systems[system]
        params = self.run_params(system, variant, deployment)
        if spec.vllm_scheduler == "stock":
            args = ["--system", "stock"]
            if spec.policy == "vllm-priority":
                args += ["--scheduling-policy", "priority"]
            if "token_budget" in params:
                args += ["--max-num-batched-tokens", str(params["token_budget"])]
            return args
        args = ["--policy", spec.policy]
        for k, v in sorted(params.items()):
            args += ["--param", f"{k}={json.dumps(v, sort_keys=True)}"]
        return args

    def floor_run(self, run: Run) -> Run | None:
        """The run of the grid that is the floor of ``run``'s Oracle search (AccelGen's own
        schedule with the Oracle's base parameters that AccelGen has, on the same trace,
        deployment and seed), read by the search instead of simulating it again
        (``accelgen oracle --floor-run``); None for a run that is no search or has none."""
        spec = self.systems[run.system]
        if spec.search is None or spec.policy != "oracle" or run.system in self.noise_level:
            return None
        from accelgen.experiments.oracle_search import FLOOR_POLICY
        from accelgen.policies.accelgen import AccelGenParams

        params = self.run_params(run.system, run.variant, run.deployment)
        args = ["-m", "accelgen.cli", "simulate", "--no-progress", "--policy", FLOOR_POLICY]
        for k, v in sorted(params.items()):
            if k in AccelGenParams.model_fields:
                args += ["--param", f"{k}={json.dumps(v, sort_keys=True)}"]
        return self._by_command.get((tuple(args), run.variant, run.deployment, run.seed))

    def floor_args(self, run: Run) -> list[str]:
        """``--floor-run DIR`` of an Oracle search whose floor the grid runs anyway, else []."""
        floor = self.floor_run(run)
        return [] if floor is None else ["--floor-run", self.run_dir(floor)]

    def system_args(self, system: str, variant: str | None = None,
                    deployment: str | None = None) -> list[str]:
        """The command of one simulation, without trace, config, seed and output:
        ``-m accelgen.cli simulate --no-progress --policy P --param k=v ...``, or for an Oracle
        with its own grid ``-m accelgen.cli oracle --grid G --param k=v ...`` (run after the
        Python interpreter; ``simulate --policy oracle`` searches the default grid). A tuned
        system's budget depends on the run's variant and deployment."""
        spec = self.systems[system]
        if spec.search is not None:
            args = ["-m", "accelgen.cli", "oracle"]
            if spec.search:
                args += ["--grid", json.dumps(spec.search, sort_keys=True)]
        else:
            args = ["-m", "accelgen.cli", "simulate", "--no-progress", "--policy", spec.policy]
        for k, v in sorted(self.run_params(system, variant, deployment).items()):
            args += ["--param", f"{k}={json.dumps(v, sort_keys=True)}"]
        return args + self.noise_args(system)
