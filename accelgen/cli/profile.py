"""``accelgen profile``: measure iteration latency over forward sizes, write a profile CSV, and
compute the pivot forward size S_pf / T_pf with the simulator's rule.

Backends: ``torch`` (a random-initialised decoder of the model's real shape, CUDA when present,
else CPU), ``vllm`` (engine step timings of a real vLLM engine; run it with the Python that has
vllm installed), ``analytic`` (the calibrated analytic model written as a table, for machines
without the paper's GPUs: not a measurement, and the CSV says so) and ``auto`` (the pipeline's
stage for a --deployment: torch on the GPU when one is present and the deployment runs on one
GPU, else analytic, and it says which).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from accelgen.cli.options import hidden_alias
from accelgen.core.specs import Deployment
from accelgen.costmodel.datasheets import MODELS, resolve_deployment, resolve_model
from accelgen.costmodel.table import read_profile_csv
from accelgen.profiling.measure import Measurement, PivotReport, pivot_report, write_profile

BACKENDS = ("auto", "torch", "vllm", "analytic")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure iteration latency vs forward size; pivot S_pf",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, default="torch",
                   help="auto: torch on CUDA for a one-GPU --deployment, else analytic")
    p.add_argument("--model", help=f"torch: a model shape ({', '.join(MODELS)}); vllm: one "
                   "of those (random weights), or a Hugging Face id or local directory (real "
                   "weights, e.g. facebook/opt-13b)")
    p.add_argument("--deployment", help="analytic: a default deployment (e.g. opt-13b)")
    p.add_argument("--hardware", help="analytic: hardware profile (default: the deployment's)")
    p.add_argument("--tp", type=int, help="analytic: tensor-parallel degree; vllm: GPUs of the "
                   "engine (tensor_parallel_size)")
    p.add_argument("--pp", type=int, help="analytic: pipeline-parallel degree")
    p.add_argument("--device", help="torch: cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--dtype", default="auto",
                   help="torch: float32, float16, bfloat16 (auto: float16 on CUDA, float32 on CPU)")
    p.add_argument("--threads", type=int,
                   help="CPU threads (torch.set_num_threads; vLLM: its OpenMP threads)")
    p.add_argument("--attention", choices=("auto", "flash", "sdpa"), default="auto",
                   help="torch: flash-attn's varlen kernel (CUDA, fp16/bf16, package flash-attn) "
                        "or torch SDPA; auto: flash where it can run, else SDPA (the profile's "
                        "`attention` metadata says which and why)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="torch: wall time, or CPU time of the model thread (needs --threads 1; "
                        "robust to other processes competing for the cores)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes (median is kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first")
    p.add_argument("--max-tokens", type=int,
                   help="largest forward size / sequence length (default: max_model_len, <= 8192)")
    p.add_argument("--grid", choices=("cpu", "gpu"),
                   help="shape sweep: cpu (small) or gpu (the paper's range); default: torch by "
                        "device, vllm cpu")
    p.add_argument("--quick", action="store_true",
                   help="a few fresh-prefill sizes and decode/mixed shapes only (tests)")
    p.add_argument("--block-size", type=int, default=32, help="pivot sweep step (KV block size)")
    p.add_argument("--tolerance", type=float, help="pivot tolerance (default 0.03)")
    p.add_argument("--max-num-seqs", type=int, default=128, help="vllm: engine max_num_seqs")
    p.add_argument("--num-gpu-blocks", type=int,
                   help="vllm: KV blocks of the engine (num_gpu_blocks_override; default: "
                        "what VLLM_CPU_KVCACHE_SPACE holds)")
    hidden_alias(p, "--num-blocks", "num_gpu_blocks")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="vllm: engine token budget per step (largest profiled forward size)")
    p.add_argument("--max-model-len", type=int, default=2048, help="vllm: engine max_model_len")
    p.add_argument("--engine", help="vllm: JSON of more engine settings (the replay's "
                   "EngineSpec fields, e.g. '{\"dtype\": \"float16\", \"extra_args\": "
                   "{\"enforce_eager\": false}}'); the pipeline passes a deployment's `engine:`")
    p.add_argument("--work-dir", type=Path, help="vllm: where the model's config.json is "
                   "written (default: a temporary directory)")
    p.add_argument("--out", type=Path, help="profile CSV to write (required unless --from-csv)")
    p.add_argument("--from-csv", type=Path,
                   help="measure nothing: report the pivot of an existing profile CSV (and "
                        "--plot it), e.g. one written where matplotlib is missing")
    p.add_argument("--plot", type=Path, help="throughput/latency plot (.png also writes .pdf)")
    p.set_defaults(func=run)


def _max_tokens(args: argparse.Namespace, max_model_len: int) -> int:
    top = min(max_model_len, 8192)
    if args.max_tokens is not None:
        if not 16 <= args.max_tokens <= max_model_len:
            raise ValueError(f"--max-tokens must be in 16..{max_model_len}")
        top = args.max_tokens
    return top


def _analytic_deployment(args: argparse.Namespace) -> Deployment:
    if args.deployment is None and args.model is None:
        raise ValueError("--backend analytic needs --deployment (or --model)")
    dep = resolve_deployment(args.deployment) if args.deployment else Deployment(model=args.model)
    updates = {k: v for k, v in (("model", args.model if args.deployment else None),
                                 ("hardware", args.hardware), ("tp", args.tp), ("pp", args.pp))
               if v is not None}
    updates["block_size"] = args.block_size
    if args.tolerance is not None:
        updates["pivot_tolerance"] = args.tolerance
    return Deployment.model_validate({**dep.model_dump(), **updates})


def resolve_auto(args: argparse.Namespace) -> str:
    """The backend ``auto`` stands for here, with the reason printed."""
    if args.deployment is None:
        raise ValueError("--backend auto needs --deployment")
    dep = _analytic_deployment(args)
    gpus = dep.tp * dep.pp
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda and gpus == 1:
        print(f"profile: CUDA device found; measuring {dep.model} with the torch backend")
        args.model, args.device = dep.model, args.device or "cuda"
        return "torch"
    why = "no CUDA device" if not cuda else f"{dep.model} is deployed on {gpus} GPUs (the torch " \
        "backend profiles one device)"
    print(f"profile: {why}; writing the calibrated analytic profile of {args.deployment} "
          "(not a measurement of this machine)")
    return "analytic"


def _measure(args: argparse.Namespace) -> tuple[list[Measurement], dict[str, object], int, str]:
    """Measurements, metadata, the model's max_model_len and its name."""
    def say(msg: str) -> None:
        print(f"  {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    if args.backend == "auto":
        args.backend = resolve_auto(args)

    if args.backend == "analytic":
        from accelgen.profiling.analytic_backend import profile_analytic

        dep = _analytic_deployment(args)
        meas, meta = profile_analytic(dep)
        model = resolve_model(dep.model)
        return meas, meta, dep.max_model_len or model.max_model_len, model.name

    if args.backend == "vllm":
        return _measure_vllm(args, say)
    model = resolve_model(args.model or "tiny")
    if args.backend == "torch":
        top = _max_tokens(args, model.max_model_len)
        from accelgen.profiling.grid import cpu_grid, gpu_grid, quick_grid
        from accelgen.profiling.torch_backend import TorchOptions, default_device, profile_torch

        device = args.device or default_device()
        grid = args.grid or ("gpu" if device.startswith("cuda") else "cpu")
        shapes = quick_grid(top) if args.quick else (
            gpu_grid(top) if grid == "gpu" else cpu_grid(top))
        # The standard grid's chunks over 4096 tokens of context and its decodes at 4096 tokens
        # per sequence do not fit a model of a 4K context: left out, as the vllm backend does.
        fits = [s for s in shapes if s.max_len() <= model.max_model_len]
        if len(fits) < len(shapes):
            say(f"{len(shapes) - len(fits)} shapes of the {grid} grid need more than the "
                f"{model.max_model_len} positions of {model.name}: left out")
        shapes = fits
        opts = TorchOptions(device=device, dtype=args.dtype, threads=args.threads,
                            repeats=args.repeats, warmup=args.warmup, clock=args.clock,
                            attention=args.attention)
        say(f"torch profile of {model.name} on {device}: {len(shapes)} shapes x "
            f"({args.warmup} + {args.repeats}) passes")
        meas, meta = profile_torch(model, shapes, opts, progress=say)
        return meas, meta, model.max_model_len, model.name
    raise ValueError(f"unknown backend {args.backend!r}")


def _measure_vllm(args: argparse.Namespace, say: Callable[[str], None]
                  ) -> tuple[list[Measurement], dict[str, object], int, str]:
    """``--backend vllm``: ``--model`` is ``tiny``, a built-in shape (random weights), or a
    Hugging Face id / local directory (real weights; on GPUs, ``--tp`` of them)."""
    from accelgen.profiling.vllm_backend import VllmOptions, profile_vllm

    try:
        engine = json.loads(args.engine) if args.engine else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"--engine: not valid JSON: {exc}") from None
    if not isinstance(engine, dict):
        raise ValueError("--engine: expected a JSON object of engine settings")
    if args.tp is not None and args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    top = min(args.max_tokens or args.max_model_len, args.max_model_len)
    opts_v = VllmOptions(model=args.model or "tiny", tp=args.tp or 1, grid=args.grid or "cpu",
                         max_tokens=top, repeats=args.repeats,
                         warmup=args.warmup, threads=args.threads, quick=args.quick,
                         max_num_seqs=args.max_num_seqs, num_blocks=args.num_gpu_blocks,
                         block_size=args.block_size,
                         max_num_batched_tokens=args.max_num_batched_tokens,
                         max_model_len=args.max_model_len, engine=engine,
                         work_dir=args.work_dir or Path(tempfile.mkdtemp(prefix="accelgen-prof-")))
    say(f"vllm profile of {opts_v.model} ({opts_v.tp} GPU(s) if on CUDA), grid {opts_v.grid}")
    meas, meta = profile_vllm(opts_v, progress=say)
    return meas, meta, args.max_model_len, opts_v.model


