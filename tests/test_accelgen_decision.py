"""AccelGen's one compiled decision (``accelgen.policies.accelgen``): the cost-model protocol, the
budget rules, ``explain``, the workspace, and the builds it runs as.

The decision evaluates a linear cost model itself and asks any other for the latency of the
batches it needs (``Workspace.run``); ``test_asking_the_cost_model_decides_as_evaluating_it``
runs every variant both ways over random traces and requires identical schedules and
diagnostics. The golden digests (``test_accelgen_golden.py``) pin the decisions themselves."""

from __future__ import annotations

import dataclasses
import math
import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelgen.core.iteration import BatchShape, Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Decision, InfoRow, SchedulerView
from accelgen.core.request import Request, Status
from accelgen.core.specs import Deployment
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.factory import make_cost_model
from accelgen.costmodel.linear import LinearCostModel, LinearTerms, OnlineLinearCostModel
from accelgen.costmodel.pivot import budget_for_time
from accelgen.policies.accelgen import AccelGenPolicy
from accelgen.policies.accelgen.build import load
from accelgen.policies.accelgen.state import INFO_INDEX, INFO_KEYS
from accelgen.policies.accelgen.table import RequestTable
from accelgen.policies.registry import make_policy
from tests.conftest import LinearCost, make_requests, run_sim
from tests.invariants import table_mismatches
from tests.strategies import mixed_slo_traces, trace_requests


class Opaque(CostModel):
    """A cost model that hides its linear terms: the decision must ask it for every latency."""

    name = "opaque"

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner

    def iteration_time(self, shape: BatchShape) -> float:
        return self.inner.iteration_time(shape)


def test_decision_of_batch_is_the_dataclass_with_an_info_row() -> None:
    """``Decision.of_batch`` skips the generated ``__init__``: it must still set every field
    (a field added to ``Decision`` later fails here until ``of_batch`` sets it too)."""
    reqs = [Request(req_id=i, arrival=0.0, prompt_len=8, ttft_slo=1.0, tbt_slo=0.1)
            for i in range(3)]
    values = np.arange(len(INFO_KEYS), dtype=np.float64)
    fast = Decision.of_batch([(reqs[0], 8), (reqs[1], 1)], [reqs[2]], INFO_INDEX, values)
    slow = Decision(scheduled=[(reqs[0], 8), (reqs[1], 1)], preempted=[reqs[2]],
                    info=InfoRow(INFO_INDEX, values.copy()))
    for f in dataclasses.fields(Decision):
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
    assert fast.swap_out is not slow.swap_out  # fresh lists, as the default factories give
    fast.info["adapter_budget"] = 9.0  # an entry under a new name goes to the row's extras
    assert fast.info.as_dict() == {**dict(zip(INFO_KEYS, values.tolist(), strict=True)),
                                   "adapter_budget": 9.0}
    assert fast.info["n_urgent"] == 6.0 and len(fast.info) == len(INFO_KEYS) + 1


def test_only_the_linear_model_offers_compiled_code_its_terms() -> None:
    lin = LinearCostModel(0.01, 1e-4, 2e-7, 3e-9)
    assert lin.linear_terms() == LinearTerms(0.01, 1e-4, 2e-7, 3e-9)
    shape = BatchShape()
    shape.add_prefill(100, 50)
    shape.add_decode(300)
    assert lin.iteration_time(shape) == 0.01 + 1e-4 * 101 + 2e-7 * 300 + 3e-9 * shape.prefill_attn
    online = OnlineLinearCostModel(0.5, 0.0, refit_every=2)
    before = online.linear_terms()
    assert before == LinearTerms(0.5, 0.0, 0.0, 0.0)
    online.observe(10, 0.002)
    assert online.linear_terms() is before
    assert online.observe(100, 0.003)  # a refit replaces the terms: users notice by identity
    assert online.linear_terms() is not before and online.linear_terms().base_s < 0.5
    assert make_cost_model(Deployment()).linear_terms() is None
    assert Opaque(lin).linear_terms() is None


