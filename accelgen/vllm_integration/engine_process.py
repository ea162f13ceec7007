"""Fresh processes for vLLM engines, started without paying vLLM's import each time.

Importing vLLM and its engine modules costs about 17 s of CPU on a 2-core host (torch,
transformers, the OpenAI protocol models), more than a small replay itself. Engine processes
are therefore forked from a multiprocessing fork server that imported those modules once and
never ran an engine: every engine process still starts with nothing of an earlier engine
(threads, garbage, oneDNN kernels), only the imports are shared. The fork server is started by
the first engine process of a Python process and lives as long as it does; its children get the
caller's working directory from multiprocessing and the caller's environment (as it is when the
job is submitted) from ``with_environment``, since a fork server's children would otherwise see
the environment of its start.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.context import ForkServerContext
from typing import Any, TypeVar

T = TypeVar("T")

# What an engine process imports before it builds an engine (vllm's top level imports the
# engine modules lazily, so they are named).
PRELOAD = ("vllm", "vllm.engine.arg_utils", "vllm.v1.engine.llm_engine", "vllm.entrypoints.llm",
           "accelgen.vllm_integration.replay", "accelgen.vllm_integration.scheduler")


def engine_context() -> ForkServerContext:
    """The multiprocessing context of engine processes: a fork server with ``PRELOAD``
    imported (a module that fails to import there is imported by each child instead)."""
    ctx = mp.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def with_environment(env: dict[str, str], job: Callable[..., T], *args: Any) -> T:
    """In an engine process: take ``env`` as the environment, then ``job(*args)``."""
    set_environment(env)
    return job(*args)


def set_environment(env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
