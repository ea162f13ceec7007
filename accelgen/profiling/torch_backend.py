"""``--backend torch``: time a random-initialised decoder of the model's real shape."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from accelgen.config import ModelProfile
from accelgen.profiling.grid import Shape
from accelgen.profiling.measure import Measurement, interleaved
from accelgen.profiling.torch_model import DEFAULT_KV_BUDGET_BYTES, build_model, make_batch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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

    def torch_dtype(self) -> torch.dtype:
        name = self.dtype
        if name == "auto":
            name = "float16" if self.device.startswith("cuda") else "float32"
        try:
            return DTYPES[name]
        except KeyError:
            raise ValueError(f"unknown dtype {name!r}; known: auto, {', '.join(DTYPES)}") from None


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
    net = build_model(model, opts.device, dtype, seed=opts.seed)
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
