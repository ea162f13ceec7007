"""``python -m accelgen.pipeline COMMAND``: the small steps the Snakemake rules run.

    write-yaml  --spec JSON --out FILE        a YAML file from a JSON mapping (workload, deployment)
    scenario    --spec JSON --out FILE.csv    a hand-built scenario trace (figures 2 and 6)
    aggregate   --spec JSON --out FILE.csv    a figure's CSV from its results directories
    schema      [--out config/schema.json]    the JSON schema of the pipeline config
    check       CONFIG.yaml                   validate a config and print the grid's size
    estimate    CONFIG.yaml --benchmarks DIR  jobs of a config and a runtime estimate
    headline-md HEADLINE.csv                  the paper's headline numbers beside ours (Markdown)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml


def _atomic_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cmd_write_yaml(args: argparse.Namespace) -> int:
    data = json.loads(args.spec)
    _atomic_text(args.out, "# written by the pipeline (accelgen.pipeline); do not edit\n"
                 + yaml.safe_dump(data, sort_keys=True, default_flow_style=False))
    print(f"wrote {args.out}")
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from accelgen.pipeline.scenarios import write_scenario

    write_scenario(json.loads(args.spec), args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from accelgen.pipeline.aggregate import aggregate, write_csv

    spec = json.loads(args.spec) if not args.spec.startswith("@") else \
        json.loads(Path(args.spec[1:]).read_text())
    df = aggregate(spec)
    write_csv(df, args.out)
    print(f"{spec['figure']}: {len(df)} rows from {len(spec.get('runs', []))} runs -> {args.out}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from accelgen.pipeline.config import json_schema_text

    text = json_schema_text()
    if args.out is None:
        sys.stdout.write(text)
    else:
        _atomic_text(args.out, text)
        print(f"wrote {args.out}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from accelgen.pipeline.config import load_file
    from accelgen.pipeline.grid import Grid

    grid = Grid(load_file(args.config))
    print(f"{args.config}: valid; {len(grid.traces())} traces, {len(grid.runs())} runs, "
          f"{len(grid.figures)} figures in {grid.figures_dir}/")
    return 0


def cmd_headline_md(args: argparse.Namespace) -> int:
    import math

    import pandas as pd

    df = pd.read_csv(args.csv)

    def fmt(x: float) -> str:
        if isinstance(x, float) and math.isnan(x):
            return "n/a"
        return "inf" if math.isinf(x) else f"{x:.3g}"

    print("| claim | paper | ours (min - max) | pairs |")
    print("|---|---|---|---|")
    for r in df.itertuples():
        rng = f"{fmt(r.ours_min)} - {fmt(r.ours_max)}"
        if math.isinf(r.ours_max) and not math.isnan(r.ours_finite_max):
            rng += f" (largest finite {fmt(r.ours_finite_max)})"
        print(f"| {r.description} | {r.paper} | {rng} | {r.n_pairs} |")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from accelgen.pipeline.estimate import estimate

    print(estimate(args.config, args.benchmarks, cores=args.cores, alpha=args.alpha,
                   measured_config=args.measured_config))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelgen.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("write-yaml")
    s.add_argument("--spec", required=True)
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=cmd_write_yaml)
    s = sub.add_parser("scenario")
    s.add_argument("--spec", required=True)
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=cmd_scenario)
    s = sub.add_parser("aggregate")
    s.add_argument("--spec", required=True, help="JSON, or @FILE")
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=cmd_aggregate)
    s = sub.add_parser("schema")
    s.add_argument("--out", type=Path)
    s.set_defaults(func=cmd_schema)
    s = sub.add_parser("check")
    s.add_argument("config", type=Path)
    s.set_defaults(func=cmd_check)
    s = sub.add_parser("headline-md", help="headline.csv as a Markdown table")
    s.add_argument("csv", type=Path)
    s.set_defaults(func=cmd_headline_md)
    s = sub.add_parser("estimate")
    s.add_argument("config", type=Path)
    s.add_argument("--benchmarks", type=Path, required=True,
                   help="benchmarks/<name> of a finished run (per-job times)")
    s.add_argument("--measured-config", type=Path,
                   help="config of the measured run (default: config/<benchmarks dir name>.yaml)")
    s.add_argument("--cores", type=int, default=2)
    s.add_argument("--alpha", type=float, default=1.0,
                   help="time ~ requests^alpha (1: linear; >1: superlinear schedulers)")
    s.set_defaults(func=cmd_estimate)
    args = p.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"accelgen.pipeline {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
