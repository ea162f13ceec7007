"""A fidelity runs directory without an engine: each round's "replays" are simulations of an
engine with known calibrated terms (scaled per round), then the stage's own calibrations and
simulations (``accelgen.fidelity.run.calibrate_and_simulate``)."""

from __future__ import annotations

import json
from pathlib import Path

from accelgen.core.specs import CalibratedTerms
from accelgen.costmodel.calibrated import TERMS
from accelgen.fidelity.check_spec import FidelityConfig, engine_deployment, make_trace
from accelgen.fidelity.run import ROUND_NAME, calibrate_and_simulate, simulate_run

ENGINE = {"block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048,
          "max_num_seqs": 128, "num_gpu_blocks": 512}
# A tiny CPU engine's step: 1.6 ms + 5.5 us per prefill token + 30 us per decode, attention.
ENGINE_TERMS = CalibratedTerms(overhead_s=1.6e-3, prefill_token_s=5.5e-6, decode_token_s=3e-5,
                               causal_pair_s=2e-9, context_pair_s=1e-9, context_token_s=8e-8)


def fake_fidelity_runs(out: Path, scales: tuple[float, ...] = (1.0, 1.05, 1.1),
                       num_requests: int = 60) -> Path:
    """``run_fidelity``'s layout; round k's "engine" runs at ``scales[k]`` times the terms."""
    cfg = FidelityConfig(num_requests=num_requests, rate=30.0, seed=2, rounds=len(scales),
                         engine=ENGINE)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(cfg.model_dump_json(indent=2))
    trace = make_trace(cfg)
    for k, scale in enumerate(scales):
        rdir = out / f"round-{k}"
        terms = ENGINE_TERMS.model_copy(update={t: getattr(ENGINE_TERMS, t) * scale
                                                for t in TERMS})
        replays = {}
        for system in cfg.systems:
            simulate_run(trace, system, engine_deployment(ENGINE, 511, terms), ENGINE,
                         rdir / f"real-{system}")
            replays[system] = {"start": 10.0 * k, "end": 10.0 * k + 5, "load_before": [1.0] * 3,
                               "load_after": [1.5] * 3,
                               "cpu_shares": {"busy": 0.6, "idle": 0.4, "steal": 0.0}}
        (rdir / ROUND_NAME).write_text(json.dumps({"replays": replays}))
    calibrate_and_simulate(out, cfg, trace)
    return out
