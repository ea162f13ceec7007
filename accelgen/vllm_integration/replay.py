"""Replay a trace into a real vLLM engine and write the simulator's results files.

Each trace request is added to the engine when its arrival time comes (wall clock, measured from
the replay's start), with its SLOs in ``SamplingParams.extra_args`` and its exact output length
forced (``max_tokens=output_len, ignore_eos=True``; the engine stops a sequence at
``max_model_len``, and such a request is recorded as ``cut``). The engine is stepped by hand in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the scheduler object - ``AccelGenScheduler`` running a
policy, or ``InstrumentedScheduler`` for stock vLLM - is reachable: it time-stamps every token
when the engine core returns it and logs every iteration, and those logs become
``requests.parquet`` / ``iterations.parquet`` / ``timing.parquet`` through ``accelgen.results``,
as the simulator's do, so ``accelgen.metrics`` and the notebooks read real runs and simulated runs
alike (``replay`` returns the same ``RunOutput`` as ``accelgen.sim.runner.simulate``).

On CPU the model is a tiny random-weight Llama written from ``TinyModelSpec`` (no downloads); on
GPU pass a real model name or path.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from accelgen import metrics
from accelgen.core.kvcache import never_fits_reason
from accelgen.core.request import Request, Status, served_output_len
from accelgen.core.specs import StrictModel
from accelgen.results import RunOutput, requests_frame
from accelgen.vllm_integration import SCHEDULER_CLS, STOCK_SCHEDULER_CLS
from accelgen.vllm_integration.adapter_config import (
    AdapterConfig,
    TokenLimit,
    build_cost_model,
    build_pivot,
    choose_token_limit,
    request_extra_args,
)
from accelgen.vllm_integration.tiny_model import TinyModelSpec, write_tiny_model
from accelgen.workloads.prompts import prompt_token_ids
from accelgen.workloads.trace import to_requests

T = TypeVar("T")
logger = logging.getLogger("accelgen.replay")

System = Literal["accelgen", "stock"]


class EngineSpec(StrictModel):
    """The vLLM engine a replay runs on."""

    model: str | None = None  # None: the tiny random-weight model below (CPU runs)
    tiny: TinyModelSpec = Field(default_factory=TinyModelSpec)
    tiny_dir: Path | None = None  # where the tiny model is written (default: a temp dir)
    load_format: str = "dummy"  # random weights: timing depends on shape only
    block_size: PositiveInt = 32
    num_gpu_blocks: PositiveInt | None = None  # KV blocks (incl. vLLM's reserved null block)
    max_model_len: PositiveInt = 2048
    # None: the policy's largest token budget (at least max_num_seqs), or vLLM's default 2048
    # for stock vLLM and a policy without a budget of its own; a value set caps the policy's
    # budget (``adapter_config.choose_token_limit``).
    max_num_batched_tokens: PositiveInt | None = None
    max_num_seqs: PositiveInt = 256
    cpu_kvcache_space_gb: PositiveFloat = 1.0  # VLLM_CPU_KVCACHE_SPACE
    dtype: str = "auto"
    seed: int = 0
    # vLLM's async scheduling: the engine core schedules step N+1 while step N executes (one
    # step in flight). None: vLLM's own default (on on a GPU; vLLM's CPU platform turns it off);
    # True: on, also on CPU (see ``build_engine``); False: sync (schedule, execute, process
    # outputs, in turn), which is what the simulator models.
    async_scheduling: bool | None = None
    extra_args: dict[str, Any] = Field(default_factory=dict)  # more EngineArgs fields


class ReplayConfig(StrictModel):
    system: System = "accelgen"  # accelgen: AccelGenScheduler + adapter.policy; stock: vLLM's own
    # stock only: vLLM's queue mode; priority = each request's SLO class (tight TBT first).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    adapter: AdapterConfig = Field(default_factory=AdapterConfig)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    # Requests run before the trace (and then forgotten) so that one-off start-up costs of the
    # first forward passes do not land on the first trace requests.
    warmup_requests: NonNegativeInt = 2
    max_wall_s: PositiveFloat = 3600.0  # give up (and record the rest as rejected) after this

    @model_validator(mode="after")
    def _priority_is_stock(self) -> ReplayConfig:
        if self.scheduling_policy == "priority" and self.system != "stock":
            raise ValueError("scheduling_policy: priority is vLLM's own queue mode (system: "
                             "stock); the plugin's policy orders its queue itself")
        return self


# oneDNN's primitive cache (per process, least recently used first out; 1024 primitives by
# default). vLLM's CPU linear layers (``onednn_mm``) build a oneDNN kernel for every new number of
# rows, about 0.6-0.8 ms per linear layer on the tiny model, and keep only the last 32 per layer
# themselves; a miss there that hits oneDNN's cache costs about 0.01 ms. The tiny model needs up
# to 9 primitives per token count (2 layers x 4 linear layers + the LM head), so the default
# cache holds only a hundred or two token counts: a replay with hundreds of distinct prefill
# sizes evicts the kernels of the small decode sizes, which then pay the first-use cost again
# (docs/profiling.md section 3.2). With a large cache every token count
# pays it once per process, as the engine step model charges it. Read by oneDNN when it first
# builds a primitive, so it must be set before the engine's first forward pass.
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 65536


def engine_env_defaults() -> dict[str, str]:
    """Environment defaults of every engine process (``setdefault``: a value the user set
    wins); call before the process's first oneDNN use (its engine's start). Returns the
    values in effect."""
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))
    return {ONEDNN_CACHE_ENV: os.environ[ONEDNN_CACHE_ENV]}


def in_fresh_process(job: Callable[..., T], *args: Any) -> T:
    """``job(*args)`` in a new engine process (``engine_process``: forked from a server that
    imported vLLM once), which gets this one's environment (with ``engine_env_defaults``),
    working directory and priority, and nothing of an engine that ran before (threads still
    shutting down, garbage, oneDNN kernels already built)."""
    from concurrent.futures import ProcessPoolExecutor

    from accelgen.vllm_integration.engine_process import engine_context, with_environment

    engine_env_defaults()
    with ProcessPoolExecutor(1, mp_context=engine_context()) as pool:
        return pool.submit(with_environment, dict(os.environ), job, *args).result()


def _prepare_env(spec: EngineSpec) -> None:
    # The replay must reach the scheduler object, so the engine core runs in this process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{spec.cpu_kvcache_space_gb:g}")
    engine_env_defaults()


def engine_token_limit(cfg: ReplayConfig) -> TokenLimit:
    """The engine's ``max_num_batched_tokens`` for ``cfg`` and why (``choose_token_limit``; a
    value in ``engine.extra_args`` counts as set by the user)."""
    spec = cfg.engine
    user = spec.extra_args.get("max_num_batched_tokens", spec.max_num_batched_tokens)
    return choose_token_limit(cfg.adapter if cfg.system == "accelgen" else None,
                              None if user is None else int(user), block_size=spec.block_size,
                              max_model_len=spec.max_model_len,
                              max_num_seqs=int(spec.extra_args.get("max_num_seqs",
                                                                   spec.max_num_seqs)))


def build_engine(cfg: ReplayConfig, work_dir: Path | None = None) -> Any:
    """An in-process ``LLMEngine`` with the configured scheduler; returns it.

    Async scheduling on CPU: vLLM 0.32's CPU platform hook turns it off ("not required on
    CPU", ``platforms/cpu.py``), after which the engine is built with it on again (vLLM's CPU
    model runner is its GPU runner, whose async path it keeps), and the model runs in a worker
    process (``distributed_executor_backend="mp"``, unless ``extra_args`` names an executor):
    in this process's executor the forward pass would run inside ``execute_model`` and each
    step's outputs would come back only after the next step's forward pass, so nothing would
    overlap and every token would come a step late.
    """
    spec = cfg.engine
    _prepare_env(spec)
    from accelgen.vllm_integration.llvmlite_guard import refuse_dunder_lookups
    from accelgen.vllm_integration.version import check_vllm_version

    check_vllm_version()
    refuse_dunder_lookups()  # this process may have run numba-compiled code
    import vllm.envs
    from vllm import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.executor.abstract import Executor

    # An engine core freezes vLLM's environment-variable cache; a later engine in the same
    # process must read the variables set above afresh.
    vllm.envs.disable_envs_cache()

    limit = engine_token_limit(cfg)
    logger.info("accelgen replay: %s", limit.describe())
    model = spec.model
    if model is None:
        tiny_dir = spec.tiny_dir or Path(work_dir or ".") / "tiny-model"
        model = str(write_tiny_model(tiny_dir, spec.tiny))
    args: dict[str, Any] = dict(
        model=model,
        load_format=spec.load_format,
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=spec.block_size,
        num_gpu_blocks_override=spec.num_gpu_blocks,
        max_model_len=spec.max_model_len,
        max_num_batched_tokens=limit.tokens,
        max_num_seqs=spec.max_num_seqs,
        enable_prefix_caching=False,  # the policies' KV model has no prefix sharing
        enable_chunked_prefill=True,
        dtype=spec.dtype,
        seed=spec.seed,
        disable_log_stats=True,
        scheduler_cls=SCHEDULER_CLS if cfg.system == "accelgen" else STOCK_SCHEDULER_CLS,
        scheduling_policy=cfg.scheduling_policy,
        # (The results are built from the scheduler's records: it keeps what its log wrote.)
        additional_config={"accelgen": cfg.adapter.model_copy(
            update={"keep_logged_records": True}).model_dump(mode="json")},
    )
    if spec.async_scheduling is not None:
        args["async_scheduling"] = spec.async_scheduling
    force_async = spec.async_scheduling is True and current_platform.is_cpu()
    if force_async:
        args["distributed_executor_backend"] = "mp"
    args.update(spec.extra_args)
    engine_args = EngineArgs(**args)
    vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
    if force_async:
        vllm_config.scheduler_config.async_scheduling = True
    return LLMEngine(vllm_config=vllm_config, executor_class=Executor.get_class(vllm_config),
                     log_stats=not engine_args.disable_log_stats,
                     usage_context=UsageContext.ENGINE_CONTEXT, multiprocess_mode=False)


def engine_scheduler(engine: Any) -> Any:
    """The scheduler object of an in-process engine."""
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("the engine core runs in another process; replay needs "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0")
    return core.scheduler


def shutdown_engine(engine: Any) -> None:
    engine.engine_core.shutdown()


def admission_reject_reason(prompt_len: int, output_len: int, *, max_model_len: int,
                            kv_tokens: int, block_size: int) -> str:
    """The simulator's rule for a request that can never run, on the engine's KV pool."""
    return never_fits_reason(prompt_len, output_len, max_model_len=max_model_len,
                             num_blocks=kv_tokens // block_size, block_size=block_size)


def _prompt_ids(req_id: int, n: int, vocab: int) -> list[int]:
    # Content does not matter (random weights, no prefix caching); ids avoid BOS/EOS (1, 2).
    return prompt_token_ids(req_id, n, vocab)


def _sampling(extra: dict[str, Any], max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                          extra_args=extra, detokenize=False)


def run_warmup(engine: Any, n: int, vocab: int) -> None:
    """Serve ``n`` short requests so that a fresh engine has built its common kernels (also used
    by the fidelity check's first-use probe, which must start from the replay's state)."""
    for i in range(n):
        engine.add_request(f"warmup-{i}", {"prompt_token_ids": _prompt_ids(10**6 + i, 64, vocab)},
                           _sampling({"req_id": 10**9 + i}, 4))
    while engine.has_unfinished_requests():
        engine.step()


def replay(trace: pd.DataFrame, cfg: ReplayConfig, *, work_dir: Path | None = None,
           progress: bool = False) -> RunOutput:
    """Run ``trace`` through a fresh engine; the run's tables, summary and config, as
    ``accelgen.sim.runner.simulate`` returns them."""
    engine = build_engine(cfg, work_dir)
    try:
        return _replay(engine, trace, cfg, progress=progress)
    finally:
        shutdown_engine(engine)


def replay_with(engine: Any, trace: pd.DataFrame, cfg: ReplayConfig, *,
                progress: bool = False) -> RunOutput:
    """``replay`` on an engine ``build_engine(cfg)`` built earlier, kept for several replays (the
    engine sweep: one engine per system); the scheduler's records are reset at the start."""
    return _replay(engine, trace, cfg, progress=progress)


