"""The simulator tunes Python's garbage collector for its loop only: the thresholds and the
frozen objects are back as they were after a run, also one that fails."""

from __future__ import annotations

import gc

import pytest

from accelgen.core.iteration import Pivot
from accelgen.core.kvcache import BlockManager
from accelgen.core.policy import Decision, SchedulerView
from accelgen.policies.vllm import VLLMPolicy
from accelgen.sim.engine import LOOP_GC_THRESHOLDS, PolicyError, Simulator
from tests.conftest import LinearCost, make_requests


def _sim(policy: VLLMPolicy) -> Simulator:
    cost = LinearCost()
    return Simulator(make_requests([(0.0, 40), (0.1, 30)]), [5, 7], policy, cost,
                     BlockManager(32, 16), Pivot(s_pf=64, t_pf=cost.forward_time(64)),
                     max_model_len=1000)


class _Broken(VLLMPolicy):
    def schedule(self, view: SchedulerView) -> Decision:
        assert gc.get_threshold() == LOOP_GC_THRESHOLDS
        raise PolicyError("broken on purpose")


def test_the_collector_is_restored_after_a_run() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    res = _sim(VLLMPolicy()).run()
    assert all(r.status.name == "FINISHED" for r in res.requests)
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    with pytest.raises(PolicyError, match="on purpose"):
        _sim(_Broken()).run()
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen


def test_a_callers_frozen_objects_stay_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # The run must neither freeze nor thaw anything while the caller has frozen objects.
        calls: list[str] = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        _sim(VLLMPolicy()).run()
        monkeypatch.undo()
        assert calls == []
        after = gc.get_freeze_count()
        # A frozen object can still be freed by reference counting (other threads of this test
        # process drop a few meanwhile); unfreezing the caller's objects would empty the frozen
        # generation, and freezing the run's own would grow it.
        assert frozen > 0 and 0.99 * frozen <= after <= frozen
    finally:
        gc.unfreeze()
