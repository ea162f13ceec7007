"""Print, one per line, the `uv pip install` options that give uv the package sources pip is
configured with here: index URL, extra index URLs, wheel directories (find-links) and constraint
files, from `pip config list` (files) and the PIP_* environment variables, which win over the
files as they do for pip; a configured certificate bundle makes uv use the system's certificate
store (where such bundles are installed). Also: every index searched for the best version (pip's rule; uv by
default stops at the first index that has the package) and byte-compilation (pip's default).

Run with the venv's Python (its pip is asked): `.venv/bin/python scripts/uv_pip_args.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

# pip option -> (uv option, takes a list)
OPTIONS = {
    "index-url": ("--index-url", False),
    "extra-index-url": ("--extra-index-url", True),
    "find-links": ("--find-links", True),
    "constraint": ("--constraint", True),
}
CERT = "cert"
LINE = re.compile(r"^(?P<scope>[^.]*)\.(?P<key>[a-z-]+)='(?P<value>.*)'$")


def pip_config() -> dict[str, list[str]]:
    """What `pip config list` of this Python says, with ``parse_pip_config``."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    return parse_pip_config(out, os.environ.get("PIP_CONSTRAINT", ""))


def parse_pip_config(listing: str, pip_constraint: str = "") -> dict[str, list[str]]:
    """pip's configured values per option name from `pip config list` output: the
    environment's (``:env:``) where set, else the files' (a later file wins for a single value,
    list values are joined); ``pip_constraint``: PIP_CONSTRAINT, which the listing leaves out."""
    files: dict[str, list[str]] = {}
    env: dict[str, list[str]] = {}
    for line in listing.splitlines():
        m = LINE.match(line.strip())
        if m is None or m["key"] not in (*OPTIONS, CERT) or m["scope"] not in (":env:", "global",
                                                                                 "install"):
            continue
        target = env if m["scope"] == ":env:" else files
        values = m["value"].split()
        if m["key"] in OPTIONS and OPTIONS[m["key"]][1]:
            known = target.setdefault(m["key"], [])
            known.extend(v for v in values if v not in known)
        else:
            target[m["key"]] = values[-1:]
    if pip_constraint:
        env["constraint"] = pip_constraint.split()
    return {**files, **env}


def uv_args(config: dict[str, list[str]]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    if config.get(CERT):
        args.append("--native-tls")
    for key, (flag, _) in OPTIONS.items():
        for value in config.get(key, []):
            args += [flag, value]
    return args


if __name__ == "__main__":
    print("\n".join(uv_args(pip_config())))
