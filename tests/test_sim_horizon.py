"""``sim.horizon_s``: the simulation stops at a simulated time; what is not done is unfinished."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from accelgen.core.specs import Deployment, ExperimentConfig, PolicySpec, SimOptions
from accelgen.results import ITERATION_COLUMNS

HORIZON = 12.0


def _trace(n: int = 60, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, 1500, n)
    out = rng.integers(20, 400, n)
    ttft, tbt = rng.uniform(0.2, 2.0, n), rng.uniform(0.05, 0.3, n)
    return pd.DataFrame({
        "req_id": np.arange(n), "arrival": np.sort(rng.uniform(0, 20.0, n)),
        "source": "test", "prompt_len": prompt, "prompt_len_natural": prompt,
        "prompt_truncated": False, "output_len": out, "output_len_natural": out,
        "output_capped": False, "ttft_slo": ttft, "tbt_slo": tbt,
        "jct_slo": ttft + tbt * (out - 1), "online": True, "predicted_output_len": 150,
    })


def _run(policy: str, horizon: float | None):
    from accelgen.sim.runner import simulate

    cfg = ExperimentConfig(deployment=Deployment(model="opt-13b", hardware="a100", kv_cache_gb=2.0),
                           policy=PolicySpec(name=policy),
                           sim=SimOptions(progress=False, horizon_s=horizon))
    return simulate(_trace(), cfg)


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "fastserve", "edf"])
def test_horizon_run_is_the_full_run_cut_at_the_horizon(policy: str) -> None:
    full, cut = _run(policy, None), _run(policy, HORIZON)
    its_full, its_cut = full.iterations, cut.iterations
    # Nothing starts at or after the horizon, and what ran before it ran as in the full run.
    assert (its_cut["start"] < HORIZON).all()
    before = its_full[its_full["start"] < HORIZON].reset_index(drop=True)
    pd.testing.assert_frame_equal(its_cut[list(ITERATION_COLUMNS)],
                                  before[list(ITERATION_COLUMNS)])
    rf, rc = full.requests.set_index("req_id"), cut.requests.set_index("req_id")
    done = rc["status"].isin(["finished", "cut", "rejected"])
    pd.testing.assert_frame_equal(rc[done], rf.loc[rc.index[done]])
    # Every other request is unfinished, with its reason; the counts and the window say so.
    un = rc[~done]
    assert len(un) and (un["status"] == "unfinished").all()
    assert un["reject_reason"].str.startswith("horizon: simulation stopped at").all()
    later = un["arrival"] >= HORIZON
    assert later.any() and un.loc[later, "reject_reason"].str.contains("arrives after").all()
    s = cut.summary
    assert s["num_unfinished"] == len(un)
    assert s["num_finished"] + s["num_cut"] + s["num_rejected"] + s["num_unfinished"] == 60
    assert s["horizon_s"] == HORIZON and s["window_s"] == [float(_trace()["arrival"].min()),
                                                           HORIZON]
    assert "horizon_s" not in full.summary and full.summary["num_unfinished"] == 0


def test_horizon_default_off() -> None:
    assert SimOptions().horizon_s is None
    with pytest.raises(ValueError):
        SimOptions(horizon_s=0.0)
