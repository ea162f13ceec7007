"""``accelgen trace``: generate a workload trace file and print its summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from accelgen.workloads.build import build_trace
from accelgen.workloads.latency import resolve_latency_reference
from accelgen.workloads.summary import summarize
from accelgen.workloads.trace import write_trace
from accelgen.workloads.workload_spec import WorkloadConfig

FORMATS = ("synthetic", "alpaca", "sharegpt", "bookcorpus", "vidur_csv", "azure_csv")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "trace", help="generate a workload trace (Parquet) and print its summary",
        description="Generate a workload trace from the `workload` section of a config file "
                    "(or from a real-format input file) and print a summary.")
    p.add_argument("--config", type=Path, default=None,
                   help="YAML with a `workload` section (default: the built-in quick workload)")
    p.add_argument("--key", default="workload", help="top-level key to read (default: workload)")
    p.add_argument("--out", type=Path, required=True, help="trace file to write (.parquet)")
    p.add_argument("--csv", action="store_true", help="also write the rows as CSV beside --out")
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--arrival", choices=("poisson", "gamma", "replay"), default=None,
                   help="arrival process (replay: the input file's timestamps)")
    p.add_argument("--rate", type=float, default=None, help="arrival rate lambda (req/s)")
    p.add_argument("--cv", type=float, default=None, help="gamma arrivals: CV of the gaps")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + output fit in this many tokens (prompts are truncated); default: "
                        "the config's workload.max_model_len, else --deployment's, else 8192")
    p.add_argument("--tokenizer", default=None, help="gpt2 | opt | hf:<name> (text formats)")
    p.add_argument("--input", type=Path, default=None, help="a real-format file to sample from")
    p.add_argument("--format", choices=FORMATS[1:], default=None, help="format of --input")
    p.add_argument("--all-records", action="store_true",
                   help="with --input: every record once, in file order (sampling sequential)")
    p.add_argument("--deployment", default=None,
                   help="named deployment of the cost model for TTFT SLOs (e.g. opt-175b: its "
                        "TP/PP layout); overrides --model/--hardware")
    p.add_argument("--model", default="opt-13b", help="model for TTFT SLOs (one device)")
    p.add_argument("--hardware", default="a100", help="hardware for TTFT SLOs")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree for TTFT SLOs")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree for TTFT SLOs")
    p.add_argument("--profile-csv", type=Path, default=None,
                   help="TTFT SLOs from a measured profile table (`accelgen profile`) of the "
                        "deployment instead of the analytic model of --model/--hardware")
    p.add_argument("--quiet", action="store_true", help="print only where the file went")
    p.set_defaults(func=run)
    return p


def resolve_config(args: argparse.Namespace) -> WorkloadConfig:
    cfg = (WorkloadConfig.from_yaml(args.config, key=args.key) if args.config is not None
           else WorkloadConfig())
    changes: dict[str, Any] = {}
    if (args.input is None) != (args.format is None):
        raise ValueError("--input and --format go together")
    if args.input is not None:
        changes.update(kind=args.format, path=args.input, hf_dataset=None, sources={})
        if args.all_records:
            changes.update(sampling="sequential", num_requests=None)
    elif args.all_records:
        raise ValueError("--all-records needs --input")
    for key in ("num_requests", "seed", "max_model_len", "tokenizer"):
        value = getattr(args, key)
        if value is not None:
            changes[key] = value
    if (args.max_model_len is None and args.deployment is not None
            and "max_model_len" not in cfg.model_fields_set):
        # The trace is for this deployment: its prompts must fit the deployment's context.
        changes["max_model_len"] = deployment_max_model_len(args.deployment)
    arrival = {key: getattr(args, name) for key, name in
               (("kind", "arrival"), ("rate", "rate"), ("cv", "cv"))
               if getattr(args, name) is not None}
    if arrival:
        changes["arrival"] = {**cfg.arrival.model_dump(), **arrival}
    return cfg.updated(**changes) if changes else cfg


def deployment_max_model_len(name: str) -> int:
    """A named deployment's max_model_len (its own, else its model's)."""
    from accelgen.costmodel.factory import effective_max_model_len, resolve_deployment

    return effective_max_model_len(resolve_deployment(name))


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    reference = resolve_latency_reference(args.model, args.hardware, args.deployment,
                                          tp=args.tp, pp=args.pp, profile_csv=args.profile_csv)
    trace = build_trace(cfg, reference=reference)
    written = write_trace(trace.df, trace.meta, args.out, csv=args.csv)
    if not args.quiet:
        print(summarize(trace.df, trace.meta))
        print()
    for path in written:
        print(f"wrote {path}")
    return 0
