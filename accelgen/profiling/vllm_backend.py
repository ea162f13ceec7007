"""``--backend vllm``: iteration latencies of a real vLLM engine, for the same sweep of shapes.

The engine is the replay runner's (``accelgen.vllm_integration.replay.build_engine``: in-process
engine core, stock vLLM scheduling through ``InstrumentedScheduler``, which logs every step's
batch composition). Each shape is produced by a short scenario of requests and timed over a burst
of consecutive steps of that shape:

- fresh prefill of P tokens in k chunks: k new prompts (``max_tokens=1``) before every step, so
  every step prefills k fresh prompts (the first step of the burst is not timed);
- a chunk of C tokens over X tokens of prior context: per sample, one prompt of X + C tokens, an
  untimed step with the token budget (``max_num_scheduled_tokens``) set to X, then the timed step
  with it set to C;
- B decodes over contexts of about c: B prompts of c tokens, stepped until all are decoding (with
  a token budget below B x c the prompts are prefilled over several steps, so the contexts differ
  by the tokens the earlier ones decoded meanwhile), ``settle`` untimed decode steps, then the
  timed steps (contexts grow by one token per sequence and step; the row keeps the median);
- mixed: the decode setup, then a new prompt of P tokens before every timed step.

A sample is the wall time from the end of one engine step to the end of the next
(``LLMEngine.step()``: scheduling, model execution, sampling, output processing, plus adding the
step's new prompts): the spacing of two consecutive tokens in a busy replay. Steps are timed back
to back because this engine's first step after an idle moment, and its first decode steps after a
prefill, are measurably slower (about 1.5 ms on the tiny CPU model) than the steady state that
most steps of a replay are in. Every timed step's composition, as the scheduler logged it, is
checked against the plan.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accelgen.costmodel.datasheets import MODELS
from accelgen.profiling.grid import Shape, cpu_grid, gpu_grid, quick_grid
from accelgen.profiling.measure import Measurement

Progress = Callable[[str], None]


@dataclass(slots=True)
class VllmOptions:
    # "tiny": the replay runner's TinyModelSpec; a MODELS name: random weights of that shape; any
    # other string: a Hugging Face model id or local directory, served with its real weights.
    model: str = "tiny"
    tp: int = 1  # tensor-parallel GPUs of the engine
    grid: str = "cpu"  # "cpu": profiling.grid.cpu_grid; "gpu": the paper's range (gpu_grid)
    max_tokens: int = 2048
    repeats: int = 5
    warmup: int = 1
    threads: int | None = None
    quick: bool = False
    max_num_seqs: int = 128
    num_blocks: int | None = None
    block_size: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    work_dir: Path | None = None
    settle: int = 2  # untimed decode steps before timed decode or mixed steps
    burst: int = 4  # timed consecutive steps of a shape per pass
    # Overrides of the engine spec (``EngineSpec`` fields), e.g. from a fidelity config, so that
    # the profile is measured on exactly the engine the replay uses.
    engine: dict[str, Any] = field(default_factory=dict)


def hf_config(name: str) -> dict[str, Any]:
    """A Hugging Face config.json for a MODELS shape (OPT or Llama architecture)."""
    m = MODELS[name]
    if m.gated_ffn:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": m.hidden_size, "intermediate_size": m.ffn_size,
                "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
                "num_key_value_heads": m.num_kv_heads, "vocab_size": m.vocab_size,
                "max_position_embeddings": m.max_model_len, "rms_norm_eps": 1e-6,
                "hidden_act": "silu", "torch_dtype": "float32", "tie_word_embeddings": False,
                "bos_token_id": 1, "eos_token_id": 2}
    return {"architectures": ["OPTForCausalLM"], "model_type": "opt",
            "hidden_size": m.hidden_size, "ffn_dim": m.ffn_size,
            "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
            "vocab_size": m.vocab_size, "max_position_embeddings": m.max_model_len,
            "word_embed_proj_dim": m.hidden_size, "do_layer_norm_before": True,
            "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine":
            True, "torch_dtype": "float32", "tie_word_embeddings": True,
            "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1}


def engine_spec(opts: VllmOptions) -> Any:
    from accelgen.vllm_integration.replay import EngineSpec

    spec: dict[str, Any] = {
        "block_size": opts.block_size, "max_model_len": opts.max_model_len,
        "max_num_batched_tokens": opts.max_num_batched_tokens,
        "max_num_seqs": opts.max_num_seqs, "num_gpu_blocks": opts.num_blocks,
    }
    if opts.model in MODELS and opts.model != "tiny":
        work = Path(opts.work_dir or ".") / f"model-{opts.model}"
        work.mkdir(parents=True, exist_ok=True)
        (work / "config.json").write_text(json.dumps(hf_config(opts.model), indent=2) + "\n")
        spec["model"] = str(work)
    elif opts.model != "tiny":  # a real checkpoint: its weights, not random ones
        spec.update(model=opts.model, load_format="auto")
    if opts.tp > 1:
        spec["extra_args"] = {"tensor_parallel_size": opts.tp}
    spec.update(opts.engine)
    # One step at a time: the driver sets each step's budget and reads its outputs before the
    # next (async scheduling would schedule a step ahead of them).
    spec["async_scheduling"] = False
    return EngineSpec.model_validate(spec)


def vllm_shapes(opts: VllmOptions, max_seq_len: int, kv_tokens: int | None = None,
                block_size: int = 32) -> list[Shape]:
    """The sweep (``opts.grid``), limited to what one engine step and its KV cache can hold."""
    top = min(opts.max_tokens, max_seq_len)
    budget = opts.engine.get("max_num_batched_tokens", opts.max_num_batched_tokens)
    seqs = opts.engine.get("max_num_seqs", opts.max_num_seqs)
    grid = (quick_grid(top) if opts.quick else
            gpu_grid(top) if opts.grid == "gpu" else cpu_grid(top, max_num_seqs=seqs))
    return [s for s in grid if s.forward_size <= budget and s.max_len() < max_seq_len
            and s.decode_seqs + s.prefill_seqs <= seqs
            and (kv_tokens is None or kv_need(s, block_size) <= kv_tokens)]


def kv_need(shape: Shape, block_size: int) -> int:
    """KV tokens (whole blocks) the sequences of one step hold at its end."""
    lengths = [c + shape.prefill_ctx for c in shape.chunks()] + \
        [c + 1 for c in shape.decode_contexts()]
    return sum(-(-n // block_size) * block_size for n in lengths)


class _Driver:
    """Builds each shape's scenario on one engine and times a burst of steps of that shape."""

    def __init__(self, engine: Any, sched: Any, vocab: int, settle: int = 2,
                 burst: int = 4) -> None:
        self.engine, self.sched, self.vocab = engine, sched, vocab
        self.settle, self.burst = settle, burst
        self.budget = int(sched.max_num_scheduled_tokens)
        self.n = 0

    def _add(self, prompt_len: int, max_tokens: int) -> str:
        from vllm import SamplingParams

        self.n += 1
        rid = f"p{self.n}"
        ids = [3 + (self.n * 7919 + i) % (self.vocab - 3) for i in range(prompt_len)]
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False)
        # The engine may extend the id to keep it unique; the scheduler knows the returned one.
        return str(self.engine.add_request(rid, {"prompt_token_ids": ids}, sp))

    def _step(self, budget: int | None = None) -> tuple[Any, ...]:
        """One engine step (at a token budget); returns its IterationLog row."""
        before = len(self.sched.log)
        self.sched.max_num_scheduled_tokens = budget or self.budget
        try:
            self.engine.step()
        finally:
            self.sched.max_num_scheduled_tokens = self.budget
        if len(self.sched.log) != before + 1:
            raise RuntimeError("an engine step scheduled nothing")
        return self.sched.log.row(-1)

    def _drain(self, ids: list[str]) -> None:
        live = [i for i in ids if i in self.sched.requests]
        if live:
            self.engine.abort_request(live, internal=True)
        for _ in range(1000):
            if not self.engine.has_unfinished_requests():
                return
            self.engine.step()
        raise RuntimeError("engine did not drain after the scenario")

    def _decoding(self, shape: Shape, ids: list[str]) -> None:
        """Add the decode batch and step until every prompt is prefilled, then settle."""
        c = shape.decode_ctx // shape.decode_seqs
        steps = shape.decode_seqs * c // self.budget + 8
        max_tokens = steps + self.settle + self.burst + 4
        ids += [self._add(c, max_tokens) for _ in range(shape.decode_seqs)]
        for _ in range(steps):
            reqs = [self.sched.requests.get(i) for i in ids]
            if all(r is not None and r.num_computed_tokens >= r.num_prompt_tokens for r in reqs):
                break
            self._step()
        else:
            raise RuntimeError(f"{shape}: prompts not prefilled after {steps} steps")
        for _ in range(self.settle):
            self._step()

    def run(self, shape: Shape) -> list[tuple[Shape, float]]:
        """``burst`` timed steps of ``shape``: each sample is the time from the end of the
        previous step to the end of this one (arrivals added in between included), the spacing
        of a busy engine's steps. The engine is busy before the first timed step."""
        ids: list[str] = []
        out: list[tuple[Shape, float]] = []
        try:
            if shape.decode_seqs:
                self._decoding(shape, ids)
            if shape.prefill_ctx:
                if shape.prefill_seqs != 1 or shape.decode_seqs:
                    raise ValueError(f"{shape}: chunks over context: one chunk, no decodes")
                if shape.prefill_ctx > self.budget:
                    raise ValueError(f"{shape}: context above the engine's token budget")
                for _ in range(self.burst):
                    ids.append(self._add(shape.prefill_ctx + shape.prefill_tokens, 1))
                    self._step(shape.prefill_ctx)  # untimed: the context
                    t0 = time.perf_counter()
                    row = self._step(shape.prefill_tokens)
                    out.append((_observed(shape, row), time.perf_counter() - t0))
                return out
            # Fresh prefills (alone or beside the decodes): new prompts before every step.
            warm = 0 if shape.decode_seqs else 1
            t_end = time.perf_counter()
            for i in range(warm + self.burst):
                ids += [self._add(n, 1) for n in shape.chunks()]
                row = self._step()
                t = time.perf_counter()
                if i >= warm:
                    out.append((_observed(shape, row), t - t_end))
                t_end = t
            return out
        finally:
            self._drain(ids)


