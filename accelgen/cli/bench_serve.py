"""``accelgen bench-serve``: replay a trace, or a random request set, against an
OpenAI-compatible server.

The requests: a trace file (``--trace``), or ``--dataset-name random`` (``--num-prompts``
requests with lengths from ``--random-input-len``, ``--random-output-len`` and
``--random-range-ratio``, as ``vllm bench serve`` makes them; ``accelgen.serving.datasets``).
SLOs: the trace's own, or drawn from a named class set (``--slo-classes``:
``workloads.slo_classes``); a random set without one, or ``--no-slos``, has none, sends none and
reports no attainment.

Sends every request at its arrival time (or at ``--request-rate``) as a streaming
completion with ``max_tokens`` = its output length, ``ignore_eos`` and its SLOs in
``vllm_xargs``, time-stamps every streamed token, and writes ``requests.parquet``,
``summary.json`` (the metrics of ``accelgen simulate``) and ``config.json`` to ``--out``;
``--save-result`` adds the result JSON of ``vllm bench serve`` (its keys and definitions, with
per-request SLO attainment beside them, per class too). ``--find-capacity`` searches the highest
request rate that meets ``--target`` attainment. Options shared with ``vllm bench serve`` are
spelt as there. The closing lines are short whatever the number of SLO classes (per-class
numbers are in ``summary.json`` and the result JSON). See ``accelgen.serving``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

DEFAULT_RESULT_FILENAME = "result.json"
MAX_LINE = 200  # characters of a line bench-serve prints
DATASETS = ("trace", "random")
# vLLM bench serve's defaults for its random dataset
DEFAULT_NUM_PROMPTS = 1000
RANDOM_DEFAULTS: dict[str, Any] = {"random_input_len": 1024, "random_output_len": 128,
                                   "random_range_ratio": 0.0}


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return value


def _request_rate(text: str) -> float:
    return _positive(text)


def _burstiness(text: str) -> float:
    value = _positive(text)
    if value == float("inf"):
        raise argparse.ArgumentTypeError("must be finite (the gamma shape of the gaps)")
    return value


def _comma_separated(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _percentile_metrics(text: str) -> list[str]:
    from accelgen.serving.report import PERCENTILE_METRICS

    names = _comma_separated(text)
    unknown = [n for n in names if n not in PERCENTILE_METRICS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown metrics {unknown}; known: {','.join(PERCENTILE_METRICS)}")
    return names


def _metric_percentiles(text: str) -> list[float]:
    try:
        return [float(w) for w in _comma_separated(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not numbers: {text!r}") from None


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    from accelgen.serving.report import GOODPUT_METRICS

    out: dict[str, float] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition(":")
        if not sep:
            raise ValueError(f"--goodput: {pair!r} is not KEY:MILLISECONDS")
        if key not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: unknown metric {key!r} (known: "
                             f"{', '.join(GOODPUT_METRICS)})")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {key}:{value!r} is not a number of "
                             "milliseconds") from None
        if not ms >= 0:
            raise ValueError(f"--goodput: {key} must be >= 0 ms, got {value}")
        out[key] = ms
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    from accelgen.cli.options import hidden_alias
    from accelgen.workloads.slo_classes import SLO_CLASS_SETS

    p = sub.add_parser("bench-serve", help="replay a trace or a random request set against an "
                       "OpenAI-compatible server", description=__doc__)
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", required=True, type=Path, help="results directory")
    p.add_argument("--model", help="model name to request (default: the server's first model)")
    p.add_argument("--prompt", choices=["tokens", "text"], default="tokens",
                   help="token-id prompts (exact lengths; the default) or text (about one token "
                        "per word, for servers that need text)")
    p.add_argument("--vocab-size", type=int, default=1024,
                   help="token-id prompts use ids in [3, VOCAB_SIZE) (default 1024: the tiny model)")
    p.add_argument("--label", default="server",
                   help="what the server runs (summary.json 'policy'), e.g. accelgen or stock")
    p.add_argument("--no-slos", action="store_true",
                   help="send no vllm_xargs (for servers other than vLLM) and judge nothing "
                        "against SLOs (no attainment reported)")
    p.add_argument("--req-id-offset", type=int, default=0,
                   help="added to every req_id sent, to replay a trace again on one server "
                        "(it refuses a req_id it has served; default 0)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS")
    data = p.add_argument_group("requests (as vllm bench serve)")
    data.add_argument("--dataset-name", choices=DATASETS,
                      help="trace: the --trace file (the default when --trace is given); random: "
                           "--num-prompts requests of random lengths")
    data.add_argument("--trace", type=Path, help="trace file (.parquet or .csv)")
    data.add_argument("--num-prompts", type=int,
                      help="random: how many requests (default 1000); trace: replay only the "
                           "first N")
    data.add_argument("--random-input-len", type=int,
                      help="random: mean prompt length in tokens (default 1024)")
    data.add_argument("--random-output-len", type=int,
                      help="random: mean output length in tokens (default 128)")
    data.add_argument("--random-range-ratio", type=float,
                      help="random: lengths uniform in [L x (1 - r), L x (1 + r)], 0 <= r < 1 "
                           "(default 0: every length L)")
    data.add_argument("--slo-classes", choices=list(SLO_CLASS_SETS),
                      help="SLOs drawn (--seed) from a named class set instead of the trace's; "
                           "a random set has none without it (docs/vllm.md)")
    hidden_alias(data, "--limit", "num_prompts")
    traffic = p.add_argument_group("traffic (as vllm bench serve)")
    traffic.add_argument("--request-rate", type=_request_rate, metavar="RATE",
                         help="requests per second, with new arrival times (inf: all at once); "
                              "default: the trace's own arrival times (random: inf)")
    traffic.add_argument("--burstiness", type=_burstiness, default=1.0,
                         help="gamma shape of the inter-arrival times at --request-rate (1: "
                              "Poisson; below 1 burstier)")
    traffic.add_argument("--seed", type=int, default=0,
                         help="seed of the arrival times at --request-rate, of the random "
                              "lengths and of the SLO classes (default 0)")
    traffic.add_argument("--max-concurrency", type=int, default=256,
                         help="most requests open at once; the others wait (default 256)")
    traffic.add_argument("--num-warmups", type=int, default=2,
                         help="short requests sent one at a time, not recorded, before the run "
                              "(default 2)")
    result = p.add_argument_group("result JSON (vllm bench serve's keys)")
    result.add_argument("--save-result", action="store_true",
                        help=f"write the result JSON (default {DEFAULT_RESULT_FILENAME} in --out)")
    result.add_argument("--save-detailed", action="store_true",
                        help="with per-request input_lens, output_lens, start_times, ttfts, "
                             "itls, errors")
    result.add_argument("--result-dir", type=Path, help="folder of the result JSON (--out)")
    result.add_argument("--result-filename", help="its name (default result.json)")
    result.add_argument("--percentile-metrics", type=_percentile_metrics,
                        default=["ttft", "tpot", "itl", "e2el"],
                        help="comma-separated: ttft,tpot,itl,e2el,client_queue_time,"
                             "e2el_including_client_queue (default ttft,tpot,itl,e2el)")
    result.add_argument("--metric-percentiles", type=_metric_percentiles, default=[99.0],
                        help="comma-separated percentiles, e.g. 50,90,99 (default 99)")
    result.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                        help="global thresholds in ms (ttft, tpot, e2el) for request_goodput, "
                             "vLLM's definition, beside the trace's per-request SLOs")
    cap = p.add_argument_group("capacity search")
    cap.add_argument("--find-capacity", action="store_true",
                     help="bisect the request rate for the highest one meeting --target")
    cap.add_argument("--target", type=float, default=0.9,
                     help="SLO attainment to meet (default 0.9)")
    cap.add_argument("--target-metric", default="slo_attainment_request",
                     choices=["slo_attainment_request", "ttft_attainment", "tbt_attainment",
                              "jct_attainment", "slo_attainment_distserve"],
                     help="the attainment that must reach --target (default: per-request SLOs)")
    cap.add_argument("--capacity-tolerance", type=float, default=0.1,
                     help="stop when the bracket's ends are within this fraction (default 0.1)")
    cap.add_argument("--max-probes", type=int, default=12,
                     help="most runs of the trace, the saturation run included (default 12)")
    p.set_defaults(func=run)


def bench_config(args: argparse.Namespace) -> Any:
    from accelgen.serving.bench import BenchConfig
    from accelgen.serving.report import ReportConfig

    report = ReportConfig(percentile_metrics=args.percentile_metrics,
                          metric_percentiles=args.metric_percentiles, goodput=parse_goodput(args.goodput))
    return BenchConfig(url=args.url, model=args.model, prompt=args.prompt,
                       vocab_size=args.vocab_size, send_slos=not args.no_slos,
                       req_id_offset=args.req_id_offset,
                       max_concurrency=args.max_concurrency,
                       request_timeout_s=args.request_timeout,
                       limit=args.num_prompts if args.dataset_name == "trace" else None,
                       label=args.label, num_warmups=args.num_warmups,
                       request_rate=args.request_rate, burstiness=args.burstiness,
                       seed=args.seed, report=report)


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ValueError("bench-serve needs aiohttp: pip install 'accelgen[serve]'") from None
    trace, classes, dataset = requests_of(args)
    cfg = bench_config(args)
    if not cfg.send_slos and args.find_capacity:
        raise ValueError("--find-capacity searches the rate that meets SLOs: give requests "
                         "SLOs (a trace without --no-slos, or --slo-classes)")
    if args.find_capacity:
        return _find_capacity(args, cfg, trace)
    if args.dataset_name == "random" and args.request_rate is None:
        cfg = cfg.model_copy(update={"request_rate": math.inf})  # vLLM's default
    from accelgen.results import outcome_counts
    from accelgen.serving.bench import bench_to_dir

    result_path = None
    if args.save_result or args.save_detailed:
        result_path = ((args.result_dir or args.out)
                       / (args.result_filename or DEFAULT_RESULT_FILENAME))
    out = bench_to_dir(trace, cfg, args.out, progress=not args.no_progress,
                       trace_path=None if args.trace is None else str(args.trace),
                       result_path=result_path, save_detailed=args.save_detailed,
                       slo_classes=classes, dataset=dataset)
    s, r = out["summary"], out["result"]
    print(_clip(f"{s['model']} at {s['url']}: {r['completed']} completed, {r['failed']} failed "
                f"in {r['duration']:.1f} s; {r['request_throughput']:.2f} req/s, "
                f"{r['output_throughput']:.1f} out tok/s"
                + (f", goodput {r['request_goodput']:.2f} req/s"
                   if r["request_goodput"] is not None else "")))
    print(_clip("  " + "; ".join(_medians(r))))
    if s["slo_attainment_request"] is not None:
        print(_attainment_line(s["slo_attainment_request"], s["slo_attainment_by_class"]))
    if result_path is None:
        wrote = "requests.parquet, summary.json"
    elif result_path.parent == args.out:
        wrote = f"requests.parquet, summary.json, {result_path.name}"
    else:
        wrote = f"requests.parquet, summary.json; {result_path}"
    print(f"bench-serve: wrote {args.out} ({wrote}): {outcome_counts(s)}")
    return 0


def requests_of(args: argparse.Namespace
                ) -> tuple[Any, dict[int, str] | None, dict[str, Any]]:
    """The request set of the options: (trace frame, SLO class name by req_id or None, how it
    was made); ``args.no_slos`` is set for a set without SLOs."""
    from accelgen.serving.datasets import random_dataset, with_slo_classes
    from accelgen.workloads.trace import load_trace

    name = args.dataset_name or ("trace" if args.trace is not None else None)
    if name is None:
        raise ValueError("give the requests: --trace FILE or --dataset-name random")
    args.dataset_name = name
    if name == "trace" and args.trace is None:
        raise ValueError("--dataset-name trace needs --trace FILE")
    if name == "random" and args.trace is not None:
        raise ValueError("--trace is a dataset of its own; leave out --dataset-name random")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    dataset: dict[str, Any] = {"name": name, "seed": args.seed,
                               "slo_classes": None if args.no_slos else args.slo_classes}
    given = [f"--{k.replace('_', '-')}" for k in RANDOM_DEFAULTS if getattr(args, k) is not None]
    if name == "trace":
        if given:
            raise ValueError(f"{', '.join(given)}: options of --dataset-name random, not of a "
                             "trace")
        trace = load_trace(args.trace)
        dataset["trace"] = str(args.trace)
    else:
        opts = {k: v if getattr(args, k) is None else getattr(args, k)
                for k, v in RANDOM_DEFAULTS.items()}
        n = args.num_prompts if args.num_prompts is not None else DEFAULT_NUM_PROMPTS
        trace = random_dataset(n, opts["random_input_len"], opts["random_output_len"],
                               opts["random_range_ratio"], args.seed)
        dataset.update(num_prompts=n, **opts)
        if args.slo_classes is None:
            args.no_slos = True  # nothing to send nor to judge
    classes = None
    if args.slo_classes is not None and not args.no_slos:
        trace, classes = with_slo_classes(trace, args.slo_classes, args.seed)
    return trace, classes, dataset


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."


def _attainment_line(overall: float, by_class: dict[str, dict[str, Any]]) -> str:
    """Overall attainment, and each class's while they fit one short line."""
    head = f"  SLO attainment request {_f(overall)}"
    parts = ", ".join(f"{k} {_f(v['slo_attainment'])} of {v['requests']}"
                      for k, v in by_class.items())
    line = f"{head} ({parts})"
    if len(line) <= MAX_LINE:
        return line
    return f"{head} ({len(by_class)} SLO classes: slo_attainment_by_class in summary.json)"


