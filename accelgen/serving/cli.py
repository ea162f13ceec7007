"""``accelgen bench-serve``: replay a trace against an OpenAI-compatible server.

Sends every request of the trace at its arrival time as a streaming completion with
``max_tokens`` = its output length, ``ignore_eos`` and its SLOs in ``vllm_xargs``, time-stamps
every streamed token, and writes ``requests.parquet``, ``summary.json`` (the metrics of
``accelgen simulate``) and ``config.json`` to ``--out``. See ``accelgen.serving.bench``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-serve", help="replay a trace against an OpenAI-compatible server",
                       description=__doc__)
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--trace", required=True, type=Path, help="trace file (.parquet or .csv)")
    p.add_argument("--out", required=True, type=Path, help="results directory")
    p.add_argument("--model", help="model name to request (default: the server's first model)")
    p.add_argument("--prompt", choices=["tokens", "text"], default="tokens",
                   help="token-id prompts (exact lengths; the default) or text (about one token "
                        "per word, for servers that need text)")
    p.add_argument("--vocab-size", type=int, default=1024,
                   help="token-id prompts use ids in [3, VOCAB_SIZE) (default 1024: the tiny model)")
    p.add_argument("--max-concurrency", type=int, default=256,
                   help="most requests open at once (default 256)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS")
    p.add_argument("--limit", type=int, help="replay only the first N requests")
    p.add_argument("--label", default="server",
                   help="what the server runs (summary.json 'policy'), e.g. accelgen or stock")
    p.add_argument("--warmup", type=int, default=2,
                   help="short requests sent (one at a time, not recorded) before the run "
                        "(default 2)")
    p.add_argument("--no-slos", action="store_true",
                   help="send no vllm_xargs (for servers other than vLLM)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ValueError("bench-serve needs aiohttp: pip install 'accelgen[serve]'") from None
    from accelgen.results import outcome_counts
    from accelgen.serving.bench import BenchConfig, bench_to_dir
    from accelgen.workloads.trace import load_trace

    cfg = BenchConfig(url=args.url, model=args.model, prompt=args.prompt,
                      vocab_size=args.vocab_size, send_slos=not args.no_slos,
                      max_concurrency=args.max_concurrency,
                      request_timeout_s=args.request_timeout, limit=args.limit, label=args.label,
                      warmup=args.warmup)
    trace = load_trace(args.trace)
    out = bench_to_dir(trace, cfg, args.out, progress=not args.no_progress,
                       trace_path=str(args.trace))
    s = out["summary"]
    print(f"{s['model']} at {s['url']}")
    print(f"  throughput {s['throughput_output_tps']:.1f} out tok/s, {s['throughput_rps']:.2f} "
          f"req/s; SLO attainment request {s['slo_attainment_request']:.3f}, iteration "
          f"{s['slo_attainment_iteration']:.3f}; TTFT p50 {s['ttft_p50'] * 1e3:.0f} ms, p99 "
          f"{s['ttft_p99'] * 1e3:.0f} ms; TBT p50 {s['tbt_p50'] * 1e3:.1f} ms, p99 "
          f"{s['tbt_p99'] * 1e3:.1f} ms")
    print(f"  results: {args.out} ({outcome_counts(s)})")
    return 0
