"""Engine processes of a sweep: one engine process per system (``vllm_integration.
engine_process``) holds that system's vLLM engine and replays the points it is sent, so an
engine starts once per system and not once per point.

A process is pinned to ``cpus`` when given (``os.sched_setaffinity``; its threads inherit it),
runs ``omp_threads`` OpenMP threads and inherits the caller's priority (``accelgen engine-sweep
run --renice``). On its first point it builds the engine and serves a start-up replay (untimed,
discarded), so the kernels of the common token counts exist before any measured point.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from accelgen.fidelity.run import cpu_shares, cpu_ticks, loadavg

JITTER_WARM_STEPS = 5
# In an engine process: the engine, and the configuration it was built with.
_STATE: dict[str, Any] = {}


def _init(env: dict[str, str], omp_threads: int, cpus: list[int] | None) -> None:
    from accelgen.vllm_integration.engine_process import set_environment

    set_environment(env)
    os.environ["OMP_NUM_THREADS"] = str(omp_threads)
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def _engine(rc_data: dict[str, Any], warm: pd.DataFrame | None) -> Any:
    from accelgen.vllm_integration.replay import ReplayConfig, build_engine, replay_with

    if _STATE.get("config") != rc_data:
        if "engine" in _STATE:
            from accelgen.vllm_integration.replay import shutdown_engine

            shutdown_engine(_STATE.pop("engine"))
        rc = ReplayConfig.model_validate(rc_data)
        engine = build_engine(rc)
        if warm is not None and len(warm):
            replay_with(engine, warm, rc)
        _STATE.update(engine=engine, config=rc_data)
    return _STATE["engine"]


def _replay_point(rc_data: dict[str, Any], trace: pd.DataFrame, out: str, trace_path: str,
                  warm: pd.DataFrame | None) -> dict[str, Any]:
    """One sweep point on this process's engine; its results are written to ``out``."""
    from accelgen.vllm_integration.replay import ReplayConfig, replay_with

    engine = _engine(rc_data, warm)
    rc = ReplayConfig.model_validate(rc_data)
    run = replay_with(engine, trace, rc)
    run.config["trace"] = trace_path
    run.write(Path(out))
    return run.summary


def _step_jitter(rc_data: dict[str, Any], prompt_len: int, steps: int) -> list[float]:
    """``steps`` identical steps on this process's engine, each timed (s): one request of
    ``prompt_len`` prompt tokens and one output token, alone in the engine (no prefix caching,
    so every step computes the same prefill). The first few, which may still build kernels,
    are left out."""
    from accelgen.vllm_integration.replay import ReplayConfig, _prompt_ids, _sampling

    engine = _engine(rc_data, None)
    vocab = ReplayConfig.model_validate(rc_data).engine.tiny.vocab_size
    times = []
    for i in range(steps + JITTER_WARM_STEPS):
        engine.add_request(f"jitter-{i}", {"prompt_token_ids": _prompt_ids(2 * 10**6 + i,
                                                                            prompt_len, vocab)},
                           _sampling({"req_id": 2 * 10**9 + i}, 1))
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        while engine.has_unfinished_requests():  # one step serves it; drain to be sure
            engine.step()
        if i >= JITTER_WARM_STEPS:
            times.append(dt)
    return times


def _shutdown() -> None:
    if "engine" in _STATE:
        from accelgen.vllm_integration.replay import shutdown_engine

        shutdown_engine(_STATE.pop("engine"))


class EnginePool:
    """An engine process per system (``engine_process``; started on first use), one point at a
    time."""

    def __init__(self, omp_threads: int, cpus: list[int] | None) -> None:
        self._args = (omp_threads, cpus)
        self._pools: dict[str, ProcessPoolExecutor] = {}

    def _pool(self, system: str) -> ProcessPoolExecutor:
        if system not in self._pools:
            from accelgen.vllm_integration.engine_process import engine_context
            from accelgen.vllm_integration.replay import engine_env_defaults

            engine_env_defaults()
            self._pools[system] = ProcessPoolExecutor(
                1, mp_context=engine_context(), initializer=_init,
                initargs=(dict(os.environ), *self._args))
        return self._pools[system]

    def replay(self, system: str, rc_data: dict[str, Any], trace: pd.DataFrame, out: Path,
               trace_path: str, warm: pd.DataFrame | None = None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Replay ``trace`` on ``system``'s engine; returns its summary and what the machine
        did meanwhile (start/end, load averages, CPU time shares)."""
        info: dict[str, Any] = {"start": time.time(), "load_before": loadavg()}
        ticks = cpu_ticks()
        summary = self._pool(system).submit(_replay_point, rc_data, trace, str(out), trace_path,
                                            warm).result()
        info.update(end=time.time(), load_after=loadavg(),
                    cpu_shares=cpu_shares(ticks, cpu_ticks()))
        return summary, info

    def step_jitter(self, system: str, rc_data: dict[str, Any], prompt_len: int,
                    steps: int) -> list[float]:
        """``steps`` identical steps timed on ``system``'s engine (``_step_jitter``)."""
        return list(self._pool(system).submit(_step_jitter, rc_data, prompt_len,
                                              steps).result())

    def close(self, system: str | None = None) -> None:
        """Shut down one system's engine process (or all)."""
        for name in [system] if system is not None else list(self._pools):
            pool = self._pools.pop(name, None)
            if pool is None:
                continue
            try:
                pool.submit(_shutdown).result(timeout=60)
            except Exception as exc:  # the process may already be gone; say so, go on
                print(f"  (engine of {name}: shutdown: {type(exc).__name__}: {exc})",
                      file=sys.stderr)
            pool.shutdown(wait=True)

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
