"""Golden digests of AccelGen's decisions: a handful of short simulations (AccelGen, each
ablation, both budget rules below the cap, ERA off and per request, gamma 0, other flags, the
Oracle with and without its exact KV plan) on three small fixed traces, each reduced to one
sha256 of its results' contents (``requests.parquet`` and ``iterations.parquet``, column by
column: names, dtypes and values; independent of the Parquet writer's version).

``tests/test_accelgen_golden.py`` compares them with ``tests/fixtures/accelgen_golden/digests.json``,
recorded on the build before AccelGen's decision became one compiled implementation (7d448c9;
main at 67e41b8 records the same), and again when the exact plan added four diagnostics (the same
decisions: every digest equal with those columns left out): a change of any decision, diagnostic
or timing changes a digest. The closed loop's runs have the open loop's digests; three runs under
the engine's noise have their own.

    python tests/accelgen_golden.py traces DIR   # the traces (from the workload generator; kept)
    python tests/accelgen_golden.py record       # the digests of this build (a reference build)

Only ``accelgen`` is imported (``PYTHONPATH=<other checkout>`` records another build).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent / "fixtures" / "accelgen_golden"
DIGESTS = HERE / "digests.json"

# Workloads of the traces: OPT-13B's quick mix overloaded (8 req/s: urgent, late and lost
# requests, preemptions), a moderate one with offline requests (step 2's slack groups, skipped
# decodes, offline JCT plans), and a BookCorpus-heavy mix with 16K prompts (ERA). Outputs fit the
# context, so no output is ever cut at max_model_len.
_MIX = "mix: {alpaca: 0.25, sharegpt: 0.40, bookcorpus: 0.35}"
TRACES = {
    "overload": f"num_requests: 40\nseed: 5\nmax_model_len: 1536\nmax_tokens: 256\n{_MIX}\n"
                "arrival: {kind: poisson, rate: 8.0}\n",
    "moderate": f"num_requests: 40\nseed: 6\nmax_model_len: 1536\nmax_tokens: 256\n{_MIX}\n"
                "arrival: {kind: poisson, rate: 0.5}\nslo: {offline_fraction: 0.3}\n",
    "long": "num_requests: 24\nseed: 7\nmax_model_len: 12000\nmax_tokens: 128\n"
            "mix: {alpaca: 0.15, sharegpt: 0.15, bookcorpus: 0.70}\n"
            "arrival: {kind: poisson, rate: 0.5}\n",
}
_OPT13B_16K = "deployment: {model: opt-13b, hardware: a100, kv_cache_gb: 12.0, max_model_len: 16384}\n"

# name -> (trace, policy, parameters). The runs above "batch" were recorded when `paper` was the
# default budget rule and name it, so they still prove that rule decides as before; the default
# rule `batch` has its own runs.
RUNS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "overload/accelgen": ("overload", "accelgen", ("budget_rule=paper",)),
    "overload/no-order": ("overload", "accelgen/order", ("budget_rule=paper",)),
    "overload/no-chunk": ("overload", "accelgen/chunk", ("budget_rule=paper",)),
    "overload/no-batch": ("overload", "accelgen/batch", ("budget_rule=paper",)),
    "overload/budget-model": ("overload", "accelgen", ("budget_rule=model",)),
    "overload/gamma0": ("overload", "accelgen", ("gamma=0", "budget_rule=paper")),
    "overload/lost-last-off": ("overload", "accelgen", ("lost_last=false", "budget_rule=paper")),
    "overload/late-urgent-no-spill": ("overload", "accelgen", (
        "late_is_urgent=true", "spill_groups=false", "max_num_seqs=8", "kv_growth_reserve=0",
        "budget_rule=paper")),
    "overload/oracle": ("overload", "oracle", ("budget_rule=paper",)),
    "overload/oracle-no-plan": ("overload", "oracle", ("kv_plan=none", "budget_rule=paper")),
    "moderate/accelgen": ("moderate", "accelgen", ("budget_rule=paper",)),
    "moderate/no-batch": ("moderate", "accelgen/batch", ("budget_rule=paper",)),
    "moderate/oracle": ("moderate", "oracle", ("budget_rule=paper",)),
    # a budget cap above S_pf, so that SLO_min sets the budget and the two rules differ
    "moderate/cap4": ("moderate", "accelgen", ("budget_cap=4", "budget_rule=paper")),
    "moderate/cap4-budget-model": ("moderate", "accelgen", ("budget_cap=4", "budget_rule=model")),
    "long/accelgen": ("long", "accelgen", ("budget_rule=paper",)),
    "long/no-era": ("long", "accelgen", ("era=false", "budget_rule=paper")),
    "long/era-request": ("long", "accelgen", ("era_scope=request", "budget_rule=paper")),
    "long/no-chunk": ("long", "accelgen/chunk", ("budget_rule=paper",)),
    # batch
    "overload/budget-batch": ("overload", "accelgen", ()),
    "overload/no-order-budget-batch": ("overload", "accelgen/order", ()),
    "overload/oracle-budget-batch": ("overload", "oracle", ()),
    "moderate/budget-batch": ("moderate", "accelgen", ()),
    "moderate/cap4-budget-batch": ("moderate", "accelgen", ("budget_cap=4",)),
    "long/budget-batch": ("long", "accelgen", ()),
    # the closed loop (SPEC 13): with the simulator's exact latencies, the open loop's decisions
    "overload/closed-loop": ("overload", "accelgen-closed", ()),
    "moderate/closed-loop": ("moderate", "accelgen-closed", ()),
    "long/closed-loop": ("long", "accelgen-closed", ()),
    # ... and under the engine's noise (``NOISY``): the open loop as it is, the closed loop with
    # its correction and margin
    "moderate/noise": ("moderate", "accelgen", ()),
    "moderate/closed-loop-noise": ("moderate", "accelgen-closed", ()),
    "overload/closed-loop-noise": ("overload", "accelgen-closed", ()),
}
# Runs charged with per-step lognormal noise (10 %, mean 1; ``accelgen simulate --noise``).
NOISE = '{"kind": "lognormal", "step_mu": -0.005, "step_sigma": 0.1}'
NOISY = {name for name in RUNS if name.endswith("noise")}


def table_digest(path: Path, h: hashlib._Hash) -> None:
    df = pd.read_parquet(path)
    for col in df.columns:
        v = df[col].to_numpy()
        h.update(f"{col}:{v.dtype}\n".encode())
        if v.dtype.kind in "biuf":
            h.update(np.ascontiguousarray(v).tobytes())
        else:
            h.update("\x1f".join(map(str, v)).encode())


def results_digest(out: Path) -> str:
    h = hashlib.sha256()
    for name in ("requests.parquet", "iterations.parquet"):
        table_digest(out / name, h)
    return h.hexdigest()


def simulate_args(name: str, out: Path, tmp: Path) -> list[str]:
    """``accelgen simulate`` arguments of run ``name`` (writing to ``out``)."""
    trace, policy, params = RUNS[name]
    if trace == "long":
        cfg = tmp / "opt-13b-16k.yaml"
        cfg.write_text(_OPT13B_16K)
        dep = ["--config", str(cfg)]
    else:
        dep = ["--deployment", "opt-13b"]
    args = ["simulate", "--trace", str(HERE / f"{trace}.csv"), *dep, "--policy", policy,
            "--seed", "0", "--no-progress", "--out", str(out)]
    for p in params:
        args += ["--param", p]
    if name in NOISY:
        args += ["--noise", NOISE]
    return args


def simulate_one(args: list[str]) -> None:
    """``accelgen simulate ARGS`` for one policy: the Oracle's policy too (the command runs the
    Oracle's schedule search; these digests are of its decisions)."""
    import argparse

    from accelgen.cli.simulate import add_parser, build_config
    from accelgen.sim.runner import simulate_to_dir
    from accelgen.workloads.trace import load_trace

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    a = parser.parse_args(args)
    simulate_to_dir(load_trace(a.trace), build_config(a), a.out, trace_path=str(a.trace))