def _representative(seen: list[Shape]) -> Shape:
    """One row for a burst's steps: they share the prefill part and the decode count; decode
    contexts grow by one token per sequence and step, so the median total is kept."""
    first = seen[0]
    if any((g.prefill_tokens, g.prefill_seqs, g.prefill_ctx, g.decode_seqs)
           != (first.prefill_tokens, first.prefill_seqs, first.prefill_ctx, first.decode_seqs)
           for g in seen):
        raise RuntimeError(f"steps of one shape differ: {sorted(set(seen), key=str)[:3]}")
    ctx = round(float(np.median([g.decode_ctx for g in seen])))
    return Shape(first.prefill_tokens, first.prefill_seqs, first.prefill_ctx,
                 first.decode_seqs, ctx)


def _observed(planned: Shape, row: tuple[Any, ...]) -> Shape:
    """The logged composition of the timed step (IterationLog row), checked against the plan."""
    # IterationLog row: start, latency, forward_size, prefill_tokens, decode_tokens,
    # num_prefill_seqs, batch_size, prefill_attn, decode_ctx, ...
    prefill_tokens, decode_seqs = int(row[3]), int(row[4])
    prefill_seqs, prefill_attn, decode_ctx = int(row[5]), float(row[7]), int(row[8])
    got = Shape(prefill_tokens, prefill_seqs, planned.prefill_ctx if prefill_tokens else 0,
                decode_seqs, decode_ctx)
    ok = (prefill_tokens == planned.prefill_tokens and prefill_seqs == planned.prefill_seqs
          and decode_seqs == planned.decode_seqs
          and abs(got.row(1.0).shape().prefill_attn - prefill_attn) <= 1e-6 * max(1.0,
                                                                                  prefill_attn))
    if planned.decode_seqs and not planned.prefill_ctx:
        # Staggered prefills leave contexts a little above the plan; never below.
        ok = ok and decode_ctx >= planned.decode_ctx
    else:
        ok = ok and decode_ctx == planned.decode_ctx
    if not ok:
        raise RuntimeError(f"planned {planned}, but the engine ran prefill_tokens="
                           f"{prefill_tokens} in {prefill_seqs} chunks (attention pairs "
                           f"{prefill_attn}), {decode_seqs} decodes over {decode_ctx} tokens")
    return got


