"""docs/accelgen.md names the code it describes: every ``module.name`` and ``module: name`` of the
AccelGen package it cites exists (a renamed or removed function fails here)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "accelgen" / "policies" / "accelgen"


def cited() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "accelgen.md").read_text()
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    refs = set()
    for code in re.findall(r"`([^`]+)`", text):
        m = re.fullmatch(r"(\w+)(?:\.|: )([\w.]+)(?:\(.*\))?", code)
        if m and m.group(1) in modules and m.group(2) != "py":  # (`module.py`: a file)
            refs.add((m.group(1), m.group(2)))
    for row in re.findall(r"\| `(\w+): ([\w.]+)`((?:, `\w+`)*)", text):  # the steps table
        refs |= {(row[0], name) for name in [row[1], *re.findall(r"`(\w+)`", row[2])]}
    return refs


def test_every_cited_function_exists():
    refs = cited()
    assert len(refs) > 40, refs
    missing = []
    for module, name in sorted(refs):
        obj = importlib.import_module(f"accelgen.policies.accelgen.{module}")
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(f"{module}.{name}")
    assert not missing, f"docs/accelgen.md cites what does not exist: {missing}"
