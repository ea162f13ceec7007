"""Simulator fidelity against the real vLLM CPU engine: ``python scripts/fidelity.py run|report``.

The same as ``python -m accelgen.profiling.fidelity_cli run|report`` (see its --help); the
pipeline's stage (``snakemake --cores all fidelity``, rules/fidelity.smk) runs both.
"""

from __future__ import annotations

import sys

from accelgen.profiling.fidelity_cli import main

if __name__ == "__main__":
    sys.exit(main())
