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

from accelgen.costmodel.base import BatchShape
from accelgen.costmodel.profiles import MODELS
from accelgen.profiling.grid import Shape, cpu_grid, gpu_grid, quick_grid
from accelgen.profiling.measure import Measurement

Progress = Callable[[str], None]
# CSV metadata keys: the measured extra time of a step whose token count is new to the engine;
# steady decode step periods by batch size (stock scheduling); a scheduler plugin's extra time
# per step as a + b x batch size (from the same decode probe on an engine with the plugin).
FIRST_USE_KEY = "first_use_penalty_s"
DECODE_PERIODS_KEY = "decode_periods_s"
PLUGIN_KEY = "plugin_overhead_s"
PLUGIN_SPREAD_KEY = "plugin_overhead_spread"
JITTER_KEY = "step_time_ratio_quantiles"
# The first-use penalty probed for each replay of a fidelity round ({system: seconds}), in a fresh
# engine started just before that replay (``fidelity.probe_first_use_fresh``): building kernels
# can cost several times more in a new process than the profiling engine measures meanwhile.
FIRST_USE_REPLAY_KEY = "first_use_penalty_by_replay_s"
# New token counts per probe slice of the profiling engine (``ProfileSession.first_use``).
FIRST_USE_SLICE = 12
# A session's passes (ProfileSession): the machine's speed during each timed pass relative to the
# whole profile (diagnostics of its drift; nothing reads it back).
PASS_SPEED_KEY = "pass_speeds"
JITTER_LEVELS = tuple(round(0.025 + 0.05 * i, 3) for i in range(20))  # 0.025 .. 0.975
DECODE_PROBE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)


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
        self.sizes_seen: set[int] = set()  # forward sizes (token counts) this engine has run

    def _add(self, prompt_len: int, max_tokens: int, extra: dict[str, Any] | None = None) -> str:
        from vllm import SamplingParams

        self.n += 1
        rid = f"p{self.n}"
        ids = [3 + (self.n * 7919 + i) % (self.vocab - 3) for i in range(prompt_len)]
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False, extra_args=extra)
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
        row = self.sched.log.rows[-1]
        self.sizes_seen.add(int(row[2]))
        return row

    def _drain(self, ids: list[str]) -> None:
        live = [i for i in ids if i in self.sched.requests]
        if live:
            self.engine.abort_request(live, internal=True)
        for _ in range(1000):
            if not self.engine.has_unfinished_requests():
                return
            before = len(self.sched.log)
            self.engine.step()
            if len(self.sched.log) > before:
                self.sizes_seen.add(int(self.sched.log.rows[-1][2]))
        raise RuntimeError("engine did not drain after the scenario")

    def probe_first_use(self, count: int = 20, lo: int = 24, hi: int = 1000,
                        decodes: int = 3) -> list[tuple[int, float, float]]:
        """(size, first step, later steps) of mixed steps (``decodes`` running decodes plus a
        fresh prompt) whose token count this engine has not run before, and of the same
        composition twice more (their mean). vLLM's CPU GEMMs (oneDNN) build a kernel for every
        new token count the first time they see it, so the first step of a new forward size
        costs more; the table holds warm costs and this probe measures the difference."""
        top = min(hi, self.budget - decodes)
        free = [s for s in range(lo, top) if s + decodes not in self.sizes_seen
                and s not in self.sizes_seen]
        if len(free) < count:
            raise RuntimeError(f"fewer than {count} unused token counts in {lo}..{top}")
        sizes = [free[round(i * (len(free) - 1) / max(count - 1, 1))] for i in range(count)]
        out = []
        ids: list[str] = []
        try:
            self._decoding(Shape.decode(decodes, 64), ids, max_tokens=12 * count + 20)
            for size in sizes:
                times = []
                for _ in range(3):
                    self._step()  # a decode step: busy before the timed one
                    t_end = time.perf_counter()
                    ids.append(self._add(size, 1))
                    row = self._step()
                    if int(row[2]) != size + decodes:
                        raise RuntimeError(f"probe step ran {row[2]} tokens, not "
                                           f"{size} + {decodes}")
                    times.append(time.perf_counter() - t_end)
                out.append((size, times[0], (times[1] + times[2]) / 2))
        finally:
            self._drain(ids)
        return out

    def _decoding(self, shape: Shape, ids: list[str], max_tokens: int | None = None,
                  extra: dict[str, Any] | None = None) -> None:
        """Add the decode batch and step until every prompt is prefilled, then settle."""
        c = shape.decode_ctx // shape.decode_seqs
        steps = shape.decode_seqs * c // self.budget + 8
        max_tokens = max_tokens or steps + self.settle + self.burst + 4
        ids += [self._add(c, max_tokens, extra) for _ in range(shape.decode_seqs)]
        for _ in range(steps):
            reqs = [self.sched.requests.get(i) for i in ids]
            if all(r is not None and r.num_computed_tokens >= r.num_prompt_tokens for r in reqs):
                break
            self._step()
        else:
            raise RuntimeError(f"{shape}: prompts not prefilled after {steps} steps")
        for _ in range(self.settle):
            self._step()

    def decode_periods(self, batches: tuple[int, ...], steps: int = 10,
                       extra: dict[str, Any] | None = None) -> list[tuple[int, float]]:
        """(batch size, step period) of steady decode steps at several batch sizes (prompts of
        64 tokens), e.g. to compare a scheduler plugin with stock scheduling."""
        out: list[tuple[int, float]] = []
        for b in batches:
            ids: list[str] = []
            try:
                self._decoding(Shape.decode(b, 64), ids, max_tokens=steps + 40, extra=extra)
                t_end = time.perf_counter()
                for _ in range(steps):
                    row = self._step()
                    t = time.perf_counter()
                    if int(row[3]) == 0:  # decode-only steps (a policy may run fewer decodes)
                        out.append((int(row[4]), t - t_end))
                    t_end = t
            finally:
                self._drain(ids)
        return out

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
    """A vLLM profiling engine in a child process, driven pass by pass.

    Profile passes can then be spread over a period, e.g. between the replays of a fidelity
    round, so that the profile and the replays see the machine in the same state on average
    (its speed drifts by tens of per cent within minutes here). The engine lives in its own
    process because an in-process vLLM engine cannot coexist with a replay's in one process.
    Use as a context manager; ``passes(n)`` times n passes over all shapes, ``finish()`` runs
    the probes and returns the measurements and CSV metadata.
    """

    def __init__(self, opts: VllmOptions, progress: Progress | None = None) -> None:
        import importlib.util
        import multiprocessing as mp

        if importlib.util.find_spec("vllm") is None:
            raise ValueError("--backend vllm needs vllm in this Python (CPU: `bash "
                             "scripts/install_vllm_cpu.sh <venv>`; run that venv's python -m "
                             "accelgen.cli profile ...)")
        self.opts, self.say = opts, progress or (lambda _m: None)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_profile_worker, args=(child, opts), daemon=True)
        self._samples: dict[Shape, list[float]] = {}
        self._seen: dict[Shape, list[Shape]] = {}
        self._pass_of: dict[Shape, list[int]] = {}  # the timed pass (0-based) of each sample
        self.pass_times: list[tuple[float, float]] = []  # (start, end) of each timed pass
        self._passes = 0
        # First-use probe slices run between passes: (start, end, [(size, first, warm)]).
        self.first_use_slices: list[tuple[float, float, list[tuple[int, float, float]]]] = []

    def __enter__(self) -> ProfileSession:
        t0 = time.time()
        self._proc.start()
        self.shapes: list[Shape] = self._call(("start", None))
        self.say(f"engine ready in {time.time() - t0:.0f} s ({len(self.shapes)} shapes)")
        for _ in range(self.opts.warmup):
            self._call(("pass", None))
        return self

    def __exit__(self, *exc: object) -> None:
        import contextlib

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
            t0 = time.time()
            got: dict[Shape, list[tuple[Shape, float]]] = self._call(("pass", None))
            self.pass_times.append((t0, time.time()))
            for s, pairs in got.items():
                self._samples.setdefault(s, []).extend(dt for _, dt in pairs)
                self._seen.setdefault(s, []).extend(g for g, _ in pairs)
                self._pass_of.setdefault(s, []).extend([self._passes] * len(pairs))
            self._passes += 1
            self.say(f"pass {self._passes} done ({len(self.shapes)} shapes x "
                     f"{self.opts.burst} steps)")

    def first_use(self, count: int = FIRST_USE_SLICE) -> list[tuple[int, float, float]]:
        """A slice of the first-use probe now: (size, first step, warm) of ``count`` token
        counts new to the engine (``finish`` pools every slice with its own probe)."""
        t0 = time.time()
        probe = [(int(n), float(c), float(w)) for n, c, w in self._call(("first_use", count))]
        self.first_use_slices.append((t0, time.time(), probe))
        self.say(f"first use of a token count now: +{first_use_penalty(probe) * 1e3:.2f} ms "
                 f"(median of {len(probe)})")
        return probe

    def snapshot(self) -> list[Measurement]:
        """The measurements of the passes so far (no probes)."""
        if not self._passes:
            raise RuntimeError("no timed pass")
        return [Measurement(_representative(self._seen[s]), list(self._samples[s]))
                for s in self.shapes]

    @property
    def num_passes(self) -> int:
        return self._passes

    def pass_speeds(self) -> list[float]:
        """Per timed pass, the median over shapes of (the pass's median sample of the shape /
        the shape's median over all passes): 1.2 = the machine ran 20 % slower than over the
        whole profile."""
        per: list[list[float]] = [[] for _ in range(self._passes)]
        for s, samples in self._samples.items():
            x, idx = np.asarray(samples), np.asarray(self._pass_of[s])
            med = float(np.median(x))
            for k in range(self._passes):
                if (idx == k).any():
                    per[k].append(float(np.median(x[idx == k])) / med)
        return [float(np.median(v)) for v in per]

    def finish(self) -> tuple[list[Measurement], dict[str, object]]:
        meas = self.snapshot()
        last, periods, info = self._call(("probe", None))
        probe = [p for _, _, ps in self.first_use_slices for p in ps] + [
            (int(n), float(c), float(w)) for n, c, w in last]
        penalty = first_use_penalty(probe)
        self.say(f"first use of a token count: +{penalty * 1e3:.2f} ms (median of {len(probe)})")
        meta = _metadata(self.opts, meas, probe, periods, penalty, self._passes, info)
        if self.first_use_slices:
            meta["first_use_slices"] = json.dumps(
                [{"start": round(a, 2), "end": round(b, 2),
                  "penalty_s": round(first_use_penalty(ps), 7), "n": len(ps)}
                 for a, b, ps in self.first_use_slices])
        speeds = self.pass_speeds()
        self.say("pass speeds (vs the whole profile): " + ", ".join(f"{v:.3f}" for v in speeds))
        meta[PASS_SPEED_KEY] = json.dumps([round(v, 4) for v in speeds])
        return meas, meta


