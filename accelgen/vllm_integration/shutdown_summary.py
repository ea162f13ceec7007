"""What a scheduler holds when its engine shuts down, written beside its logs (``shutdown.json``).

A served engine lives in vLLM's engine-core process, which a client cannot inspect; after a drain
(SIGTERM with ``--shutdown-timeout`` > 0) every request should have ended, every KV block should
be back in vLLM's pool and the policy's own state should hold no request. ``summary`` reads those
numbers in ``Scheduler.shutdown()`` (after the last step), and ``write_summary`` puts them in
``<log_dir>/shutdown.json`` (via a temporary file and a rename) after the final log write, so the
file's presence also says that the logs were completed at shutdown:

- ``kv_blocks_total`` / ``kv_blocks_free``: vLLM's block pool, without its reserved null block;
- ``vllm_requests``, ``waiting``, ``running``: vLLM's own request table and queues;
- ``tracked_requests``: the plugin's mirrors of requests not ended;
- ``policy_live_requests``: the policy's own table (``Policy.live_requests``; null for a policy
  that keeps none, and for ``--system stock``);
- ``requests_by_status``: every request the records hold, by the status the log writes
  (``finished``, ``cut``, ``rejected``, ``unfinished``), and ``unfinished_by_reason``;
- ``iterations`` (every step logged), ``log_writes``, ``time`` (epoch seconds at the summary).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from accelgen.vllm_integration.logsink import IN_FLIGHT_REASON

FILE = "shutdown.json"


def summary(scheduler: Any) -> dict[str, Any]:
    """The numbers above, from an ``InstrumentedScheduler`` (under its ``log_lock``)."""
    with scheduler.log_lock:
        kv = scheduler.kv_view
        policy = getattr(scheduler, "accelgen_policy", None)
        live = policy.live_requests() if policy is not None else None
        # The statuses requests_frame writes, counted on the mirrors (no frame of every
        # request built again at shutdown), and on the counts of those a server's scheduler
        # forgot once its log had written them.
        forgotten = scheduler.forgotten
        statuses: Counter[str] = Counter(forgotten.statuses)
        reasons: Counter[str] = Counter(forgotten.reasons)
        unfinished = scheduler.unfinished_reason
        for r in scheduler.done:
            why = unfinished.get(r.req_id)
            if why:
                statuses["unfinished"] += 1
                reasons[why] += 1
            else:
                statuses[r.status.name.lower()] += 1
        for r in scheduler.tracked.values():
            statuses["unfinished"] += 1
            reasons[unfinished.get(r.req_id) or IN_FLIGHT_REASON] += 1
        sink = scheduler.log_sink
        return {
            "time": time.time(),
            "kv_blocks_total": int(kv.num_total_blocks),
            "kv_blocks_free": int(kv.num_free_blocks),
            "vllm_requests": len(scheduler.requests),
            "waiting": len(scheduler.waiting) + len(scheduler.kv_holding_waiting),
            "running": len(scheduler.running),
            "tracked_requests": len(scheduler.tracked),
            "policy_live_requests": live,
            "requests_by_status": dict(sorted(statuses.items())),
            "unfinished_by_reason": dict(sorted(reasons.items())),
            "iterations": scheduler.num_iterations,
            "log_writes": sink.writes if sink is not None else 0,
        }


def write_summary(data: dict[str, Any], log_dir: Path | str) -> Path:
    path = Path(log_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_summary(log_dir: Path | str) -> dict[str, Any] | None:
    """The summary written at shutdown, or None if there is none (the engine did not reach its
    ``shutdown()``: killed, or stopped with ``--shutdown-timeout 0``)."""
    path = Path(log_dir) / FILE
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data