def _f(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _medians(r: dict[str, Any]) -> list[str]:
    out = []
    for m in ("ttft", "tpot", "itl", "e2el"):
        if r.get(f"median_{m}_ms") is not None:
            p = [k for k in r if k.startswith("p") and k.endswith(f"_{m}_ms")]
            tail = ", ".join(f"{k.split('_')[0]} {r[k]:.1f}" for k in p if r[k] is not None)
            out.append(f"{m.upper()} median {r[f'median_{m}_ms']:.1f} ms"
                       + (f" ({tail})" if tail else ""))
    return out


def _find_capacity(args: argparse.Namespace, cfg: Any, trace: Any) -> int:
    from accelgen.serving.capacity import CapacityConfig, find_capacity

    if args.request_rate is not None:
        raise ValueError("--find-capacity chooses the request rates itself; leave out "
                         "--request-rate")
    cap = CapacityConfig(target=args.target, metric=args.target_metric,
                         tolerance=args.capacity_tolerance, max_probes=args.max_probes)

    def show(row: dict[str, Any]) -> None:
        print(f"  rate {row['request_rate']}: {cap.metric} {_f(row[cap.metric])} "
              f"({'meets' if row['meets_target'] else 'misses'} {cap.target}), "
              f"{row['request_throughput']:.2f} req/s served, {row['completed']} completed, "
              f"{row['failed']} failed", flush=True)

    res = find_capacity(trace, cfg, cap, args.out, progress=not args.no_progress, on_probe=show)
    b = res["bracket"]
    print(f"bench-serve --find-capacity: wrote {args.out} (capacity.json, "
          f"{res['num_probes']} probes): {cap.metric} >= {cap.target} up to "
          f"{_show_rate(b['meets'])} req/s, missed at {_show_rate(b['misses'])} req/s"
          + ("" if res["bracketed"] else " (not bracketed: see capacity.json)"))
    return 0


def _show_rate(rate: Any) -> str:
    return "none" if rate is None else (rate if isinstance(rate, str) else f"{rate:.2f}")