def first_use_penalty(probe: list[tuple[int, float, float]]) -> float:
    """The median of (first step - the same composition warm) over probe samples."""
    if not probe:
        raise ValueError("no first-use probe samples")
    return float(np.median([c - w for _, c, w in probe]))


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
                elif cmd == "first_use":
                    conn.send(("ok", driver.probe_first_use(count=int(msg[1]))))
                elif cmd == "probe":
                    probe = driver.probe_first_use()
                    periods = driver.decode_periods(DECODE_PROBE_BATCHES)
                    import torch
                    import vllm

                    info = {"spec": spec.model_dump(mode="json"), "vllm": vllm.__version__,
                            "torch": torch.__version__, "threads": torch.get_num_threads(),
                            "env": env, "device": _device_name(torch)}
                    conn.send(("ok", (probe, periods, info)))
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


def _metadata(opts: VllmOptions, meas: list[Measurement], probe: list[tuple[int, float, float]],
              periods: list[tuple[int, float]], penalty: float, passes: int,
              info: dict[str, Any]) -> dict[str, object]:
    ratios = np.concatenate([np.asarray(m.samples) / m.median for m in meas])
    jitter = np.quantile(ratios, JITTER_LEVELS)
    cold = [c for _, c, _ in probe]
    warm = [w for _, _, w in probe]
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
        FIRST_USE_KEY: f"{penalty:.6g}",
        DECODE_PERIODS_KEY: json.dumps(_median_by_batch(periods)),
        JITTER_KEY: json.dumps({"levels": list(JITTER_LEVELS),
                                "ratios": [round(float(x), 4) for x in jitter],
                                "samples": len(ratios),
                                "what": "sample / median of its shape, all timed steps"}),
        "first_use_probe": (f"mixed steps (3 decodes + a fresh prompt) of {len(probe)} token "
                            f"counts new to the engine (prompts {min(p[0] for p in probe)}.."
                            f"{max(p[0] for p in probe)}; slices between the passes and a "
                            "final one): "
                            f"first step median {np.median(cold) * 1e3:.3f} ms, next two "
                            f"{np.median(warm) * 1e3:.3f} ms; {FIRST_USE_KEY} is the median "
                            "difference (accelgen.profiling.engine_model)"),
    }


