"""Byte-compile what this project's processes run, not the whole venv (scripts/setup.sh, new venvs).

A new venv's site-packages hold about 28,000 modules; the pipeline, the real-engine runs and the
tests import about 9,000 of them. Compiling all of them took 120 s of CPU here (2 cores,
2026-11-29). This compiles the packages that load their modules piecemeal while they run (vLLM
and its quantization and grammar packages, its server's, Snakemake, the kernel's debugger, numba,
pip and setuptools) file by file, and for everything else what importing the project's entry
points imports (every module of the package, vLLM's server and engine, papermill's kernel,
Jupyter's server, the plotting and test stacks). A module missed here is compiled when first
imported, as Python does by default. Byte-code writing must be on, whatever the environment says:

    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/byte_compile.py
"""

from __future__ import annotations

import compileall
import contextlib
import importlib
import importlib.util
import io
import os
import pkgutil
import sys
import warnings

# Packages that import most of their modules lazily while they run (an engine's worker, a model's
# layers, a workflow's executors): compiled file by file.
WHOLE = (
    # the engine and its server
    "vllm", "compressed_tensors", "model_hosting_container_standards", "xgrammar", "tvm_ffi",
    "opentelemetry", "fastapi", "starlette", "uvicorn", "anyio", "httpcore", "pydantic",
    # the workflow, the notebooks' kernels and server, the decision's compiler
    "snakemake", "pathspec", "docutils", "debugpy", "jupyter_server", "numba",
    # the tests' own tools
    "setuptools", "pip", "packaging", "xdist",
)
# Entry points whose imports are the rest of what the project runs.
ENTRY_POINTS = (
    "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main", "vllm.v1.engine.core",
    "vllm.v1.worker.cpu_worker", "vllm.model_executor.models.opt",
    "transformers.models.opt", "transformers.models.auto.tokenization_auto",
    "snakemake.cli", "papermill", "nbclient", "nbformat", "ipykernel.kernelapp",
    "ipykernel.ipkernel", "jupyter_server.serverapp", "matplotlib.pyplot",
    "matplotlib.backends.backend_agg", "matplotlib.backends.backend_pdf", "pandas",
    "pyarrow.parquet", "scipy.stats", "scipy.optimize", "pytest", "hypothesis.strategies",
    "hypothesis.extra.numpy", "openai", "httpx", "aiohttp", "jupyterlab", "jupyter_lsp",
    "jupyterlab_server", "smart_open", "loguru", "websockets",
)


def _compile_whole(names: tuple[str, ...]) -> None:
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            for where in spec.submodule_search_locations:
                compileall.compile_dir(where, quiet=2, workers=1)


def _import(name: str) -> None:
    # (an optional or platform-specific module that does not import, or exits on import: skipped)
    with contextlib.suppress(Exception, SystemExit):
        importlib.import_module(name)


def run(whole: tuple[str, ...], entry_points: tuple[str, ...], walked: tuple[str, ...]) -> int:
    """Compile the packages ``whole`` file by file, then import ``entry_points`` and every module
    of the packages ``walked`` (``__main__`` modules left out: they run something), so that
    Python compiles what they import. Returns how many modules this process then holds."""
    _compile_whole(whole)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for name in entry_points:
            _import(name)
        for package in walked:
            _import(package)
            path = getattr(sys.modules.get(package), "__path__", None)
            for module in pkgutil.walk_packages(path or [], f"{package}.", onerror=lambda _: None):
                if not module.name.endswith("__main__"):
                    _import(module.name)
    return len(sys.modules)


def main() -> int:
    if sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("byte_compile: byte-code writing is off; run it as "
              "`env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/byte_compile.py`",
              file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    imported = run(WHOLE, ENTRY_POINTS, ("accelgen",))
    print(f"byte_compile: {len(WHOLE)} packages compiled whole, {imported} modules imported "
          "(compiled where they were not)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
