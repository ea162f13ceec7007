"""``accelgen download``: fetch the paper's datasets (Alpaca, ShareGPT, BookCorpus) into data/raw/.

Only `workload.kind: datasets` (the paper's 20K mix from the real files) needs them; the default
workload is the built-in mix and downloads nothing. Each file is fetched resumably (an interrupted
download continues where it stopped) and atomically (the file appears only when complete), and its
size and sha256 are recorded in data/raw/SHA256SUMS on first download and checked on every later
run; `download.datasets.<name>.sha256` in a config pins it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from accelgen.workloads.datasets import CATALOGUE, DownloadConfig, describe


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "download", help="fetch the Alpaca, ShareGPT and BookCorpus files into data/raw/",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="What is fetched by default (URLs can be changed in the config's `download:` "
               "section or with --url):\n\n" + describe())
    p.add_argument("--config", type=Path,
                   help="experiment YAML whose `download:` section says the URLs and directory "
                        "(default: the public sources below, into data/raw)")
    p.add_argument("--spec", help="the `download:` section as JSON (the pipeline's rule)")
    p.add_argument("--dir", type=Path, help="download directory (default: data/raw)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"only these datasets ({', '.join(CATALOGUE)}; repeat or comma-separate)")
    p.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                   help="fetch NAME from URL (a mirror)")
    p.add_argument("--force", action="store_true",
                   help="fetch again even if present; the file is replaced only if the new bytes "
                        "match the recorded (or pinned) sha256")
    p.add_argument("--list", action="store_true",
                   help="print what would be fetched, and where, and exit (no network)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def resolve_config(args: argparse.Namespace) -> DownloadConfig:
    from accelgen.core.specs import load_yaml

    data: dict[str, Any] = {}
    if args.config is not None:
        section = load_yaml(args.config).get("download") or {}
        if not isinstance(section, dict):
            raise ValueError(f"{args.config}: `download` must be a mapping")
        data = dict(section)
    if args.spec is not None:
        data = json.loads(args.spec)
    if args.dir is not None:
        data["dir"] = str(args.dir)
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep or not url:
            raise ValueError(f"--url {item!r}: expected NAME=URL")
        data.setdefault("datasets", {}).setdefault(name, {})["url"] = url
    return DownloadConfig.model_validate(data)


def _names(args: argparse.Namespace) -> list[str] | None:
    if not args.only:
        return None
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown:
        raise ValueError(f"--only: unknown dataset(s) {', '.join(unknown)}; known: "
                         f"{', '.join(CATALOGUE)}")
    return names


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from accelgen.workloads.download import ensure

    try:
        cfg = resolve_config(args)
    except ValidationError as exc:
        raise ValueError(f"invalid download config: {exc}") from None
    names = _names(args)
    if args.list:
        for name in names or list(cfg.datasets):
            src = cfg.datasets[name]
            pin = f" (sha256 pinned: {src.sha256})" if src.sha256 else ""
            print(f"{name}: {src.url} -> {cfg.path(name)}{pin}")
        return 0
    done = ensure(cfg, names, force=args.force, progress=not args.no_progress)
    for o in done:
        print(f"{o.name}: {o.action} {o.path} ({o.record.size:,} bytes, sha256 "
              f"{o.record.sha256[:16]}...)")
    counts = {a: sum(o.action == a for o in done) for a in ("downloaded", "verified", "recorded")}
    total = sum(o.record.size for o in done)
    print(f"download: {len(done)} files in {cfg.dir} ("
          + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
          + f"; {total / 1e6:,.1f} MB), checksums in {cfg.dir / 'SHA256SUMS'}")
    return 0
