"""Invariants every policy must keep in the simulator (shared by the property tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Status
from accelgen.sim.engine import SimulationResult


class RecordingPolicy(Policy):
    """Wraps a policy and records the forward size of every decision that schedules tokens."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.clairvoyant = inner.clairvoyant  # type: ignore[misc]
        self.params = inner.params
        self.forward_sizes: list[int] = []

    def schedule(self, view: SchedulerView) -> Decision:
        d = self.inner.schedule(view)
        if d.scheduled:
            self.forward_sizes.append(sum(n for _, n in d.scheduled))
        return d

    def on_arrival(self, req: Any, now: float) -> None:
        self.inner.on_arrival(req, now)

    def on_step_end(self, view: SchedulerView, decision: Decision, latency: float) -> None:
        self.inner.on_step_end(view, decision, latency)

    def on_finish(self, req: Any, now: float) -> None:
        self.inner.on_finish(req, now)


def check_invariants(res: SimulationResult, recorder: RecordingPolicy | None = None) -> None:
    its = res.iterations.to_frame()
    if len(its):
        assert (its["kv_used_blocks"] <= its["kv_total_blocks"]).all(), "KV over capacity"
        assert (its["kv_used_blocks"] >= 0).all()
        assert (its["latency"] > 0).all()
        assert np.all(np.diff(its["start"].to_numpy()) > 0), "iterations overlap"
    for r in res.requests:
        assert r.status in (Status.FINISHED, Status.CUT, Status.REJECTED), (
            f"req {r.req_id} ended {r.status}")
        if r.status != Status.REJECTED:
            # Cut exactly when max_model_len left less than the trace's output, with the reason.
            cut = res.served_output_len[r.req_id] < res.requested_output_len[r.req_id]
            assert (r.status == Status.CUT) == cut, r.req_id
            assert r.reject_reason.startswith("length_cap:") == cut, r.req_id
        if r.status == Status.REJECTED:
            assert r.reject_reason, f"req {r.req_id} rejected without a reason"
        else:
            assert r.num_output_tokens == res.served_output_len[r.req_id], (
                f"req {r.req_id} emitted {r.num_output_tokens}, "
                f"wanted {res.served_output_len[r.req_id]}")
            assert len(r.token_times) == r.num_output_tokens
            t = np.asarray(r.token_times)
            assert np.all(np.diff(t) > 0), f"req {r.req_id} token times not increasing"
            assert t[0] > r.arrival
            assert r.num_blocks == 0
    if recorder is not None:
        assert recorder.forward_sizes == its["forward_size"].tolist()
