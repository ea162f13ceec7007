"""A vLLM scheduler without a model: for scenario tests and scheduler-overhead benchmarks.

``make_scheduler`` builds a real vLLM ``Scheduler`` (or subclass) over a KV pool of a chosen size
from a config that never loads weights; ``FakeModelStep`` plays the model runner's part: for each
scheduled request it returns a sampled token once the request's prompt (and any recomputed
output) is fully computed, exactly as the engine's output would. Nothing here runs a forward pass,
so a step costs only the scheduler's own time.
"""

from __future__ import annotations

import tempfile
import time
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
                   model_dir: Path | str | None = None) -> Any:
    """A scheduler of class ``cls`` over ``num_blocks`` usable KV blocks (plus vLLM's null
    block); ``accelgen`` is the plugin config (``additional_config["accelgen"]``)."""
    spec = TinyModelSpec(max_position_embeddings=max(max_model_len, 2048))
    model = write_tiny_model(model_dir or Path(tempfile.gettempdir()) / "accelgen-tiny-model",
                             spec)
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True,
                               max_model_len=max_model_len, dtype="float32",
                               enforce_eager=True)
    sched_config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens,
                                   max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                   is_encoder_decoder=False, async_scheduling=False,
                                   enable_chunked_prefill=True)
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    cache_config.num_gpu_blocks = num_blocks + 1
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=sched_config,
                             cache_config=cache_config,
                             additional_config={"accelgen": accelgen} if accelgen else {})
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
    """What the model runner returns for ``out``: one token for every request whose scheduled
    chunk completes its pending tokens (vLLM has already advanced ``num_computed_tokens``)."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = scheduler.requests.get(rid)
        done = r is not None and r.num_computed_tokens >= r.num_tokens
        sampled.append([token_id] if done else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def step(scheduler: Scheduler) -> tuple[SchedulerOutput, dict[int, Any]]:
    """One engine step with a fake model: ``schedule()`` then ``update_from_output()``."""
    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, fake_model_output(scheduler, out))