SHOWN_SIZES = {16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 2048, 4096, 8192}


def print_report(report: PivotReport, name: str) -> None:
    for line in report.lines():
        print(f"{name}: {line}")
    best = max(p.throughput for p in report.curve)
    print(f"{'forward size':>12} {'T (ms)':>10} {'tokens/s':>10} {'vs best':>8}")
    long = len(report.curve) > 30
    for p in report.curve:
        if long and p.size not in SHOWN_SIZES and p.size != report.measured.s_pf:
            continue
        mark = "  <- S_pf (profiled points)" if p.size == report.measured.s_pf else ""
        print(f"{p.size:>12} {p.time_s * 1e3:>10.3f} {p.throughput:>10.0f} "
              f"{p.throughput / best:>8.1%}{mark}")


def _model_len_from_csv(path: Path, default: int) -> int:
    """max_model_len recorded by a vllm profile (its engine spec), else ``default``."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        if key.strip() == "engine":
            try:
                return int(json.loads(value)["max_model_len"])
            except (ValueError, KeyError, TypeError):
                return default
    return default


def replot(args: argparse.Namespace) -> int:
    path: Path = args.from_csv
    rows = read_profile_csv(path)
    name = args.model or path.stem
    default_len = resolve_model(args.model).max_model_len if args.model else 2048
    report = pivot_report(rows, _model_len_from_csv(path, default_len), args.block_size,
                          args.tolerance)
    print_report(report, name)
    if args.plot is not None:
        from accelgen.profiling.plot import plot_profile

        files = plot_profile(rows, report, args.plot, title=f"{name}: {path.name}")
        print("plot: " + ", ".join(str(f) for f in files))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.from_csv is not None:
        return replot(args)
    if args.out is None:
        raise ValueError("--out is required (or --from-csv to re-read a profile)")
    started = time.time()
    meas, meta, max_model_len, name = _measure(args)
    rows = [m.row() for m in meas]
    report = pivot_report(rows, max_model_len, args.block_size, args.tolerance)
    meta = {
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **meta,
        "elapsed_s": f"{time.time() - started:.0f}",
        "S_pf": report.model.s_pf,
        "T_pf_s": f"{report.model.t_pf:.6g}",
        "S_pf_measured_points": report.measured.s_pf,
        "pivot_rule": f"accelgen.costmodel.pivot.find_pivot(tolerance={report.tolerance:g}, "
                      f"step={report.step}, max_size={report.max_size})",
    }
    write_profile(args.out, meas, meta)
    read_profile_csv(args.out)  # the simulator can read what was written
    print_report(report, name)
    print(f"profile: {args.out} ({len(rows)} shapes)")
    if args.plot is not None:
        try:
            from accelgen.profiling.plot import plot_profile

            files = plot_profile(rows, report, args.plot,
                                 title=f"{name}, {args.backend}: {meta.get('device', '')}")
        except ModuleNotFoundError as exc:  # e.g. the vLLM environment has no matplotlib
            print(f"no plot ({exc}); plot later with: accelgen profile --from-csv {args.out} "
                  f"--plot {args.plot}", file=sys.stderr)
            return 0
        print("plot: " + ", ".join(str(f) for f in files))
    return 0
