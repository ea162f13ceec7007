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
    """pip's configured values per option name: the environment's (``:env:``) where set, else
    the files' (later files win for a single value, list values are joined)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    files: dict[str, list[str]] = {}
    env: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = LINE.match(line.strip())
        if m is None or m["key"] not in (*OPTIONS, CERT) or m["scope"] not in (":env:", "global",
                                                                        "install"):
            continue
        target = env if m["scope"] == ":env:" else files
        values = m["value"].split()
        if m["key"] in OPTIONS and OPTIONS[m["key"]][1]:
            target.setdefault(m["key"], []).extend(v for v in values
                                                   if v not in target.get(m["key"], []))
        else:
            target[m["key"]] = values[-1:]
    # pip config list shows PIP_* only under its own names; PIP_CONSTRAINT is read here too.
    if os.environ.get("PIP_CONSTRAINT"):
        env["constraint"] = os.environ["PIP_CONSTRAINT"].split()
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
