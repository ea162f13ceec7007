"""The soak under faults, shortened (``accelgen.serving.soak``; the 10-minute one is
``scripts/soak_serve.py``): one ``accelgen serve`` of its own on 127.0.0.1 (AccelGen, the plugin's
logs), its throughput with every request at once as the capacity estimate, then 40 s at 1.2 times
it with bursty arrivals, aborted streams, malformed requests and impossible SLOs, SIGTERM with
requests in flight and requests still arriving until the exit; every check of the long soak must
hold, with the same limits (RSS growth measured from 10 s on instead of 60 s) (marker ``vllm``;
its own xdist group, beside the engine tests' worker)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from accelgen.serving.soak import CapacitySearch, SoakConfig, closing_line, soak
from tests.lazy_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("serve-soak")]


def test_short_soak_under_faults_holds_every_check(tmp_path: Path) -> None:
    # 40 s of load (the RSS check over the 30 s after the warm-up): the long soak is
    # scripts/soak_serve.py; this one checks every rule under faults within CI's budget.
    cfg = SoakConfig(rate=1.0, duration_s=40.0, warmup_s=10.0, rss_interval_s=1.0,
                     drain_timeout_s=90.0)
    # The capacity search's first probe alone (every request at once): the saturated
    # throughput.
    report = soak(tmp_path, cfg, search=CapacitySearch(requests=40, estimate="saturation"),
                  load_factor=1.2)
    print(closing_line(report, tmp_path))
    checks = report["checks"]
    failed = {name: check for name, check in checks.items() if not check["held"]}
    assert not failed, json.dumps(failed, indent=1, default=str)
    load = report["load"]
    # The faults really happened: each kind was sent and ended as it should.
    kinds = load["by_kind"]
    assert kinds["abort"].get("aborted", 0) > 0, kinds
    # Every malformed request the server answered was refused. Not answered: one still waiting
    # at SIGTERM may find the server gone, and one whose connection failed before any reply
    # (the client's "connection: ..." reasons; on a 2-core host that saturated at ~135 req/s,
    # at 1.2 times that, the server once closed ~50 connections at one instant mid-load, the
    # soak's checks holding).
    client = pd.read_parquet(tmp_path / "client.parquet")
    malformed = client[client["kind"] == "malformed"]
    no_reply = (malformed["outcome"] != "refused") & (
        malformed["in_flight_at_sigterm"] | ((malformed["outcome"] == "unfinished")
                                             & malformed["reason"].fillna("").str.startswith("connection:")))
    answered = Counter(malformed.loc[~no_reply, "outcome"])
    assert set(answered) == {"refused"}, (kinds, load["by_kind_in_flight_at_sigterm"])
    assert no_reply.sum() <= 0.05 * len(malformed), kinds
    assert sum(kinds["impossible"].values()) > 0 and "error" not in kinds["impossible"]
    assert load["in_flight_at_sigterm"] > 0
    # Requests kept arriving while the server stopped: refused (503), not faults.
    assert checks["no_5xx"]["refused_at_shutdown"] > 0
    assert checks["drained"]["kv_blocks_free"] == checks["drained"]["kv_blocks_total"] > 0