class ProfileSession:
    """A vLLM profiling engine in a child process, driven pass by pass (an in-process vLLM
    engine cannot coexist with another one in the same process). Use as a context manager:
    ``passes(n)`` times n passes over all shapes, ``finish()`` returns the measurements and the
    CSV metadata."""

    def __init__(self, opts: VllmOptions, progress: Progress | None = None) -> None:
        import importlib.util
        import os

        if importlib.util.find_spec("vllm") is None:
            raise ValueError("--backend vllm needs vllm in this Python (CPU: `bash "
                             "scripts/install_vllm_cpu.sh <venv>`; run that venv's python -m "
                             "accelgen.cli profile ...)")
        self.opts, self.say = opts, progress or (lambda _m: None)
        from accelgen.vllm_integration.engine_process import engine_context, with_environment

        ctx = engine_context()
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=with_environment,
                                 args=(dict(os.environ), _profile_worker, child, opts),
                                 daemon=True)
        self._samples: dict[Shape, list[float]] = {}
        self._seen: dict[Shape, list[Shape]] = {}
        self._passes = 0

    def __enter__(self) -> ProfileSession:
        t0 = time.time()
        self._proc.start()
        self.shapes: list[Shape] = self._call(("start", None))
        self.say(f"engine ready in {time.time() - t0:.0f} s ({len(self.shapes)} shapes)")
        for _ in range(self.opts.warmup):
            self._call(("pass", None))
        return self

    def __exit__(self, *exc: object) -> None:

        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(None)
        self._proc.join(timeout=120)

    def _call(self, msg: tuple[str, Any]) -> Any:
        try:
            self._conn.send(msg)
            kind, value = self._conn.recv()
        except (EOFError, ConnectionError) as exc:
            raise RuntimeError(f"the vLLM profiling engine process exited (exit code "
                               f"{self._proc.exitcode}); its output is above") from exc
        if kind == "error":
            raise RuntimeError(f"vLLM profiling engine failed: {value}")
        return value

    def passes(self, n: int) -> None:
        for _ in range(n):
            got: dict[Shape, list[tuple[Shape, float]]] = self._call(("pass", None))
            for s, pairs in got.items():
                self._samples.setdefault(s, []).extend(dt for _, dt in pairs)
                self._seen.setdefault(s, []).extend(g for g, _ in pairs)
            self._passes += 1
            self.say(f"pass {self._passes} done ({len(self.shapes)} shapes x "
                     f"{self.opts.burst} steps)")

    def finish(self) -> tuple[list[Measurement], dict[str, object]]:
        if not self._passes:
            raise RuntimeError("no timed pass")
        meas = [Measurement(_representative(self._seen[s]), list(self._samples[s]))
                for s in self.shapes]
        return meas, _metadata(self.opts, self._passes, self._call(("info", None)))


