"""Golden runs: a fixed set of simulations whose results files prove a refactor or a speed-up
changes nothing.

    .venv/bin/python scripts/golden_runs.py record /tmp/golden/before      # on the old build
    .venv/bin/python scripts/golden_runs.py record /tmp/golden/after       # on the new build
    .venv/bin/python scripts/golden_runs.py compare /tmp/golden/before /tmp/golden/after

``record`` builds the traces and runs every simulation through the command line (``accelgen
trace``, ``accelgen simulate``, ``accelgen oracle``), the interface that stays put while the
package's insides move, each in a fresh process. ``compare`` checks ``requests.parquet``,
``iterations.parquet`` and ``summary.json`` of every run byte for byte (``cmp`` semantics) and
prints one line per run; it exits non-zero if any file differs or is missing. With
``--ignore-summary-keys num_cut,num_unfinished`` it compares ``summary.json`` as JSON without
those keys (summary fields a change added on purpose), every other file still byte for byte.

The set: the quick workload (OPT-13B, overloaded at 8 req/s and moderate at 0.2 req/s), the
Llama-3-70B deployment (large KV), a BookCorpus-heavy mix with a 16K context, and the ERA scenario
of paper figure 6 (two 10K-token prompts among 20 short ones); on them AccelGen with its default
parameters, each ablation, the ``model`` budget rule, ERA off and per request, the Oracle's
search, and every baseline. ``--only SUBSTRING`` keeps the runs whose name contains it;
``--jobs N`` runs N simulations at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import filecmp
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("requests.parquet", "iterations.parquet", "summary.json")

# The two 10K-token prompts of paper figure 6 and 20 short ones, arrivals 0.05 s apart.
_ERA_PROMPTS = [10214, 10252, 128, 384, 200, 256, 300, 150, 170, 333, 222, 140, 380, 260, 190,
                310, 135, 275, 240, 350, 160, 290]
_ERA_OUTPUTS = [64, 64, 40, 90, 12, 75, 33, 128, 64, 20, 48, 100, 16, 80, 55, 27, 120, 36, 70, 44,
                18, 95]

# OPT-13B's shapes with a 16K context (the pipeline's `opt-13b-16k`).
_OPT13B_16K = """deployment: {model: opt-13b, hardware: a100, kv_cache_gb: 12.0, max_model_len: 16384}
"""

_LONG_MIX = """workload:
  kind: synthetic
  num_requests: 80
  seed: 3
  max_model_len: 16383
  max_tokens: 512
  mix: {alpaca: 0.15, sharegpt: 0.15, bookcorpus: 0.70}
  arrival: {kind: poisson, rate: 0.5}