PARAMS: list[tuple[str, dict[str, Any]]] = [
    ("accelgen", {}),
    ("accelgen", {"long_prompt_threshold": 200}),
    ("accelgen", {"long_prompt_threshold": 200, "era_scope": "request"}),
    ("accelgen", {"late_is_urgent": True, "lost_last": False}),
    ("accelgen", {"kv_growth_reserve": 0, "gamma": 0.0}),
    ("accelgen", {"spill_groups": False, "max_num_seqs": 3}),
    ("accelgen", {"era": False, "budget_cap": 0.5}),
    ("accelgen", {"budget_rule": "model", "budget_cap": 3.0}),
    ("accelgen", {"min_budget": 64, "kv_growth_reserve": 48, "budget_cap": 2.0}),
    ("accelgen/order", {}),
    ("accelgen/chunk", {"long_prompt_threshold": 200}),
    ("accelgen/batch", {}),
    ("oracle", {}),
    ("oracle", {"kv_plan": "none"}),
]


def _run(name: str, params: dict[str, Any], trace: Any, num_blocks: int,
         cost: CostModel) -> tuple[list[Any], list[dict[str, float]]]:
    reqs, outs = trace_requests(trace)
    pol = make_policy(name, params)
    assert isinstance(pol, AccelGenPolicy)
    pol.verify = table_mismatches
    res = run_sim(reqs, outs, pol, num_blocks=num_blocks, block_size=16, s_pf=128, cost=cost)
    runs = [(r.status.name, r.token_times, r.num_preemptions) for r in res.requests]
    its = res.iterations.to_frame()
    return runs, its.astype(object).where(its.notna(), "nan").to_dict("records")


@pytest.mark.parametrize(("name", "params"), PARAMS, ids=[f"{n}{p or ''}" for n, p in PARAMS])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=mixed_slo_traces, num_blocks=st.integers(min_value=8, max_value=80))
def test_asking_the_cost_model_decides_as_evaluating_it(name: str, params: dict[str, Any],
                                                         trace: Any, num_blocks: int) -> None:
    """The same linear model, evaluated inside the compiled decision (T_max, forward times, the
    ``model`` rule's bisection) or asked through ``Workspace.run`` and a forward-time table:
    identical requests, token times and iteration logs (diagnostics included), but the exact plan's
    price of the batch formed, which the decision computes only for a model it evaluates itself (an
    asked model is priced at T_max alone; with this linear model no plan depends on more)."""
    compiled = _run(name, params, trace, num_blocks, LinearCost())
    asked = _run(name, params, trace, num_blocks, Opaque(LinearCost()))
    assert compiled[0] == asked[0]
    exact = ("info_t_planned", "info_planned_overrun")
    assert all(row["info_t_planned"] == "nan" and not row["info_planned_overrun"] for row in asked[1])
    assert ([{k: v for k, v in row.items() if k not in exact} for row in compiled[1]]
            == [{k: v for k, v in row.items() if k not in exact} for row in asked[1]])


@pytest.mark.parametrize("tbt", [0.004, 0.011, 0.0137, 0.02, 0.05, 0.09, 0.2, 5.0])
@pytest.mark.parametrize("cost", [LinearCost(), make_cost_model(Deployment())],
                         ids=["linear", "analytic"])
def test_budget_rule_model_bisects_forward_times_as_budget_for_time(cost: CostModel,
                                                                    tbt: float) -> None:
    """A running decode with TBT ``tbt`` sets SLO_min; the ``model`` rule's budget is the largest
    forward size whose forward time fits it (``costmodel.pivot.budget_for_time``), clamped."""
    bs, s_pf, cap = 16, 512, 1024
    r = Request(req_id=0, arrival=0.0, prompt_len=40, ttft_slo=1.0, tbt_slo=tbt)
    r.status, r.num_output_tokens, r.num_computed_tokens = Status.RUNNING, 2, 41
    r.num_blocks, r.last_token_time = 3, 1.0
    kv = BlockManager(64, bs)
    kv.num_free_blocks = 61
    view = SchedulerView(now=1.0, waiting=[], running=[r], swapped=[], kv=kv, cost=cost,
                         pivot=Pivot(s_pf, cost.forward_time(s_pf)), max_model_len=4096)
    pol = AccelGenPolicy(budget_rule="model", budget_cap=cap / s_pf)
    got = pol.explain(view)[0]["token_budget"]
    want = min(max(budget_for_time(cost, tbt, limit=cap + 1), bs), cap)
    assert got == want
    assert pol.schedule(view).info["token_budget"] == want


