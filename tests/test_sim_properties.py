"""Property tests: random traces through every policy keep the simulator's invariants."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.policies.registry import POLICIES, VARIANTS, make_policy
from tests.conftest import make_requests, run_sim
from tests.invariants import RecordingPolicy, check_invariants


def _available(name: str) -> bool:
    base = VARIANTS[name][0] if name in VARIANTS else name
    module = POLICIES[base].split(":")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    return True


ALL_POLICIES = sorted([*POLICIES, *VARIANTS])
BUILT = [p for p in ALL_POLICIES if _available(p)]


def test_core_policies_are_built() -> None:
    for name in ("vllm", "vllm-v0", "sarathi"):
        assert name in BUILT


traces = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=3.0, allow_nan=False),  # arrival
        st.integers(min_value=1, max_value=600),  # prompt tokens
        st.integers(min_value=1, max_value=80),  # output tokens
        st.sampled_from([0.05, 0.2, 1.0]),  # tbt slo
        st.sampled_from([0.1, 0.5, 3.0]),  # ttft slo
    ),
    min_size=1, max_size=40,
)


@pytest.mark.parametrize("policy_name", BUILT)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_invariants_hold(policy_name: str, trace, num_blocks: int) -> None:
    trace = sorted(trace, key=lambda x: x[0])
    reqs = make_requests([(a, p) for a, p, *_ in trace])
    for r, (_, _, _, tbt, ttft) in zip(reqs, trace, strict=True):
        r.tbt_slo, r.ttft_slo = tbt, ttft
    outs = [o for _, _, o, _, _ in trace]
    policy = RecordingPolicy(make_policy(policy_name))
    res = run_sim(reqs, outs, policy, num_blocks=num_blocks, block_size=16, s_pf=128,
                  num_swap_blocks=4 * num_blocks, kv_bytes_per_token=1024,
                  host_link_bandwidth=1e9)
    check_invariants(res, policy)
    # Requests that fit in the total KV must all finish.
    for r in res.requests:
        if r.prompt_len + outs[r.req_id] <= num_blocks * 16:
            assert r.status.name == "FINISHED", (policy_name, r.req_id, r.reject_reason)
