"""scripts/compare_clients.py's bookkeeping (the script itself runs servers and clients: not in
CI): each run's requests are those the server logged between the run's start and end, and the
table sets every client beside bench-serve's medians of the same definition."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from accelgen.results import REQUEST_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_clients",
                                              ROOT / "scripts" / "compare_clients.py")
assert spec is not None and spec.loader is not None
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def _request(i: int, arrival: float, prompt: int, ttft: float, tpot: float, n: int) -> dict:
    first = arrival + ttft
    times = first + tpot * np.arange(n)
    return {"req_id": i, "arrival": arrival, "source": "", "online": True, "prompt_len": prompt,
            "output_len": n, "ttft_slo": np.inf, "tbt_slo": np.inf, "jct_slo": np.nan,
            "status": "finished", "reject_reason": "", "num_output_tokens": n,
            "first_scheduled_time": arrival, "first_token_time": first,
            "finish_time": float(times[-1]), "num_preemptions": 0, "token_times": times}


def test_server_view_splits_the_log_by_run(tmp_path: Path) -> None:
    rows = [_request(i, 1.0 + 0.1 * i, 128, 0.008, 0.003, 32) for i in range(5)]
    rows += [_request(10 + i, 20.0 + 0.1 * i, 64, 0.020, 0.005, 16) for i in range(3)]
    pd.DataFrame(rows, columns=list(REQUEST_COLUMNS)).to_parquet(tmp_path / "requests.parquet")
    view = cc.server_view(tmp_path, {0: (0.5, 10.0), 1: (19.5, 30.0), 2: (40.0, 50.0)})
    assert view.loc[0, "server_requests"] == 5 and view.loc[1, "server_requests"] == 3
    assert view.loc[0, "server_prompt"] == 128 and view.loc[1, "server_output"] == 16
    assert abs(view.loc[0, "server_ttft"] - 8.0) < 1e-6
    assert abs(view.loc[1, "server_tpot"] - 5.0) < 1e-6
    assert view.loc[2, "server_requests"] == 0


def test_table_compares_each_itl_with_the_same_definition() -> None:
    base = {"completed": 40, "failed": 0, "output_tokens": 1280, "expected_tokens": 1280,
            "server_prompt": 128, "server_ttft": 8.0, "server_tpot": 3.0, "error": ""}
    runs = pd.DataFrame([
        {**base, "client": "bench-serve", "rep": 0, "ttft": 12.0, "itl": 2.0, "tpot": 4.0},
        {**base, "client": "aiperf", "rep": 0, "ttft": 15.0, "itl": 4.4, "tpot": 4.4},
        {**base, "client": "guidellm", "rep": 0, "error": "RuntimeError: failed",
         "ttft": np.nan, "itl": np.nan, "tpot": np.nan}])
    md = cc.table(runs, {"vllm": "not installed"})
    aiperf = next(line for line in md.splitlines() if line.startswith("| AIPerf"))
    cells = [c.strip() for c in aiperf.strip("|").split("|")]
    assert cells[7] == "1.25"  # TTFT 15 / 12
    assert cells[9] == "7.0"  # client - engine
    assert cells[12] == "4.0" and cells[13] == "1.10"  # beside bench-serve's TPOT, not its ITL
    assert "GuideLLM repeat 0: RuntimeError: failed" in md
    assert "vllm bench serve: not run: not installed" in md