def _profile_worker(conn: Any, opts: VllmOptions) -> None:
    """The engine side of ``ProfileSession``: answers ("kind", value) to each command."""
    import os

    if opts.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    from accelgen.vllm_integration.replay import (
        ReplayConfig,
        build_engine,
        engine_env_defaults,
        engine_scheduler,
        shutdown_engine,
    )

    env = engine_env_defaults()  # before the engine's first oneDNN kernel (build_engine too)

    engine = None
    try:
        spec = engine_spec(opts)
        engine = build_engine(ReplayConfig(system="stock", engine=spec), opts.work_dir)
        sched = engine_scheduler(engine)
        vocab = spec.tiny.vocab_size if spec.model is None else _vocab_size(engine, opts.model)
        kv_tokens = (sched.kv_cache_manager.block_pool.num_gpu_blocks - 1) * sched.block_size
        shapes = vllm_shapes(opts, int(sched.max_model_len), kv_tokens, sched.block_size)
        driver = _Driver(engine, sched, vocab, opts.settle, opts.burst)
        while (msg := conn.recv()) is not None:
            cmd = msg[0]
            try:
                if cmd == "start":
                    conn.send(("ok", shapes))
                elif cmd == "pass":
                    out = {s: driver.run(s) for s in shapes}
                    sched.reset_records()
                    conn.send(("ok", out))
                elif cmd == "info":
                    import torch
                    import vllm

                    conn.send(("ok", {"spec": spec.model_dump(mode="json"),
                                      "vllm": vllm.__version__, "torch": torch.__version__,
                                      "threads": torch.get_num_threads(), "env": env,
                                      "device": _device_name(torch)}))
                else:
                    conn.send(("error", f"unknown command {cmd!r}"))
            except Exception as exc:  # report to the parent instead of dying silently
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if engine is not None:
            shutdown_engine(engine)


def _vocab_size(engine: Any, model: str) -> int:
    """Token ids the engine's model accepts (a real checkpoint's own vocabulary)."""
    if model in MODELS:
        return MODELS[model].vocab_size
    return int(engine.model_config.get_vocab_size())


def _device_name(torch: Any) -> str:
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"cuda: {n} x {torch.cuda.get_device_name(0)}"
    return "cpu"


def _metadata(opts: VllmOptions, passes: int, info: dict[str, Any]) -> dict[str, object]:
    spec = info["spec"]
    return {
        "backend": "vllm (LLMEngine.step() wall time of an engine in a child process, stock "
                   "scheduler; accelgen.profiling.vllm_backend)",
        "model": opts.model if spec.get("model") is None else f"{opts.model} ({spec['model']})",
        "engine": json.dumps(spec, sort_keys=True),
        "device": f"{info.get('device', 'cpu')}: vllm {info['vllm']}, torch {info['torch']}, "
                  f"{info['threads']} threads",
        "engine_env": json.dumps(info.get("env", {}), sort_keys=True),
        "repeats": f"{passes} timed passes after {opts.warmup} warm-up, {opts.burst} steps of "
                   "each shape per pass; latency_s is the median",
        "clock": "wall (time.perf_counter, end of one LLMEngine.step() to the end of the next)",
        "load_average": _loadavg(),
    }


def profile_vllm(opts: VllmOptions, progress: Progress | None = None
                 ) -> tuple[list[Measurement], dict[str, object]]:
    """Step timings of a vLLM engine over the sweep; returns measurements and CSV metadata."""
    with ProfileSession(opts, progress) as session:
        session.passes(opts.repeats)
        return session.finish()


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"
