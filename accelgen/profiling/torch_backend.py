"""``--backend torch``: time a random-initialised decoder of the model's real shape.

Attention runs through flash-attn's varlen kernel (``flash_attn_varlen_func``, the kernel family
the paper's engine uses) on a CUDA device when the ``flash-attn`` package is installed, else
through torch's SDPA; the profile's metadata (``attention``) says which and, for SDPA, why.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from accelgen.core.specs import ModelProfile
from accelgen.profiling.grid import Shape
from accelgen.profiling.measure import Measurement, interleaved
from accelgen.profiling.torch_model import (
    DEFAULT_KV_BUDGET_BYTES,
    VarlenAttention,
    build_model,
    make_batch,
)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ATTENTION = ("auto", "flash", "sdpa")


@dataclass(frozen=True, slots=True)
class TorchOptions:
    device: str = "cpu"
    dtype: str = "auto"  # float16 on CUDA, float32 on CPU
    threads: int | None = None  # CPU threads (torch.set_num_threads); default: all cores
    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    kv_budget_bytes: int = DEFAULT_KV_BUDGET_BYTES
    # "wall": elapsed time. "cpu": CPU time of the timing thread, which excludes the time the
    # process waits for a core on a shared machine; only meaningful with one CPU thread.
    clock: str = "wall"
    # "auto": flash-attn's varlen kernel on CUDA when installed (fp16/bf16), else SDPA;
    # "flash": that kernel or an error; "sdpa": torch's scaled_dot_product_attention.
    attention: str = "auto"

    def torch_dtype(self) -> torch.dtype:
        name = self.dtype
        if name == "auto":
            name = "float16" if self.device.startswith("cuda") else "float32"
        try:
            return DTYPES[name]
        except KeyError:
            raise ValueError(f"unknown dtype {name!r}; known: auto, {', '.join(DTYPES)}") from None


def flash_varlen() -> tuple[VarlenAttention | None, str]:
    """``flash_attn.flash_attn_varlen_func`` and its version, or None and why not."""
    try:
        import flash_attn
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:  # not installed, or built against another torch/CUDA
        return None, f"{type(exc).__name__}: {exc}"
    return flash_attn_varlen_func, str(getattr(flash_attn, "__version__", "unknown version"))


def select_attention(opts: TorchOptions, dtype: torch.dtype,
                     probe: Callable[[], tuple[VarlenAttention | None, str]] = flash_varlen
                     ) -> tuple[VarlenAttention | None, str]:
    """The attention path of a profile: (varlen kernel or None for SDPA, the metadata text)."""
    if opts.attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {opts.attention!r}")
    sdpa = "torch SDPA (scaled_dot_product_attention per group of equally shaped sequences)"
    if opts.attention == "sdpa":
        return None, f"{sdpa}: chosen with --attention sdpa"
    why = None
    if not opts.device.startswith("cuda"):
        why = f"flash-attn's kernels need a CUDA device, this profile runs on {opts.device}"
    elif dtype not in (torch.float16, torch.bfloat16):
        why = f"flash-attn needs float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    kernel = None
    if why is None:
        kernel, info = probe()
        if kernel is None:
            why = f"flash-attn is not usable here ({info}; pip install 'accelgen[gpu]')"
    if why is not None:
        if opts.attention == "flash":
            raise ValueError(f"--attention flash: {why}")
        return None, f"{sdpa}; fallback: {why}"
    return kernel, (f"flash-attn {info} flash_attn_varlen_func (one call per layer over the "
                    "packed ragged batch, causal mask aligned to each sequence's end)")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def profile_torch(model: ModelProfile, shapes: Sequence[Shape], opts: TorchOptions,
                  progress: Callable[[str], None] | None = None
                  ) -> tuple[list[Measurement], dict[str, object]]:
    """Median iteration latency of every shape; returns the measurements and CSV metadata."""
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device")
    threads = opts.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    if opts.clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be wall or cpu, got {opts.clock!r}")
    if opts.clock == "cpu" and (threads != 1 or opts.device != "cpu"):
        raise ValueError("--clock cpu needs --device cpu and --threads 1 (CPU time of the one "
                         "thread that runs the model)")
    clock = time.thread_time if opts.clock == "cpu" else time.perf_counter
    dtype = opts.torch_dtype()
    varlen, attention = select_attention(opts, dtype)
    if progress is not None:
        progress(f"attention: {attention}")
    net = build_model(model, opts.device, dtype, seed=opts.seed, varlen=varlen)
    cuda = opts.device.startswith("cuda")
    shared: set[Shape] = set()

    def run_once(shape: Shape) -> float:
        batch = make_batch(net, shape, opts.kv_budget_bytes)
        if batch.shared_cache:
            shared.add(shape)
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        net(batch)
        if cuda:
            torch.cuda.synchronize()
        return clock() - t0

    meas = interleaved(shapes, run_once, opts.repeats, opts.warmup, progress)
    hw = torch.cuda.get_device_name(opts.device) if cuda else f"{cpu_name()}, {threads} threads"
    meta: dict[str, object] = {
        "backend": "torch (random-initialised decoder of the model's shape, accelgen.profiling."
                   "torch_model)",
        "model": f"{model.name} (layers {model.num_layers}, hidden {model.hidden_size}, heads "
                 f"{model.num_heads}/{model.num_kv_heads} kv, ffn {model.ffn_size}, vocab "
                 f"{model.vocab_size})",
        "device": f"{opts.device}: {hw}",
        "dtype": str(dtype).removeprefix("torch."),
        "attention": attention,
        "torch": torch.__version__,
        "repeats": f"{opts.repeats} timed passes after {opts.warmup} warm-up; latency_s is the "
                   "median",
        "clock": "wall (time.perf_counter)" if opts.clock == "wall" else
                 "cpu (time.thread_time of the model thread: excludes waiting for a core)",
        "load_average": _loadavg(),
    }
    if shared:
        meta["kv_cache"] = (f"{len(shared)} shapes above {opts.kv_budget_bytes >> 20} MiB of KV "
                            "shared one cache tensor across layers")
    return meas, meta
