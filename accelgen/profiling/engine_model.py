"""Step latency of the vLLM CPU engine, from its profile, with the two effects the table cannot
express (found by the fidelity check; docs/profiling.md has the numbers):

1. Decode-only steps are cheaper than a fresh prefill of as many tokens. The table's base curve
   is made of fresh-prefill steps, which carry per-new-request work (admitting the request,
   adding it to the model runner's persistent batch, finishing it); the table's extra terms are
   non-negative, so it can only add to that curve. Decode-only iterations therefore use a fit of
   the profile's decode rows alone: T = a + b x decode_seqs + c x decode_ctx (non-negative least
   squares on relative error).
2. vLLM's CPU GEMMs (oneDNN) build a kernel the first time they see a token count, so the first
   step with a new forward size costs ``first_use_penalty_s`` more (measured by the profile's
   probe: mixed steps at token counts new to the engine, first vs the same composition warm).
   Building kernels (JIT code, fresh memory pages) can cost 3-5x more in engine processes
   started at some times than the long-lived profiling engine measures in the same seconds, so
   a fidelity round probes it in a fresh engine started just before each replay and simulates
   that replay with that penalty (``first_use_penalty_by_replay_s``; ``from_csv(replay=...)``).
   The table holds warm costs; this model remembers the forward sizes it has charged and adds
   the penalty once per size.
   That holds for an engine whose oneDNN kernel cache keeps every size it built (the engines
   here get a large one: ``accelgen.vllm_integration.replay.engine_env_defaults``) and that
   starts cold, like a fidelity replay in its own process.

3. Step times vary: on a shared machine the same step takes from about 0.7 to 2 times its
   median. With ``jitter=True`` every charged iteration is multiplied by a draw from the
   distribution the profile measured (``step_time_ratio_quantiles``: each timed step over the
   median of its shape, pooled), from a seeded generator, so runs stay reproducible.

Optionally (``plugin=True``) a scheduler plugin's extra time per step, a + b x batch size, as the
profile measured it (``plugin_overhead_s``: steady decode steps with the AccelGen adapter minus
stock ones). It replaces the simulator's own policy decision time for such runs: the adapter's
work (mirroring vLLM's queues, building the policy's view, restoring the queues) and the model
runner's reordering of a re-ordered batch are part of it, and the simulated policy alone is
about a third of it on the tiny CPU model. With ``jitter=True`` it also varies from step to
step as the profile's A/B measured (``plugin_overhead_spread``: the plugin's residual quantiles
beyond stock scheduling's), never below zero.

``iteration_time`` is what the simulator charges for an executed iteration and is stateful (2);
``forward_time``, which policies use to plan (token budgets, pivot), is the table's warm cost and
changes nothing. Use one instance per simulated run.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from accelgen.costmodel.base import BatchShape, CostModel
from accelgen.costmodel.table import ProfileCostModel, ProfileRow, read_profile_csv
from accelgen.profiling.vllm_backend import (
    FIRST_USE_KEY,
    FIRST_USE_REPLAY_KEY,
    JITTER_KEY,
    PLUGIN_KEY,
    PLUGIN_SPREAD_KEY,
)


def read_metadata(path: Path | str) -> dict[str, str]:
    """The ``# key: value`` lines at the top of a profile CSV."""
    meta: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        key, sep, value = line[1:].partition(":")
        if sep:
            meta[key.strip()] = value.strip()
    return meta


def fit_decode(rows: Iterable[ProfileRow]) -> tuple[float, float, float]:
    """(a, b, c) of T = a + b x decode_seqs + c x decode_ctx over the decode-only rows."""
    dec = [r for r in rows if r.kind == "decode"]
    if len(dec) < 3:
        raise ValueError(f"need 3 or more decode rows to fit decode steps, got {len(dec)}")
    a = np.array([[1.0, r.decode_seqs, r.decode_ctx] for r in dec])
    y = np.array([r.latency_s for r in dec])
    w = 1.0 / y  # relative error: every row counts alike
    aw = a * w[:, None]
    norms = np.linalg.norm(aw, axis=0)
    sol, _ = nnls(aw / norms, y * w)
    coef = sol / norms
    return float(coef[0]), float(coef[1]), float(coef[2])


