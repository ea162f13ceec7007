#!/usr/bin/env python
"""One loaded point of an engine sweep served over HTTP: ``accelgen serve`` + ``accelgen
bench-serve``, the client's numbers beside the engine's own.

    flock /tmp/accelgen-engine.lock .venv/bin/python scripts/serve_engine_point.py \\
        --runs results/quick/engine --rate 5.31 [--seed 0] [--systems vllm-tuned,accelgen] \\
        [--engine-cpus 1 --client-cpus 0 --renice -15] [--out results/serve-engine]

Takes the sweep's engine (its model shape, KV blocks, scheduling mode), its calibrated
deployment, its budgets and the trace of one (seed, rate) probe (``traces/``: every rate the
sweep's searches probed at that seed), and for each
system starts a fresh ``accelgen serve`` on 127.0.0.1 with that engine (``--system stock`` with
``--max-num-batched-tokens`` = the system's budget, or the plugin hosting the system's policy and
planning with the calibrated deployment), replays the trace with ``accelgen bench-serve`` and
stops the server with SIGTERM (the plugin then writes its logs). Placement: the engine core's
thread on ``--engine-cpus`` (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``), the API server process and
the client on ``--client-cpus`` (``os.sched_setaffinity``, inherited by the server), so neither
the HTTP path nor the client takes the engine's core; ``--renice`` runs all of it at that nice
value in its own session, as the sweep's replays run.

Per system: the client's request-level attainment, TTFT and TBT p50/p99 (``bench-serve``'s
``summary.json``), the same metrics on the plugin's own token times (``--log-dir``: the engine
core's clock), and the in-process replay of the same point in the sweep (``real/``; NaN where that
system's search did not probe this rate), so that
what the HTTP path adds shows beside what the scheduler did. Writes ``serve.csv`` and
``serve.md`` (the table of docs/vllm.md). Needs vllm-cpu.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

COLUMNS = ("req_att", "ttft_p50_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p99_ms")


def _cols(prefix: str, s: dict[str, Any]) -> dict[str, float]:
    return {f"{prefix}req_att": s["slo_attainment_request"],
            f"{prefix}ttft_p50_ms": s["ttft_p50"] * 1e3, f"{prefix}ttft_p99_ms": s["ttft_p99"] * 1e3,
            f"{prefix}tbt_p50_ms": s["tbt_p50"] * 1e3, f"{prefix}tbt_p99_ms": s["tbt_p99"] * 1e3}


def serve_one(runs: Path, system: str, seed: int, rate: float, out: Path,
              engine_cpus: str, client_cpus: set[int] | None) -> dict[str, Any]:
    from accelgen import metrics
    from accelgen.cli import main as accelgen
    from accelgen.engine_regime import systems as sysmod
    from accelgen.engine_regime.run import (
        point_dir,
        rate_name,
        read_config,
        read_deployment,
        read_plan,
        trace_path,
    )
    from accelgen.results import read_results
    from accelgen.vllm_integration.logsink import read_logs
    from accelgen.vllm_integration.serve import ServerProcess
    from accelgen.vllm_integration.tiny_model import write_tiny_model

    cfg, plan, dep = read_config(runs), read_plan(runs), read_deployment(runs)
    spec = cfg.systems[system]
    budget = plan["budgets"][system]
    rc = sysmod.replay_config(cfg, spec, budget, dep, str(out / "model"))
    model = write_tiny_model(out / "model", cfg.model)
    out.mkdir(parents=True, exist_ok=True)
    adapter = out / f"{system}-adapter.json"
    adapter.write_text(json.dumps(rc["adapter"]))
    eng = rc["engine"]
    args = ["--system", "stock" if spec.runs == "stock" else "accelgen",
            "--adapter-config", str(adapter), "--log-dir", str(out / f"{system}-logs"),
            "--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
            "--enforce-eager", "--block-size", str(eng["block_size"]),
            "--num-gpu-blocks-override", str(eng["num_gpu_blocks"]),
            "--max-model-len", str(eng["max_model_len"]),
            "--max-num-batched-tokens", str(eng["max_num_batched_tokens"]),
            "--max-num-seqs", str(eng["max_num_seqs"])]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.omp_threads))
    if engine_cpus:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = engine_cpus  # the engine core's thread
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)  # this client and the API server it starts
    tpath = trace_path(runs, seed, rate)
    load_before = os.getloadavg()[0]
    with ServerProcess(args, log_path=out / f"{system}-server.log") as server:
        rc_code = accelgen(["bench-serve", "--url", server.url, "--trace", str(tpath),
                            "--out", str(out / f"{system}-bench"), "--label", system,
                            "--no-progress"])
        load_after = os.getloadavg()[0]
        if rc_code != 0:
            raise RuntimeError(f"bench-serve failed ({rc_code}); see {out}")
        status = server.stop()
    if status != 0:
        raise RuntimeError(f"the {system} server exited with {status}; see {out}")
    _, _, client = read_results(out / f"{system}-bench")
    logs = read_logs(out / f"{system}-logs")
    served = logs["requests"][logs["requests"]["req_id"] < (1 << 40)]  # no warm-ups
    engine = metrics.summarize(served, logs["iterations"], s_pf=plan["s_pf"])
    probed = point_dir(runs, "real", system, seed, rate)
    replay = (read_results(probed)[2] if (probed / "summary.json").exists()
              else dict.fromkeys(("slo_attainment_request", "ttft_p50", "ttft_p99", "tbt_p50",
                                  "tbt_p99"), float("nan")))
    return {"system": system, "label": plan["labels"][system], "seed": seed, "rate": rate,
            "point": rate_name(rate), "finished": client["num_finished"],
            "requests": client["num_requests"], **_cols("client_", client),
            **_cols("engine_", engine), **_cols("replay_", replay),
            "shared_chunk_frac": client["tokens_sharing_a_chunk"]
            / max(int(served["num_output_tokens"].sum()), 1),
            "send_lag_max_ms": client["send_lag_max_s"] * 1e3,
            "preemptions": int(served["num_preemptions"].sum()),
            "load_before": load_before, "load_after": load_after,
            "engine_cpus": engine_cpus, "client_cpus": ",".join(map(str, sorted(client_cpus or
                                                                              [])))}


def markdown(df: pd.DataFrame) -> str:
    cols = ["label", "finished", *(f"{p}{c}" for p in ("client_", "engine_", "replay_")
                                   for c in COLUMNS), "shared_chunk_frac", "send_lag_max_ms",
            "preemptions", "load_before"]
    head = ["system", "finished",
            *(f"{p} {c.replace('_ms', ' (ms)').replace('_', ' ')}"
              for p in ("client", "engine", "replay") for c in COLUMNS),
            "shared chunk", "send lag max (ms)", "preempt.", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:.3f}" if c.endswith("req_att") else
                         f"{v:.2f}" if c == "shared_chunk_frac" else
                         f"{v:.1f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="an engine sweep's runs directory")
    ap.add_argument("--rate", type=float, required=True,
                    help="a rate (req/s) the sweep probed at --seed (its traces/ directory)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", default="vllm-tuned,accelgen")
    ap.add_argument("--engine-cpus", default="1",
                    help="CPU ids of the engine core's thread(s), as VLLM_CPU_OMP_THREADS_BIND "
                         "takes them ('' : vLLM's choice)")
    ap.add_argument("--client-cpus", default="0",
                    help="comma-separated CPU ids of the API server and the client ('' : any)")
    ap.add_argument("--renice", type=int, metavar="N",
                    help="run the servers and the client at nice N in their own session")
    ap.add_argument("--out", type=Path, default=Path("results/serve-engine"))
    args = ap.parse_args(argv)
    from accelgen.engine_regime.run import rate_name, trace_path

    if not trace_path(args.runs, args.seed, args.rate).exists():
        probed = sorted(p.stem.split("-", 1)[1] for p in
                        (args.runs / "traces").glob(f"seed{args.seed}-rate*.parquet"))
        raise SystemExit(f"--rate {args.rate:g} ({rate_name(args.rate)}): no trace of seed "
                         f"{args.seed} in {args.runs / 'traces'}; probed: {', '.join(probed)}")
    client = {int(c) for c in args.client_cpus.split(",")} if args.client_cpus else None
    if args.renice is not None:
        from accelgen.cli.fidelity import raise_priority

        raise_priority(args.renice)
    rows = []
    for system in args.systems.split(","):
        row = serve_one(args.runs, system, args.seed, args.rate,
                        args.out / system, args.engine_cpus, client)
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "serve.csv", index=False)
    (args.out / "serve.md").write_text(markdown(df))
    print(markdown(df))
    print(f"serve_engine_point: {len(df)} servers; results in {args.out} (serve.csv, serve.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