"""


@dataclass(frozen=True)
class Trace:
    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    name: str
    trace: str
    deployment: str
    policy: str
    params: tuple[str, ...] = ()
    oracle_grid: str | None = None  # JSON grid: run `accelgen oracle` (the search) instead
    extra: tuple[str, ...] = field(default=())


def traces(tmp: Path) -> list[Trace]:
    quick = str(ROOT / "config" / "quick.yaml")
    era_csv = tmp / "era.csv"
    long_yaml = tmp / "long_mix.yaml"
    return [
        Trace("quick-8rps", ("--config", quick, "--num-requests", "200", "--seed", "0",
                             "--deployment", "opt-13b", "--max-model-len", "8191")),
        Trace("quick-0.2rps", ("--config", quick, "--num-requests", "120", "--seed", "1",
                               "--rate", "0.2", "--deployment", "opt-13b",
                               "--max-model-len", "8191")),
        Trace("llama70b", ("--config", quick, "--num-requests", "120", "--seed", "2",
                           "--rate", "2", "--deployment", "llama-3-70b",
                           "--max-model-len", "131071")),
        Trace("long-mix", ("--config", str(long_yaml), "--deployment", "opt-13b")),
        Trace("era", ("--input", str(era_csv), "--format", "vidur_csv", "--arrival", "replay",
                      "--all-records", "--deployment", "opt-13b", "--max-model-len", "16383")),
    ]


def runs() -> list[Run]:
    out: list[Run] = []
    baselines = ("vllm", "vllm-v0", "sarathi", "fastgen", "orca", "fastserve", "edf",
                 "sarathi-slack")
    # The AccelGen and Oracle runs were recorded when `paper` was the default budget rule and
    # name it, so they still prove that rule decides as before; "budget-batch" is the default.
    paper = ("budget_rule=paper",)
    accel = [("accelgen", "accelgen", paper), ("no-order", "accelgen/order", paper),
             ("no-chunk", "accelgen/chunk", paper), ("no-batch", "accelgen/batch", paper),
             ("budget-model", "accelgen", ("budget_rule=model",)),
             ("no-era", "accelgen", ("era=false", *paper)),
             ("era-request", "accelgen", ("era_scope=request", *paper)),
             ("gamma0", "accelgen", ("gamma=0", *paper)),
             ("budget-batch", "accelgen", ())]
    grid = json.dumps({"kv_plan": ["exact", "none"], "gamma": [0.75, 0.25]})
    for trace, dep in (("quick-8rps", "opt-13b"), ("quick-0.2rps", "opt-13b")):
        for label, pol, params in accel:
            out.append(Run(f"{trace}/{label}", trace, dep, pol, params))
        out.append(Run(f"{trace}/oracle", trace, dep, "oracle", paper))
        out.append(Run(f"{trace}/oracle-search", trace, dep, "oracle", paper, oracle_grid=grid))
        for pol in baselines:
            out.append(Run(f"{trace}/{pol}", trace, dep, pol))
    for label, pol, params in accel[:1] + accel[4:7] + accel[8:]:
        out.append(Run(f"llama70b/{label}", "llama70b", "llama-3-70b", pol, params))
    out.append(Run("llama70b/vllm", "llama70b", "llama-3-70b", "vllm"))
    out.append(Run("llama70b/sarathi", "llama70b", "llama-3-70b", "sarathi"))
    for trace in ("long-mix", "era"):
        for label, pol, params in accel[:3] + accel[5:7] + accel[8:]:
            out.append(Run(f"{trace}/{label}", trace, "opt-13b-16k", pol, params))
        out.append(Run(f"{trace}/sarathi", trace, "opt-13b-16k", "sarathi"))
        out.append(Run(f"{trace}/vllm", trace, "opt-13b-16k", "vllm"))
    return out


def _accelgen(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelgen.cli", *args]


def _run_cmd(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc != 0:
        raise RuntimeError(f"command failed (rc {rc}, log {log}): {' '.join(cmd)}")
    return time.perf_counter() - t0


def record(out: Path, only: str | None, jobs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "_inputs"
    tmp.mkdir(exist_ok=True)
    (tmp / "long_mix.yaml").write_text(_LONG_MIX)
    (tmp / "opt-13b-16k.yaml").write_text(_OPT13B_16K)
    (tmp / "era.csv").write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + "".join(
        f"{p},{o},{i * 0.05:.2f}\n" for i, (p, o) in enumerate(zip(_ERA_PROMPTS, _ERA_OUTPUTS,
                                                                   strict=True))))
    selected = [r for r in runs() if only is None or only in r.name]
    needed = {r.trace for r in selected}
    for t in traces(tmp):
        if t.name not in needed:
            continue
        path = out / "traces" / f"{t.name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        _run_cmd(_accelgen("trace", *t.args, "--out", str(path), "--quiet"),
                 out / "traces" / f"{t.name}.log")
        print(f"trace {t.name}: {path}", flush=True)

    def one(r: Run) -> tuple[str, float]:
        res = out / r.name
        res.parent.mkdir(parents=True, exist_ok=True)
        trace = str(out / "traces" / f"{r.trace}.parquet")
        dep = (["--config", str(tmp / f"{r.deployment}.yaml")] if r.deployment == "opt-13b-16k"
               else ["--deployment", r.deployment])
        if r.oracle_grid is not None:
            cmd = _accelgen("oracle", "--trace", trace, *dep, "--seed", "0",
                            "--grid", r.oracle_grid, "--out", str(res))
            for p in r.params:
                cmd += ["--param", p]
        else:
            cmd = _accelgen("simulate", "--trace", trace, *dep, "--policy", r.policy,
                            "--seed", "0", "--no-progress", "--out", str(res))
            for p in r.params:
                cmd += ["--param", p]
        return r.name, _run_cmd(cmd + list(r.extra), res.with_name(res.name + ".log"))

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for name, secs in pool.map(one, selected):
            print(f"{name}: {secs:.1f} s", flush=True)
    print(f"golden_runs: recorded {len(selected)} runs in {out} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0


def _same(fa: Path, fb: Path, ignore_keys: frozenset[str]) -> bool:
    if fa.name != "summary.json" or not ignore_keys:
        return filecmp.cmp(fa, fb, shallow=False)
    # Parsed JSON compares values exactly (the writer prints every float in full).
    sa, sb = json.loads(fa.read_text()), json.loads(fb.read_text())
    return ({k: v for k, v in sa.items() if k not in ignore_keys}
            == {k: v for k, v in sb.items() if k not in ignore_keys})


def compare(a: Path, b: Path, only: str | None, ignore_keys: frozenset[str] = frozenset()) -> int:
    same = differ = missing = 0
    if ignore_keys:
        print(f"summary.json compared without: {', '.join(sorted(ignore_keys))}")
    for r in runs():
        if only is not None and only not in r.name:
            continue
        bad: list[str] = []
        for f in FILES:
            fa, fb = a / r.name / f, b / r.name / f
            if not (fa.exists() and fb.exists()):
                bad.append(f"{f} missing in {'a' if not fa.exists() else 'b'}")
            elif not _same(fa, fb, ignore_keys):
                bad.append(f"{f} differs")
        if not bad:
            same += 1
            print(f"same    {r.name}")
        else:
            miss = all("missing" in x for x in bad)
            missing += miss
            differ += not miss
            print(f"{'MISSING' if miss else 'DIFFERS'} {r.name}: {', '.join(bad)}")
    print(f"golden_runs: {same} identical, {differ} differ, {missing} missing ({a} vs {b})")
    return 0 if differ == 0 and missing == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="build the traces and run every golden simulation")
    rec.add_argument("out", type=Path)
    rec.add_argument("--only", help="runs whose name contains this")
    rec.add_argument("--jobs", type=int, default=1)
    cmp_ = sub.add_parser("compare", help="compare two recorded sets byte for byte")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    cmp_.add_argument("--only", help="runs whose name contains this")
    cmp_.add_argument("--ignore-summary-keys", default="", metavar="KEY,KEY",
                      help="compare summary.json as JSON without these keys (new fields)")
    sub.add_parser("list", help="print the runs")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        os.environ.setdefault("PYTHONHASHSEED", "0")
        return record(args.out, args.only, args.jobs)
    if args.cmd == "compare":
        keys = frozenset(k.strip() for k in args.ignore_summary_keys.split(",") if k.strip())
        return compare(args.a, args.b, args.only, keys)
    for r in runs():
        print(r.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