def profile_vllm(opts: VllmOptions, progress: Progress | None = None
                 ) -> tuple[list[Measurement], dict[str, object]]:
    """Step timings of a vLLM engine over the sweep; returns measurements and CSV metadata."""
    with ProfileSession(opts, progress) as session:
        session.passes(opts.repeats)
        return session.finish()


def _median_by_batch(samples: list[tuple[int, float]]) -> dict[str, float]:
    by: dict[int, list[float]] = {}
    for b, t in samples:
        by.setdefault(b, []).append(t)
    return {str(b): float(np.median(ts)) for b, ts in sorted(by.items())}


def _fit_line(points: dict[int, float]) -> tuple[float, float]:
    xs = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(x)] for x in xs])
    if len(xs) < 2:
        raise ValueError("need two or more batch sizes to fit a line")
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(b)


def profile_plugin_overhead(opts: VllmOptions, profile_csv: Path, adapter: dict[str, Any],
                            progress: Progress | None = None, blocks: int = 48, block: int = 25,
                            tbt_slos: tuple[float, ...] = (0.01, 0.02, 0.05),
                            seed: int = 0) -> tuple[float, float, str]:
    """The extra time per step of a scheduler plugin (the AccelGen adapter running a policy),
    as a + b x batch size; adds it to the profile's metadata (``plugin_overhead_s``).

    Measured A/B: two engines of the same spec in two processes, one with stock scheduling and
    one with the plugin, run the same kind of request stream (prompts of 16..511 tokens, 8..64
    outputs, TBT SLOs from ``tbt_slos``, a target number of requests in the engine that cycles
    through 2, 4, 8 and 12) in alternating blocks of ``block`` steps, so that the machine's
    drift hits both alike. Each timed step's period (end of the previous step to the end of
    this one) minus the engine step model's warm prediction for its composition is its
    residual; the plugin's overhead at a batch size is the difference of the two engines'
    median residuals there, fitted as a line over the batch sizes with 20 or more steps in both.
    Steps whose token count is new to their engine, and the first two steps of a block, are not
    used. A period covers the plugin's decision, its queue handling and the model runner's work
    on the batch order it gets."""
    import multiprocessing as mp

    say = progress or (lambda _m: None)
    spec = engine_spec(opts).model_dump(mode="json")
    ctx = mp.get_context("spawn")
    workers = []
    for system in ("stock", "accelgen"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_ab_worker, args=(child, system, spec, adapter,
                                                    str(profile_csv), seed, tbt_slos,
                                                    str(opts.work_dir or ".")), daemon=True)
        proc.start()
        workers.append((system, parent, proc))
    resid: dict[str, dict[int, list[float]]] = {"stock": {}, "accelgen": {}}
    try:
        for _, conn, _ in workers:
            if conn.recv() != "ready":
                raise RuntimeError("A/B engine did not start")
        for k in range(blocks):
            target = (2, 4, 8, 12)[(k // 4) % 4]
            order = workers if k % 2 == 0 else workers[::-1]
            for system, conn, _ in order:
                conn.send((target, block))
                for batch, r in conn.recv():
                    resid[system].setdefault(batch, []).append(r)
    finally:
        for _, conn, proc in workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(None)
            proc.join(timeout=120)
    on, off = resid["accelgen"], resid["stock"]
    diff = {b: float(np.median(on[b]) - np.median(off[b])) for b in sorted(on)
            if b in off and len(on[b]) >= 20 and len(off[b]) >= 20}
    counts = {b: (len(on[b]), len(off[b])) for b in diff}
    a, b = _fit_line(diff)
    if b < 0:  # noise: an overhead does not shrink with more requests; use a weighted constant
        w = np.array([sum(counts[k]) for k in diff], dtype=float)
        a, b = float(np.average(list(diff.values()), weights=w)), 0.0
    # The plugin's step-to-step variation beyond the engine's own: quantiles of the plugin's
    # residuals minus those of stock scheduling, each centred on its batch size's median.
    cen = {m: np.concatenate([np.asarray(r[k]) - np.median(r[k]) for k in diff])
           for m, r in (("on", on), ("off", off))}
    spread = np.sort(np.quantile(cen["on"], JITTER_LEVELS)
                     - np.quantile(cen["off"], JITTER_LEVELS))  # a quantile function rises
    spread -= np.interp(0.5, JITTER_LEVELS, spread)
    text = (f"{a:.6g} + {b:.6g} x batch_size (A/B of two engines under a request stream, "
            f"plugin minus stock median step residual vs the engine step model, TBT SLOs "
            f"{list(tbt_slos)}; by batch size: "
            + ", ".join(f"{k}: {v * 1e3:+.3f} ms (n {counts[k][0]}/{counts[k][1]})"
                        for k, v in diff.items()) + ")")
    say(f"plugin overhead per step: {a * 1e3:.3f} ms + {b * 1e6:.1f} us x batch size; spread "
        f"p10..p90 {np.interp(0.1, JITTER_LEVELS, spread) * 1e3:+.3f}.."
        f"{np.interp(0.9, JITTER_LEVELS, spread) * 1e3:+.3f} ms")
    _append_metadata(profile_csv, PLUGIN_KEY, text)
    raw = Path(profile_csv).with_suffix(".plugin-ab.json")
    raw.write_text(json.dumps({m: {str(k): [round(x, 7) for x in v] for k, v in r.items()}
                               for m, r in (("plugin", on), ("stock", off))}) + "\n")
    _append_metadata(profile_csv, PLUGIN_SPREAD_KEY, json.dumps(
        {"levels": list(JITTER_LEVELS), "extra_s": [round(float(x), 7) for x in spread],
         "what": "quantiles of plugin step residuals minus those of stock scheduling, each "
                 "centred on the median of its batch size; the median is 0"}))
    return a, b, text


def _ab_worker(conn: Any, system: str, spec: dict[str, Any], adapter: dict[str, Any],
               profile_csv: str, seed: int, tbt_slos: tuple[float, ...], work_dir: str) -> None:
    """One engine of the A/B plugin probe: runs blocks of steps of a request stream on demand
    and answers (batch size, residual) pairs."""
    import random as _random

    from accelgen.profiling.engine_model import EngineStepModel
    from accelgen.vllm_integration.replay import (
        ReplayConfig,
        build_engine,
        engine_scheduler,
        shutdown_engine,
    )

    model = EngineStepModel.from_csv(profile_csv)
    cfg = ReplayConfig.model_validate({"system": system, "engine": spec,
                                       "adapter": adapter if system != "stock" else {}})
    engine = build_engine(cfg, Path(work_dir) / f"ab-{system}")
    rng = _random.Random(seed)
    try:
        sched = engine_scheduler(engine)
        vocab = cfg.engine.tiny.vocab_size if cfg.engine.model is None else 1000
        driver = _Driver(engine, sched, vocab)
        ids: list[str] = []
        conn.send("ready")
        while (msg := conn.recv()) is not None:
            target, steps = msg
            out: list[tuple[int, float]] = []
            t_end = time.perf_counter()
            for k in range(steps):
                while len(sched.running) + len(sched.waiting) < target:
                    extra = {"ttft_slo": rng.uniform(0.05, 0.5), "tbt_slo": rng.choice(tbt_slos)}
                    ids.append(driver._add(rng.randrange(16, 512), rng.randrange(8, 65), extra))
                before, known = len(sched.log), len(driver.sizes_seen)
                engine.step()
                t = time.perf_counter()
                if len(sched.log) > before:  # a step that ran something
                    row = sched.log.rows[-1]
                    driver.sizes_seen.add(int(row[2]))
                    if k >= 2 and len(driver.sizes_seen) == known:
                        shape = BatchShape(int(row[3]), int(row[5]), float(row[7]),
                                           int(row[4]), int(row[8]))
                        out.append((int(row[6]), (t - t_end) - model.warm_time(shape)))
                t_end = t
            conn.send(out)
        driver._drain(ids)
    finally:
        shutdown_engine(engine)


def _append_metadata(path: Path, key: str, value: str) -> None:
    lines = Path(path).read_text().splitlines()
    lines = [ln for ln in lines if not ln.startswith(f"# {key}:")]
    head = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    lines.insert(head, f"# {key}: {value}")
    Path(path).write_text("\n".join(lines) + "\n")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"
