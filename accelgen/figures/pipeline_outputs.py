"""Which pipeline config a notebook plots.

:func:`pipeline_outputs`: where a pipeline config's outputs are, so a notebook opened by hand
  (JupyterLab) plots the results of the config that produced them. The config is named by the
  notebook's ``config`` parameter, else by ``$ACCELGEN_CONFIG``, else it is the Snakefile's own
  ``config/quick.yaml``; a config given with ``--configfile`` extends ``config/quick.yaml`` as it
  does under Snakemake.

How the notebook files stay free of outputs: :mod:`accelgen.pipeline.nbsource`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from accelgen.figures.catalog import DEFAULT_FIGURES_DIR

DEFAULT_CONFIG = "config/quick.yaml"  # the Snakefile's `configfile:`
CONFIG_ENV = "ACCELGEN_CONFIG"


@dataclass(frozen=True)
class PipelineOutputs:
    """The output locations of one pipeline config (paths relative to the repository root)."""

    config: str  # the config file as given
    name: str
    figures_dir: str

    @property
    def results_root(self) -> str:  # as accelgen.pipeline.grid.Grid.results_root
        return f"results/{self.name}"


def chosen_config(config: str | os.PathLike[str] | None = None) -> str:
    """``config``, else ``$ACCELGEN_CONFIG``, else config/quick.yaml."""
    return str(config) if config else os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def snakemake_command(config: str | os.PathLike[str] | None, *targets: str) -> str:
    """The command that makes ``targets`` with ``config`` (as :func:`chosen_config`)."""
    chosen = chosen_config(config)
    args = ["snakemake", "--cores", "all"]
    if Path(chosen) != Path(DEFAULT_CONFIG):
        args += ["--configfile", chosen]
    return shlex.join([*args, *targets])


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: pipeline config not found (paths are relative to the "
                                f"repository root)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping of config sections")
    return data


def pipeline_outputs(config: str | os.PathLike[str] | None = None,
                     root: str | os.PathLike[str] = ".") -> PipelineOutputs:
    """Where the pipeline writes the outputs of ``config`` (None: ``$ACCELGEN_CONFIG``, else
    ``config/quick.yaml``). Only ``name`` and ``figures_dir`` are read, so a config whose inputs
    are not on this machine still resolves."""
    chosen = chosen_config(config)
    base = Path(root)
    data = _read(base / DEFAULT_CONFIG)
    if Path(chosen) != Path(DEFAULT_CONFIG):
        # Both keys are top-level scalars: the chosen config's value wins, as in the pipeline's
        # deep merge of the two files.
        data = {**data, **_read(base / chosen)}
    default_dir = DEFAULT_FIGURES_DIR
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{chosen}: no `name` (the namespace of results/ and logs/)")
    return PipelineOutputs(config=chosen, name=name,
                           figures_dir=str(data.get("figures_dir") or default_dir).rstrip("/"))
