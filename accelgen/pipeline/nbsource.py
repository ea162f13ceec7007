"""The notebooks in ``notebooks/`` are sources of the pipeline: code only, no outputs.

Running one in JupyterLab autosaves its outputs into the tracked file, which would dirty git and,
the file being newer than its figures, make Snakemake run it again. Two things prevent that:

- :func:`lab_pre_save_hook`: a save hook of the Jupyter server behind JupyterLab, registered by
  this module as a server extension (enabled by ``scripts/setup.sh``, which copies
  ``jupyter-config/jupyter_server_config.d/accelgen.json`` into the venv). It drops outputs,
  execution counts and run metadata (:func:`strip_outputs`) from a notebook of ``notebooks/``
  before it is written, so a notebook that was only run is saved byte for byte as committed.
  Lab still shows the outputs until the notebook is closed; the executed copies with every
  output are the pipeline's logs (``logs/<name>/notebooks/``).
- :func:`code_digest`: the notebook rules take the notebook as an ``ancient`` input and its
  digest (cells without outputs) as a parameter, so Snakemake re-runs them when the code
  changes and not when the file is saved by any tool.

Standard library only: the Jupyter server imports this module when it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Cell metadata that running or viewing a notebook writes (timing, papermill's record, Lab's
# collapsed/scrolled view state); `tags` (e.g. papermill's `parameters`) and the rest are kept.
RUN_CELL_METADATA = ("execution", "papermill", "ExecuteTime", "collapsed", "scrolled")
RUN_NOTEBOOK_METADATA = ("papermill", "widgets")
INJECTED = "injected-parameters"  # the tag of the cell papermill adds for `-p NAME VALUE`


def strip_outputs(nb: dict[str, Any]) -> dict[str, Any]:
    """``nb`` (a notebook as JSON data) without outputs, execution counts and run metadata;
    modified in place and returned."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        meta = cell.get("metadata", {})
        for key in RUN_CELL_METADATA:
            meta.pop(key, None)
        if meta.get("tags") == []:  # papermill and Lab add empty tag lists
            del meta["tags"]
    meta = nb.get("metadata", {})
    for key in RUN_NOTEBOOK_METADATA:
        meta.pop(key, None)
    info = meta.get("language_info")
    if isinstance(info, dict):  # the kernel's version details; the language stays
        meta["language_info"] = {"name": info.get("name", "python")}
    return nb


def is_pipeline_notebook(path: str | os.PathLike[str]) -> bool:
    """A notebook in the ``notebooks/`` directory of a checkout of this project."""
    p = Path(path)
    root = p.parent.parent
    return (p.suffix == ".ipynb" and p.parent.name == "notebooks"
            and (root / "Snakefile").is_file() and (root / "config" / "quick.yaml").is_file())


def lab_pre_save_hook(model: dict[str, Any], path: str, contents_manager: Any,
                      **kwargs: Any) -> None:
    """Jupyter server ``pre_save_hook``: strip a pipeline notebook before it is written."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    root = getattr(contents_manager, "root_dir", ".")
    if is_pipeline_notebook(Path(root) / path.strip("/")):
        strip_outputs(model["content"])


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "accelgen.pipeline.nbsource"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    serverapp.contents_manager.register_pre_save_hook(lab_pre_save_hook)
    serverapp.log.info("accelgen: notebooks/*.ipynb of this project are saved without outputs")


def code_digest(path: str | os.PathLike[str]) -> str:
    """Digest of a notebook's kernel and cells (type, tags, source): outputs, execution counts,
    metadata and the parameters cell papermill injects, all written by running it (JupyterLab,
    papermill), leave it unchanged."""
    nb = json.loads(Path(path).read_text())
    cells = [{"type": c.get("cell_type"), "tags": sorted(tags), "source": "".join(c["source"])}
             for c in nb.get("cells", [])
             if INJECTED not in (tags := c.get("metadata", {}).get("tags", []))]
    text = json.dumps({"kernel": nb.get("metadata", {}).get("kernelspec", {}).get("name"),
                       "cells": cells}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
