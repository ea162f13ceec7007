"""Sarathi-Serve's token-budget rule (accelgen.costmodel.budget) and the budgets the pipeline
resolves for the ``tuned`` systems: the predicted iteration at the tuned budget meets the
workload's tightest TBT SLO and the next larger candidate's does not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelgen.core.iteration import BatchShape
from accelgen.costmodel.budget import (
    KneeDecodes,
    candidates,
    knee_decodes,
    predicted_iteration,
    prefill_pairs_per_token,
    tuned_token_budget,
)
from accelgen.costmodel.factory import make_cost_model
from accelgen.pipeline.capacity import _trace, workload_tuned_budget
from accelgen.pipeline.config_file import load_file
from tests.conftest import LinearCost

QUICK = "config/quick.yaml"


@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12), st.integers(16, 700))
def test_prefill_pairs_match_chunk_by_chunk(prompts: list[int], chunk: int) -> None:
    shape = BatchShape()
    for p in prompts:
        done = 0
        while done < p:
            n = min(chunk, p - done)
            shape.add_prefill(n, done)
            done += n
    assert prefill_pairs_per_token(np.array(prompts), chunk) == \
        pytest.approx(shape.prefill_attn / sum(prompts))


def test_knee_decodes_is_littles_law_with_time_weighted_context() -> None:
    prompt, output = np.array([100, 300]), np.array([11, 21])
    kd = knee_decodes(prompt, output, rate=2.0, t_iteration=0.05, max_num_seqs=256)
    assert kd.num_seqs == round(2.0 * (10 + 20) / 2 * 0.05)
    ctx = [p + j for p, o in zip(prompt, output, strict=True) for j in range(1, o)]
    assert kd.mean_context == pytest.approx(np.mean(ctx))
    assert knee_decodes(prompt, output, rate=1e4, t_iteration=1.0, max_num_seqs=8).num_seqs == 8


def test_rule_picks_largest_candidate_within_slo() -> None:
    cost = LinearCost()
    decodes = KneeDecodes(num_seqs=4, mean_context=500.0)
    prompts = np.array([200, 900, 2500])
    slo = predicted_iteration(cost, 160, prefill_pairs_per_token(prompts, 160), decodes) + 1e-9
    tb = tuned_token_budget(cost, slo, prompts, decodes, block_size=16, max_tokens=2048)
    assert tb.meets and tb.token_budget == 160 and tb.next_budget == 176
    assert tb.predicted_s <= slo < tb.next_predicted_s
    assert candidates(16, 2048)[-1] == 2048
    # Not even one block fits: the smallest candidate, flagged.
    tb = tuned_token_budget(cost, 1e-6, prompts, decodes, block_size=16, max_tokens=2048)
    assert not tb.meets and tb.token_budget == 16


@pytest.mark.parametrize("deployment", ["opt-13b-auto", "opt-13b", "llama-13b", "opt-175b",
                                        "llama-3-70b"])
def test_pipeline_tuned_budget_meets_tightest_tbt_and_next_does_not(deployment: str) -> None:
    cfg = load_file(QUICK)
    dep = cfg.deployment(deployment)
    wl = cfg.workload_dict("capacity")
    tb = workload_tuned_budget(wl, dep, 0, 8191, max_num_seqs=128)
    # Recomputed here from the trace and the cost model, not read from the result.
    trace = _trace(wl, dep, 0, 8191)
    online = trace["online"].to_numpy(bool)
    tightest = float(trace["tbt_slo"].to_numpy()[online].min())
    assert tb.tbt_slo == tightest == pytest.approx(0.1875 * 0.25)
    cost = make_cost_model(dep)
    prompts = trace["prompt_len"].to_numpy()
    decodes = KneeDecodes(tb.decode_seqs, tb.decode_context)
    at = predicted_iteration(cost, tb.token_budget, prefill_pairs_per_token(prompts,
                                                                            tb.token_budget),
                             decodes)
    nxt = tb.token_budget + dep.block_size
    if deployment == "opt-175b":
        # On 8 A100s the all-reduces of one iteration (NCCL fit, docs/costmodel.md) leave no
        # room: even one block beside the knee's decodes misses 47 ms, so the rule falls back to
        # its smallest candidate and says so.
        assert not tb.meets and tb.token_budget == dep.block_size and at > tightest
        assert tb.next_budget == nxt
        return
    assert tb.meets and at <= tightest
    assert tb.next_budget == nxt
    assert predicted_iteration(cost, nxt, prefill_pairs_per_token(prompts, nxt),
                               decodes) > tightest
