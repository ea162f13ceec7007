"""A vLLM scheduler without a model: for scenario tests and scheduler-overhead benchmarks.

``make_scheduler`` builds a real vLLM ``Scheduler`` (or subclass) over a KV pool of a chosen size
from a config that never loads weights; ``fake_model_output`` plays the model runner's part: for
each scheduled request it returns a sampled token once the request's prompt (and any recomputed
output) is fully computed, exactly as the engine's output would; ``step`` calls the scheduler in
the engine core's order, sync or with async scheduling. Nothing here runs a forward pass, so a
step costs only the scheduler's own time.
"""

from __future__ import annotations

import tempfile
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from accelgen.vllm_integration.version import check_vllm_version

check_vllm_version()

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from accelgen.vllm_integration.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402


def make_scheduler(cls: type[Scheduler], *, num_blocks: int, block_size: int = 32,
                   max_model_len: int = 2048, max_num_batched_tokens: int = 2048,
                   max_num_seqs: int = 256, accelgen: dict[str, Any] | None = None,
                   model_dir: Path | str | None = None, async_scheduling: bool = False) -> Any:
    """A scheduler of class ``cls`` over ``num_blocks`` usable KV blocks (plus vLLM's null
    block); ``accelgen`` is the plugin config (``additional_config["accelgen"]``);
    ``async_scheduling`` as vLLM's option (``step`` then keeps one step in flight)."""
    spec = TinyModelSpec(max_position_embeddings=max(max_model_len, 2048))
    model = write_tiny_model(model_dir or Path(tempfile.gettempdir()) / "accelgen-tiny-model",
                             spec)
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True,
                               max_model_len=max_model_len, dtype="float32",
                               enforce_eager=True)
    sched_config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens,
                                   max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                   is_encoder_decoder=False,
                                   enable_chunked_prefill=True)
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    cache_config.num_gpu_blocks = num_blocks + 1
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=sched_config,
                             cache_config=cache_config,
                             additional_config={"accelgen": accelgen} if accelgen else {})
    # (after vLLM's CPU platform hook, which turns async scheduling off: see replay.py)
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    kv_spec = FullAttentionSpec(block_size=block_size, num_kv_heads=spec.num_kv_heads,
                                head_size=spec.head_dim, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer.0"], kv_spec)])
    return cls(vllm_config=vllm_config, kv_cache_config=kv_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=block_size, log_stats=False)


def make_request(request_id: str, prompt_len: int, max_tokens: int, *,
                 extra_args: dict[str, Any] | None = None,
                 arrival_time: float | None = None) -> VRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
    return VRequest(request_id, list(range(3, 3 + prompt_len)), params, None,
                    arrival_time=time.time() if arrival_time is None else arrival_time)


def fake_model_output(scheduler: Scheduler, out: SchedulerOutput,
                      token_id: int = 7) -> ModelRunnerOutput:
    """What the model runner returns for ``out``, computed when it executes (right after
    ``schedule()``): one token for every request whose scheduled chunk completes its pending
    tokens (vLLM has already advanced ``num_computed_tokens`` and set ``is_prefill_chunk``)."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = scheduler.requests.get(rid)
        done = r is not None and not r.is_prefill_chunk
        sampled.append([token_id] if done else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


# Async scheduling: per scheduler, the steps executed whose outputs are not processed yet
# (newest first), as ``EngineCore.batch_queue``.
_batch_queues: weakref.WeakKeyDictionary[Any, deque[tuple[SchedulerOutput, ModelRunnerOutput]]] \
    = weakref.WeakKeyDictionary()
# vLLM's ``VllmConfig.max_concurrent_batches`` with async scheduling (one model runner, no PP).
ASYNC_BATCHES = 2


def step(scheduler: Scheduler) -> tuple[SchedulerOutput | None, dict[int, Any]]:
    """One engine step with a fake model, in the order vLLM 0.32's engine core calls the
    scheduler (``v1/engine/core.py``). Sync (``EngineCore.step``): ``schedule()``, execute,
    ``update_from_output()``. Async scheduling (``EngineCore.step_with_batch_queue``, two
    batches): ``schedule()`` and execute the next step, then ``update_from_output()`` of the
    oldest step in flight, unless the queue has room and there is more to schedule. Returns
    the step scheduled (None when none was) and the outputs that came back (maybe none)."""
    out: SchedulerOutput | None = None
    if not scheduler.scheduler_config.async_scheduling:
        out = scheduler.schedule()
        return out, scheduler.update_from_output(out, fake_model_output(scheduler, out))
    queue = _batch_queues.setdefault(scheduler, deque())
    if scheduler.has_requests():
        out = scheduler.schedule()
        queue.appendleft((out, fake_model_output(scheduler, out)))
        if len(queue) < ASYNC_BATCHES and (out.total_num_scheduled_tokens > 0
                                           or scheduler.has_requests()):
            return out, {}
    elif not queue:
        return None, {}
    done, result = queue.pop()
    return out, scheduler.update_from_output(done, result)


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> int:
    """``step`` until no request is unfinished and no step is in flight; returns the steps."""
    for i in range(max_steps):
        if not (scheduler.has_requests() or _batch_queues.get(scheduler)):
            return i
        step(scheduler)
    raise RuntimeError(f"requests still unfinished after {max_steps} steps")
