"""Invariants every policy must keep in the simulator (shared by the property tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.core.request import Status
from accelgen.policies.accelgen.state import LOST_OFFSET
from accelgen.policies.accelgen.table import RequestTable
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


def table_mismatches(t: RequestTable) -> list[str]:
    """AccelGen's table fields that disagree with the request objects, and a broken partition of
    its slots into active and dormant ones (``AccelGenPolicy.verify``: checked every decision)."""
    bad = []
    for s in range(t.n):
        r = t.objs[s]
        want = (r.num_output_tokens, r.num_computed_tokens, r.num_blocks, r.status == Status.RUNNING)
        got = (int(t.n_out[s]), int(t.computed[s]), int(t.blocks[s]), bool(t.running[s]))
        if want != got or t.slot_of.get(r.req_id) != s:
            bad.append(f"req {r.req_id}: table {got} vs request {want}")
    active = t.active[: t.n_active].tolist()
    lo, hi = t.dormant_lo, t.dormant_lo + t.n_dormant
    keys, slots = t.dormant_key[lo:hi].tolist(), t.dormant_slot[lo:hi].tolist()
    order, dormant = sorted(zip(keys, slots, strict=True)), set(slots)
    if (sorted(active + slots) != list(range(t.n)) or active != sorted(active)
            or order != list(zip(keys, slots, strict=True))
            or any(t.dormant[s] != (s in dormant) for s in range(t.n))):
        bad.append(f"active {active} and dormant {order} do not partition the table in order")
    for key, s in order:
        if key != float(t.arrival[s]) + LOST_OFFSET or t.running[s] or not t.online[s]:
            bad.append(f"dormant slot {s}: key {key}, running {t.running[s]}")
    return bad
