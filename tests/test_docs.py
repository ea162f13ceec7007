"""The figure maps of README.md and docs/ARTIFACT.md agree with the pipeline: every figure target
of the grid (accelgen.figures.catalog.FIGURES) is listed once, beside the notebook that draws it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelgen.figures.catalog import FIGURES

ROOT = Path(__file__).resolve().parents[1]
# Targets outside the grid's figure table -> the notebook that draws them (None: a CSV only).
OTHER_TARGETS: dict[str, str | None] = {"fidelity": "fidelity", "fig17": "engine", "claims": None,
                                        "headline": None}


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every Markdown pipe table as rows of {lower-case header: cell}."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2:
            header = [h.lower() for h in block[0]]
            found.append([dict(zip(header, row, strict=False)) for row in block[2:]])
        block = []
    return found


def figure_map(path: Path) -> list[dict[str, str]]:
    maps = [t for t in tables(path.read_text()) if {"target", "notebook"} <= set(t[0])]
    assert len(maps) == 1, f"{path.name}: one table with `target` and `notebook` columns"
    return maps[0]


def notebooks_in(cell: str) -> set[str]:
    names = {n.strip().strip("`").removesuffix(".ipynb") for n in cell.split(",")}
    return names - {"-", ""}


@pytest.mark.parametrize("doc", ["README.md", "docs/ARTIFACT.md"])
def test_figure_map_matches_the_notebooks(doc):
    expected = {key: group for key, _id, group, *_ in FIGURES} | OTHER_TARGETS
    ids = {key: fid for key, fid, *_ in FIGURES}
    existing = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    listed: list[str] = []
    for row in figure_map(ROOT / doc):
        targets = re.findall(r"`([a-z0-9_]+)`", row["target"])
        assert targets, f"{doc}: no target in {row}"
        unknown = [t for t in targets if t not in expected]
        assert not unknown, f"{doc}: unknown targets {unknown}"
        want = {expected[t] for t in targets} - {None}
        got = notebooks_in(row["notebook"])
        assert got == want, f"{doc}: {targets} are drawn by {sorted(want)}, listed {sorted(got)}"
        assert got <= existing, f"{doc}: no such notebook {sorted(got - existing)}"
        if "output id" in row and targets[0] in ids:
            assert f"`{ids[targets[0]]}`" in row["output id"], f"{doc}: {row['output id']}"
        listed += targets
    missing = [key for key in ids if key not in listed]
    assert not missing, f"{doc}: figure targets missing from the figure map: {missing}"
    twice = sorted({t for t in listed if listed.count(t) > 1})
    assert not twice, f"{doc}: listed twice: {twice}"


def test_notebook_defaults_draw_their_figures():
    """Each figure notebook's default `figures` parameter names the figures of its group."""
    import ast

    import nbformat

    for group in sorted({g for _k, _i, g, *_ in FIGURES}):
        nb = nbformat.read(ROOT / "notebooks" / f"{group}.ipynb", as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        params = {t.id: n.value.value for n in ast.parse(cell.source).body
                  for t in n.targets if isinstance(n.value, ast.Constant)}
        assert set(params["figures"].split(",")) == {fid for _k, fid, g, *_ in FIGURES
                                                     if g == group}, group