def run_digests(names: list[str] | None = None) -> dict[str, str]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(RUNS):
            res = Path(tmp) / name
            simulate_one(simulate_args(name, res, Path(tmp)))
            out[name] = results_digest(res)
    return out


def write_traces(out: Path) -> None:
    from accelgen.cli import main

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in TRACES.items():
            cfg = Path(tmp) / f"{name}.yaml"
            cfg.write_text("workload:\n" + "".join(f"  {line}\n" for line in text.splitlines()))
            pq = Path(tmp) / f"{name}.parquet"
            assert main(["trace", "--config", str(cfg), "--out", str(pq), "--quiet"]) == 0
            df = pd.read_parquet(pq)
            df.to_csv(out / f"{name}.csv", index=False)
            back = pd.read_csv(out / f"{name}.csv")
            for col in df.columns:  # floats round-trip exactly through their repr
                assert (back[col].to_numpy() == df[col].to_numpy()).all(), col


if __name__ == "__main__":
    if sys.argv[1:2] == ["traces"]:
        write_traces(Path(sys.argv[2]) if len(sys.argv) > 2 else HERE)
    elif sys.argv[1:] == ["record"]:
        DIGESTS.write_text(json.dumps(run_digests(), indent=1, sort_keys=True) + "\n")
        print(f"accelgen_golden: {len(RUNS)} digests in {DIGESTS}")
    else:
        raise SystemExit("usage: python tests/accelgen_golden.py traces [DIR] | record")
