"""The CLAIRVOYANT Oracle policy: exact KV planning never preempts, it reduces to AccelGen
without the plan, and it refuses to run without clairvoyance (its search: test_oracle_search)."""

from __future__ import annotations

import pytest

from accelgen.core.kvcache import blocks_for
from accelgen.core.policy import Decision, InfoRow, SchedulerView
from accelgen.core.request import Request
from accelgen.policies.registry import make_policy
from tests.conftest import make_requests, run_sim
from tests.invariants import RecordingPolicy, check_invariants


def _kv_pressure_trace() -> tuple[list[Request], list[int]]:
    # Short prompts with long outputs: every prompt fits on arrival, but their KV keeps growing
    # until it exceeds the cache, so a scheduler that admits on the prompt alone must preempt.
    specs = [(0.02 * i, 60 + 17 * (i % 5)) for i in range(14)]
    outs = [150 + 23 * (i % 4) for i in range(14)]
    return make_requests(specs, ttft_slo=2.0, tbt_slo=0.5), outs


class _PlanCheck(RecordingPolicy):
    """Asserts before every decision that the final KV of the running requests fits."""

    def schedule(self, view: SchedulerView) -> Decision:
        assert view.true_output_len is not None
        b = view.kv.block_size
        final = sum(blocks_for(r.prompt_len + view.true_output_len[r.req_id] - 1, b)
                    for r in view.running)
        assert final <= view.kv.num_total_blocks, "admitted more than can finish"
        self.last = super().schedule(view)
        return self.last


def test_oracle_never_preempts_where_accelgen_must() -> None:
    reqs, outs = _kv_pressure_trace()
    res = run_sim(reqs, outs, make_policy("accelgen"), num_blocks=48, block_size=16)
    check_invariants(res)
    assert sum(r.num_preemptions for r in res.requests) > 0, "scenario must force AccelGen to preempt"

    reqs, outs = _kv_pressure_trace()
    policy = _PlanCheck(make_policy("oracle"))
    res = run_sim(reqs, outs, policy, num_blocks=48, block_size=16)
    check_invariants(res, policy)
    assert all(r.status.name == "FINISHED" for r in res.requests)
    assert sum(r.num_preemptions for r in res.requests) == 0
    its = res.iterations.to_frame()
    assert its["num_preempted"].sum() == 0
    assert (its["info_clairvoyant"] == 1.0).all()
    # The plan was binding: some request waited although its prompt alone would have fitted.
    assert its["info_oracle_excluded"].max() > 0
    # Its diagnostics are one row of names the log knows (its fast path), nothing added after.
    d = policy.last
    assert isinstance(d.info, InfoRow) and d.info._extra is None
    assert list(d.info)[-4:] == ["clairvoyant", "oracle_reforms", "oracle_excluded",
                                 "oracle_admissible"]
    assert its.columns[-4:].tolist() == [f"info_{k}" for k in list(d.info)[-4:]]


def test_oracle_without_kv_plan_is_accelgen_on_online_traces() -> None:
    reqs, outs = _kv_pressure_trace()
    a = run_sim(reqs, outs, make_policy("accelgen"), num_blocks=48, block_size=16)
    reqs, outs = _kv_pressure_trace()
    o = run_sim(reqs, outs, make_policy("oracle", {"kv_plan": "none"}), num_blocks=48,
                block_size=16)
    for ra, ro in zip(a.requests, o.requests, strict=True):
        assert ra.token_times == ro.token_times
        assert ra.num_preemptions == ro.num_preemptions


def test_oracle_uses_true_lengths_for_offline_plans() -> None:
    reqs, outs = _kv_pressure_trace()
    for r in reqs:
        r.online, r.jct_slo, r.predicted_output_len = False, 60.0, 7
    seen: list[tuple[int, int]] = []

    class Spy(RecordingPolicy):
        def schedule(self, view: SchedulerView) -> Decision:
            d = super().schedule(view)
            t = self.inner._table
            seen.extend((int(t.req_id[s]), int(t.pred_out[s])) for s in range(t.n))
            return d

    res = run_sim(reqs, outs, Spy(make_policy("oracle")), num_blocks=48, block_size=16)
    check_invariants(res)
    # S_g of every offline plan was the true length, never the predicted 7.
    assert seen and all(s_g == outs[rid] for rid, s_g in seen)
    seen.clear()
    reqs, outs = _kv_pressure_trace()
    for r in reqs:
        r.online, r.jct_slo, r.predicted_output_len = False, 60.0, 7
    run_sim(reqs, outs, Spy(make_policy("oracle", {"exact_lengths": False})), num_blocks=48,
            block_size=16)
    assert seen and all(s_g == 7 for _, s_g in seen)


def test_oracle_refuses_without_clairvoyance() -> None:
    from accelgen.core.kvcache import BlockManager
    from tests.conftest import scheduler_view

    view = scheduler_view(make_requests([(0.0, 10)]), [], BlockManager(10, 16))
    with pytest.raises(RuntimeError, match="clairvoyant"):
        make_policy("oracle").schedule(view)