def _replay(engine: Any, trace: pd.DataFrame, cfg: ReplayConfig, *,
            progress: bool) -> RunOutput:
    sched = engine_scheduler(engine)
    spec = cfg.engine
    vocab = spec.tiny.vocab_size if spec.model is None else 1000
    kv_blocks = sched.kv_view.num_total_blocks
    kv_tokens = kv_blocks * sched.block_size
    max_model_len = sched.max_model_len

    run_warmup(engine, cfg.warmup_requests, vocab)

    df = trace.sort_values(["arrival", "req_id"], kind="stable").reset_index(drop=True)
    # The engine serves its own copies of these requests (the scheduler's mirrors); these objects
    # stand for the ones that never reach it.
    requests, requested = to_requests(df)
    served = served_output_len(df["prompt_len"].to_numpy(), requested, max_model_len)
    out_len = np.zeros(int(df["req_id"].max()) + 1 if len(df) else 0, dtype=np.int64)
    pre_rejected: list[Request] = []
    # (request, max_tokens) in arrival order: the trace's output length; the engine itself stops
    # a sequence at max_model_len and the scheduler records that request as cut.
    submit: list[tuple[Request, int]] = []
    for r, n_asked, n_served in zip(requests, requested.tolist(), served.tolist(), strict=True):
        out_len[r.req_id] = n_served
        why = admission_reject_reason(r.prompt_len, n_served, max_model_len=max_model_len,
                                      kv_tokens=kv_tokens, block_size=sched.block_size)
        if why:
            r.status, r.reject_reason, r.finish_time = Status.REJECTED, why, r.arrival
            pre_rejected.append(r)
            continue
        submit.append((r, n_asked))

    bar = _progress(len(submit)) if progress else None
    t0 = time.time()
    sched.reset_records(t0)
    i = 0
    deadline = time.monotonic() + cfg.max_wall_s
    timed_out = False
    while i < len(submit) or engine.has_unfinished_requests():
        now = time.time() - t0
        while i < len(submit) and submit[i][0].arrival <= now:
            r, max_tokens = submit[i]
            engine.add_request(str(r.req_id),
                               {"prompt_token_ids": _prompt_ids(r.req_id, r.prompt_len, vocab)},
                               _sampling(request_extra_args(r), max_tokens),
                               arrival_time=t0 + r.arrival)
            i += 1
        if engine.has_unfinished_requests():
            engine.step()
        elif i < len(submit):
            time.sleep(max(0.0, submit[i][0].arrival - (time.time() - t0)))
        if bar is not None:
            bar.n = len(sched.done)
            bar.refresh()
        if time.monotonic() > deadline:
            timed_out = True
            break
    wall = time.time() - t0
    if bar is not None:
        bar.close()

    reqs = sched.all_requests()
    if timed_out:
        for m in reqs:
            if not m.is_done:
                m.status, m.reject_reason = Status.REJECTED, f"replay stopped after {wall:.0f} s"
                m.finish_time = wall
        for r, _ in submit[i:]:
            r.status, r.reject_reason = Status.REJECTED, "replay stopped before it arrived"
            pre_rejected.append(r)
    all_reqs = sorted([*reqs, *pre_rejected], key=lambda r: r.req_id)
    req_df = requests_frame(all_reqs, out_len)
    its_df = sched.iterations_frame()
    timing = sched.timing_frame()

    pivot = (sched.pivot if hasattr(sched, "pivot") else
             build_pivot(cfg.adapter, build_cost_model(cfg.adapter.cost),
                         block_size=sched.block_size, max_model_len=max_model_len))
    summary = metrics.summarize(req_df, its_df, s_pf=pivot.s_pf)
    summary.update({
        "backend": "vllm", "system": cfg.system,
        "policy": cfg.adapter.policy.name if cfg.system == "accelgen" else "vllm-stock",
        "s_pf": pivot.s_pf, "t_pf": pivot.t_pf, "kv_blocks": kv_blocks,
        "adapter_mismatch_steps": int(getattr(sched, "mismatch_steps", 0)),
        "adapter_trimmed_steps": int(getattr(sched, "trimmed_steps", 0)),
        "async_scheduling": bool(sched.accelgen_async),
        "overlapped_steps": int(sched.overlapped_steps),
        "idle_steps": int(sched.idle_steps), "refused_requests": len(sched.invalid),
        "timed_out": timed_out,
    })
    tsum = metrics.timing_summary(timing["decision_time"].to_numpy(), summary["makespan_s"])
    for col in ("policy_time", "vllm_schedule_time", "exec_time", "step_time"):
        x = timing[col].to_numpy()
        tsum[f"{col}_mean"] = float(x.mean()) if len(x) else math.nan
        tsum[f"{col}_p50"] = float(np.median(x)) if len(x) else math.nan
    tsum["replay_wall_time_s"] = wall
    import vllm

    config = {"replay": cfg.model_dump(mode="json"),
              "resolved": {"max_model_len": max_model_len, "kv_blocks": kv_blocks,
                           "max_num_batched_tokens": int(sched.scheduler_config
                                                         .max_num_batched_tokens),
                           "max_num_batched_tokens_why": engine_token_limit(cfg).describe(),
                           "block_size": sched.block_size, "s_pf": pivot.s_pf,
                           "t_pf": pivot.t_pf, "vllm_version": vllm.__version__,
                           "scheduler_cls": type(sched).__module__ + "." + type(sched).__name__,
                           "async_scheduling": bool(sched.accelgen_async),
                           "env": {k: os.environ.get(k) for k in (ONEDNN_CACHE_ENV,
                                                                  "OMP_NUM_THREADS")}}}
    return RunOutput(req_df, its_df, summary, timing, tsum, config)


def replay_to_dir(trace: pd.DataFrame, cfg: ReplayConfig, out: Path | str, *,
                  progress: bool = False, trace_path: str | None = None) -> RunOutput:
    out = Path(out)
    run = replay(trace, cfg, work_dir=out.parent, progress=progress)
    if trace_path is not None:
        run.config["trace"] = trace_path
    run.write(out)
    return run


def _progress(total: int) -> Any:  # pragma: no cover - cosmetic
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="replay", mininterval=1.0)
