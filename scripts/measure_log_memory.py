"""The plugin's memory over a long run with ``log_dir`` (what a server's engine core holds).

An ``AccelGenScheduler`` on vLLM's scheduler without a model (``vllm_integration.harness``)
serves ``--requests`` requests, ``--concurrency`` at a time, with its logs in a temporary
directory written every ``--flush-every`` steps (what ``--log-flush-interval`` does in a server).
At each tenth of the run it reads the process's RSS, the number of objects the garbage collector
tracks, and the records the scheduler holds (ended requests, iterations). With
``--keep-logged-records`` the scheduler keeps what its log wrote (as a replay does); by default
it forgets it, as a server does. Prints one line per checkpoint and a closing line with the
growth from the first checkpoint (after the warm-up) to the peak.

    flock /work/notes/heavy.lock env PYTHONPATH=$PWD .venv/bin/python \
        scripts/measure_log_memory.py --requests 20000
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--flush-every", type=int, default=200, help="steps between log writes")
    ap.add_argument("--keep-logged-records", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the checkpoints here")
    args = ap.parse_args(argv)
    if min(args.requests, args.concurrency, args.output_len, args.flush_every) < 1:
        ap.error("--requests, --concurrency, --output-len and --flush-every must be >= 1")

    from accelgen.vllm_integration.harness import make_request, make_scheduler, step
    from accelgen.vllm_integration.logsink import read_log
    from accelgen.vllm_integration.scheduler import AccelGenScheduler

    with tempfile.TemporaryDirectory(prefix="accelgen-logmem-") as tmp:
        logs = Path(tmp) / "logs"
        blocks = args.concurrency * ((args.prompt_len + args.output_len) // 32 + 2)
        s = make_scheduler(AccelGenScheduler, num_blocks=blocks,
                           max_num_seqs=args.concurrency,
                           accelgen={"log_dir": str(logs), "log_flush_interval_s": 3600.0,
                                     "keep_logged_records": args.keep_logged_records,
                                     "s_pf": 256},
                           model_dir=Path(tmp) / "model")
        sent = steps = 0
        marks = [args.requests * k // 10 for k in range(1, 11)]
        rows: list[dict[str, float]] = []
        while True:
            ended = s.forgotten.requests + len(s.done)
            if marks and ended >= marks[0]:
                marks.pop(0)
                gc.collect()
                rows.append({"ended": ended, "steps": steps, "rss_mib": rss_kib() / 1024,
                             "gc_objects": len(gc.get_objects()), "held_requests": len(s.done),
                             "held_iterations": len(s.log)})
                r = rows[-1]
                print(f"{r['ended']:>7} ended {r['steps']:>7} steps  RSS {r['rss_mib']:7.1f} MiB"
                      f"  gc objects {r['gc_objects']:>9}  held: {r['held_requests']} requests,"
                      f" {r['held_iterations']} iterations", flush=True)
            if not marks:
                break
            while sent < args.requests and len(s.tracked) < args.concurrency:
                s.add_request(make_request(f"r{sent}", args.prompt_len, args.output_len,
                                           extra_args={"req_id": sent}))
                sent += 1
            step(s)
            steps += 1
            if steps % args.flush_every == 0:
                s.log_sink.flush()
        s.shutdown()
        logged = len(read_log(logs / "requests.parquet"))
    base = rows[0]
    peak = max(r["rss_mib"] for r in rows)
    mode = "kept" if args.keep_logged_records else "forgotten once written"
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "checkpoints": rows}, indent=2) + "\n")
    print(f"measure_log_memory: {args.requests} requests ({logged} logged), {steps} steps, "
          f"records {mode}: RSS {base['rss_mib']:.1f} MiB after the first tenth, peak "
          f"{peak:.1f} MiB (+{100 * (peak / base['rss_mib'] - 1):.1f} %), gc objects "
          f"{base['gc_objects']} -> {rows[-1]['gc_objects']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
