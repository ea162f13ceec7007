"""AccelGen's decision over a short queue, in plain Python: the same decisions as the vectorised
``DecisionState`` / ``BatchFormer``, without numpy's per-call cost.

Why: a vectorised decision costs about a hundred numpy calls of a microsecond each whatever the
number of requests, which is all of its time when a dozen requests are live (a small engine, a
quiet period). Stock vLLM's ``schedule()`` then takes some 40 us, so the vectorised policy alone
made the vLLM plugin's step 3-5x as long as stock's (docs/vllm.md, *Scheduler time*). Here every
per-request quantity is computed in one pass over Python lists, and batch forming reuses the
vectorised classes' scalar methods (``force``, ``free_kv``, the KV ledger, the Euclidean loop) on
those lists; only the parts written with numpy are restated: per-candidate columns, urgency,
group selection, decode bulk adds and the feasibility filter.

``AccelGenPolicy`` takes this path when the live requests are at most ``small_queue`` and the
configuration is the full algorithm (slack order, chunking, Euclidean batching); the ablations
and subclasses (the Oracle) always use the vectorised classes. Both paths must decide
identically: ``tests/test_accelgen_small.py`` runs simulations through each and compares every
decision.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelgen.policies.accelgen import _LOST_OFFSET, DecisionState
from accelgen.policies.accelgen_select import _NEVER, BatchFormer
from accelgen.policies.accelgen_state import RequestTable

if TYPE_CHECKING:
    from accelgen.policies.accelgen import AccelGenPolicy
    from accelgen.policies.accelgen_budget import TokenBudget
    from accelgen.policies.base import SchedulerView


class SmallBatchFormer(BatchFormer):
    """``BatchFormer`` over Python lists (slots index them as they index the arrays)."""

    def __init__(self, table: RequestTable, *, computed: list[int], blocks: list[int],
                 running: list[bool], block_size: int, free_blocks: int, token_budget: int,
                 rem: list[int], is_dec: list[bool], key: list[float],
                 victim_key: Callable[[], Any], is_long: list[bool], available: list[bool],
                 era: bool, era_owner: int, admissions_left: float, victim_floor: float,
                 victim_margin: float, growth_reserve: int, total_blocks: int) -> None:
        # Not BatchFormer.__init__: it builds the same columns with numpy.
        self.t = table
        self.bs = bs = block_size
        self.free_blocks = free_blocks
        self.budget = self.a_c = token_budget
        self.rem, self.is_dec, self.key = rem, is_dec, key  # type: ignore[assignment]
        self._victim_key_fn = victim_key
        self._victim_key = None
        self.victim_floor, self.victim_margin = victim_floor, victim_margin
        self.is_long, self.available = is_long, available  # type: ignore[assignment]
        self.chunk, self.era, self.era_owner = True, era, era_owner
        self.admissions_left = admissions_left
        self.running = running  # type: ignore[assignment]
        self.growth = g = growth_reserve
        self.total_blocks = total_blocks
        self.computed, self.blocks = computed, blocks  # type: ignore[assignment]
        n = len(rem)
        need1, owed_all, fresh_need, delta = [0] * n, [0] * n, [0] * n, [0] * n
        need_free, need_adm = [_NEVER] * n, [0] * n
        reserved = 0
        # The vectorised constructor's formulas, per candidate.
        for i in range(n):
            comp, blk, r = computed[i], blocks[i], rem[i]
            nxt = (comp + bs) // bs
            n1 = nxt - blk if nxt > blk else 0
            ow = (comp + r + (g + bs - 1)) // bs - blk
            if ow < 0:
                ow = 0
            need1[i], owed_all[i] = n1, ow
            fn = (r + (g + bs)) // bs
            if fn > total_blocks:
                fn = total_blocks
            whole = (r + bs) // bs
            fresh_need[i] = fn = whole if whole > fn else fn
            after = (comp + (g + bs + 1)) // bs - (blk if blk > nxt else nxt)
            delta[i] = (after if after > 0 else 0) - ow
            if running[i]:
                reserved += ow
                need_free[i] = n1
                need_adm[i] = _NEVER if is_dec[i] else n1 - ow
            else:
                need_adm[i] = fn
        self.need1, self.owed_all, self.fresh_need = need1, owed_all, fresh_need  # type: ignore[assignment]
        self.dec_reserve_delta = delta  # type: ignore[assignment]
        self._need_free, self._need_admissible = need_free, need_adm  # type: ignore[assignment]
        self.reserved_blocks = reserved
        self.slots, self.tokens, self.cut_chunks, self.preempted = [], [], [], []
        self.member = [False] * n  # type: ignore[assignment]
        self._victims = None

    def _close_long(self) -> None:
        avail = self.available
        for i, long_ in enumerate(self.is_long):
            if long_:
                avail[i] = False

    def _victim_pool(self) -> list[int]:
        if self._victims is None:
            vk = self.victim_key
            self._victims = sorted((s for s, r in enumerate(self.running) if r),
                                   key=lambda s: -vk[s])
        return self._victims

    def add_decodes(self, u: Any) -> None:
        if not u:
            return
        need1, delta, member, avail = self.need1, self.dec_reserve_delta, self.member, self.available
        for s in u:
            self.free_blocks -= need1[s]
            self.reserved_blocks += delta[s]
            member[s] = True
            avail[s] = False
        self.a_c -= len(u)
        self.slots.extend(u)
        self.tokens.extend([1] * len(u))

    def _split_urgent(self, urgent: Any) -> tuple[Any, list[int]]:
        avail, is_dec = self.available, self.is_dec
        u = [s for s in urgent if avail[s]]
        return [s for s in u if is_dec[s]], [s for s in u if not is_dec[s]]

    def _urgent_decodes_fitting(self, run: Any) -> tuple[Any, list[int]]:
        need1 = self.need1
        # (the slice keeps numpy's meaning for a negative count)
        fit = set([s for s in run if need1[s] > 0][: self.free_blocks])
        return ([s for s in run if need1[s] <= 0 or s in fit],
                [s for s in run if need1[s] > 0 and s not in fit])

    def feasible(self, cand: Any) -> Any:
        if self.a_c <= 0 or not cand:
            return []
        free, adm = self.free_blocks, self.admissible_blocks
        nf, na = self._need_free, self._need_admissible
        if self.admissions_left < 1:
            run = self.running
            return [s for s in cand if nf[s] <= free and na[s] <= adm and run[s]]
        return [s for s in cand if nf[s] <= free and na[s] <= adm]

    def _euclid_pools(self, group: Any) -> tuple[list[int], list[int], list[float], list[int],
                                                 list[int], list[int]]:
        run, dec, rem, key, need1 = self.running, self.is_dec, self.rem, self.key, self.need1
        fresh = sorted((s for s in group if not run[s]), key=rem.__getitem__)
        return (fresh, [rem[s] for s in fresh], [key[s] for s in fresh],
                [s for s in group if run[s] and not dec[s]],
                [s for s in group if dec[s] and need1[s] > 0],
                [s for s in group if dec[s] and need1[s] <= 0])


class SmallDecisionState(DecisionState):
    """``DecisionState`` over Python lists (see the module docstring)."""

    def __init__(self, policy: AccelGenPolicy, view: SchedulerView, t: RequestTable,
                 bud: TokenBudget, chunk_mean: float) -> None:
        # Not DecisionState.__init__: it computes the same quantities with numpy.
        p = policy.params
        self.p, self.view, self.t, self.bud = p, view, t, bud
        self.chunk_mean = chunk_mean
        n = self.n = t.n
        now = view.now
        prompt, n_out = t.prompt[:n].tolist(), t.n_out[:n].tolist()
        computed, running = t.computed[:n].tolist(), t.running[:n].tolist()
        deadline, online, tbt = t.deadline[:n].tolist(), t.online[:n].tolist(), t.tbt[:n].tolist()
        self._computed, self._blocks, self._running = computed, t.blocks[:n].tolist(), running
        self._arrival = t.arrival[:n].tolist()
        self._prompt_out = tot = [a + b for a, b in zip(prompt, n_out, strict=True)]
        rem = [a - b for a, b in zip(tot, computed, strict=True)]
        is_dec = [o > 0 and r == 1 for o, r in zip(n_out, rem, strict=True)]
        nck = [1.0 if d else float(math.ceil(r / chunk_mean)) for d, r in zip(is_dec, rem, strict=True)]
        to_deadline = [d - now for d in deadline]
        online_dec = [d and o for d, o in zip(is_dec, online, strict=True)]
        slo_iter = [b if od else td / k
                    for od, b, td, k in zip(online_dec, tbt, to_deadline, nck, strict=True)]
        thr = p.long_prompt_threshold
        is_long = [not d and x >= thr for d, x in zip(is_dec, tot, strict=True)]
        self.rem, self.is_dec, self.nck, self.to_deadline = rem, is_dec, nck, to_deadline  # type: ignore[assignment]
        self.online_dec, self.slo_iter, self.is_long = online_dec, slo_iter, is_long  # type: ignore[assignment]
        owner = t.slot_of.get(policy._era_owner, -1) if policy._era_owner is not None else -1
        self.era_owner = owner if p.era else -1
        if self.era_owner >= 0:
            eligible = [not x for x in is_long]
            eligible[owner] = True
        else:
            eligible = [True] * n
        self.eligible = eligible  # type: ignore[assignment]
        self.prev_budget = policy._prev_budget
        dec_ctx = n_dec = prefill_ctx = 0
        for i in range(n):
            if running[i]:
                if is_dec[i]:
                    dec_ctx += computed[i]
                    n_dec += 1
                elif computed[i] > prefill_ctx:
                    prefill_ctx = computed[i]
        self.dec_ctx, self.n_dec, self.prefill_ctx = dec_ctx, n_dec, prefill_ctx
        if p.lost_last:
            self.lost = [o and (x or d < 0.0)  # type: ignore[assignment]
                         for o, x, d in zip(online, t.lost[:n].tolist(), to_deadline, strict=True)]
        else:
            self.lost = None
        self._t_max: dict[int, float] = {}
        self._key_order: Any = None
        self._plan_budget()

    def _urgency(self, t_max: float) -> float:
        p = self.p
        late_urgent = p.late_is_urgent
        slack = [td - k * t_max for td, k in zip(self.to_deadline, self.nck, strict=True)]
        counted = [od or s >= 0.0 for od, s in zip(self.online_dec, slack, strict=True)]
        urgent = [e and s < t_max and (late_urgent or s >= 0.0 or d)
                  for e, s, d in zip(self.eligible, slack, self.is_dec, strict=True)]
        lost = self.lost
        if lost is None:
            key = slack
        else:
            key = [a + _LOST_OFFSET if lo and not d else s
                   for lo, d, a, s in zip(lost, self.is_dec, self._arrival, slack, strict=True)]
        # (Lists where the vectorised state holds arrays: indexed alike by slot.)
        self.slack = slack  # type: ignore[assignment]
        self.urgent = urgent  # type: ignore[assignment]
        self.key = key  # type: ignore[assignment]
        self.counted = counted  # type: ignore[assignment]
        self.t_max = t_max
        rest = [i for i, (e, u) in enumerate(zip(self.eligible, urgent, strict=True)) if e and not u]
        slo = self.slo_iter
        best = min((slo[i] for i, (u, c) in enumerate(zip(urgent, counted, strict=True)) if u and c),
                   default=math.inf)
        if rest:
            lim = min(key[i] for i in rest) + p.gamma
            best = min(best, min((slo[i] for i in rest if key[i] <= lim and counted[i]),
                                 default=math.inf))
        return float(best)

    def _new_former(self) -> BatchFormer:
        p, view = self.p, self.view
        return SmallBatchFormer(
            self.t, computed=self._computed, blocks=self._blocks, running=self._running,
            block_size=view.kv.block_size, free_blocks=view.kv.num_free_blocks,
            token_budget=self.budget.tokens, rem=self.rem, is_dec=self.is_dec,  # type: ignore[arg-type]
            key=self.key, victim_key=self._victim_key, is_long=self.is_long,  # type: ignore[arg-type]
            available=list(self.eligible), era=p.era, era_owner=self.era_owner,
            admissions_left=(math.inf if p.max_num_seqs is None
                             else p.max_num_seqs - sum(self._running)),
            victim_floor=self.t_max, victim_margin=p.gamma,
            growth_reserve=(view.kv.block_size if p.kv_growth_reserve is None
                            else p.kv_growth_reserve),
            total_blocks=view.kv.num_total_blocks)

    def _urgent_order(self, former: BatchFormer) -> Any:
        urgent, avail, slack = self.urgent, former.available, self.slack
        return sorted((s for s in range(self.n) if urgent[s] and avail[s]), key=slack.__getitem__)

    def _victim_key(self) -> Any:
        cm, t_max = self.chunk_mean, self.t_max
        key = [td - math.ceil(x / cm) * t_max
               for td, x in zip(self.to_deadline, self._prompt_out, strict=True)]
        if self.lost is None:
            return key
        return [_LOST_OFFSET - a if lo else k
                for lo, a, k in zip(self.lost, self._arrival, key, strict=True)]

    def _next_group(self, former: BatchFormer) -> Any:
        key = self.key
        order = self._key_order
        if order is None:
            order = self._key_order = sorted(range(self.n), key=key.__getitem__)
        avail = former.available
        cand = former.feasible([s for s in order if avail[s]])  # type: ignore[arg-type]
        if not cand:
            return None
        kc = [key[s] for s in cand]
        return cand[: bisect_right(kc, kc[0] + self.p.gamma)]

    def _group_slo_min(self, group: Any) -> float:
        slo, counted = self.slo_iter, self.counted
        return min((slo[s] for s in group if counted[s]), default=math.inf)

    def _ensure_progress(self, former: BatchFormer) -> None:
        run, key, avail = self._running, self.key, former.available
        for s in sorted((s for s in range(self.n) if avail[s]), key=lambda s: (not run[s], key[s])):
            if former.force(s, min_key=-math.inf):
                self._select(former)
                return

    def info(self, former: BatchFormer) -> dict[str, float]:
        dec = [self.is_dec[s] for s in former.slots]
        n_lost = sum(self.lost) if self.lost is not None else 0
        return self._info(former, dec, sum(1 for x in self.slack if x < 0.0), n_lost)
