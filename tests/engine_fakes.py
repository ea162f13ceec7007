"""An engine-sweep runs directory without an engine: the "engine" points are simulations of an
engine with known calibrated terms (slower by a factor per repeat), the simulator's points are
the stage's own (``accelgen.engine_regime.run``)."""

from __future__ import annotations

import json
from pathlib import Path

from accelgen.core.specs import CalibratedTerms, ExperimentConfig, SimOptions
from accelgen.costmodel.calibrated import TERMS
from accelgen.engine_regime import systems as sysmod
from accelgen.engine_regime.run import (
    CONFIG_NAME,
    PLAN_NAME,
    POINT_NAME,
    SEARCHES_NAME,
    Traces,
    make_plan,
    point_dir,
    predict_after,
    predict_before,
    search_all,
    write_searches,
)
from accelgen.engine_regime.sweep_spec import EngineSweepConfig
from accelgen.fidelity.check_spec import engine_deployment

ENGINE = {"block_size": 32, "max_model_len": 2048, "max_num_seqs": 128, "num_gpu_blocks": 128}
KV_BLOCKS = 127  # vLLM's null block is not usable
# The engine of the quick sweep, as a calibration on this machine fitted it (rounded): 2.9 ms
# per step, 0.21 ms per prefill token, 0.33 ms per decode, 0.66 ms per new chunk.
ENGINE_TERMS = CalibratedTerms(overhead_s=2.9e-3, weights_s=2.7e-4, transition_p=1.4,
                               prefill_token_s=2.1e-4, prefill_seq_s=6.6e-4,
                               decode_token_s=3.3e-4, causal_pair_s=2.5e-10,
                               context_pair_s=2.5e-10, context_token_s=3.2e-7)


def fake_cfg(**over: object) -> EngineSweepConfig:
    data: dict[str, object] = {"engine": ENGINE, "num_requests": 40, "repeats": 2,
                               "search": {"max_probes": 4, "tolerance": 0.2}}
    data.update(over)
    return EngineSweepConfig.model_validate(data)


def fake_engine_runs(out: Path, cfg: EngineSweepConfig | None = None,
                     slower: tuple[float, ...] = (1.05, 1.10)) -> Path:
    """``run_sweep``'s layout; repeat k's "engine" runs at ``slower[k]`` times the terms."""
    from accelgen.sim.runner import simulate

    cfg = cfg or fake_cfg()
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(cfg.model_dump_json(indent=2))
    dep = engine_deployment(ENGINE, KV_BLOCKS, ENGINE_TERMS)
    plan = make_plan(cfg, dep)
    (out / PLAN_NAME).write_text(json.dumps(plan, indent=2))
    traces = Traces(cfg, plan, dep, out)
    starts = predict_before(cfg, plan, dep, out, traces)
    engines = {}
    for k, seed in enumerate(cfg.seeds):
        terms = ENGINE_TERMS.model_copy(update={t: getattr(ENGINE_TERMS, t) * slower[k]
                                                for t in TERMS if t != "transition_p"})
        engines[seed] = engine_deployment(ENGINE, KV_BLOCKS, terms)

    def probe(name: str, seed: int, rate: float) -> float:
        policy = sysmod.sim_policy(cfg.systems[name], plan["budgets"][name], 128)
        ecfg = ExperimentConfig(deployment=engines[seed], policy=policy,
                                sim=SimOptions(progress=False, swap_space_gb=0.0))
        d = point_dir(out, "real", name, seed, rate)
        run = simulate(traces.get(seed, rate), ecfg)
        run.write(d)
        (d / POINT_NAME).write_text(json.dumps({
            "start": 0.0, "end": 5.0, "load_before": [1.0] * 3,
            "load_after": [1.0] * 3, "cpu_shares": {"busy": 0.6, "idle": 0.4, "steal": 0.0}}))
        return float(run.summary["slo_attainment_request"])

    write_searches(out / "real" / SEARCHES_NAME, search_all(cfg, plan, starts, probe))
    predict_after(cfg, plan, dep, out, traces)
    return out
