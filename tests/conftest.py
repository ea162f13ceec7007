"""Shared test helpers: a simple linear cost model, a one-call simulator runner, and a
scheduler view for calling a policy's ``schedule`` directly. Also the hypothesis profiles:
``ci`` (the default: the same examples on every run, so a red suite is reproducible) and
``explore`` (``HYPOTHESIS_PROFILE=explore``: new random examples each run, for hunting)."""

from __future__ import annotations

import math
import os
from collections.abc import Generator, Sequence

import pytest
from hypothesis import settings

from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Policy, SchedulerView
from accelgen.core.request import Request, Status
from accelgen.costmodel.base import CostModel
from accelgen.costmodel.linear import LinearCostModel
from accelgen.sim.engine import SimulationResult, Simulator

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Real-engine tests share one pytest-xdist worker (``--dist loadgroup``): a vLLM CPU engine takes
# both cores, so two at once only slow each other down and blur the timings they read. They run
# first, since they are the longest share of the suite. Every other module is a group of its
# own, so a module-scoped fixture (a served model, a workflow's dry runs, executed notebooks) is
# built once, not once per worker. The groups with tests marked ``slow`` follow, most slow tests
# first, and the quick groups last: a worker that ends on a long group while the other has
# nothing left to take is what makes a two-worker suite slower than half its summed time.
ENGINE_GROUP = "vllm-engine"


def pytest_configure(config: pytest.Config) -> None:
    # xdist would otherwise queue the groups by their number of tests, putting the engine group
    # behind every larger module and the few-test slow groups (a soak, executed notebooks, the
    # workflow's dry runs) at the end; the queue keeps the order set below instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(wrapper=True)  # around xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> Generator[None, None, None]:
    engine = [item for item in items if item.get_closest_marker("vllm") is not None]
    others = [item for item in items if item.get_closest_marker("vllm") is None]
    for item in engine:
        # A real-engine test with a group of its own (the soak, tests/test_serve_soak.py) runs
        # beside the engine group, on the other worker: the engine group is the suite's
        # critical path.
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
    for item in others:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module
                                                    else item.nodeid.split("::")[0]))
    items[:] = engine + slow_groups_first(others)
    result = yield
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            group_the_node_id(item)
    return result


def _group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0] if marker and marker.args else "")


def slow_groups_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with each xdist group's tests together, the groups ordered by how many of their
    tests are marked ``slow`` (most first), otherwise in the order they were collected."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(_group_of(item), []).append(item)
    slow = {name: sum(i.get_closest_marker("slow") is not None for i in members)
            for name, members in groups.items()}
    order = sorted(groups, key=lambda name: -slow[name])  # stable: collection order otherwise
    return [item for name in order for item in groups[name]]


def group_the_node_id(item: pytest.Item) -> None:
    """Append ``@<group>`` to the item's node id, which is how xdist's loadgroup scheduler finds
    the group. xdist 3.8 writes it to ``item._nodeid``, which pytest 9 no longer reads (the id is
    ``item._id``): without this every test is a group of its own, the engine tests run on both
    workers at once and a module fixture is built on each worker."""
    from _pytest.nodeid import NodeId

    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})
    if groups and "@" not in item.nodeid.rsplit("]", 1)[-1]:
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


class LinearCost(LinearCostModel):
    """The project's linear model with the tests' defaults: base + per_token x S_f + per_ctx x
    (decode context + prefill attention pairs / 64). Simple, monotone, easy to reason about;
    AccelGen's compiled decision evaluates it itself (``linear_terms``)."""

    def __init__(self, base: float = 0.010, per_token: float = 1e-4, per_ctx: float = 1e-7) -> None:
        super().__init__(base, per_token, per_ctx, per_ctx / 64)


def make_requests(specs: Sequence[tuple[float, int]], *, ttft_slo: float = 1.0,
                  tbt_slo: float = 0.2, source: str = "test") -> list[Request]:
    """``specs``: (arrival, prompt_len) per request; ids follow the order given."""
    reqs = []
    for i, (arrival, prompt) in enumerate(specs):
        reqs.append(Request(req_id=i, arrival=arrival, prompt_len=prompt, source=source,
                            ttft_slo=ttft_slo, tbt_slo=tbt_slo, jct_slo=math.inf))
    return reqs


def scheduler_view(waiting: list[Request], running: list[Request], kv: BlockManager, *,
                   swapped: list[Request] | None = None, s_pf: int = 256,
                   now: float = 0.0) -> SchedulerView:
    """The view a policy's ``schedule`` sees, under the linear test cost model."""
    cost = LinearCost()
    return SchedulerView(now=now, waiting=waiting, running=running, swapped=swapped or [], kv=kv,
                         cost=cost, pivot=Pivot(s_pf, cost.forward_time(s_pf)),
                         max_model_len=100_000)


def put_running(r: Request, kv: BlockManager, computed: int, outputs: int) -> Request:
    """Put ``r`` in the running state holding KV for ``computed`` tokens."""
    r.status, r.num_output_tokens = Status.RUNNING, outputs
    kv.allocate(r, computed)
    r.num_computed_tokens = computed
    return r


def run_sim(requests: list[Request], output_len: Sequence[int], policy: Policy, *,
            num_blocks: int = 64, block_size: int = 16, s_pf: int = 256,
            cost: CostModel | None = None, max_model_len: int = 100_000,
            kv_bytes_per_token: int = 1024, host_link_bandwidth: float = math.inf,
            num_swap_blocks: int = 0, watermark: float = 0.0,
            swap_overlap: bool = False) -> SimulationResult:
    cost = cost or LinearCost()
    kv = BlockManager(num_blocks, block_size, watermark=watermark, num_swap_blocks=num_swap_blocks)
    pivot = Pivot(s_pf=s_pf, t_pf=cost.forward_time(s_pf))
    sim = Simulator(requests, list(output_len), policy, cost, kv, pivot,
                    max_model_len=max_model_len, kv_bytes_per_token=kv_bytes_per_token,
                    host_link_bandwidth=host_link_bandwidth, swap_overlap=swap_overlap,
                    max_iterations=200_000)
    return sim.run()


def assert_same_results(a: SimulationResult, b: SimulationResult) -> None:
    """Two simulations of the same trace gave the same results: every request's outcome and
    token times, the end time and the iteration log."""
    def outcomes(res: SimulationResult) -> list[tuple[object, ...]]:
        return [(r.req_id, r.status, r.reject_reason, r.num_preemptions, r.finish_time,
                 r.first_scheduled_time, tuple(r.token_times)) for r in res.requests]

    assert outcomes(a) == outcomes(b)
    assert a.end_time == b.end_time
    assert a.iterations.to_frame().equals(b.iterations.to_frame())


@pytest.fixture
def linear_cost() -> LinearCost:
    return LinearCost()