def test_explain_reads_the_plan_the_decision_uses() -> None:
    specs = [(0.1 * i, 40 + 97 * i) for i in range(12)]
    reqs = make_requests(specs, ttft_slo=0.6, tbt_slo=0.05)
    seen = []

    class Explaining(AccelGenPolicy):
        def schedule(self, view: SchedulerView) -> Decision:
            why = self.explain(view)
            d = super().schedule(view)
            if why:
                one = next(iter(why.values()))
                seen.append((one["t_max"], d.info["t_max"]))
                assert sum(w["urgent"] for w in why.values()) == d.info["n_urgent"]
                assert sum(w["slack"] < 0 for w in why.values()) == d.info["n_late"]
            return d

    run_sim(reqs, [30] * len(specs), Explaining(), num_blocks=60, s_pf=128)
    assert len(seen) > 50 and all(a == b for a, b in seen)


def test_workspace_follows_a_growing_table() -> None:
    """A table that reallocates its rows while requests arrive decides as one that does not."""
    specs = [(0.01 * i, 30 + 13 * i) for i in range(40)]

    def run(capacity: int) -> list[list[float]]:
        pol = AccelGenPolicy()
        pol._table = RequestTable(capacity=capacity, kernels=load())
        res = run_sim(make_requests(specs, ttft_slo=2.0, tbt_slo=0.2), [20] * 40, pol,
                      num_blocks=200, s_pf=128)
        return [r.token_times for r in res.requests]

    assert run(2) == run(1024)


def test_no_decision_needs_no_compiled_code() -> None:
    view = SchedulerView(now=0.0, waiting=[], running=[], swapped=[], kv=BlockManager(8, 16),
                         cost=LinearCost(), pivot=Pivot(64, 0.02), max_model_len=100)
    d = AccelGenPolicy().schedule(view)
    assert d.scheduled == [] and d.info == {"token_budget": 64.0, "n_candidates": 0.0}
    assert math.isfinite(LinearCost().forward_time(64))


def test_decide_names_the_slot_lists_as_the_workspace_lays_them_out() -> None:
    """``decide`` unpacks the rows of its int64 list array by position into NamedTuples
    (``x[k]``, one array crossing into compiled code): each position is the row of that name."""
    import ast
    import inspect

    from accelgen.policies.accelgen import decide, state

    tree = ast.parse(inspect.getsource(decide.decide.py_func))
    seen = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue  # (``st.Batch(...)``: the record types of ``state``)
        fields = getattr(getattr(state, node.func.attr, None), "_fields", ())
        for field, arg in zip(fields, node.args, strict=False):
            if isinstance(arg, ast.Call):  # x[k].view(...)
                arg = arg.func.value  # type: ignore[attr-defined]
            if isinstance(arg, ast.Subscript) and getattr(arg.value, "id", "") == "x":
                seen.append((field, state.LISTS[arg.slice.value]))  # type: ignore[attr-defined]
    assert sorted(seen) == sorted((name, name) for name in state.LISTS)


def test_the_build_command_keeps_a_current_build_and_rebuilds_on_force(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m accelgen.policies.accelgen`` (what setup.sh runs every time): a build of the
    current sources that is there is kept, ``--force`` builds again, anything else is refused."""
    from accelgen.policies.accelgen import build as build_module

    built: list[Path] = []
    current = tmp_path / "decide_current.so"

    def fake_build() -> Path:
        current.write_bytes(b"x" * 2048)
        built.append(current)
        return current

    monkeypatch.setattr(build_module, "aot_path", lambda: current)
    monkeypatch.setattr(build_module, "build", fake_build)

    def run(*args: str) -> str:
        monkeypatch.setattr(sys, "argv", ["accelgen.policies.accelgen", *args])
        runpy.run_module("accelgen.policies.accelgen", run_name="__main__")
        return capsys.readouterr().out

    assert "accelgen: built" in run() and len(built) == 1  # none there: built
    assert "is there" in run() and len(built) == 1  # kept
    assert "accelgen: built" in run("--force") and len(built) == 2
    with pytest.raises(SystemExit, match="usage"):
        run("--forced")
    assert len(built) == 2