class EngineStepModel(CostModel):
    """A vLLM CPU engine's step latency: profile table + decode fit + first-use penalty."""

    name = "vllm-cpu-step"

    def __init__(self, table: ProfileCostModel, decode: tuple[float, float, float],
                 first_use_s: float = 0.0, warm_sizes: Iterable[int] = (),
                 plugin: tuple[float, float] = (0.0, 0.0),
                 jitter: tuple[list[float], list[float]] | None = None, seed: int = 0,
                 plugin_spread: tuple[list[float], list[float]] | None = None,
                 planning: CostModel | None = None, decode_fit: bool = True) -> None:
        if first_use_s < 0:
            raise ValueError(f"first_use_s must be >= 0, got {first_use_s}")
        if jitter is not None:
            levels, ratios = jitter
            if len(levels) != len(ratios) or len(levels) < 2 or any(
                    b < a for a, b in itertools.pairwise(ratios)) or min(ratios) <= 0:
                raise ValueError("jitter needs increasing positive ratio quantiles at >= 2 levels")
        self.jitter = jitter
        self.plugin_spread = plugin_spread
        self.planning = planning  # what forward_time answers with (default: the table)
        self.use_decode_fit = decode_fit
        self._rng = random.Random(seed)
        self.table = table
        self.plugin_fixed, self.plugin_per_seq = plugin
        self.decode_fixed, self.decode_seq, self.decode_ctx = decode
        self.first_use_s = first_use_s
        self.seen: set[int] = set(warm_sizes)
        self.first_uses = 0  # penalties charged so far

    @classmethod
    def from_csv(cls, path: Path | str, warm_sizes: Iterable[int] = (),
                 first_use: bool = True, plugin: bool = False, jitter: bool = False,
                 seed: int = 0, planning: CostModel | None = None,
                 decode_fit: bool = True, replay: str | None = None) -> EngineStepModel:
        """The model of a vLLM profile CSV; with every effect off (``first_use``,
        ``decode_fit``, ``jitter`` and ``plugin`` False) it is the profile table itself.
        ``replay``: a system whose replay the profile probed the first-use penalty next to
        (``first_use_penalty_by_replay_s``); that penalty replaces the profile-wide one."""
        rows = read_profile_csv(path)
        meta = read_metadata(path)
        penalty = first_use_penalty_of(meta, replay) if first_use else 0.0
        overhead = (0.0, 0.0)
        spread = None
        if plugin and jitter and PLUGIN_SPREAD_KEY in meta:
            sp = json.loads(meta[PLUGIN_SPREAD_KEY])
            spread = ([float(x) for x in sp["levels"]], [float(x) for x in sp["extra_s"]])
        if plugin:
            if PLUGIN_KEY not in meta:
                raise ValueError(f"{path}: no {PLUGIN_KEY} line (measure it with "
                                 "accelgen.profiling.vllm_backend.profile_plugin_overhead)")
            overhead = parse_plugin_overhead(meta[PLUGIN_KEY])
        quantiles = None
        if jitter:
            if JITTER_KEY not in meta:
                raise ValueError(f"{path}: no {JITTER_KEY} line (profile it again)")
            j = json.loads(meta[JITTER_KEY])
            quantiles = ([float(x) for x in j["levels"]], [float(x) for x in j["ratios"]])
        return cls(ProfileCostModel(rows, source=str(path)), fit_decode(rows),
                   max(penalty, 0.0), warm_sizes, overhead, quantiles, seed, spread, planning,
                   decode_fit)

    def decode_time(self, shape: BatchShape) -> float:
        return (self.decode_fixed + self.decode_seq * shape.decode_seqs
                + self.decode_ctx * shape.decode_ctx)

    def warm_time(self, shape: BatchShape) -> float:
        """Latency once the engine has run this forward size before (no state change)."""
        if self.use_decode_fit and shape.prefill_tokens == 0 and shape.decode_seqs > 0:
            t = self.decode_time(shape)
        else:
            t = self.table.iteration_time(shape)
        if self.plugin_fixed or self.plugin_per_seq:
            batch = shape.prefill_seqs + shape.decode_seqs
            t += max(0.0, self.plugin_fixed + self.plugin_per_seq * batch)
        return t

    def _plugin_extra(self, shape: BatchShape) -> float:
        """A draw of the plugin overhead's variation (0 without a measured spread); the
        overhead with it stays >= 0."""
        if self.plugin_spread is None:
            return 0.0
        levels, extra = self.plugin_spread
        base = self.plugin_fixed + self.plugin_per_seq * (shape.prefill_seqs + shape.decode_seqs)
        return max(float(np.interp(self._rng.random(), levels, extra)), -max(base, 0.0))

    def iteration_time(self, shape: BatchShape) -> float:
        n = shape.forward_size
        if n <= 0:
            return 0.0
        t = self.warm_time(shape)
        if n not in self.seen:
            self.seen.add(n)
            self.first_uses += 1
            t += self.first_use_s
        if self.jitter is not None:
            t *= self._ratio()
        return t + self._plugin_extra(shape)

    def _ratio(self) -> float:
        """A draw from the measured step-time ratio distribution (inverse CDF, linear between
        the quantiles, the outermost quantiles held flat beyond them)."""
        levels, ratios = self.jitter  # type: ignore[misc]
        return float(np.interp(self._rng.random(), levels, ratios))

    def forward_time(self, forward_size: int) -> float:
        return (self.planning or self.table).forward_time(forward_size)

    def __repr__(self) -> str:
        plugin = (f", plugin +{self.plugin_fixed * 1e3:.3f} ms + {self.plugin_per_seq * 1e6:.1f} "
                  "us/seq" if self.plugin_fixed or self.plugin_per_seq else "")
        jit = ", jitter" if self.jitter is not None else ""
        return (f"EngineStepModel({self.table.source}, decode {self.decode_fixed * 1e3:.3f} ms + "
                f"{self.decode_seq * 1e6:.1f} us/seq + {self.decode_ctx * 1e9:.2f} ns/ctx token, "
                f"first use +{self.first_use_s * 1e3:.2f} ms{plugin}{jit})")


def first_use_penalty_of(meta: dict[str, str], replay: str | None = None) -> float:
    """A profile's first-use penalty: the one probed next to ``replay``'s run when the profile
    has it, else the profile-wide median (0 when the profile has neither)."""
    if replay is not None and FIRST_USE_REPLAY_KEY in meta:
        by = json.loads(meta[FIRST_USE_REPLAY_KEY])
        if replay in by:
            return float(by[replay])
    return float(meta.get(FIRST_USE_KEY, 0.0))


def parse_plugin_overhead(text: str) -> tuple[float, float]:
    """``"a + b x batch_size (...)"`` -> (a, b)."""
    head = text.split("(")[0]
    a_txt, _, rest = head.partition("+")
    b_txt = rest.split("x")[0]
    try:
        return float(a_txt), float(b_txt)
    except ValueError:
        raise ValueError(f"cannot read plugin overhead {text!r}") from None
